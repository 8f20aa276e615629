#include "train/nn/classifiers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <ostream>
#include <string>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/half.h"
#include "kernels/test_random.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/finite_difference.h"

// Counts heap allocations while `counting` is set, to check that a steady-state step makes
// none. Covers every replaceable operator new this program's code can reach.
namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

void* Allocate(size_t size, size_t align) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(size == 0 ? 1 : size)
                : std::aligned_alloc(align, (size + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(size_t size) { return Allocate(size, alignof(std::max_align_t)); }
void* operator new[](size_t size) { return Allocate(size, alignof(std::max_align_t)); }
void* operator new(size_t size, std::align_val_t a) {
  return Allocate(size, static_cast<size_t>(a));
}
void* operator new[](size_t size, std::align_val_t a) {
  return Allocate(size, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace ringmaster::train::nn {
namespace {

using ::testing::HasSubstr;

MlpOptions TinyMlp() { return {.inputs = 6, .hidden = {5, 4}, .classes = 3}; }

// 2x6x6 images -> conv 3 -> pool 3x3 -> conv 4 -> pool 1x1 -> fc 5 -> 3.
CnnOptions TinyCnn() {
  return {
      .channels = 2, .height = 6, .width = 6, .conv_channels = {3, 4}, .hidden = {5}, .classes = 3};
}

struct Case {
  std::string name;
  ModelOptions options;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> TinyModels() {
  return {{"mlp", {.kind = ModelKind::kMlp, .mlp = TinyMlp()}},
          {"cnn", {.kind = ModelKind::kCnn, .cnn = TinyCnn()}}};
}

std::unique_ptr<Model> Build(const ModelOptions& options) {
  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(options);
  CHECK(model.ok()) << model.status();
  return *std::move(model);
}

// n samples with features uniform in [0, 1) (like pixel intensities) and mixed labels.
Batch RandomBatch(int64_t n, int64_t feature_dim, int64_t classes, uint32_t seed) {
  Batch b;
  b.size = n;
  b.feature_dim = feature_dim;
  b.features = kernels::RandomFloats(n * feature_dim, seed, 0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    b.labels.push_back(static_cast<int32_t>((i * 7 + seed) % classes));
  }
  return b;
}

// Every element of `buffer` outside the table's tensors (alignment padding) equals `value`.
void ExpectPadding(const state::TensorTable& table, const state::FlatBuffer& buffer, float value) {
  std::vector<bool> in_tensor(table.total_elements(), false);
  for (const state::TensorSpec& t : table.tensors()) {
    std::fill(in_tensor.begin() + t.offset, in_tensor.begin() + t.offset + t.numel, true);
  }
  for (int64_t i = 0; i < buffer.size(); ++i) {
    if (!in_tensor[i]) {
      EXPECT_EQ(buffer.data()[i], value) << "padding at " << i;
    }
  }
}

Batch Slice(const Batch& b, int64_t begin, int64_t count) {
  Batch s;
  s.size = count;
  s.feature_dim = b.feature_dim;
  s.features.assign(b.features.begin() + begin * b.feature_dim,
                    b.features.begin() + (begin + count) * b.feature_dim);
  s.labels.assign(b.labels.begin() + begin, b.labels.begin() + begin + count);
  return s;
}

class ClassifierTest : public testing::TestWithParam<Case> {
 protected:
  ClassifierTest()
      : model_(Build(GetParam().options)),
        sequential_(dynamic_cast<SequentialClassifier&>(*model_)),
        params_(model_->table().total_elements()),
        grads_(model_->table().total_elements()) {
    model_->Init(11, params_);
  }

  Batch MakeBatch(int64_t n, uint32_t seed = 1) const {
    return RandomBatch(n, sequential_.input_size(), sequential_.classes(), seed);
  }

  StepStats Step(const Batch& batch, state::FlatBuffer& grads,
                 const ForwardBackwardOptions& options) {
    absl::StatusOr<StepStats> stats = model_->ForwardBackward(batch, params_, grads, options);
    CHECK(stats.ok()) << stats.status();
    return *stats;
  }

  std::unique_ptr<Model> model_;
  SequentialClassifier& sequential_;
  state::FlatBuffer params_;
  state::FlatBuffer grads_;
};

// Central differences of the batch's mean loss (Evaluate, fp32) against ForwardBackward's
// gradient with loss_divisor = batch size. Step h = 1e-3 on parameters of magnitude <= 1;
// tolerance 2e-3 · (1 + |g|): fp32 rounding of the loss (about 2e-7) contributes
// 2e-7 / 2h = 1e-4, truncation h²·|f'''| less. Where a step crosses a ReLU or max-pool
// switch the quotient means nothing: such a parameter is recognised by one-sided slopes
// that differ by more than the tolerance (for a smooth loss they differ by h·|f''| < 2e-4)
// and skipped; an undetected switch moves the quotient by less than the tolerance. At most
// 1 in 10 parameters may be skipped.
TEST_P(ClassifierTest, GradientsMatchFiniteDifferences) {
  constexpr float kStep = 1e-3f;
  constexpr double kTolerance = 2e-3;
  const Batch batch = MakeBatch(4);
  ForwardBackwardOptions options;
  options.loss_divisor = batch.size;
  Step(batch, grads_, options);
  auto mean_loss = [&] {
    return model_->Evaluate(batch, params_, Precision::kFloat32)->loss_sum / batch.size;
  };
  int checked = 0, skipped = 0;
  for (const state::TensorSpec& t : model_->table().tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) {
      const Slope slope = MeasureSlope(params_.data()[t.offset + i], kStep, kTolerance, mean_loss);
      if (!slope.smooth) {
        ++skipped;
        continue;
      }
      ++checked;
      const double analytic = grads_.data()[t.offset + i];
      EXPECT_TRUE(GradientClose(analytic, slope.central, kTolerance))
          << t.name << "[" << i << "]: " << analytic << " vs finite difference " << slope.central;
    }
  }
  EXPECT_LE(skipped * 10, checked + skipped) << skipped << " of " << checked + skipped;
}

// The loss convention: two halves of a batch, each with loss_divisor = the full count and
// the second accumulating, give the full batch's gradient (up to fp32 summation order).
TEST_P(ClassifierTest, HalfBatchesAccumulateToTheFullBatchGradient) {
  const Batch batch = MakeBatch(8);
  ForwardBackwardOptions options;
  options.loss_divisor = 8;
  const StepStats full = Step(batch, grads_, options);

  state::FlatBuffer halves(grads_.size());
  for (float& g : halves.span()) g = 1234.0f;  // overwritten in tensors, kept in padding
  const StepStats a = Step(Slice(batch, 0, 4), halves, options);
  options.accumulate = true;
  const StepStats b = Step(Slice(batch, 4, 4), halves, options);

  EXPECT_NEAR(a.loss_sum + b.loss_sum, full.loss_sum, 1e-5);
  EXPECT_EQ(a.correct + b.correct, full.correct);
  EXPECT_EQ(a.loss_terms + b.loss_terms, 8);
  for (const state::TensorSpec& t : model_->table().tensors()) {
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      EXPECT_NEAR(halves.data()[i], grads_.data()[i], 1e-6 + 1e-5 * std::abs(grads_.data()[i]))
          << t.name << "[" << i - t.offset << "]";
    }
  }
  ExpectPadding(model_->table(), halves, 1234.0f);
}

// Under bf16/fp16 a micro-batch's gradient is produced (rounded) in the compute format and
// added to `grads` in fp32: accumulating B onto A's gradient gives exactly A's plus B's.
TEST_P(ClassifierTest, HalfPrecisionAccumulatesRoundedGradientsInFp32) {
  const Batch a = MakeBatch(4, 1), b = MakeBatch(4, 2);
  for (Precision precision : {Precision::kBFloat16, Precision::kFloat16}) {
    ForwardBackwardOptions options;
    options.precision = precision;
    state::FlatBuffer only_b(grads_.size());
    Step(b, only_b, options);
    Step(a, grads_, options);
    const std::vector<float> only_a(grads_.data(), grads_.data() + grads_.size());
    options.accumulate = true;
    Step(b, grads_, options);
    for (int64_t i = 0; i < grads_.size(); ++i) {
      ASSERT_EQ(grads_.data()[i], only_a[i] + only_b.data()[i]) << i;
    }
  }
}

// L = loss_scale · Σ loss / loss_divisor. With powers of two every product scales exactly.
TEST_P(ClassifierTest, LossScaleAndDivisorScaleTheGradient) {
  const Batch batch = MakeBatch(6);
  ForwardBackwardOptions options;
  options.loss_divisor = 4;
  const StepStats plain = Step(batch, grads_, options);
  state::FlatBuffer scaled(grads_.size());
  options.loss_scale = 1024;
  options.loss_divisor = 2;
  const StepStats stats = Step(batch, scaled, options);
  EXPECT_EQ(stats.loss_sum, plain.loss_sum);  // unscaled
  for (int64_t i = 0; i < grads_.size(); ++i) {
    ASSERT_EQ(scaled.data()[i], 2048 * grads_.data()[i]) << i;
  }
}

TEST_P(ClassifierTest, EvaluateMatchesForwardBackwardStats) {
  const Batch batch = MakeBatch(16);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    ForwardBackwardOptions options;
    options.precision = precision;
    const StepStats trained = Step(batch, grads_, options);
    const absl::StatusOr<StepStats> evaluated = model_->Evaluate(batch, params_, precision);
    ASSERT_TRUE(evaluated.ok()) << evaluated.status();
    EXPECT_EQ(evaluated->loss_sum, trained.loss_sum);
    EXPECT_EQ(evaluated->correct, trained.correct);
    EXPECT_EQ(evaluated->loss_terms, 16);
    EXPECT_GT(trained.loss_sum, 0);
  }
}

// on_grads_ready: one call per layer with parameters, at its first tensor's offset, in
// decreasing order, the last with 0; and what each call announces is already final.
TEST_P(ClassifierTest, GradsReadyAnnouncesFinalRangesInDecreasingOrder) {
  const Batch batch = MakeBatch(5);
  std::vector<int64_t> want_offsets;  // the weight of each parameterised layer, last first
  for (const auto& layer : sequential_.layers()) {
    if (!layer->parameters().empty()) {
      want_offsets.insert(want_offsets.begin(), layer->parameters().front().offset);
    }
  }
  ASSERT_EQ(want_offsets.back(), 0);
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "precision " << static_cast<int>(precision) << " accumulate " << accumulate);
      for (float& g : grads_.span()) g = 0.5f;  // what accumulate adds to
      std::vector<int64_t> offsets;
      std::vector<std::vector<float>> snapshots;
      ForwardBackwardOptions options;
      options.precision = precision;
      options.accumulate = accumulate;
      options.on_grads_ready = [&](int64_t offset) {
        offsets.push_back(offset);
        snapshots.emplace_back(grads_.data() + offset, grads_.data() + grads_.size());
      };
      Step(batch, grads_, options);
      EXPECT_EQ(offsets, want_offsets);
      for (size_t k = 0; k < offsets.size(); ++k) {
        const std::vector<float> final_values(grads_.data() + offsets[k],
                                              grads_.data() + grads_.size());
        EXPECT_EQ(snapshots[k], final_values) << "announced at " << offsets[k];
      }
    }
  }
}

// Gradients in bf16 and fp16 against fp32, as the relative L2 distance of the whole
// gradient vector (and of the loss). Unit roundoff: bf16 2^-8 = 3.9e-3, fp16 2^-11 =
// 4.9e-4; through a few layers most tensors land near one unit (fp16: 2e-4 to 6e-4).
// What dominates the distance is discrete: a ReLU input or a max-pool window's top two
// inputs that rounding flips or ties (tiny CNN, fp16: conv1.weight is off by 3e-2, every
// other tensor by < 7e-4; bf16 8.7e-3 overall). Bounds: bf16 3e-2, fp16 1.5e-2, and fp16
// closer than bf16; losses 1e-2 and 2e-3. The gradients are computed with loss_scale 1024,
// as fp16 training does, so that small ones stay out of fp16's subnormal range.
TEST_P(ClassifierTest, ReducedPrecisionIsCloseToFp32AndRoundsEveryGradient) {
  const Batch batch = MakeBatch(16);
  ForwardBackwardOptions options;
  options.loss_divisor = 16;
  const StepStats fp32 = Step(batch, grads_, options);
  struct Format {
    Precision precision;
    double gradient_tolerance;
    double loss_tolerance;
    float (*round)(float);
  };
  const Format formats[] = {
      {Precision::kBFloat16, 3e-2, 1e-2,
       [](float x) { return kernels::BFloat16ToFloat(kernels::FloatToBFloat16(x)); }},
      {Precision::kFloat16, 1.5e-2, 2e-3,
       [](float x) { return kernels::Float16ToFloat(kernels::FloatToFloat16(x)); }},
  };
  std::vector<double> distances;
  for (const Format& f : formats) {
    SCOPED_TRACE(static_cast<int>(f.precision));
    options.precision = f.precision;
    options.loss_scale = 1024;
    state::FlatBuffer half(grads_.size());
    const StepStats stats = Step(batch, half, options);
    EXPECT_NEAR(stats.loss_sum, fp32.loss_sum, f.loss_tolerance * fp32.loss_sum);
    double diff = 0, norm = 0;
    int64_t fp32_representable = 0;
    for (const state::TensorSpec& t : model_->table().tensors()) {
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        const float scaled = half.data()[i], g = scaled / 1024, want = grads_.data()[i];
        ASSERT_EQ(f.round(scaled), scaled) << t.name << " is not in the compute format";
        diff += (double{g} - want) * (double{g} - want);
        norm += double{want} * want;
        fp32_representable += f.round(want) == want;
      }
    }
    distances.push_back(std::sqrt(diff / norm));
    EXPECT_LT(distances.back(), f.gradient_tolerance);
    // The representability check above can fail: most fp32 gradients are not.
    EXPECT_LT(fp32_representable * 2, model_->table().parameter_count());
  }
  EXPECT_LT(distances[1], distances[0]);
}

