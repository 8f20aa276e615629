#include "train/nn/layers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/activation.h"
#include "kernels/softmax_xent.h"

namespace ringmaster::train::nn {
namespace {

using kernels::OutputMode;

void WriteOrAdd(const double* sums, float* out, int64_t n, OutputMode mode) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(sums[i]);
    out[i] = mode == OutputMode::kAccumulate ? out[i] + v : v;
  }
}

}  // namespace

int64_t Layer::AddParameter(state::TensorTable& table, absl::string_view name,
                            std::vector<int64_t> shape, float init_bound) {
  const int index = table.Add(name, std::move(shape));
  const state::TensorSpec& spec = table.tensor(index);
  parameters_.push_back({spec.offset, spec.numel, index, init_bound});
  return spec.offset;
}

Linear::Linear(state::TensorTable& table, absl::string_view name, int64_t in, int64_t out)
    : Layer(in, out, Aliasing::kSeparate) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  weight_ = AddParameter(table, absl::StrCat(name, ".weight"), {out, in}, bound);
  bias_ = AddParameter(table, absl::StrCat(name, ".bias"), {out}, bound);
}

std::string Linear::Describe() const {
  return absl::StrCat("linear ", input_size(), "->", output_size());
}

void Linear::Forward(const float* params, const float* x, float* y, int64_t n) {
  kernels::LinearForward(x, params + weight_, params + bias_, y, n, input_size(), output_size());
}

void Linear::BackwardParams(const float* x, const float* dy, int64_t n,
                            absl::Span<float* const> grads, kernels::OutputMode mode) {
  kernels::LinearBackwardWeights(x, dy, grads[0], grads[1], n, input_size(), output_size(), mode);
}

void Linear::BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                           float* dx, int64_t n) {
  kernels::LinearBackwardInput(dy, params + weight_, dx, n, input_size(), output_size());
}

void Relu::Forward(const float* params, const float* x, float* y, int64_t n) {
  kernels::ReluForward(x, y, n * input_size());
}

void Relu::BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                         float* dx, int64_t n) {
  kernels::ReluBackward(y, dy, dx, n * input_size());
}

Conv2d::Conv2d(state::TensorTable& table, absl::string_view name, int64_t in_channels,
               int64_t out_channels, int64_t height, int64_t width, int64_t kernel_size)
    : Layer(in_channels * height * width, out_channels * height * width, Aliasing::kSeparate),
      shape_{0, in_channels, out_channels, height, width, kernel_size} {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_channels * kernel_size * kernel_size));
  weight_ = AddParameter(table, absl::StrCat(name, ".weight"),
                         {out_channels, in_channels, kernel_size, kernel_size}, bound);
  bias_ = AddParameter(table, absl::StrCat(name, ".bias"), {out_channels}, bound);
  scratch_.Reserve(kernels::Conv2dScratchElements(shape_));
}

std::string Conv2d::Describe() const {
  return absl::StrCat("conv ", shape_.in_channels, "->", shape_.out_channels, " ",
                      shape_.kernel_size, "x", shape_.kernel_size, " on ", shape_.height, "x",
                      shape_.width);
}

kernels::Conv2dShape Conv2d::Shape(int64_t n) const {
  kernels::Conv2dShape shape = shape_;
  shape.batch = n;
  return shape;
}

void Conv2d::Forward(const float* params, const float* x, float* y, int64_t n) {
  kernels::Conv2dForward(Shape(n), x, params + weight_, params + bias_, y, scratch_.data());
}

void Conv2d::BackwardParams(const float* x, const float* dy, int64_t n,
                            absl::Span<float* const> grads, kernels::OutputMode mode) {
  kernels::Conv2dBackwardWeights(Shape(n), x, dy, grads[0], grads[1], mode, scratch_.data());
}

void Conv2d::BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                           float* dx, int64_t n) {
  kernels::Conv2dBackwardInput(Shape(n), params + weight_, dy, dx, scratch_.data());
}

MaxPool2d::MaxPool2d(int64_t channels, int64_t height, int64_t width)
    : Layer(channels * height * width, channels * (height / 2) * (width / 2), Aliasing::kSeparate),
      channels_(channels),
      height_(height),
      width_(width) {}

void MaxPool2d::Forward(const float* params, const float* x, float* y, int64_t n) {
  kernels::MaxPool2x2Forward(x, y, argmax_.Reserve(n * output_size()), n * channels_, height_,
                             width_);
}

void MaxPool2d::BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                              float* dx, int64_t n) {
  kernels::MaxPool2x2Backward(dy, argmax_.data(), dx, n * channels_, height_, width_);
}

