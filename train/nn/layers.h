// Layers with explicit forward and backward over flat buffers (ARCHITECTURE.md, llm.c
// style), the building blocks of the classifiers in train/nn/classifiers.h.
//
// A layer is built against the model's TensorTable and appends its parameter tensors to it
// (forward order). It reads parameters as `params + offset` from a flat buffer laid out by
// that table, and works on activations of `n` samples stored row-major, one sample after
// another ([n, input_size] in, [n, output_size] out; images are NCHW, so flattening is
// free). Buffers are owned by the caller, except what a layer keeps between its forward and
// its backward (e.g. max-pool's argmax), which it owns, grows once per larger batch and
// reports in scratch_bytes().
//
// Backward is split in two so that the caller can announce the parameter gradients as soon
// as they are final (train/model.h's on_grads_ready), before computing the input gradient.
// Computation is fp32; mixed-precision rounding is the caller's business. Not thread-safe.
#ifndef RINGMASTER_TRAIN_NN_LAYERS_H_
#define RINGMASTER_TRAIN_NN_LAYERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/matmul.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/grow_buffer.h"

namespace ringmaster::train::nn {

// A parameter tensor a layer added to the table, and its initial distribution.
struct Parameter {
  int64_t offset = 0;  // in the flat buffers
  int64_t numel = 0;
  int table_index = 0;
  float init_bound = 0;  // initialised uniformly in [-init_bound, init_bound)
};

// Whether a layer's forward may write its output over its input (and its backward the
// input gradient over the output gradient).
enum class Aliasing { kSeparate, kInPlace };

class Layer {
 public:
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual std::string Describe() const = 0;  // e.g. "linear 784->512"

  // Floats per sample.
  int64_t input_size() const { return input_size_; }
  int64_t output_size() const { return output_size_; }
  Aliasing aliasing() const { return aliasing_; }
  // In the order added; contiguous in the table (increasing offsets).
  const std::vector<Parameter>& parameters() const { return parameters_; }

  // y = layer(x) for n samples. y may be x only for Aliasing::kInPlace.
  virtual void Forward(const float* params, const float* x, float* y, int64_t n) = 0;

  // Writes (mode kOverwrite) or adds (kAccumulate) the gradients of the parameters, one
  // pointer per parameters() entry, given the forward input x and the output gradient dy.
  // Layers without parameters do nothing.
  virtual void BackwardParams(const float* x, const float* dy, int64_t n,
                              absl::Span<float* const> grads, kernels::OutputMode mode) {}

  // dx = the input gradient, given the forward's input x, output y (the same buffer after an
  // in-place forward) and the output gradient dy. Overwrites dx; dx may be dy only for
  // Aliasing::kInPlace.
  virtual void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                             float* dx, int64_t n) = 0;

  // Bytes of the buffers the layer owns.
  virtual int64_t scratch_bytes() const { return 0; }

 protected:
  Layer(int64_t input_size, int64_t output_size, Aliasing aliasing)
      : input_size_(input_size), output_size_(output_size), aliasing_(aliasing) {}

  // Adds "<name>" to `table` and returns its offset.
  int64_t AddParameter(state::TensorTable& table, absl::string_view name,
                       std::vector<int64_t> shape, float init_bound);

 private:
  int64_t input_size_;
  int64_t output_size_;
  Aliasing aliasing_;
  std::vector<Parameter> parameters_;
};

// y = x · weightᵀ + bias, weight [out, in] ("<name>.weight") and bias [out] ("<name>.bias"),
// both initialised like PyTorch's nn.Linear: uniform in ±1/sqrt(in).
class Linear final : public Layer {
 public:
  Linear(state::TensorTable& table, absl::string_view name, int64_t in, int64_t out);
  std::string Describe() const override;
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardParams(const float* x, const float* dy, int64_t n, absl::Span<float* const> grads,
                      kernels::OutputMode mode) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;

 private:
  int64_t weight_;
  int64_t bias_;
};

// y = max(x, 0), in place.
class Relu final : public Layer {
 public:
  explicit Relu(int64_t size) : Layer(size, size, Aliasing::kInPlace) {}
  std::string Describe() const override { return "relu"; }
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
};