// A loss scale so large that the logits' gradient exceeds fp16's 65504 overflows in fp16,
// as on a GPU (the trainer's dynamic loss scaling then skips the step); bf16 and fp32
// have the range for it.
TEST_P(ClassifierTest, Fp16OverflowShowsAsNonFiniteGradients) {
  const Batch batch = MakeBatch(8);
  ForwardBackwardOptions options;
  options.loss_divisor = 8;
  options.loss_scale = 1e9f;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    options.precision = precision;
    Step(batch, grads_, options);
    int64_t non_finite = 0;
    for (float g : grads_.span()) non_finite += !std::isfinite(g);
    if (precision == Precision::kFloat16) {
      EXPECT_GT(non_finite, 0);
    } else {
      EXPECT_EQ(non_finite, 0) << static_cast<int>(precision);
    }
  }
}

TEST_P(ClassifierTest, InitIsDeterministicBoundedAndSeedDependent) {
  state::FlatBuffer again(params_.size()), other(params_.size());
  for (float& v : again.span()) v = 7.0f;  // padding is zeroed
  model_->Init(11, again);
  model_->Init(12, other);
  EXPECT_EQ(std::memcmp(again.data(), params_.data(), params_.bytes()), 0);
  EXPECT_NE(std::memcmp(other.data(), params_.data(), params_.bytes()), 0);
  for (const auto& layer : sequential_.layers()) {
    for (const Parameter& p : layer->parameters()) {
      const state::TensorSpec& t = model_->table().tensor(p.table_index);
      // PyTorch's default: ±1/sqrt(fan_in), fan_in = the weight's elements per output.
      const int64_t fan_in = model_->table().tensor(layer->parameters()[0].table_index).numel /
                             model_->table().tensor(layer->parameters()[0].table_index).shape[0];
      EXPECT_FLOAT_EQ(p.init_bound, 1 / std::sqrt(static_cast<float>(fan_in))) << t.name;
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        ASSERT_LE(std::abs(params_.data()[i]), p.init_bound) << t.name;
      }
    }
  }
  ExpectPadding(model_->table(), again, 0.0f);
}

