#include "train/nn/gpt.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/half.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/finite_difference.h"
#include "train/nn/gpt_testing.h"
#include "train/nn/random.h"

// Counts heap allocations while `counting` is set, to check that a steady-state step makes
// none. libstdc++ routes every other form of operator new (arrays, nothrow) to these two, and
// its operator deletes release with free(), which takes what aligned_alloc gives.
namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

void* CountedAllocation(size_t size, size_t align) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  void* p = std::aligned_alloc(align, (std::max<size_t>(size, 1) + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(size_t size) { return CountedAllocation(size, alignof(std::max_align_t)); }
void* operator new(size_t size, std::align_val_t align) {
  return CountedAllocation(size, std::max(static_cast<size_t>(align), sizeof(void*)));
}

namespace ringmaster::train::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 2 layers, 2 heads, width 8, context 5, vocabulary 11: 1,976 parameters.
GptOptions Tiny() { return {.layers = 2, .heads = 2, .width = 8, .context = 5, .vocab = 11}; }

std::unique_ptr<GptModel> Build(const GptOptions& options) {
  absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(options);
  CHECK(model.ok()) << model.status();
  return *std::move(model);
}


Batch Slice(const Batch& b, int64_t begin, int64_t count) {
  Batch s;
  s.size = count;
  s.context = b.context;
  const int64_t row = b.context + 1;
  s.tokens.assign(b.tokens.begin() + begin * row, b.tokens.begin() + (begin + count) * row);
  return s;
}

bool IsLayerNormGain(const state::TensorSpec& t) {
  return absl::StrContains(t.name, "ln") && absl::EndsWith(t.name, ".weight");
}

// A model, its parameters (Init(seed)) and a gradient buffer.
struct Trial {
  explicit Trial(const GptOptions& options, uint64_t seed = 11)
      : model(Build(options)),
        params(model->table().total_elements()),
        grads(model->table().total_elements()) {
    model->Init(seed, params);
  }

  StepStats Step(const Batch& batch, state::FlatBuffer& out,
                 const ForwardBackwardOptions& options) {
    absl::StatusOr<StepStats> stats = model->ForwardBackward(batch, params, out, options);
    CHECK(stats.ok()) << stats.status();
    return *stats;
  }
  StepStats Step(const Batch& batch, const ForwardBackwardOptions& options) {
    return Step(batch, grads, options);
  }
  double Loss(const Batch& batch, Precision precision = Precision::kFloat32) {
    absl::StatusOr<StepStats> stats = model->Evaluate(batch, params, precision);
    CHECK(stats.ok()) << stats.status();
    return stats->loss_sum;
  }

  // Moves the parameters far from GPT-2's initialisation, so that every path carries a
  // gradient of order 0.01 to 1: weights, embeddings and biases uniform in ±0.5, LayerNorm
  // gains in 1 ± 0.5.
  void Roughen(uint64_t seed) {
    SplitMix64 rng(seed);
    for (const state::TensorSpec& t : model->table().tensors()) {
      absl::Span<float> values = params.tensor(t);
      FillUniform(rng, 0.5f, values);
      if (IsLayerNormGain(t)) {
        for (float& v : values) v += 1;
      }
    }
  }

  std::unique_ptr<GptModel> model;
  state::FlatBuffer params;
  state::FlatBuffer grads;
};

// The alignment padding after each tensor of `buffer` holds `value`.
void ExpectPadding(const state::TensorTable& table, const state::FlatBuffer& buffer, float value) {
  for (int i = 0; i < table.size(); ++i) {
    const state::TensorSpec& t = table.tensor(i);
    const int64_t end = i + 1 < table.size() ? table.tensor(i + 1).offset : table.total_elements();
    for (int64_t j = t.offset + t.numel; j < end; ++j) {
      EXPECT_EQ(buffer.data()[j], value) << "padding after " << t.name;
    }
  }
}

bool SameBits(const state::FlatBuffer& a, const state::FlatBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

TEST(GptModel, CreateRejectsBadOptionsNamingTheField) {
  struct Bad {
    GptOptions options;
    std::string field;
  };
  std::vector<Bad> bad;
  auto add = [&](std::string field, auto change) {
    GptOptions o = Tiny();
    change(o);
    bad.push_back({o, std::move(field)});
  };
  add("gpt.layers", [](GptOptions& o) { o.layers = 0; });
  add("gpt.heads", [](GptOptions& o) { o.heads = -1; });
  add("gpt.heads", [](GptOptions& o) { o.heads = 3; });  // does not divide 8
  add("gpt.width", [](GptOptions& o) { o.width = 0; });
  add("gpt.context", [](GptOptions& o) { o.context = 0; });
  add("gpt.vocab", [](GptOptions& o) { o.vocab = 0; });
  add("gpt.vocab", [](GptOptions& o) { o.vocab = int64_t{1} << 31; });
  add("gpt.checkpoint_every", [](GptOptions& o) { o.checkpoint_every = -1; });
  for (const Bad& b : bad) {
    const absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(b.options);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << b.field;
    EXPECT_THAT(model.status().message(), HasSubstr(b.field));
  }
  GptOptions widest = Tiny();
  widest.heads = 8;
  widest.checkpoint_every = 100;  // more than the layers: legal
  EXPECT_TRUE(GptModel::Create(widest).ok());
}

// GPT-2's parameter count: V·C + T·C + L·(12C² + 13C) + 2C for lnf, and V·C for the untied
// head.
TEST(GptModel, DefaultDescriptionTableAndParameterCount) {
  const std::unique_ptr<GptModel> model = Build({});
  EXPECT_EQ(model->Describe(), "gpt 4 layers x 4 heads x 128 wide, context 128, vocab 256");
  const int64_t c = 128, v = 256, t = 128, l = 4;
  EXPECT_EQ(model->table().parameter_count(),
            v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c + v * c);
  EXPECT_EQ(model->LossTermsPerSample(), 128);
  EXPECT_EQ(Build({.checkpoint_every = 2, .memory_efficient_attention = false})->Describe(),
            "gpt 4 layers x 4 heads x 128 wide, context 128, vocab 256, checkpointing every 2 "
            "blocks, attention keeping probabilities");

  const std::unique_ptr<GptModel> one =
      Build({.layers = 1, .heads = 2, .width = 4, .context = 3, .vocab = 5});
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const state::TensorSpec& s : one->table().tensors()) {
    names.push_back(s.name);
    shapes.push_back(s.shape);
  }
  EXPECT_THAT(names, ElementsAre("wte", "wpe", "h0.ln1.weight", "h0.ln1.bias", "h0.attn.qkv.weight",
                                 "h0.attn.qkv.bias", "h0.attn.proj.weight", "h0.attn.proj.bias",
                                 "h0.ln2.weight", "h0.ln2.bias", "h0.mlp.fc.weight",
                                 "h0.mlp.fc.bias", "h0.mlp.proj.weight", "h0.mlp.proj.bias",
                                 "lnf.weight", "lnf.bias", "lm_head.weight"));
  using S = std::vector<int64_t>;
  EXPECT_THAT(shapes,
              ElementsAre(S{5, 4}, S{3, 4}, S{4}, S{4}, S{12, 4}, S{12}, S{4, 4}, S{4}, S{4}, S{4},
                          S{16, 4}, S{16}, S{4, 16}, S{4}, S{4}, S{4}, S{5, 4}));
}

// GPT-2's initialisation, checked with sample statistics of the default model's tensors
// (16,384 to 65,536 values each): standard deviation 0.02, or 0.02/sqrt(2·4) for the residual
// projections, within 3 % (the sample deviation's own spread is 1/sqrt(2n) < 0.6 %); mean
// within 5 standard errors of 0; and 68.27 % of the values within one deviation, ± 1.5 %
// (a normal distribution's share; the uniform's would be 57.7 %). Gains 1, biases 0.
TEST(GptModel, InitIsGpt2sDeterministicAndSeedDependent) {
  Trial s({});
  const state::TensorTable& table = s.model->table();
  for (const state::TensorSpec& t : table.tensors()) {
    absl::Span<const float> v = s.params.tensor(t);
    if (absl::EndsWith(t.name, ".bias")) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0; })) << t.name;
      continue;
    }
    if (IsLayerNormGain(t)) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1; })) << t.name;
      continue;
    }
    const double want = absl::EndsWith(t.name, "proj.weight") ? 0.02 / std::sqrt(8.0) : 0.02;
    double sum = 0, squares = 0;
    int64_t within = 0;
    for (float x : v) {
      sum += x;
      squares += double{x} * x;
      within += std::abs(x) < want;
    }
    const double n = static_cast<double>(v.size());
    EXPECT_NEAR(std::sqrt(squares / n), want, 0.03 * want) << t.name;
    EXPECT_LT(std::abs(sum / n), 5 * want / std::sqrt(n)) << t.name;
    EXPECT_NEAR(within / n, 0.6827, 0.015) << t.name;
  }
  state::FlatBuffer again(s.params.size()), other(s.params.size());
  for (float& v : again.span()) v = 7.0f;  // padding is zeroed
  s.model->Init(11, again);
  s.model->Init(12, other);
  EXPECT_TRUE(SameBits(again, s.params));
  EXPECT_FALSE(SameBits(other, s.params));
  ExpectPadding(table, again, 0.0f);
}

