#include "train/nn/layers.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"
#include "kernels/softmax_xent.h"

namespace ringmaster::train::nn {

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
