// VectorOps: the passes of an optimizer step over one kind of memory, so that the optimizers,
// the loss scaler, clipping and the gradient buckets (optimizer.h, loss_scaler.h, clip.h,
// train/grad_sync.h) run the same code whether a rank's flat buffers live in host memory
// (HostVectorOps: kernels/optimizer.h on the CPU) or on a CUDA GPU (cuda_vector_ops.h).
//
// Spans passed to these functions are views of the ops' own memory: for a GPU they hold
// device pointers and are never dereferenced on the host. Functions that return a value
// (a sum, a flag) wait for it; the others may only enqueue work, which later calls on the
// same ops see in order. Errors are INTERNAL for a device failure; host ops never fail.
//
// Thread-compatible: one thread at a time per ops object, except Mark/Wait (see there).
#ifndef RINGMASTER_TRAIN_OPTIM_VECTOR_OPS_H_
#define RINGMASTER_TRAIN_OPTIM_VECTOR_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"

namespace ringmaster::train {

class VectorOps;

// n floats of a VectorOps' memory, zeroed when made; freed through the ops that made it.
class OpsBuffer {
 public:
  OpsBuffer() = default;
  OpsBuffer(VectorOps* ops, float* data, int64_t size) : ops_(ops), data_(data), size_(size) {}
  ~OpsBuffer();
  OpsBuffer(OpsBuffer&& other) noexcept;
  OpsBuffer& operator=(OpsBuffer&& other) noexcept;
  OpsBuffer(const OpsBuffer&) = delete;
  OpsBuffer& operator=(const OpsBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  absl::Span<float> span() { return {data_, static_cast<size_t>(size_)}; }

 private:
  VectorOps* ops_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

class VectorOps {
 public:
  virtual ~VectorOps() = default;

  // "host" or "cuda".
  virtual const char* name() const = 0;
  // Whether spans are device memory (the host must copy them to read them).
  virtual bool device_memory() const = 0;

  // A zeroed buffer of n >= 0 floats. RESOURCE_EXHAUSTED when the memory is not there.
  absl::StatusOr<OpsBuffer> Allocate(int64_t n);

  // Copies between this memory and the host; they return when the copy is complete.
  virtual absl::Status CopyToHost(absl::Span<const float> from, float* host) = 0;
  virtual absl::Status CopyFromHost(const float* host, absl::Span<float> to) = 0;
  // to[i] = from[i], both in this memory (may only enqueue).
  virtual absl::Status Copy(absl::Span<const float> from, absl::Span<float> to) = 0;
  virtual absl::Status Zero(absl::Span<float> x) = 0;
  // to[i] += from[i], both in this memory, not overlapping (may only enqueue).
  virtual absl::Status Add(absl::Span<const float> from, absl::Span<float> to) = 0;
  // 16-bit values in this memory (bf16 with `bf16`, else IEEE fp16; bit patterns, e.g. for a
  // collective's wire): ToHalf sets to[i] = from[i] rounded to nearest even, bit for bit
  // kernels/half.h's FloatToBFloat16 / FloatToFloat16 (to holds from.size() values);
  // FromHalf widens them back, exactly (from holds to.size() values). The two sides must
  // not overlap. A buffer of n 16-bit values is Allocate((n + 1) / 2) floats, reinterpreted.
  // (May only enqueue.)
  virtual absl::Status ToHalf(bool bf16, absl::Span<const float> from, uint16_t* to) = 0;
  virtual absl::Status FromHalf(bool bf16, const uint16_t* from, absl::Span<float> to) = 0;
  // Waits until every call made so far on these ops is complete.
  virtual absl::Status Synchronize() = 0;

  // Makes the calling thread's later calls act on these ops' device (a thread other than
  // the one that created the ops calls it once, first: CUDA's current device is per thread).
  virtual absl::Status BindThread() { return absl::OkStatus(); }

  // Orders work across threads: Mark() (on the thread that enqueued the producing work)
  // returns a token; Wait(token), from any thread, returns once all work enqueued on these
  // ops before the Mark is complete. Host ops run their work at once: both do nothing.
  // Tokens are reused after kMaxMarks further marks, so wait for a mark before that.
  static constexpr int kMaxMarks = 1024;
  virtual int Mark() { return 0; }
  virtual absl::Status Wait(int token) { return absl::OkStatus(); }

  // The kernels of kernels/optimizer.h, same formulas and arguments.
  virtual absl::Status SgdStep(const kernels::SgdStepArgs& args, absl::Span<float> params,
                               absl::Span<const float> grads,
                               absl::Span<float> momentum_buffer) = 0;
  virtual absl::Status AdamWStep(const kernels::AdamMomentArgs& moments, float lr,
                                 float weight_decay, absl::Span<float> params,
                                 absl::Span<const float> grads, absl::Span<float> exp_avg,
                                 absl::Span<float> exp_avg_sq) = 0;
  virtual absl::StatusOr<kernels::LambSquareSums> LambSquares(
      const kernels::AdamMomentArgs& moments, float weight_decay, absl::Span<const float> params,
      absl::Span<const float> grads, absl::Span<const float> exp_avg,
      absl::Span<const float> exp_avg_sq) = 0;
  virtual absl::Status LambStep(const kernels::AdamMomentArgs& moments, float weight_decay,
                                float scaled_lr, absl::Span<float> params,
                                absl::Span<const float> grads, absl::Span<float> exp_avg,
                                absl::Span<float> exp_avg_sq) = 0;
  virtual absl::StatusOr<double> SumOfSquares(absl::Span<const float> x) = 0;
  // x[i] *= factor; whether any result is inf or NaN.
  virtual absl::StatusOr<bool> ScaleAndFindNonFinite(absl::Span<float> x, float factor) = 0;

 protected:
  friend class OpsBuffer;
  // n > 0 floats, zeroed; Release frees what AllocateRaw returned.
  virtual absl::StatusOr<float*> AllocateRaw(int64_t n) = 0;
  virtual void Release(float* data) = 0;
};

// The CPU (kernels/optimizer.h over host memory). One shared, stateless instance.
VectorOps* HostVectorOps();

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_VECTOR_OPS_H_