// Stride-1 "same" 2-D convolution of [in_channels, height, width] images:
// weight [out, in, k, k] ("<name>.weight") and bias [out] ("<name>.bias"), initialised like
// PyTorch's nn.Conv2d: uniform in ±1/sqrt(in·k·k). Owns one image's im2col scratch.
class Conv2d final : public Layer {
 public:
  // kernel_size odd.
  Conv2d(state::TensorTable& table, absl::string_view name, int64_t in_channels,
         int64_t out_channels, int64_t height, int64_t width, int64_t kernel_size);
  std::string Describe() const override;
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardParams(const float* x, const float* dy, int64_t n, absl::Span<float* const> grads,
                      kernels::OutputMode mode) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
  int64_t scratch_bytes() const override { return scratch_.bytes(); }
  // The geometry for `n` images (what the CUDA twin, train/nn/sequential_cuda, runs).
  kernels::Conv2dShape Shape(int64_t n) const;

 private:
  kernels::Conv2dShape shape_;  // batch filled in per call
  int64_t weight_;
  int64_t bias_;
  GrowBuffer<float> scratch_;
};

// Max over 2x2 windows of [channels, height, width] images (stride 2; an odd last row or
// column is dropped). Keeps each output's argmax for the backward.
class MaxPool2d final : public Layer {
 public:
  MaxPool2d(int64_t channels, int64_t height, int64_t width);
  std::string Describe() const override { return "maxpool 2x2"; }
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
  int64_t scratch_bytes() const override { return argmax_.bytes(); }
  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }

 private:
  int64_t channels_;
  int64_t height_;
  int64_t width_;
  GrowBuffer<int32_t> argmax_;
};

// Sums values over the data-parallel replicas (ForwardBackwardOptions::sum_across_replicas);
// empty: one rank.
using ReplicaSum = std::function<absl::Status(absl::Span<double> values)>;

// A convolution of [in_channels, height, width] images with any stride and zero padding and
// no bias: weight [out, in, k, k] ("<name>.weight"), uniform in ±1/sqrt(in·k·k). Owns its
// im2col scratch. Runs on kernels::BlasThreads() threads (the rank's compute threads), each
// taking whole chunks of images (kernels/conv.h).
class StridedConv2d final : public Layer {
 public:
  StridedConv2d(state::TensorTable& table, absl::string_view name, int64_t in_channels,
                int64_t out_channels, int64_t height, int64_t width, int64_t kernel_size,
                int64_t stride, int64_t padding);
  std::string Describe() const override;  // "conv 64->128 3x3/2 on 32x32"
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardParams(const float* x, const float* dy, int64_t n, absl::Span<float* const> grads,
                      kernels::OutputMode mode) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
  // BackwardParams, then BackwardInput unless dx is null, in one call: Winograd transforms
  // the output gradient once for both (kernels::StridedConv2dBackward).
  void Backward(const float* params, const float* x, const float* dy, int64_t n,
                absl::Span<float* const> grads, kernels::OutputMode mode, float* dx);
  // Runs in `shared` rather than a scratch of its own: a model whose convolutions run one at
  // a time gives them one (as large as the largest needs) instead of one each. `shared`
  // outlives the layer; scratch_bytes() then counts the prepared weights only.
  void ShareScratch(GrowBuffer<float>* shared) { scratch_ = shared; }
  int64_t scratch_bytes() const override {
    return (scratch_ == &own_scratch_ ? own_scratch_.bytes() : 0) + prepared_.bytes();
  }
  kernels::StridedConv2dShape Shape(int64_t n) const;

 private:
  kernels::StridedConv2dShape shape_;  // batch filled in per call
  int64_t weight_;
  GrowBuffer<float> own_scratch_;
  GrowBuffer<float>* scratch_ = &own_scratch_;  // the calls' scratch: own_scratch_ or shared
  // The weights as the last Forward prepared them (kernels::StridedConv2dPrepareWeights), for
  // the input gradient of the same parameters; `prepared_for_` the weights they came from
  // (null: none yet).
  GrowBuffer<float> prepared_;
  const float* prepared_for_ = nullptr;
  // prepared_ if it was prepared from `weight`, else null.
  const float* PreparedFor(const float* weight);
};

