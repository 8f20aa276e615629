// GptModel's pipeline slices (GptOptions::first_block / end_block): a chain of slices run
// micro-batch by micro-batch through SliceForward / SliceBackward (/ SliceBackwardWeights)
// gives the whole model's losses and gradients, bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_testing.h"
#include "train/nn/random.h"

namespace ringmaster::train::nn {
namespace {

GptOptions Small() { return {.layers = 4, .heads = 2, .width = 8, .context = 5, .vocab = 11}; }

std::unique_ptr<GptModel> Build(const GptOptions& options) {
  absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(options);
  CHECK(model.ok()) << model.status();
  return *std::move(model);
}

GptOptions SliceOf(GptOptions o, int64_t first, int64_t end) {
  o.first_block = first;
  o.end_block = end;
  return o;
}

// Every tensor's values by name.
std::map<std::string, std::vector<float>> ByName(const state::TensorTable& table,
                                                 const state::FlatBuffer& buffer) {
  std::map<std::string, std::vector<float>> out;
  for (const state::TensorSpec& t : table.tensors()) {
    const float* p = buffer.data() + t.offset;
    out[t.name].assign(p, p + t.numel);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The whole model split at `cuts` (e.g. {1, 3}: blocks [0,1), [1,3), [3,layers)), each stage
// with its parameters taken from the whole model's by name.
struct Chain {
  Chain(const GptOptions& whole, const std::vector<int64_t>& cuts,
        const std::map<std::string, std::vector<float>>& values) {
    std::vector<int64_t> bounds = {0};
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(whole.layers);
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      stages.push_back(Build(SliceOf(whole, bounds[s], bounds[s + 1])));
      const state::TensorTable& table = stages.back()->table();
      params.emplace_back(table.total_elements());
      grads.emplace_back(table.total_elements());
      for (const state::TensorSpec& t : table.tensors()) {
        const std::vector<float>& v = values.at(t.name);
        std::copy(v.begin(), v.end(), params.back().data() + t.offset);
      }
    }
  }

  // Forward and backward of one micro-batch through every stage; returns the last stage's
  // stats. With defer, each stage's weight gradients come after the whole backward.
  StepStats Run(const Batch& batch, const ForwardBackwardOptions& options, bool defer) {
    const int64_t n = batch.size * batch.context * stages[0]->options().width;
    std::vector<std::vector<float>> acts(stages.size() + 1);
    for (size_t s = 0; s < stages.size(); ++s) {
      acts[s + 1].assign(s + 1 < stages.size() ? n : 0, 0.0f);
      absl::Status st = stages[s]->SliceForward(batch, params[s].span(), options.precision, acts[s],
                                                absl::MakeSpan(acts[s + 1]));
      CHECK(st.ok()) << st;
    }
    StepStats last;
    std::vector<float> out_grad, in_grad;
    for (size_t s = stages.size(); s-- > 0;) {
      in_grad.assign(s > 0 ? n : 0, 0.0f);
      absl::StatusOr<StepStats> stats = stages[s]->SliceBackward(grads[s].span(), options, out_grad,
                                                                 absl::MakeSpan(in_grad), defer);
      CHECK(stats.ok()) << stats.status();
      if (s + 1 == stages.size()) last = *stats;
      out_grad = in_grad;
    }
    if (defer) {
      for (size_t s = 0; s < stages.size(); ++s) {
        absl::Status st = stages[s]->SliceBackwardWeights(grads[s].span(), options);
        CHECK(st.ok()) << st;
      }
    }
    return last;
  }

  std::vector<std::unique_ptr<GptModel>> stages;
  std::vector<state::FlatBuffer> params;
  std::vector<state::FlatBuffer> grads;
};

TEST(GptSlice, TablesHoldTheStagesTensorsWithTheWholeModelsNamesAndInitialValues) {
  const GptOptions whole = Small();
  std::unique_ptr<GptModel> full = Build(whole);
  state::FlatBuffer full_params(full->table().total_elements());
  full->Init(7, full_params);
  const auto want = ByName(full->table(), full_params);

  std::map<std::string, int> seen;
  for (auto [first, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 3}, {3, 4}}) {
    std::unique_ptr<GptModel> stage = Build(SliceOf(whole, first, end));
    EXPECT_EQ(stage->has_embeddings(), first == 0);
    EXPECT_EQ(stage->has_head(), end == 4);
    EXPECT_FALSE(stage->is_whole());
    EXPECT_NE(
        stage->Describe().find(absl::StrCat("pipeline stage of blocks ", first, "..", end - 1)),
        std::string::npos)
        << stage->Describe();
    state::FlatBuffer params(stage->table().total_elements());
    stage->Init(7, params);
    for (const auto& [name, values] : ByName(stage->table(), params)) {
      ++seen[name];
      ASSERT_TRUE(want.count(name)) << name;
      EXPECT_TRUE(SameBits(values, want.at(name))) << name << " differs from the whole model's";
    }
    // Parameter groups name only the stage's tensors.
    for (const ParameterGroup& g : stage->parameter_groups()) {
      EXPECT_GE(g.first_tensor, 0);
      EXPECT_LE(g.end_tensor, stage->table().size()) << g.name;
    }
  }
  EXPECT_EQ(seen.size(), want.size()) << "every tensor is on exactly one stage";
  for (const auto& [name, count] : seen) EXPECT_EQ(count, 1) << name;
  EXPECT_TRUE(Build(SliceOf(whole, 0, -1))->is_whole());
}

TEST(GptSlice, ChainsOfSlicesGiveTheWholeModelsLossAndGradientsBitForBit) {
  for (int64_t checkpoint_every : {0, 1}) {
    for (bool defer : {false, true}) {
      for (const std::vector<int64_t>& cuts :
           std::vector<std::vector<int64_t>>{{2}, {1, 3}, {1, 2, 3}}) {
        GptOptions whole = Small();
        whole.checkpoint_every = checkpoint_every;
        const std::string what = absl::StrCat("checkpoint_every ", checkpoint_every, " defer ",
                                              defer, " cuts ", cuts.size());
        std::unique_ptr<GptModel> full = Build(whole);
        state::FlatBuffer params(full->table().total_elements());
        state::FlatBuffer grads(full->table().total_elements());
        full->Init(3, params);
        // Rough parameters, so that every path carries a sizeable gradient.
        SplitMix64 rng(5);
        for (float& p : params.span()) p += 0.3f * static_cast<float>(rng.Next() % 1000) / 1000;
        Chain chain(whole, cuts, ByName(full->table(), params));

        // Two micro-batches: the whole model accumulates, the stages always add.
        ForwardBackwardOptions options;
        options.loss_divisor = 3 * 5;
        options.loss_scale = 4;
        double whole_loss = 0, chain_loss = 0;
        for (int micro = 0; micro < 2; ++micro) {
          const Batch batch = RandomTokens(micro == 0 ? 2 : 1, whole, 10 + micro);
          options.accumulate = micro > 0;
          absl::StatusOr<StepStats> stats = full->ForwardBackward(batch, params, grads, options);
          ASSERT_TRUE(stats.ok()) << stats.status();
          whole_loss += stats->loss_sum;
          const StepStats last = chain.Run(batch, options, defer);
          chain_loss += last.loss_sum;
          EXPECT_EQ(last.loss_terms, batch.size * 5);
        }
        EXPECT_EQ(chain_loss, whole_loss) << what;
        const auto want = ByName(full->table(), grads);
        for (size_t s = 0; s < chain.stages.size(); ++s) {
          for (const auto& [name, values] : ByName(chain.stages[s]->table(), chain.grads[s])) {
            EXPECT_TRUE(SameBits(values, want.at(name))) << what << ": gradient of " << name;
            double norm = 0;
            for (float v : values) norm += std::abs(v);
            EXPECT_GT(norm, 0) << what << ": " << name << " has no gradient";
          }
        }
      }
    }
  }
}

// A tied LM head split into stages: the last stage holds a copy of wte (first in its table,
// the whole model's initial values) as its head; the first stage's wte gradient plus the
// copy's is the whole tied model's wte gradient (up to the order of the fp32 additions), and
// every other gradient and the loss are the whole model's bit for bit.
TEST(GptSlice, ATiedHeadsLastStageHoldsACopyOfWteWhoseGradientAddsToTheFirsts) {
  GptOptions whole = Small();
  whole.tied_head = true;
  std::unique_ptr<GptModel> full = Build(whole);
  state::FlatBuffer params(full->table().total_elements());
  state::FlatBuffer grads(full->table().total_elements());
  full->Init(3, params);
  const auto initial = ByName(full->table(), params);
  for (const auto& [first, end] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 3}, {3, 4}}) {
    std::unique_ptr<GptModel> stage = Build(SliceOf(whole, first, end));
    state::FlatBuffer p(stage->table().total_elements());
    stage->Init(3, p);
    const auto values = ByName(stage->table(), p);
    EXPECT_EQ(values.count("wte"), first == 0 || end == 4 ? 1u : 0u) << first;
    if (end == 4) {
      EXPECT_EQ(stage->table().tensor(0).name, "wte");
      EXPECT_TRUE(SameBits(values.at("wte"), initial.at("wte")));
      EXPECT_NE(stage->Describe().find("LM head tied to wte (a copy of it)"), std::string::npos)
          << stage->Describe();
    }
    if (first == 0) {
      EXPECT_FALSE(stage->parameter_groups().front().read_again_by_head);
    }
  }