// The first two SplitMix64 outputs from seed 0 (Vigna's reference sequence) through
// Box–Muller, both values of the pair: wte[0] and wte[1].
TEST(GptModel, InitFollowsTheSplitMix64ReferenceSequence) {
  Trial s(Tiny(), 0);
  auto unit = [](uint64_t bits) { return static_cast<double>((bits >> 11) + 1) * 0x1p-53; };
  const double radius = 0.02 * std::sqrt(-2 * std::log(unit(0xe220a8397b1dcdafu)));
  const double angle = 2 * std::numbers::pi * unit(0x6e789e6aa1b965f4u);
  EXPECT_EQ(s.params.data()[0], static_cast<float>(radius * std::cos(angle)));
  EXPECT_EQ(s.params.data()[1], static_cast<float>(radius * std::sin(angle)));
}

// At initialisation the logits are small (lnf's output has unit variance per channel and the
// head's weights deviation 0.02, so a logit's variance is 0.02² · width = 0.0128 here): the
// predicted distribution is nearly uniform and the mean loss is ln(vocab) + about half that
// variance. Tolerance 0.02 (ln 256 = 5.545).
TEST(GptModel, LossAtInitIsLogVocabulary) {
  const GptOptions options{.layers = 2, .heads = 2, .width = 32, .context = 16, .vocab = 256};
  Trial s(options);
  const Batch batch = RandomTokens(4, options, 5);
  const StepStats stats = s.Step(batch, {});
  EXPECT_EQ(stats.loss_terms, 4 * 16);
  EXPECT_NEAR(stats.loss_sum / stats.loss_terms, std::log(256.0), 0.02);
}