// Mean over each channel's positions: [channels, positions] -> [channels].
class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool(int64_t channels, int64_t positions)
      : Layer(channels * positions, channels, Aliasing::kSeparate), positions_(positions) {}
  std::string Describe() const override { return "global average pool"; }
  void Forward(const float* params, const float* x, float* y, int64_t n) override;
  void BackwardInput(const float* params, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;

 private:
  int64_t positions_;
};

// BatchNorm2d over [channels, positions] maps: weight ("<name>.weight", 1) and bias
// ("<name>.bias", 0) added by the constructor; the running statistics
// ("<name>.running_mean", 0, and "<name>.running_var", 1) by AddRunningStatistics, which the
// model calls once every trained tensor is in the table. Keeps the statistics of its last
// training forward for the backward.
class BatchNorm2d {
 public:
  static constexpr double kMomentum = 0.1;
  static constexpr double kEps = 1e-5;

  BatchNorm2d(state::TensorTable& table, absl::string_view name, int64_t channels,
              int64_t positions);
  void AddRunningStatistics(state::TensorTable& table);

  int64_t channels() const { return channels_; }
  int64_t size() const { return channels_ * positions_; }  // floats per sample
  int weight_tensor() const { return weight_tensor_; }
  // Flat offsets of the tensors.
  int64_t weight_offset() const { return weight_; }
  int64_t bias_offset() const { return bias_; }
  int64_t running_mean_offset() const { return running_mean_; }
  int64_t running_var_offset() const { return running_var_; }

  // Training: y = the normalisation of x by its batch statistics (every replica's with
  // `sum`), then `then` (a residual added, a ReLU), and running_mean / running_var
  // (channels() floats each) moved towards the statistics. y may be x. Errors: `sum`'s;
  // INVALID_ARGUMENT when the statistics cover a single value per channel (the unbiased
  // variance needs two).
  absl::Status ForwardTrain(const float* params, const float* x, float* y, int64_t n,
                            const ReplicaSum& sum, float* running_mean, float* running_var,
                            const kernels::BatchNormEpilogue& then = {});
  // Evaluation: normalises by the running statistics in `params`, then `then`. y may be x.
  void ForwardEval(const float* params, const float* x, float* y, int64_t n,
                   const kernels::BatchNormEpilogue& then = {});
  // After ForwardTrain on x: the weight and bias gradients into dweight and dbias (written
  // or added, `mode`) and dx (overwritten; may be dy). Errors: `sum`'s.
  absl::Status Backward(const float* params, const float* x, const float* dy, float* dx, int64_t n,
                        const ReplicaSum& sum, float* dweight, float* dbias,
                        kernels::OutputMode mode);

 private:
  // Split over the rank's compute threads (kernels::BlasThreads()).
  kernels::BatchNormShape Shape(int64_t n) const;

  std::string name_;
  int64_t channels_;
  int64_t positions_;
  int weight_tensor_;
  int64_t weight_ = 0;
  int64_t bias_ = 0;
  int64_t running_mean_ = 0;
  int64_t running_var_ = 0;
  // The last training forward's statistics and count (every replica's with a sum).
  std::vector<float> mean_;
  std::vector<float> invstd_;
  double count_ = 0;
  std::vector<double> sums_;  // 2·channels + 1 doubles for the sums' collectives
};

// Softmax cross-entropy of logits [n, classes] against labels in [0, classes) (the caller
// validates them). Owns the per-sample loss and prediction arrays.
class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(int64_t classes) : classes_(classes) {}

  // loss_sum = Σ per-sample loss, loss_terms = n, correct = #(argmax == label).
  StepStats Forward(const float* logits, const int32_t* labels, int64_t n);
  // The same, and dlogits = d(scale · loss_sum)/d(logits) ([n, classes], overwritten).
  StepStats ForwardBackward(const float* logits, const int32_t* labels, int64_t n, float scale,
                            float* dlogits);

  int64_t classes() const { return classes_; }
  int64_t scratch_bytes() const { return loss_.bytes() + predicted_.bytes(); }

 private:
  StepStats Sum(const int32_t* labels, int64_t n);

  int64_t classes_;
  GrowBuffer<float> loss_;
  GrowBuffer<int32_t> predicted_;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_LAYERS_H_