  SplitMix64 rng(5);
  for (float& x : params.span()) x += 0.3f * static_cast<float>(rng.Next() % 1000) / 1000;
  Chain chain(whole, {1, 3}, ByName(full->table(), params));
  ForwardBackwardOptions options;
  options.loss_divisor = 2 * 5;
  const Batch batch = RandomTokens(2, whole, 12);
  absl::StatusOr<StepStats> stats = full->ForwardBackward(batch, params, grads, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(chain.Run(batch, options, /*defer=*/true).loss_sum, stats->loss_sum);
  const auto want = ByName(full->table(), grads);
  const auto first = ByName(chain.stages.front()->table(), chain.grads.front());
  const auto last = ByName(chain.stages.back()->table(), chain.grads.back());
  const std::vector<float>& wte = want.at("wte");
  for (size_t k = 0; k < wte.size(); ++k) {
    const float a = first.at("wte")[k], b = last.at("wte")[k];
    EXPECT_NEAR(a + b, wte[k], 1e-6 * (std::abs(a) + std::abs(b)) + 1e-9) << "wte[" << k << "]";
  }
  for (size_t s = 0; s < chain.stages.size(); ++s) {
    for (const auto& [name, values] : ByName(chain.stages[s]->table(), chain.grads[s])) {
      if (name != "wte") {
        EXPECT_TRUE(SameBits(values, want.at(name))) << name;
      }
    }
  }
}

TEST(GptSlice, HalfPrecisionSlicesMatchTheWholeModel) {
  for (Precision precision : {Precision::kBFloat16, Precision::kFloat16}) {
    for (bool defer : {false, true}) {
      const GptOptions whole = Small();
      std::unique_ptr<GptModel> full = Build(whole);
      state::FlatBuffer params(full->table().total_elements());
      state::FlatBuffer grads(full->table().total_elements());
      full->Init(3, params);
      Chain chain(whole, {2}, ByName(full->table(), params));
      ForwardBackwardOptions options;
      options.precision = precision;
      options.loss_divisor = 2 * 5;
      const Batch batch = RandomTokens(2, whole, 1);
      // The whole model with accumulate (its gradients rounded, then added in fp32), as the
      // stages always add.
      options.accumulate = true;
      ASSERT_TRUE(full->ForwardBackward(batch, params, grads, options).ok());
      chain.Run(batch, options, defer);
      const auto want = ByName(full->table(), grads);
      for (size_t s = 0; s < chain.stages.size(); ++s) {
        for (const auto& [name, values] : ByName(chain.stages[s]->table(), chain.grads[s])) {
          EXPECT_TRUE(SameBits(values, want.at(name)))
              << static_cast<int>(precision) << " defer " << defer << ": " << name;
        }
      }
    }
  }
}

TEST(GptSlice, MisuseIsRefusedNamingWhatToDo) {
  const GptOptions whole = Small();
  for (auto [first, end] :
       std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {4, -1}, {2, 2}, {0, 5}}) {
    absl::Status s = GptModel::Create(SliceOf(whole, first, end)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << first << " " << end;
    EXPECT_NE(s.message().find("want 0 <= first_block < end_block <= layers"), std::string::npos)
        << s;
  }
  std::unique_ptr<GptModel> middle = Build(SliceOf(whole, 1, 3));
  state::FlatBuffer params(middle->table().total_elements());
  state::FlatBuffer grads(middle->table().total_elements());
  middle->Init(1, params);
  const Batch batch = RandomTokens(1, whole, 1);
  absl::Status s = middle->ForwardBackward(batch, params, grads, {}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("SliceForward/SliceBackward"), std::string::npos) << s;
  EXPECT_TRUE(
      absl::IsFailedPrecondition(middle->Evaluate(batch, params, Precision::kFloat32).status()));

  const int64_t n = 5 * 8;
  std::vector<float> in(n), out(n), wrong(n + 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      middle->SliceBackward(grads.span(), {}, out, absl::MakeSpan(in), false).status()))
      << "backward before forward";
  s = middle->SliceForward(batch, params.span(), Precision::kFloat32, wrong, absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("want 40 and 40"), std::string::npos) << s;
  ASSERT_TRUE(
      middle->SliceForward(batch, params.span(), Precision::kFloat32, in, absl::MakeSpan(out))
          .ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      middle->SliceBackward(grads.span(), {}, wrong, absl::MakeSpan(in), false).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(middle->SliceBackwardWeights(grads.span(), {})))
      << "nothing deferred";
  ASSERT_TRUE(middle->SliceBackward(grads.span(), {}, out, absl::MakeSpan(in), true).ok());
  EXPECT_TRUE(middle->SliceBackwardWeights(grads.span(), {}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(middle->SliceBackwardWeights(grads.span(), {})))
      << "done once";
}

}  // namespace
}  // namespace ringmaster::train::nn