// Central differences of the mean loss (Evaluate, fp32) against ForwardBackward's gradient,
// for every element of every tensor of the tiny model (batch 2: 10 loss terms) at rough
// parameters. Step h = 3e-3; tolerance 2e-4 · (1 + |g|). The loss is smooth (no ReLU or
// max), so the one-sided slopes agree to about h·|f''|; the central quotient is off by the
// fp32 rounding of the loss (about 1e-7 / 2h = 2e-5) plus h²·|f'''|/6 (measured: largest
// error 6.4e-5; h = 1e-2 gives 4e-4, h = 1e-3 2.4e-4). Every tensor's largest gradient is
// above 0.05 (up to 0.76), so the tolerance is a fraction of a percent of each.
// Also with a tied head, whose wte gradient sums the embedding's and the head's.
class GptGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(GptGradientTest, GradientsMatchFiniteDifferences) {
  constexpr float kStep = 3e-3f;
  constexpr double kTolerance = 2e-4;
  GptOptions o = Tiny();
  o.tied_head = GetParam();
  Trial s(o);
  s.Roughen(3);
  const Batch batch = RandomTokens(2, o, 1);
  ForwardBackwardOptions options;
  options.loss_divisor = 2 * 5;
  s.Step(batch, options);
  auto mean_loss = [&] { return s.Loss(batch) / 10; };
  double largest_error = 0;
  for (const state::TensorSpec& t : s.model->table().tensors()) {
    double largest = 0;
    for (int64_t i = 0; i < t.numel; ++i) {
      const Slope slope = MeasureSlope(s.params.data()[t.offset + i], kStep, 1e-2, mean_loss);
      EXPECT_TRUE(slope.smooth) << t.name << "[" << i << "]";
      const double analytic = s.grads.data()[t.offset + i];
      EXPECT_TRUE(GradientClose(analytic, slope.central, kTolerance))
          << t.name << "[" << i << "]: " << analytic << " vs finite difference " << slope.central;
      largest = std::max(largest, std::abs(slope.central));
      largest_error = std::max(largest_error, std::abs(analytic - slope.central));
    }
    // The check means something: every tensor has gradients well above the tolerance.
    EXPECT_GT(largest, 20 * kTolerance) << t.name;
  }
  LOG(INFO) << "largest gradient error " << largest_error;
}

INSTANTIATE_TEST_SUITE_P(Head, GptGradientTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tied" : "Untied";
                         });

// A tied head (GPT-2) is the untied model whose lm_head holds wte's values: the same table
// without lm_head.weight, the same logits and loss bit for bit, the same gradients of every
// other tensor bit for bit, and for wte the sum of the untied model's wte and lm_head
// gradients (up to the order of the fp32 additions; in bf16 the tied sum is rounded once, the
// untied parts each); Init gives the tied model the untied one's values for the tensors they
// share.
TEST(GptModel, ATiedHeadIsTheUntiedModelWithWteAsItsHead) {
  GptOptions untied_options = Tiny();
  GptOptions tied_options = Tiny();
  tied_options.tied_head = true;
  Trial untied(untied_options), tied(tied_options);
  const state::TensorTable& table = tied.model->table();
  ASSERT_EQ(table.size() + 1, untied.model->table().size());
  EXPECT_FALSE(table.Find("lm_head.weight").ok());
  EXPECT_EQ(tied.model->table().parameter_count() + 11 * 8,
            untied.model->table().parameter_count());
  EXPECT_THAT(tied.model->Describe(), HasSubstr(", LM head tied to wte"));
  const std::vector<ParameterGroup> groups = tied.model->parameter_groups();
  ASSERT_EQ(groups.size() + 1, untied.model->parameter_groups().size());
  EXPECT_EQ(groups.front().name, "embeddings");
  EXPECT_TRUE(groups.front().read_again_by_head);
  EXPECT_TRUE(groups.front().backward_reads_parameters);  // the head's backward reads wte
  EXPECT_EQ(groups.back().name, "lnf");
  EXPECT_FALSE(untied.model->parameter_groups().front().read_again_by_head);
  // Init: the shared tensors' values (the untied one draws lm_head last).
  for (int i = 0; i < table.size(); ++i) {
    const state::TensorSpec& t = table.tensor(i);
    ASSERT_EQ(t.offset, untied.model->table().tensor(i).offset) << t.name;
    EXPECT_TRUE(std::equal(tied.params.tensor(t).begin(), tied.params.tensor(t).end(),
                           untied.params.tensor(untied.model->table().tensor(i)).begin()))
        << t.name;
  }

  tied.Roughen(5);
  std::copy_n(tied.params.data(), table.total_elements(), untied.params.data());
  const state::TensorSpec& wte = table.tensor(0);
  const state::TensorSpec& head = untied.model->table().tensor(table.size());
  std::copy_n(tied.params.data() + wte.offset, wte.numel, untied.params.data() + head.offset);
  const Batch batch = RandomTokens(3, tied_options, 6);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    const std::string what = PrecisionName(precision);
    ForwardBackwardOptions options;
    options.loss_divisor = 3 * 5;
    options.precision = precision;
    const StepStats a = tied.Step(batch, options);
    const StepStats b = untied.Step(batch, options);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << what;
    EXPECT_EQ(a.correct, b.correct) << what;
    EXPECT_EQ(tied.Loss(batch, precision), untied.Loss(batch, precision)) << what;
    // bf16: each of the three roundings is within 2^-8 of its value.
    const double relative = precision == Precision::kFloat32 ? 1e-5 : 3 * 0x1p-8;
    for (int i = 0; i < table.size(); ++i) {
      const state::TensorSpec& t = table.tensor(i);
      for (int64_t k = 0; k < t.numel; ++k) {
        const float got = tied.grads.data()[t.offset + k];
        if (i == 0) {
          const float embedding = untied.grads.data()[t.offset + k];
          const float from_head = untied.grads.data()[head.offset + k];
          const float want = embedding + from_head;
          EXPECT_NEAR(got, want, 1e-7 + relative * (std::abs(embedding) + std::abs(from_head)))
              << what << ", wte[" << k << "]";
        } else {
          ASSERT_EQ(got, untied.grads.data()[t.offset + k])
              << what << ", " << t.name << "[" << k << "]";
        }
      }
    }
  }
}