TEST_P(ClassifierTest, RejectsBatchesThatDoNotFit) {
  const Batch good = MakeBatch(4);
  ForwardBackwardOptions options;
  auto error = [&](const Batch& b) {
    absl::StatusOr<StepStats> s = model_->ForwardBackward(b, params_, grads_, options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(model_->Evaluate(b, params_, Precision::kFloat32).status(), s.status());
    return std::string(s.status().message());
  };
  Batch b = good;
  b.size = 0;
  EXPECT_THAT(error(b), HasSubstr("batch.size"));
  b = good;
  b.feature_dim += 1;
  EXPECT_THAT(error(b), HasSubstr("batch.feature_dim"));
  b = good;
  b.features.pop_back();
  EXPECT_THAT(error(b), HasSubstr("batch.features"));
  b = good;
  b.labels.pop_back();
  EXPECT_THAT(error(b), HasSubstr("batch.labels"));
  b = good;
  b.labels[2] = static_cast<int32_t>(sequential_.classes());
  EXPECT_THAT(error(b), HasSubstr("batch.labels[2]"));
  b.labels[2] = -1;
  EXPECT_THAT(error(b), HasSubstr("batch.labels[2]"));

  options.loss_divisor = 0;
  absl::StatusOr<StepStats> s = model_->ForwardBackward(good, params_, grads_, options);
  EXPECT_THAT(s.status().message(), HasSubstr("options.loss_divisor"));
  options.loss_divisor = 1;
  options.loss_scale = INFINITY;
  s = model_->ForwardBackward(good, params_, grads_, options);
  EXPECT_THAT(s.status().message(), HasSubstr("options.loss_scale"));
}

// Activation buffers grow to the largest batch and are then reused: steady-state steps,
// evaluations and smaller batches allocate nothing.
TEST_P(ClassifierTest, SteadyStateStepsAllocateNothing) {
  const Batch big = MakeBatch(12), small = MakeBatch(5);
  ForwardBackwardOptions fp32, bf16, fp16;
  bf16.precision = Precision::kBFloat16;
  fp16.precision = Precision::kFloat16;
  fp16.accumulate = true;
  int64_t announced = 0;
  fp32.on_grads_ready = [&announced](int64_t) { ++announced; };
  for (const ForwardBackwardOptions* o : {&fp32, &bf16, &fp16}) Step(big, grads_, *o);
  const int64_t peak = model_->memory().activation_bytes_peak;
  EXPECT_GT(peak, 0);

  allocations = 0;
  counting = true;
  for (const ForwardBackwardOptions* o : {&fp32, &bf16, &fp16}) {
    Step(big, grads_, *o);
    Step(small, grads_, *o);
  }
  const bool evaluated = model_->Evaluate(big, params_, Precision::kFloat16).ok();
  counting = false;
  EXPECT_TRUE(evaluated);
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(model_->memory().activation_bytes_peak, peak);
  EXPECT_GT(announced, 0);

  Step(MakeBatch(24), grads_, fp32);
  EXPECT_GT(model_->memory().activation_bytes_peak, peak);
}

// A few steps of plain SGD fit a small problem whose label is a pattern in the features.
TEST_P(ClassifierTest, SgdLearnsASeparableProblem) {
  const int64_t n = 48;
  Batch batch = MakeBatch(n, 3);
  for (int64_t i = 0; i < n; ++i) {
    float* x = batch.features.data() + i * batch.feature_dim;
    for (int64_t j = 0; j < batch.feature_dim; ++j) {
      x[j] = 0.3f * x[j] + (j % sequential_.classes() == batch.labels[i] ? 0.7f : 0.0f);
    }
  }
  ForwardBackwardOptions options;
  options.loss_divisor = n;
  const StepStats first = Step(batch, grads_, options);
  StepStats last;
  for (int step = 0; step < 300; ++step) {
    for (int64_t i = 0; i < params_.size(); ++i) params_.data()[i] -= 0.2f * grads_.data()[i];
    last = Step(batch, grads_, options);
  }
  EXPECT_LT(last.loss_sum, 0.2 * first.loss_sum);
  EXPECT_EQ(last.correct, n);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ClassifierTest, testing::ValuesIn(TinyModels()),
                         [](const testing::TestParamInfo<Case>& c) { return c.param.name; });

TEST(MlpClassifier, DefaultIsThe669706ParameterBenchmarkModel) {
  const std::unique_ptr<Model> model = Build({});
  EXPECT_EQ(model->Describe(), "mlp 784-512-512-10");
  EXPECT_EQ(model->table().parameter_count(), 669706);
  std::vector<std::string> names;
  for (const state::TensorSpec& t : model->table().tensors()) names.push_back(t.name);
  EXPECT_THAT(names, testing::ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                          "fc3.weight", "fc3.bias"));
  EXPECT_EQ(model->LossTermsPerSample(), 1);
}