StridedConv2d::StridedConv2d(state::TensorTable& table, absl::string_view name, int64_t in_channels,
                             int64_t out_channels, int64_t height, int64_t width,
                             int64_t kernel_size, int64_t stride, int64_t padding)
    : Layer(in_channels * height * width,
            out_channels * ((height + 2 * padding - kernel_size) / stride + 1) *
                ((width + 2 * padding - kernel_size) / stride + 1),
            Aliasing::kSeparate),
      shape_{0, in_channels, out_channels, height, width, kernel_size, stride, padding} {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_channels * kernel_size * kernel_size));
  weight_ = AddParameter(table, absl::StrCat(name, ".weight"),
                         {out_channels, in_channels, kernel_size, kernel_size}, bound);
}

std::string StridedConv2d::Describe() const {
  return absl::StrCat("conv ", shape_.in_channels, "->", shape_.out_channels, " ",
                      shape_.kernel_size, "x", shape_.kernel_size, "/", shape_.stride, " on ",
                      shape_.height, "x", shape_.width);
}

kernels::StridedConv2dShape StridedConv2d::Shape(int64_t n) const {
  kernels::StridedConv2dShape shape = shape_;
  shape.batch = n;
  shape.threads = kernels::BlasThreads();  // the rank's compute threads
  return shape;
}

void StridedConv2d::Forward(const float* params, const float* x, float* y, int64_t n) {
  const kernels::StridedConv2dShape s = Shape(n);
  const float* weight = params + weight_;
  float* prepared = nullptr;
  if (const int64_t elements = kernels::StridedConv2dPreparedWeightElements(s); elements > 0) {
    prepared = prepared_.Reserve(elements);
    kernels::StridedConv2dPrepareWeights(s, weight, prepared);
    prepared_for_ = weight;
  }
  kernels::StridedConv2dForward(s, x, weight, y,
                                scratch_->Reserve(kernels::StridedConv2dScratchElements(s)),
                                prepared);
}

void StridedConv2d::BackwardParams(const float* x, const float* dy, int64_t n,
                                   absl::Span<float* const> grads, kernels::OutputMode mode) {
  const kernels::StridedConv2dShape s = Shape(n);
  kernels::StridedConv2dBackwardWeights(s, x, dy, grads[0], mode,
                                        scratch_->Reserve(kernels::StridedConv2dScratchElements(s)));
}

void StridedConv2d::BackwardInput(const float* params, const float* x, const float* y,
                                  const float* dy, float* dx, int64_t n) {
  const kernels::StridedConv2dShape s = Shape(n);
  const float* weight = params + weight_;
  kernels::StridedConv2dBackwardInput(s, weight, dy, dx,
                                      scratch_->Reserve(kernels::StridedConv2dScratchElements(s)),
                                      PreparedFor(weight));
}

void StridedConv2d::Backward(const float* params, const float* x, const float* dy, int64_t n,
                             absl::Span<float* const> grads, kernels::OutputMode mode,
                             float* dx) {
  if (dx == nullptr) return BackwardParams(x, dy, n, grads, mode);
  const kernels::StridedConv2dShape s = Shape(n);
  const float* weight = params + weight_;
  kernels::StridedConv2dBackward(s, x, weight, dy, grads[0], mode, dx,
                                 scratch_->Reserve(kernels::StridedConv2dScratchElements(s)),
                                 PreparedFor(weight));
}

const float* StridedConv2d::PreparedFor(const float* weight) {
  // The backward follows its forward with the same parameters (as every layer's does), so
  // the forward's prepared weights are these; a call on other weights prepares its own.
  return prepared_for_ == weight ? prepared_.data() : nullptr;
}

void GlobalAvgPool::Forward(const float* params, const float* x, float* y, int64_t n) {
  kernels::GlobalAvgPoolForward(x, y, n * output_size(), positions_);
}

void GlobalAvgPool::BackwardInput(const float* params, const float* x, const float* y,
                                  const float* dy, float* dx, int64_t n) {
  kernels::GlobalAvgPoolBackward(dy, dx, n * output_size(), positions_);
}

BatchNorm2d::BatchNorm2d(state::TensorTable& table, absl::string_view name, int64_t channels,
                         int64_t positions)
    : name_(name),
      channels_(channels),
      positions_(positions),
      mean_(channels),
      invstd_(channels),
      sums_(2 * channels + 1) {
  weight_tensor_ = table.Add(absl::StrCat(name, ".weight"), {channels});
  weight_ = table.tensor(weight_tensor_).offset;
  bias_ = table.tensor(table.Add(absl::StrCat(name, ".bias"), {channels})).offset;
}

kernels::BatchNormShape BatchNorm2d::Shape(int64_t n) const {
  return {n, channels_, positions_, kernels::BlasThreads()};
}