// Half precision with accumulate stages each group's gradients before adding them: the tied
// wte's sum (staged while every block's groups use the stage) is the one without accumulate,
// added to what was there.
TEST(GptModel, ATiedHeadAccumulatesItsWteGradient) {
  GptOptions o = Tiny();
  o.tied_head = true;
  Trial s(o);
  s.Roughen(8);
  const Batch batch = RandomTokens(2, o, 9);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    ForwardBackwardOptions options;
    options.loss_divisor = 2 * 5;
    options.precision = precision;
    s.Step(batch, options);
    const std::vector<float> once(s.grads.data(), s.grads.data() + s.grads.size());
    state::FlatBuffer twice(s.grads.size());
    std::copy_n(once.data(), once.size(), twice.data());
    options.accumulate = true;
    s.Step(batch, twice, options);
    for (int64_t k = 0; k < s.model->table().tensor(0).numel; ++k) {
      const float want = once.data()[k] * 2;
      ASSERT_NEAR(twice.data()[k], want, 1e-7 + 1e-6 * std::abs(want))
          << PrecisionName(precision) << ", wte[" << k << "]";
    }
  }
}

// The loss convention: two halves of a batch, each with loss_divisor = the full count of
// tokens and the second accumulating, give the full batch's gradient (up to fp32 summation
// order); the padding between tensors is never written.
TEST(GptModel, HalfBatchesAccumulateToTheFullBatchGradient) {
  Trial s(Tiny());
  s.Roughen(4);
  const Batch batch = RandomTokens(6, Tiny(), 2);
  ForwardBackwardOptions options;
  options.loss_divisor = 6 * 5;
  const StepStats full = s.Step(batch, options);

  state::FlatBuffer halves(s.grads.size());
  for (float& g : halves.span()) g = 1234.0f;  // overwritten in tensors, kept in padding
  const StepStats a = s.Step(Slice(batch, 0, 2), halves, options);
  options.accumulate = true;
  const StepStats b = s.Step(Slice(batch, 2, 4), halves, options);

  EXPECT_NEAR(a.loss_sum + b.loss_sum, full.loss_sum, 1e-5);
  EXPECT_EQ(a.correct + b.correct, full.correct);
  EXPECT_EQ(a.loss_terms + b.loss_terms, 30);
  for (const state::TensorSpec& t : s.model->table().tensors()) {
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      EXPECT_NEAR(halves.data()[i], s.grads.data()[i], 1e-6 + 1e-5 * std::abs(s.grads.data()[i]))
          << t.name << "[" << i - t.offset << "]";
    }
  }
  ExpectPadding(s.model->table(), halves, 1234.0f);
}

// L = loss_scale · Σ loss / loss_divisor. Backward is linear in the logits' gradient, so a
// power-of-two factor scales every gradient exactly.
TEST(GptModel, LossScaleAndDivisorScaleTheGradient) {
  Trial s(Tiny());
  const Batch batch = RandomTokens(3, Tiny(), 3);
  ForwardBackwardOptions options;
  options.loss_divisor = 4;
  const StepStats plain = s.Step(batch, options);
  state::FlatBuffer scaled(s.grads.size());
  options.loss_scale = 1024;
  options.loss_divisor = 2;
  const StepStats stats = s.Step(batch, scaled, options);
  EXPECT_EQ(stats.loss_sum, plain.loss_sum);  // unscaled
  for (int64_t i = 0; i < s.grads.size(); ++i) {
    ASSERT_EQ(scaled.data()[i], 2048 * s.grads.data()[i]) << i;
  }
}

