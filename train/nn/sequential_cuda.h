// SequentialCuda: the classifiers (train/nn/classifiers.h: the MLP and the CNN) on one CUDA
// GPU, in fp32 (or TF32 products): each layer of a SequentialClassifier through its CUDA
// kernels (kernels/cuda: cuBLASLt products with the bias epilogue, ReLU, im2col convolution,
// 2x2 max-pooling, softmax cross-entropy), over the CPU model's parameter layout, with the
// activations in one device arena.
//
//   auto gpu = SequentialCuda::Create(*mlp, {.matmul = MatMulType::kFloat32}, stream);
//   gpu->ForwardBackward(batch, device_params, device_grads, options);
//
// Not here: bf16/fp16 activations (UNIMPLEMENTED: those jobs train on the CPU, which
// emulates them). Not thread-safe.
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
  // kFloat32 or kTensorFloat32; a 16-bit type is UNIMPLEMENTED.
  kernels::cuda::MatMulType matmul = kernels::cuda::MatMulType::kFloat32;
};

class SequentialCuda {
 public:
  // Copies the model's layer geometry and parameter offsets (the model need not outlive
  // this). UNIMPLEMENTED for a 16-bit type or a layer without a CUDA twin (says which).
  static absl::StatusOr<std::unique_ptr<SequentialCuda>> Create(
      const SequentialClassifier& model, const SequentialCudaOptions& options,
      cudaStream_t stream);
  SequentialCuda(const SequentialCuda&) = delete;
  SequentialCuda& operator=(const SequentialCuda&) = delete;

  // As SequentialClassifier::ForwardBackward (the same batch checks, errors naming the field),
  // with `params` and `grads` device pointers of at least the model's total_elements() floats.
  // Without options.accumulate the gradients are overwritten, the padding between tensors
  // included (it becomes 0). options.precision must be kFloat32 (INVALID_ARGUMENT).
  // on_grads_ready is called as the CPU model calls it (each layer with parameters, from the
  // last, with its first tensor's offset; the first with 0) once the layer's gradient kernels
  // are ENQUEUED on the stream, not run (see GptCuda::ForwardBackward).
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const float* params,
                                            float* grads, const ForwardBackwardOptions& options);

  // Device bytes held for activations, labels and scratch (the largest batch so far).
  int64_t activation_bytes() const { return arena_->bytes(); }

 private:
  enum class Kind { kLinear, kRelu, kConv, kPool };
  struct Step {
    Kind kind;
    int64_t in = 0, out = 0;         // floats per sample
    int64_t weight = 0, bias = 0;    // parameter offsets (kLinear, kConv)
    kernels::Conv2dShape conv;       // kConv; batch set per call
    int64_t channels = 0, height = 0, width = 0;  // kPool
    bool has_params() const { return kind == Kind::kLinear || kind == Kind::kConv; }
  };
  SequentialCuda() = default;
  absl::Status Reserve(int64_t batch);
  const float* Input(size_t i) const { return i == 0 ? input_ : outputs_[i - 1]; }

  std::vector<Step> steps_;
  std::string description_;
  int64_t input_size_ = 0;
  int64_t classes_ = 0;
  int64_t total_elements_ = 0;
  SequentialCudaOptions options_;
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
  float* scratch_ = nullptr;  // the largest convolution's, and the bias gradients' partials
  std::vector<int32_t*> argmax_;  // per step (kPool)
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_SEQUENTIAL_CUDA_H_
