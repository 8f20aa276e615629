// The GPT with tensor parallelism (GptOptions::tp_size, Megatron's split) on forked ranks
// (TCP communicator): each rank's shards start as the whole model's values; the ranks'
// forward gives the whole model's loss and their gradients are the whole model's, each
// rank's shard of each tensor (to float rounding: the partial sums are added in another
// order); every block sums twice in forward and twice in backward.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_testing.h"

namespace ringmaster::train {
namespace {

nn::GptOptions Whole() { return {.layers = 2, .heads = 4, .width = 16, .context = 6, .vocab = 13}; }

// `values` of a whole tensor cut to `shard` (rows in order, each to its columns).
std::vector<float> Cut(const std::vector<float>& values, const nn::TensorShard& shard) {
  std::vector<float> out;
  for (const auto& [lo, hi] : shard.row_ranges) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = values.data() + r * shard.whole_cols;
      out.insert(out.end(), row + shard.col_begin, row + shard.col_end);
    }
  }
  return out;
}

struct WholeRun {
  // The initial parameters, the ones trained (initial values moved by a fixed pattern, so
  // that biases and gains are not 0 and 1), the gradients.
  std::map<std::string, std::vector<float>> init, params, grads;
  double loss = 0, eval_loss = 0;
};

// The whole model, parameters moved off GPT-2's initialisation so every gradient is sizeable.
WholeRun RunWhole(const nn::GptOptions& o, const Batch& batch, Precision precision) {
  std::unique_ptr<nn::GptModel> m = *nn::GptModel::Create(o);
  state::FlatBuffer p(m->table().total_elements()), g(p.size());
  m->Init(5, p);
  WholeRun run;
  for (const state::TensorSpec& t : m->table().tensors()) {
    run.init[t.name].assign(p.data() + t.offset, p.data() + t.offset + t.numel);
  }
  for (int64_t i = 0; i < p.size(); ++i) p.data()[i] += 0.05f * std::sin(0.7f * i);
  ForwardBackwardOptions fb;
  fb.loss_divisor = batch.size * o.context;
  fb.precision = precision;
  run.loss = m->ForwardBackward(batch, p, g, fb)->loss_sum;
  run.eval_loss = m->Evaluate(batch, p, precision)->loss_sum;
  for (const state::TensorSpec& t : m->table().tensors()) {
    run.params[t.name].assign(p.data() + t.offset, p.data() + t.offset + t.numel);
    run.grads[t.name].assign(g.data() + t.offset, g.data() + t.offset + t.numel);
  }
  return run;
}

void ExpectMatchesTheWholeModel(int tp, nn::GptOptions o, Precision precision, double tolerance) {
  const Batch batch = nn::RandomTokens(3, o, 17);
  const WholeRun whole = RunWhole(o, batch, precision);
  comm::testing::MultiProcOptions mp;
  mp.world_size = tp;
  auto results = comm::testing::RunRanks(
      mp, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        nn::GptOptions mine = o;
        mine.tp_size = tp;
        mine.tp_rank = comm.rank();
        RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> m, nn::GptModel::Create(mine));
        int sums = 0;
        m->set_tensor_parallel_sum([&](absl::Span<float> x) {
          ++sums;
          return comm.AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32,
                                comm::ReduceOp::kSum, absl::Now() + absl::Seconds(30));
        });
        state::FlatBuffer p(m->table().total_elements()), g(p.size());
        m->Init(5, p);
        for (int i = 0; i < m->table().size(); ++i) {
          const state::TensorSpec& t = m->table().tensor(i);
          const std::vector<float> init = Cut(whole.init.at(t.name), m->shard(i));
          if (static_cast<int64_t>(init.size()) != t.numel ||
              std::memcmp(init.data(), p.data() + t.offset, t.numel * 4) != 0) {
            return absl::InternalError(
                absl::StrCat(t.name, ": the initial shard is not the whole's"));
          }
          const std::vector<float> trained = Cut(whole.params.at(t.name), m->shard(i));
          std::copy(trained.begin(), trained.end(), p.data() + t.offset);
        }
        ForwardBackwardOptions fb;
        fb.loss_divisor = batch.size * o.context;
        fb.precision = precision;
        RM_ASSIGN_OR_RETURN(StepStats s, m->ForwardBackward(batch, p, g, fb));
        // 2 sums a block in forward and 2 in backward (checkpointing recomputes forwards).
        const int want_sums = 4 * static_cast<int>(o.layers);
        if (o.checkpoint_every == 0 && sums != want_sums) {
          return absl::InternalError(absl::StrCat(sums, " sums in a step; want ", want_sums));
        }
        auto close = [&](double a, double b) {
          return std::abs(a - b) <= tolerance * (1 + std::abs(b));
        };
        if (!close(s.loss_sum, whole.loss)) {
          return absl::InternalError(absl::StrCat("loss ", s.loss_sum, "; whole ", whole.loss));
        }
        for (int i = 0; i < m->table().size(); ++i) {
          const state::TensorSpec& t = m->table().tensor(i);
          const std::vector<float> want_g = Cut(whole.grads.at(t.name), m->shard(i));
          double scale = 0;
          for (float v : want_g) scale = std::max(scale, static_cast<double>(std::abs(v)));
          for (int64_t j = 0; j < t.numel; ++j) {
            if (std::abs(g.data()[t.offset + j] - want_g[j]) > tolerance * (scale + 1e-6)) {
              return absl::InternalError(absl::StrCat(
                  t.name, "[", j, "] gradient ", g.data()[t.offset + j], "; whole ", want_g[j]));
            }
          }
        }
        const int before = sums;
        RM_ASSIGN_OR_RETURN(StepStats e, m->Evaluate(batch, p, precision));
        if (!close(e.loss_sum, whole.eval_loss)) {
          return absl::InternalError(absl::StrCat("evaluation loss ", e.loss_sum));
        }
        if (sums - before != 2 * o.layers) {
          return absl::InternalError(absl::StrCat(sums - before, " sums in an evaluation"));
        }
        return absl::OkStatus();
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok())
        << "tp " << tp << " rank " << r << ": " << results[r].status;
  }
}