// Activation checkpointing recomputes the same kernels on the same values: loss and
// gradients are bit-identical to the run without it, in fp32 and bf16, with and without
// accumulate. Memory: 4 layers; every 1 keeps 5 stream buffers and 1 block's activations,
// every 2 keeps 4 and 2, every 3 keeps 5 and 3, no checkpointing (or every 4, or more) 5 and
// 4.
TEST(GptModel, CheckpointingGivesTheSameGradientsInLessMemory) {
  GptOptions options = Tiny();
  options.layers = 4;
  const Batch batch = RandomTokens(3, options, 4);
  std::map<int64_t, int64_t> peak;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    for (bool accumulate : {false, true}) {
      ForwardBackwardOptions fb;
      fb.precision = precision;
      fb.accumulate = accumulate;
      fb.loss_divisor = 15;
      Trial plain(options);
      plain.Roughen(5);
      for (float& g : plain.grads.span()) g = 0.25f;
      const StepStats want = plain.Step(batch, fb);
      for (int64_t every : {1, 2, 3, 4, 5}) {
        SCOPED_TRACE(testing::Message()
                     << "every " << every << " precision " << static_cast<int>(precision)
                     << " accumulate " << accumulate);
        options.checkpoint_every = every;
        Trial s(options);
        std::copy_n(plain.params.data(), s.params.size(), s.params.data());
        for (float& g : s.grads.span()) g = 0.25f;
        const StepStats got = s.Step(batch, fb);
        EXPECT_EQ(got.loss_sum, want.loss_sum);
        EXPECT_EQ(got.correct, want.correct);
        EXPECT_TRUE(SameBits(s.grads, plain.grads));
        peak[every] = s.model->memory().activation_bytes_peak;
        options.checkpoint_every = 0;
      }
      peak[0] = plain.model->memory().activation_bytes_peak;
    }
  }
  EXPECT_LT(peak[1], peak[2]);
  EXPECT_LT(peak[2], peak[3]);
  EXPECT_LT(peak[3], peak[0]);
  EXPECT_EQ(peak[4], peak[0]);
  EXPECT_EQ(peak[5], peak[0]);
}

// MemoryStats.activation_bytes_peak is what gpt.h's header lists, here with sizes that need
// no alignment padding (4 layers, width 16, context 8, 2 heads, vocabulary 32, batch 2: 16
// rows): per row, `streams` residual-stream buffers of width floats, 15 width + 4 + heads
// floats per block whose activations are kept, lnf (width + 2) and the logits (vocab), the
// loss (1 float and 3 int32: loss, prediction, input, target), backward's gradients
// (2 width + max(4 width, vocab)); attention's scratch of 2 · min(context, 64) · context; and
// a LayerNorm's gradient sums (2 width).
TEST(GptModel, ActivationMemoryIsWhatTheHeaderLists) {
  const GptOptions base{.layers = 4, .heads = 2, .width = 16, .context = 8, .vocab = 32};
  auto documented = [&](int64_t streams, int64_t blocks) {
    const int64_t rows = 2 * 8, c = 16;
    const int64_t per_row = streams * c + blocks * (15 * c + 4 + 2) + (c + 2) + 32 + (1 + 3) +
                            (2 * c + std::max<int64_t>(4 * c, 32));
    return 4 * (rows * per_row + 2 * 8 * 8 + 2 * c);
  };
  const Batch batch = RandomTokens(2, base, 17);
  struct Case {
    int64_t every, streams, blocks;
  };
  // Off: 5 streams (4 block inputs and lnf's), 4 blocks. Every 1: 4 checkpoints + lnf's
  // input, 1 block. Every 2: 2 checkpoints, 1 inside a segment, lnf's input; 2 blocks.
  for (const Case& c : {Case{0, 5, 4}, Case{1, 5, 1}, Case{2, 4, 2}}) {
    GptOptions options = base;
    options.checkpoint_every = c.every;
    Trial s(options);
    s.Step(batch, {});
    EXPECT_EQ(s.model->memory().activation_bytes_peak, documented(c.streams, c.blocks))
        << "every " << c.every;
  }
}