TEST(MlpClassifier, InitFollowsTheSplitMix64ReferenceSequence) {
  const std::unique_ptr<Model> model = Build({});
  state::FlatBuffer params(model->table().total_elements());
  model->Init(0, params);
  // The first output of splitmix64 from seed 0, its top 24 bits as a fraction u in [0, 1),
  // mapped to (2u - 1) / sqrt(784).
  const float u = static_cast<float>(0xe220a8397b1dcdafu >> 40) * 0x1p-24f;
  EXPECT_EQ(params.data()[0], (2 * u - 1) * (1.0f / 28));
}

TEST(MlpClassifier, ActivationMemoryIsTheLayerOutputsGradientsAndLossArrays) {
  std::unique_ptr<Model> model = Build({.mlp = TinyMlp()});  // 6-5-4-3
  state::FlatBuffer params(model->table().total_elements()), grads(params.size());
  model->Init(1, params);
  const Batch batch = RandomBatch(8, 6, 3, 1);
  ASSERT_TRUE(model->ForwardBackward(batch, params, grads, {}).ok());
  // Outputs of fc1, fc2, fc3 (ReLU works in place): 8·(5 + 4 + 3); two gradient buffers of
  // the widest output: 2·8·5; per-sample loss and prediction: 8 + 8. Four bytes each.
  EXPECT_EQ(model->memory().activation_bytes_peak, 4 * (8 * 12 + 2 * 8 * 5 + 16));
}

