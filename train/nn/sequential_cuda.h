// SequentialCuda: the classifiers (train/nn/classifiers.h: the MLP and the CNN) on one CUDA
// GPU: each layer of a SequentialClassifier through its CUDA kernels (kernels/cuda: cuBLASLt
// products with the bias epilogue, ReLU, im2col convolution, 2x2 max-pooling, softmax
// cross-entropy), over the CPU model's parameter layout, with the activations in one device
// arena.
//
//   auto gpu = SequentialCuda::Create(*mlp, {.matmul = MatMulType::kFloat32}, stream);
//   gpu->ForwardBackward(batch, device_params, device_grads, options);
//
// Precisions: fp32, fp32 with TF32 products, and bf16 or fp16 with the CPU model's numerics
// (train/nn/sequential.h): the values are 16-bit, kept in fp32 storage and rounded where the
// CPU model rounds them (the parameters' compute copy, the input, each layer's output, the
// logits' gradient, each input gradient, each parameter gradient; kernels/cuda/elementwise.h
// RoundToHalf, bit for bit the CPU's rounding), and the products run on TF32 tensor cores,
// exact for such operands (bf16's 8 and fp16's 11 significant bits fit TF32's 11, and both
// exponent ranges fit; only bf16 values below fp32's normal range could be flushed), with
// fp32 sums. The classifiers are small: fp32 storage costs
// little, and keeps the fp32 kernels. Not thread-safe.
//
// A ParameterStore in device memory (ForwardBackwardOptions::store) gives the parameters and
// takes the gradients layer by layer, as in SequentialClassifier: Parameters(g) right before
// a layer's forward or input-gradient kernels are enqueued (the network's first layer makes no
// input gradient), BeginBackward after forward, and for each layer with parameters from the
// last: Gradients(g) (its weight and bias zeroed there, then the gradient kernels add into
// them), its input-gradient kernels, GradientsDone(g). Each call comes once the work before
// it has been ENQUEUED on stream(), not run: the store orders its own work with the stream by
// CUDA events, as train/nn/gpt_cuda.h says. In bf16 and fp16 the store gives fp32 values
// (master values, or already 16-bit values, which rounding leaves alone), rounded by the model
// into its copy of the parameters where a layer reads them, as without a store: so a store
// holding the master values gives the losses and gradients of the call without one, bit for
// bit.
#ifndef RINGMASTER_TRAIN_NN_SEQUENTIAL_CUDA_H_
#define RINGMASTER_TRAIN_NN_SEQUENTIAL_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/conv.h"
#include "kernels/cuda/matmul.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/device_arena.h"
#include "train/nn/sequential.h"

namespace ringmaster::train::nn {

struct SequentialCudaOptions {
  // kFloat32, kTensorFloat32, or kBFloat16 / kFloat16: 16-bit values (in fp32 storage, see
  // above) with TF32 products.
  kernels::cuda::MatMulType matmul = kernels::cuda::MatMulType::kFloat32;
};

class SequentialCuda {
 public:
  // Copies the model's layer geometry and parameter offsets (the model need not outlive
  // this). UNIMPLEMENTED for a layer without a CUDA twin (says which).
  static absl::StatusOr<std::unique_ptr<SequentialCuda>> Create(
      const SequentialClassifier& model, const SequentialCudaOptions& options, cudaStream_t stream);
  SequentialCuda(const SequentialCuda&) = delete;
  SequentialCuda& operator=(const SequentialCuda&) = delete;

  // As SequentialClassifier::ForwardBackward (the same batch checks, errors naming the field),
  // with `params` and `grads` device pointers of at least the model's total_elements() floats.
  // Without options.accumulate the gradients are overwritten, the padding between tensors
  // included (it becomes 0). options.precision must be precision() (INVALID_ARGUMENT).
  // on_grads_ready is called as the CPU model calls it (each layer with parameters, from the
  // last, with its first tensor's offset; the first with 0) once the layer's gradient kernels
  // are ENQUEUED on the stream, not run (see GptCuda::ForwardBackward).
  // With options.store (above) `params` and `grads` are not used (they may be null), and
  // options.accumulate is INVALID_ARGUMENT (the store sums micro-batches).
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const float* params, float* grads,
                                            const ForwardBackwardOptions& options);

  // Device bytes held for activations, labels and scratch (the largest batch so far), and in
  // 16-bit precisions the parameters' rounded copy and the staged gradients.
  int64_t activation_bytes() const { return arena_->bytes(); }

  // kFloat32 for fp32 and TF32, else kBFloat16 or kFloat16 (options.matmul).
  Precision precision() const { return precision_; }

  // The stream every kernel of the model goes to (a ParameterStore's events are recorded on it).
  cudaStream_t stream() const { return stream_; }

 private:
  enum class Kind { kLinear, kRelu, kConv, kPool };
  struct Step {
    Kind kind;
    int64_t in = 0, out = 0;       // floats per sample
    int64_t weight = 0, bias = 0;  // parameter offsets (kLinear, kConv)
    int64_t weight_numel = 0, bias_numel = 0;
    int group = -1;  // the model's parameter group (kLinear, kConv)
    kernels::Conv2dShape conv;                    // kConv; batch set per call
    int64_t channels = 0, height = 0, width = 0;  // kPool
    bool has_params() const { return kind == Kind::kLinear || kind == Kind::kConv; }
  };
  SequentialCuda() = default;
  absl::Status Reserve(int64_t batch);
  // The steps of ForwardBackward, on the stream: `params` are the compute parameters
  // (rounded to 16 bits when the precision is; unused with a store), `n` the batch's samples.
  absl::Status Forward(const float* params, ParameterStore* store, int64_t n);
  absl::Status Backward(const float* params, float* grads, int64_t n,
                        const ForwardBackwardOptions& options);
  // What step `s` (with parameters) reads: `params`, or the store's group, rounded into
  // compute_params_ in 16 bits.
  absl::StatusOr<const float*> StepParams(const Step& s, const float* params,
                                          ParameterStore* store);
  // Rounds `count` values of `x` to the precision's 16 bits in place; nothing in fp32.
  absl::Status Round(float* x, int64_t count);
  const float* Input(size_t i) const { return i == 0 ? input_ : outputs_[i - 1]; }

  std::vector<Step> steps_;
  std::string description_;
  int64_t input_size_ = 0;
  int64_t classes_ = 0;
  int64_t total_elements_ = 0;
  SequentialCudaOptions options_;
  Precision precision_ = Precision::kFloat32;
  kernels::cuda::MatMulType products_ = kernels::cuda::MatMulType::kFloat32;  // cuBLASLt's
  int64_t largest_parameter_span_ = 0;  // weight and bias of one layer
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kernels::cuda::MatMulEngine> engine_;

  // The activations, laid out for capacity_ samples.
  std::unique_ptr<DeviceArena> arena_;
  int64_t capacity_ = 0;
  float* input_ = nullptr;
  std::vector<float*> outputs_;  // per step; an in-place ReLU's is its input's
  float* grad_[2] = {nullptr, nullptr};
  int32_t* labels_ = nullptr;
  float* loss_ = nullptr;
  int32_t* predicted_ = nullptr;
  float* scratch_ = nullptr;         // the largest convolution's, and the bias gradients' partials
  float* compute_params_ = nullptr;  // 16-bit: the parameters rounded (total_elements_)
  float* staged_grads_ = nullptr;    // 16-bit: one layer's gradients before AddRoundedHalf
  std::vector<int32_t*> argmax_;     // per step (kPool)
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_SEQUENTIAL_CUDA_H_
