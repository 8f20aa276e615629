// CudaVectorOps: VectorOps (vector_ops.h) over the memory of one CUDA GPU, through the
// kernels of kernels/cuda/ (elementwise.h: AdamW, LAMB, sum of squares, scale with the
// non-finite check, the casts to and from bf16/fp16; sgd.h; vector.h: Accumulate). CUDA
// builds only (--config=cuda).
//
// Every call enqueues on the stream given at Create; calls that return a value (a sum, a
// flag, a copy to the host) wait for that stream, and only for it. Mark() records a CUDA
// event on the stream and Wait() blocks the calling thread on it, so a thread that reduces
// gradients can wait for the backward that another thread enqueued.
//
// Thread-compatible, except Mark (the enqueuing thread) and Wait (any thread). Errors:
// INTERNAL with the CUDA error; RESOURCE_EXHAUSTED when cudaMalloc runs out of memory;
// INVALID_ARGUMENT for spans of different sizes (Copy, Add) or overlapping sides (Add,
// ToHalf, FromHalf: the kernels' checks, kernels/cuda/elementwise.h and vector.h).
#ifndef RINGMASTER_TRAIN_OPTIM_CUDA_VECTOR_OPS_H_
#define RINGMASTER_TRAIN_OPTIM_CUDA_VECTOR_OPS_H_

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

class CudaVectorOps final : public VectorOps {
 public:
  // Ops on `stream` (not owned; it must outlive the ops) of the calling thread's current
  // device: scratch for the sums and the events are made now.
  static absl::StatusOr<std::unique_ptr<CudaVectorOps>> Create(cudaStream_t stream);
  ~CudaVectorOps() override;

  cudaStream_t stream() const { return stream_; }

  const char* name() const override { return "cuda"; }
  bool device_memory() const override { return true; }
  absl::Status CopyToHost(absl::Span<const float> from, float* host) override;
  absl::Status CopyFromHost(const float* host, absl::Span<float> to) override;
  absl::Status Copy(absl::Span<const float> from, absl::Span<float> to) override;
  absl::Status Zero(absl::Span<float> x) override;
  absl::Status Add(absl::Span<const float> from, absl::Span<float> to) override;
  absl::Status ToHalf(bool bf16, absl::Span<const float> from, uint16_t* to) override;
  absl::Status FromHalf(bool bf16, const uint16_t* from, absl::Span<float> to) override;
  absl::Status Synchronize() override;
  absl::Status BindThread() override;
  int Mark() override;
  absl::Status Wait(int token) override;

  absl::Status SgdStep(const kernels::SgdStepArgs& args, absl::Span<float> params,
                       absl::Span<const float> grads, absl::Span<float> momentum) override;
  absl::Status AdamWStep(const kernels::AdamMomentArgs& moments, float lr, float weight_decay,
                         absl::Span<float> params, absl::Span<const float> grads,
                         absl::Span<float> exp_avg, absl::Span<float> exp_avg_sq) override;
  absl::StatusOr<kernels::LambSquareSums> LambSquares(
      const kernels::AdamMomentArgs& moments, float weight_decay, absl::Span<const float> params,
      absl::Span<const float> grads, absl::Span<const float> exp_avg,
      absl::Span<const float> exp_avg_sq) override;
  absl::Status LambStep(const kernels::AdamMomentArgs& moments, float weight_decay,
                        float scaled_lr, absl::Span<float> params, absl::Span<const float> grads,
                        absl::Span<float> exp_avg, absl::Span<float> exp_avg_sq) override;
  absl::StatusOr<double> SumOfSquares(absl::Span<const float> x) override;
  absl::StatusOr<bool> ScaleAndFindNonFinite(absl::Span<float> x, float factor) override;

 protected:
  absl::StatusOr<float*> AllocateRaw(int64_t n) override;
  void Release(float* data) override;

 private:
  explicit CudaVectorOps(cudaStream_t stream) : stream_(stream) {}
  // Copies `count` device doubles of result_ to the host and waits for the stream.
  absl::Status ReadResults(int count, double* out);

  cudaStream_t stream_;
  int device_ = 0;             // the current device at Create (the stream's)
  double* scratch_ = nullptr;  // the sums' per-block partials
  double* result_ = nullptr;   // two device doubles
  int* flag_ = nullptr;        // the non-finite flag
  std::array<cudaEvent_t, kMaxMarks> events_{};
  int next_mark_ = 0;
  std::atomic<bool> mark_failed_{false};
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_CUDA_VECTOR_OPS_H_