TEST(CnnClassifier, DefaultIsTheSmallFashionMnistCnn) {
  const std::unique_ptr<Model> model = Build({.kind = ModelKind::kCnn});
  EXPECT_EQ(model->Describe(), "cnn 1x28x28 conv16-conv32 fc128-10");
  // conv1 16·9 + 16, conv2 32·16·9 + 32, fc1 (32·7·7)·128 + 128, fc2 128·10 + 10.
  EXPECT_EQ(model->table().parameter_count(), 160 + 4640 + 200832 + 1290);
  EXPECT_EQ(model->table().tensor(4).name, "fc1.weight");
  EXPECT_EQ(model->table().tensor(4).shape, (std::vector<int64_t>{128, 1568}));
}

TEST(CreateModel, RejectsBadOptionsNamingTheField) {
  auto message = [](const ModelOptions& o) {
    absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(o);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(model.status().message());
  };
  ModelOptions o;
  o.mlp.hidden = {512, 0};
  EXPECT_THAT(message(o), HasSubstr("mlp.hidden[1]"));
  o = {};
  o.mlp.classes = 1;
  EXPECT_THAT(message(o), HasSubstr("mlp.classes"));
  o = {.kind = ModelKind::kCnn};
  o.cnn.kernel_size = 4;
  EXPECT_THAT(message(o), HasSubstr("cnn.kernel_size"));
  o = {.kind = ModelKind::kCnn};
  o.cnn.width = 3;  // two pooling blocks need 4
  EXPECT_THAT(message(o), HasSubstr("cnn.width"));
  o = {.kind = ModelKind::kCnn};
  o.cnn.conv_channels = {8, -1};
  EXPECT_THAT(message(o), HasSubstr("cnn.conv_channels[1]"));
}

}  // namespace
}  // namespace ringmaster::train::nn