TEST(GptTensorParallel, ShardsComputeTheWholeModel) {
  ExpectMatchesTheWholeModel(2, Whole(), Precision::kFloat32, 1e-5);
  ExpectMatchesTheWholeModel(4, Whole(), Precision::kFloat32, 1e-5);
  nn::GptOptions probs = Whole();
  probs.memory_efficient_attention = false;
  ExpectMatchesTheWholeModel(2, probs, Precision::kFloat32, 1e-5);
  nn::GptOptions checkpointed = Whole();
  checkpointed.checkpoint_every = 1;
  ExpectMatchesTheWholeModel(2, checkpointed, Precision::kFloat32, 1e-5);
  // bf16 rounds the partial sums where the whole model rounds the whole ones.
  ExpectMatchesTheWholeModel(2, Whole(), Precision::kBFloat16, 3e-2);
}

TEST(GptTensorParallel, ShapesAndMisuse) {
  nn::GptOptions o = Whole();
  o.tp_size = 2;
  o.tp_rank = 1;
  std::unique_ptr<nn::GptModel> m = *nn::GptModel::Create(o);
  const state::TensorTable& t = m->table();
  auto shape = [&](const std::string& name) { return t.tensor(*t.Find(name)).shape; };
  EXPECT_EQ(shape("h0.attn.qkv.weight"), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(shape("h0.attn.qkv.bias"), (std::vector<int64_t>{24}));
  EXPECT_EQ(shape("h0.attn.proj.weight"), (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(shape("h0.attn.proj.bias"), (std::vector<int64_t>{16}));
  EXPECT_EQ(shape("h1.mlp.fc.weight"), (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(shape("h1.mlp.proj.weight"), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(shape("wte"), (std::vector<int64_t>{13, 16}));
  // Rank 1 of 2 holds heads 2 and 3: q rows 8..15, k rows 24..31, v rows 40..47.
  const nn::TensorShard& qkv = m->shard(*t.Find("h0.attn.qkv.weight"));
  EXPECT_EQ(qkv.row_ranges,
            (std::vector<std::pair<int64_t, int64_t>>{{8, 16}, {24, 32}, {40, 48}}));
  const nn::TensorShard& proj = m->shard(*t.Find("h0.attn.proj.weight"));
  EXPECT_EQ(proj.col_begin, 8);
  EXPECT_EQ(proj.col_end, 16);
  EXPECT_TRUE(m->shard(*t.Find("h0.ln1.weight")).whole());
  EXPECT_NE(m->Describe().find("tensor-parallel rank 1 of 2"), std::string::npos);

  state::FlatBuffer p(t.total_elements()), g(p.size());
  m->Init(1, p);
  const Batch batch = nn::RandomTokens(1, o, 1);
  absl::Status s = m->ForwardBackward(batch, p, g, {}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("set_tensor_parallel_sum"), std::string::npos) << s;
  m->set_tensor_parallel_sum([](absl::Span<float>) { return absl::UnavailableError("peer gone"); });
  EXPECT_TRUE(absl::IsUnavailable(m->ForwardBackward(batch, p, g, {}).status()));

  o.tp_size = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(nn::GptModel::Create(o).status()));
  o.tp_size = 2;
  o.tp_rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(nn::GptModel::Create(o).status()));
}

}  // namespace
}  // namespace ringmaster::train