void BatchNorm2d::AddRunningStatistics(state::TensorTable& table) {
  running_mean_ = table.tensor(table.Add(absl::StrCat(name_, ".running_mean"), {channels_})).offset;
  running_var_ = table.tensor(table.Add(absl::StrCat(name_, ".running_var"), {channels_})).offset;
}

absl::Status BatchNorm2d::ForwardTrain(const float* params, const float* x, float* y, int64_t n,
                                       const ReplicaSum& sum, float* running_mean,
                                       float* running_var,
                                       const kernels::BatchNormEpilogue& then) {
  const int64_t c = channels_;
  kernels::BatchNormChannelSums(Shape(n), x, sums_.data(), sums_.data() + c);
  sums_[2 * c] = static_cast<double>(n * positions_);
  if (sum) RM_RETURN_IF_ERROR(sum(absl::MakeSpan(sums_)));
  count_ = sums_[2 * c];
  if (count_ <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": BatchNorm in training needs more than 1 value per channel, got ",
                     count_, "; use a larger batch"));
  }
  for (int64_t i = 0; i < c; ++i) {
    const double mean = sums_[i] / count_;
    const double var = std::max(0.0, sums_[c + i] / count_ - mean * mean);
    mean_[i] = static_cast<float>(mean);
    invstd_[i] = static_cast<float>(1.0 / std::sqrt(var + kEps));
    running_mean[i] = static_cast<float>((1 - kMomentum) * running_mean[i] + kMomentum * mean);
    running_var[i] = static_cast<float>((1 - kMomentum) * running_var[i] +
                                        kMomentum * var * count_ / (count_ - 1));
  }
  kernels::BatchNormForward(Shape(n), x, mean_.data(), invstd_.data(), params + weight_,
                            params + bias_, y, then);
  return absl::OkStatus();
}

void BatchNorm2d::ForwardEval(const float* params, const float* x, float* y, int64_t n,
                              const kernels::BatchNormEpilogue& then) {
  for (int64_t i = 0; i < channels_; ++i) {
    mean_[i] = params[running_mean_ + i];
    invstd_[i] = static_cast<float>(1.0 / std::sqrt(double{params[running_var_ + i]} + kEps));
  }
  kernels::BatchNormForward(Shape(n), x, mean_.data(), invstd_.data(), params + weight_,
                            params + bias_, y, then);
}

absl::Status BatchNorm2d::Backward(const float* params, const float* x, const float* dy, float* dx,
                                   int64_t n, const ReplicaSum& sum, float* dweight, float* dbias,
                                   kernels::OutputMode mode) {
  const int64_t c = channels_;
  double* sum_dy = sums_.data();
  double* sum_dy_xhat = sums_.data() + c;
  kernels::BatchNormBackwardSums(Shape(n), x, dy, mean_.data(), invstd_.data(), sum_dy,
                                 sum_dy_xhat);
  // The parameters' gradients are this rank's (the gradient reduction sums them); the input
  // gradient needs the sums over every batch the statistics came from.
  WriteOrAdd(sum_dy_xhat, dweight, c, mode);
  WriteOrAdd(sum_dy, dbias, c, mode);
  if (sum) RM_RETURN_IF_ERROR(sum(absl::MakeSpan(sums_.data(), 2 * c)));
  kernels::BatchNormBackwardInput(Shape(n), x, dy, mean_.data(), invstd_.data(), params + weight_,
                                  sum_dy, sum_dy_xhat, count_, dx);
  return absl::OkStatus();
}

StepStats SoftmaxCrossEntropy::Forward(const float* logits, const int32_t* labels, int64_t n) {
  kernels::SoftmaxCrossEntropyForward(logits, labels, n, classes_, loss_.Reserve(n),
                                      predicted_.Reserve(n));
  return Sum(labels, n);
}

StepStats SoftmaxCrossEntropy::ForwardBackward(const float* logits, const int32_t* labels,
                                               int64_t n, float scale, float* dlogits) {
  kernels::SoftmaxCrossEntropyForwardBackward(logits, labels, n, classes_, scale, loss_.Reserve(n),
                                              predicted_.Reserve(n), dlogits);
  return Sum(labels, n);
}

StepStats SoftmaxCrossEntropy::Sum(const int32_t* labels, int64_t n) {
  StepStats stats;
  stats.loss_terms = n;
  const float* loss = loss_.data();
  const int32_t* predicted = predicted_.data();
  for (int64_t i = 0; i < n; ++i) {
    stats.loss_sum += loss[i];
    stats.correct += predicted[i] == labels[i];
  }
  return stats;
}

}  // namespace ringmaster::train::nn