// on_grads_ready: the LM head, lnf, each layer of each block from the last, then the
// embeddings at 0 (the parameter groups in reverse), each
// announced range already final (compared with the finished gradients), with and without
// checkpointing, in fp32 and bf16, overwriting and accumulating.
TEST(GptModel, GradsReadyAnnouncesFinalRangesInDecreasingOrder) {
  const Batch batch = RandomTokens(2, Tiny(), 6);
  for (int64_t every : {0, 1}) {
    GptOptions options = Tiny();
    options.checkpoint_every = every;
    Trial s(options);
    const state::TensorTable& table = s.model->table();
    std::vector<int64_t> want;
    std::vector<std::string> names = {"lm_head.weight", "lnf.weight"};
    for (const char* block : {"h1", "h0"}) {
      for (const char* layer : {"mlp.proj", "mlp.fc", "ln2", "attn.proj", "attn.qkv", "ln1"}) {
        names.push_back(absl::StrCat(block, ".", layer, ".weight"));
      }
    }
    for (const std::string& name : names) want.push_back(table.tensor(*table.Find(name)).offset);
    want.push_back(0);
    for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "every " << every << " precision " << static_cast<int>(precision)
                     << " accumulate " << accumulate);
        for (float& g : s.grads.span()) g = 0.5f;  // what accumulate adds to
        // Each announcement's new range [offset, previous offset), as it is then.
        state::FlatBuffer announced(s.grads.size());
        int64_t previous = s.grads.size();
        std::vector<int64_t> offsets;
        ForwardBackwardOptions fb;
        fb.precision = precision;
        fb.accumulate = accumulate;
        fb.on_grads_ready = [&](int64_t offset) {
          offsets.push_back(offset);
          std::copy(s.grads.data() + offset, s.grads.data() + previous, announced.data() + offset);
          previous = offset;
        };
        s.Step(batch, fb);
        EXPECT_EQ(offsets, want);
        EXPECT_TRUE(SameBits(announced, s.grads)) << "a gradient changed after its announcement";
      }
    }
  }
}

// The two attention forms agree up to the kernels' rounding (they sum p·v in different
// orders): loss within 1e-6 relative, each tensor's gradient within 1e-5 of its largest
// element (measured: 4e-7 at most; the kernels' own tests allow 1e-5). Keeping the probabilities
// costs heads · context floats per token and block instead of heads.
TEST(GptModel, MemoryEfficientAttentionGivesTheSameGradients) {
  GptOptions options = Tiny();
  Trial efficient(options);
  efficient.Roughen(7);
  options.memory_efficient_attention = false;
  Trial keeping(options);
  std::copy_n(efficient.params.data(), efficient.params.size(), keeping.params.data());
  const Batch batch = RandomTokens(3, options, 7);
  const StepStats a = efficient.Step(batch, {});
  const StepStats b = keeping.Step(batch, {});
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-6 * b.loss_sum);
  double worst = 0;
  for (const state::TensorSpec& t : efficient.model->table().tensors()) {
    absl::Span<const float> x = efficient.grads.tensor(t), y = keeping.grads.tensor(t);
    float largest = 0, difference = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      largest = std::max(largest, std::abs(y[i]));
      difference = std::max(difference, std::abs(x[i] - y[i]));
    }
    EXPECT_LE(difference, 1e-5 * largest) << t.name;
    worst = std::max(worst, double{difference} / largest);
  }
  LOG(INFO) << "largest relative gradient difference " << worst;
  EXPECT_GT(keeping.model->memory().activation_bytes_peak,
            efficient.model->memory().activation_bytes_peak);
}

// Gradients in bf16 and fp16 against fp32 at GPT-2's initialisation, as the relative L2
// distance of the whole gradient vector (and of the loss). Unit roundoff: bf16 2^-8 =
// 3.9e-3, fp16 2^-11 = 4.9e-4; rounding every activation and gradient through 2 blocks lands
// the distance near 1.5 units (measured: bf16 5.8e-3, fp16 7.8e-4). Bounds: bf16 2e-2,
// fp16 4e-3, and fp16 closer than bf16. The loss is near ln(vocab) at initialisation and
// moves less (measured: 1.5e-5 and 8e-7 relative; bounds 1e-3 and 1e-4). The gradients are
// computed with loss_scale 1024, as fp16 training does, so that small ones stay out of
// fp16's subnormal range; every one must be a value of the format.
TEST(GptModel, ReducedPrecisionIsCloseToFp32AndRoundsEveryGradient) {
  const GptOptions options{.layers = 2, .heads = 2, .width = 16, .context = 8, .vocab = 32};
  Trial s(options);
  const state::TensorTable& table = s.model->table();
  const Batch batch = RandomTokens(4, options, 8);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 4 * 8;
  const StepStats fp32 = s.Step(batch, fb);
  fb.loss_scale = 1024;
  state::FlatBuffer bf16(s.grads.size()), fp16(s.grads.size());
  fb.precision = Precision::kBFloat16;
  const StepStats bf16_stats = s.Step(batch, bf16, fb);
  fb.precision = Precision::kFloat16;
  const StepStats fp16_stats = s.Step(batch, fp16, fb);

  EXPECT_NEAR(bf16_stats.loss_sum, fp32.loss_sum, 1e-3 * fp32.loss_sum);
  EXPECT_NEAR(fp16_stats.loss_sum, fp32.loss_sum, 1e-4 * fp32.loss_sum);
  // The half-precision gradients are values of their format: kernels/half.h's conversions
  // (not kernels/precision.h, which the model uses) leave them unchanged.
  for (const state::TensorSpec& t : table.tensors()) {
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      const float b = bf16.data()[i], h = fp16.data()[i];
      ASSERT_EQ(kernels::BFloat16ToFloat(kernels::FloatToBFloat16(b)), b) << t.name;
      ASSERT_EQ(kernels::Float16ToFloat(kernels::FloatToFloat16(h)), h) << t.name;
    }
  }
  // |half / 1024 - fp32| / |fp32| over every tensor element.
  auto distance = [&](const state::FlatBuffer& half) {
    double diff = 0, norm = 0;
    for (const state::TensorSpec& t : table.tensors()) {
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        const double want = s.grads.data()[i];
        diff += std::pow(half.data()[i] / 1024.0 - want, 2);
        norm += want * want;
      }
    }
    return std::sqrt(diff / norm);
  };
  const double bf16_distance = distance(bf16), fp16_distance = distance(fp16);
  LOG(INFO) << "gradient distance to fp32: bf16 " << bf16_distance << ", fp16 " << fp16_distance
            << "; loss: bf16 " << bf16_stats.loss_sum / fp32.loss_sum - 1 << ", fp16 "
            << fp16_stats.loss_sum / fp32.loss_sum - 1;
  EXPECT_LT(bf16_distance, 2e-2);
  EXPECT_LT(fp16_distance, 4e-3);
  EXPECT_LT(fp16_distance, bf16_distance);
}

// A loss scale so large that the logits' gradient exceeds fp16's 65504 overflows in fp16,
// as on a GPU (the trainer's dynamic loss scaling then skips the step); bf16 and fp32 have
// the range for it.
TEST(GptModel, Fp16OverflowShowsAsNonFiniteGradients) {
  Trial s(Tiny());
  const Batch batch = RandomTokens(2, Tiny(), 9);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 10;
  fb.loss_scale = 1e9f;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    fb.precision = precision;
    s.Step(batch, fb);
    int64_t non_finite = 0;
    for (float g : s.grads.span()) non_finite += !std::isfinite(g);
    if (precision == Precision::kFloat16) {
      EXPECT_GT(non_finite, 0);
    } else {
      EXPECT_EQ(non_finite, 0) << static_cast<int>(precision);
    }
  }
}

// Under bf16/fp16 a micro-batch's gradient is produced (rounded) in the compute format and
// added to `grads` in fp32: accumulating B onto A's gradient gives exactly A's plus B's.
TEST(GptModel, HalfPrecisionAccumulatesRoundedGradientsInFp32) {
  Trial s(Tiny());
  const Batch a = RandomTokens(2, Tiny(), 1), b = RandomTokens(3, Tiny(), 2);
  for (Precision precision : {Precision::kBFloat16, Precision::kFloat16}) {
    ForwardBackwardOptions fb;
    fb.precision = precision;
    fb.loss_scale = 1024;
    state::FlatBuffer only_b(s.grads.size());
    s.Step(b, only_b, fb);
    s.Step(a, fb);
    const std::vector<float> only_a(s.grads.data(), s.grads.data() + s.grads.size());
    fb.accumulate = true;
    s.Step(b, fb);
    for (int64_t i = 0; i < s.grads.size(); ++i) {
      ASSERT_EQ(s.grads.data()[i], only_a[i] + only_b.data()[i]) << i;
    }
  }
}

// Evaluate runs ForwardBackward's forward: the same statistics bit for bit, in every
// precision, with and without checkpointing, with either attention form.
TEST(GptModel, EvaluateMatchesForwardBackwardStats) {
  const Batch batch = RandomTokens(4, Tiny(), 10);
  for (int64_t every : {0, 1}) {
    for (bool efficient : {true, false}) {
      GptOptions options = Tiny();
      options.checkpoint_every = every;
      options.memory_efficient_attention = efficient;
      Trial s(options);
      s.Roughen(10);
      for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
        ForwardBackwardOptions fb;
        fb.precision = precision;
        const StepStats trained = s.Step(batch, fb);
        const absl::StatusOr<StepStats> evaluated = s.model->Evaluate(batch, s.params, precision);
        ASSERT_TRUE(evaluated.ok()) << evaluated.status();
        EXPECT_EQ(evaluated->loss_sum, trained.loss_sum);
        EXPECT_EQ(evaluated->correct, trained.correct);
        EXPECT_EQ(evaluated->loss_terms, 4 * 5);
        EXPECT_GT(trained.loss_sum, 0);
      }
    }
  }
}

// StepStats.correct counts the positions whose highest logit is the target. With lnf's gain
// 0 and bias 1 its output is all ones; with the head zero but for token 3's row, token 3 has
// the only positive logit everywhere.
TEST(GptModel, CorrectCountsTargetsThatGetTheHighestLogit) {
  Trial s(Tiny());
  const state::TensorTable& table = s.model->table();
  auto fill = [&](const char* name, float value) {
    absl::Span<float> v = s.params.tensor(table.tensor(*table.Find(name)));
    std::fill(v.begin(), v.end(), value);
    return v;
  };
  fill("lnf.weight", 0);
  fill("lnf.bias", 1);
  std::fill_n(fill("lm_head.weight", 0).begin() + 3 * 8, 8, 0.5f);
  const Batch batch = RandomTokens(4, Tiny(), 11);
  int64_t threes = 0;
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t t = 1; t <= 5; ++t) threes += batch.tokens[b * 6 + t] == 3;
  }
  ASSERT_GT(threes, 0);
  const absl::StatusOr<StepStats> stats = s.model->Evaluate(batch, s.params, Precision::kFloat32);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->correct, threes);
}

TEST(GptModel, RejectsBatchesThatDoNotFit) {
  Trial s(Tiny());
  const Batch good = RandomTokens(3, Tiny(), 12);
  ForwardBackwardOptions fb;
  auto error = [&](const Batch& b) {
    absl::StatusOr<StepStats> st = s.model->ForwardBackward(b, s.params, s.grads, fb);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.model->Evaluate(b, s.params, Precision::kFloat32).status(), st.status());
    return std::string(st.status().message());
  };
  Batch b = good;
  b.size = 0;
  EXPECT_THAT(error(b), HasSubstr("batch.size"));
  b = good;
  b.size = 4;
  EXPECT_THAT(error(b), HasSubstr("batch.tokens"));
  b = good;
  b.context = 4;
  EXPECT_THAT(error(b), HasSubstr("batch.context"));
  b = good;
  b.tokens.pop_back();
  EXPECT_THAT(error(b), HasSubstr("batch.tokens"));
  b = good;
  b.tokens[7] = 11;  // vocabulary 11
  EXPECT_THAT(error(b), HasSubstr("batch.tokens[7]"));
  b.tokens[7] = -1;
  EXPECT_THAT(error(b), HasSubstr("batch.tokens[7]"));
  b = good;
  b.tokens.back() = 11;  // a target only
  EXPECT_THAT(error(b), HasSubstr("batch.tokens[17]"));

  fb.loss_divisor = 0;
  absl::StatusOr<StepStats> st = s.model->ForwardBackward(good, s.params, s.grads, fb);
  EXPECT_THAT(st.status().message(), HasSubstr("options.loss_divisor"));
  fb.loss_divisor = 1;
  fb.loss_scale = NAN;
  st = s.model->ForwardBackward(good, s.params, s.grads, fb);
  EXPECT_THAT(st.status().message(), HasSubstr("options.loss_scale"));
}

// Activation buffers grow to the largest batch and are then reused: steady-state steps,
// smaller batches and evaluations allocate nothing, and a smaller batch after a larger one
// gives what a fresh model gives. A larger batch grows them.
TEST(GptModel, SmallerBatchesWorkAndSteadyStateStepsAllocateNothing) {
  GptOptions options = Tiny();
  options.checkpoint_every = 1;
  Trial s(options), fresh(options);
  const Batch big = RandomTokens(6, options, 13), small = RandomTokens(2, options, 14);
  ForwardBackwardOptions fp32, bf16, fp16;
  bf16.precision = Precision::kBFloat16;
  fp16.precision = Precision::kFloat16;
  fp16.accumulate = true;
  int64_t announced = 0;
  fp32.on_grads_ready = [&announced](int64_t) { ++announced; };
  for (const ForwardBackwardOptions* o : {&fp32, &bf16, &fp16}) s.Step(big, *o);
  const int64_t peak = s.model->memory().activation_bytes_peak;
  EXPECT_GT(peak, 0);

  allocations = 0;
  counting = true;
  for (const ForwardBackwardOptions* o : {&fp32, &bf16, &fp16}) {
    s.Step(big, *o);
    s.Step(small, *o);
  }
  const bool evaluated = s.model->Evaluate(big, s.params, Precision::kFloat16).ok();
  counting = false;
  EXPECT_TRUE(evaluated);
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(s.model->memory().activation_bytes_peak, peak);
  EXPECT_GT(announced, 0);

  const StepStats after_big = s.Step(small, {});
  const StepStats first = fresh.Step(small, {});
  EXPECT_EQ(after_big.loss_sum, first.loss_sum);
  EXPECT_TRUE(SameBits(s.grads, fresh.grads));
  EXPECT_LT(fresh.model->memory().activation_bytes_peak, peak);

  s.Step(RandomTokens(7, options, 15), {});
  EXPECT_GT(s.model->memory().activation_bytes_peak, peak);
}

// Plain SGD (params -= 0.5 · grads) on one fixed batch of 4 x 8 tokens: the model memorises
// it, the mean loss falling from ln(11) = 2.4 to under a tenth of that within 100 steps
// (measured: 0.065, 31 of 32 tokens predicted).
TEST(GptModel, SgdOverfitsAFixedBatch) {
  const GptOptions options{.layers = 2, .heads = 2, .width = 16, .context = 8, .vocab = 11};
  Trial s(options);
  const Batch batch = RandomTokens(4, options, 16);
  ForwardBackwardOptions fb;
  fb.loss_divisor = 4 * 8;
  const StepStats first = s.Step(batch, fb);
  StepStats last;
  for (int step = 0; step < 100; ++step) {
    for (int64_t i = 0; i < s.params.size(); ++i) s.params.data()[i] -= 0.5f * s.grads.data()[i];
    last = s.Step(batch, fb);
  }
  LOG(INFO) << "mean loss " << first.loss_sum / 32 << " -> " << last.loss_sum / 32 << ", correct "
            << last.correct << " of 32";
  EXPECT_NEAR(first.loss_sum / 32, std::log(11.0), 0.02);
  EXPECT_LT(last.loss_sum, 0.1 * first.loss_sum);
  EXPECT_GE(last.correct, 28);
}

}  // namespace
}  // namespace ringmaster::train::nn
