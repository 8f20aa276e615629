#include "train/optim/cuda_vector_ops.h"

#include <algorithm>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sgd.h"
#include "kernels/cuda/vector.h"

namespace ringmaster::train {
namespace {

namespace kc = kernels::cuda;

size_t Bytes(size_t n) { return n * sizeof(float); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaVectorOps>> CudaVectorOps::Create(cudaStream_t stream) {
  auto ops = absl::WrapUnique(new CudaVectorOps(stream));
  RM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&ops->device_));
  const int64_t scratch =
      std::max(kc::SumOfSquaresScratchDoubles(), kc::LambSquaresScratchDoubles());
  RM_RETURN_IF_CUDA_ERROR(cudaMalloc(&ops->scratch_, scratch * sizeof(double)));
  RM_RETURN_IF_CUDA_ERROR(cudaMalloc(&ops->result_, 2 * sizeof(double)));
  RM_RETURN_IF_CUDA_ERROR(cudaMalloc(&ops->flag_, sizeof(int)));
  for (cudaEvent_t& e : ops->events_) {
    RM_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return ops;
}

CudaVectorOps::~CudaVectorOps() {
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  cudaFree(scratch_);
  cudaFree(result_);
  cudaFree(flag_);
}

absl::Status CudaVectorOps::BindThread() {
  RM_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::StatusOr<float*> CudaVectorOps::AllocateRaw(int64_t n) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, Bytes(n));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // an out-of-memory error is not sticky: clear it
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", Bytes(n), " bytes: the GPU is out of memory"));
  }
  RM_RETURN_IF_CUDA_ERROR(err);
  absl::Status zeroed = CudaToStatus(cudaMemsetAsync(p, 0, Bytes(n), stream_), "cudaMemsetAsync");
  if (zeroed.ok()) zeroed = CudaToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (!zeroed.ok()) {
    cudaFree(p);
    return zeroed;
  }
  return static_cast<float*>(p);
}

void CudaVectorOps::Release(float* data) {
  // Work queued on the stream may still use it.
  cudaStreamSynchronize(stream_);
  cudaFree(data);
}

absl::Status CudaVectorOps::CopyToHost(absl::Span<const float> from, float* host) {
  if (from.empty()) return absl::OkStatus();
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host, from.data(), Bytes(from.size()), cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::CopyFromHost(const float* host, absl::Span<float> to) {
  if (to.empty()) return absl::OkStatus();
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(to.data(), host, Bytes(to.size()), cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::Copy(absl::Span<const float> from, absl::Span<float> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Copy (CUDA): ", from.size(), " floats into ",
                                                   to.size()));
  }
  if (from.empty()) return absl::OkStatus();
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(to.data(), from.data(), Bytes(from.size()),
                                          cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::Zero(absl::Span<float> x) {
  if (x.empty()) return absl::OkStatus();
  RM_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(x.data(), 0, Bytes(x.size()), stream_));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::Add(absl::Span<const float> from, absl::Span<float> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Add (CUDA): ", from.size(), " floats into ", to.size()));
  }
  return kc::Accumulate(to.data(), from.data(), static_cast<int64_t>(to.size()), stream_);
}

absl::Status CudaVectorOps::ToHalf(bool bf16, absl::Span<const float> from, uint16_t* to) {
  const auto n = static_cast<int64_t>(from.size());
  if (bf16) {
    return kc::CastFloatToBf16(reinterpret_cast<__nv_bfloat16*>(to), from.data(), n, stream_);
  }
  return kc::CastFloatToF16(reinterpret_cast<__half*>(to), from.data(), n, stream_);
}

absl::Status CudaVectorOps::FromHalf(bool bf16, const uint16_t* from, absl::Span<float> to) {
  const auto n = static_cast<int64_t>(to.size());
  if (bf16) {
    return kc::CastBf16ToFloat(to.data(), reinterpret_cast<const __nv_bfloat16*>(from), n, stream_);
  }
  return kc::CastF16ToFloat(to.data(), reinterpret_cast<const __half*>(from), n, stream_);
}

absl::Status CudaVectorOps::Synchronize() {
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

int CudaVectorOps::Mark() {
  const int token = next_mark_;
  next_mark_ = (next_mark_ + 1) % kMaxMarks;
  if (cudaEventRecord(events_[token], stream_) != cudaSuccess) mark_failed_ = true;
  return token;
}

absl::Status CudaVectorOps::Wait(int token) {
  if (token < 0 || token >= kMaxMarks) {
    return absl::InvalidArgumentError(absl::StrCat("Wait (CUDA): no mark ", token));
  }
  if (mark_failed_) return absl::InternalError("Mark (CUDA): cudaEventRecord failed");
  RM_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(events_[token]));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::ReadResults(int count, double* out) {
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out, result_, count * sizeof(double),
                                          cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaVectorOps::SgdStep(const kernels::SgdStepArgs& args, absl::Span<float> params,
                                    absl::Span<const float> grads, absl::Span<float> momentum) {
  return kc::SgdStep(args, params.data(), grads.data(),
                     momentum.empty() ? nullptr : momentum.data(),
                     static_cast<int64_t>(params.size()), stream_);
}

absl::Status CudaVectorOps::AdamWStep(const kernels::AdamMomentArgs& moments, float lr,
                                      float weight_decay, absl::Span<float> params,
                                      absl::Span<const float> grads, absl::Span<float> exp_avg,
                                      absl::Span<float> exp_avg_sq) {
  return kc::AdamWStep(moments, lr, weight_decay, params.data(), grads.data(), exp_avg.data(),
                       exp_avg_sq.data(), static_cast<int64_t>(params.size()), stream_);
}

absl::StatusOr<kernels::LambSquareSums> CudaVectorOps::LambSquares(
    const kernels::AdamMomentArgs& moments, float weight_decay, absl::Span<const float> params,
    absl::Span<const float> grads, absl::Span<const float> exp_avg,
    absl::Span<const float> exp_avg_sq) {
  RM_RETURN_IF_ERROR(kc::LambSquares(moments, weight_decay, params.data(), grads.data(),
                                     exp_avg.data(), exp_avg_sq.data(),
                                     static_cast<int64_t>(params.size()), scratch_, result_,
                                     stream_));
  double sums[2];
  RM_RETURN_IF_ERROR(ReadResults(2, sums));
  return kernels::LambSquareSums{.params = sums[0], .update = sums[1]};
}

absl::Status CudaVectorOps::LambStep(const kernels::AdamMomentArgs& moments, float weight_decay,
                                     float scaled_lr, absl::Span<float> params,
                                     absl::Span<const float> grads, absl::Span<float> exp_avg,
                                     absl::Span<float> exp_avg_sq) {
  return kc::LambStep(moments, weight_decay, scaled_lr, params.data(), grads.data(),
                      exp_avg.data(), exp_avg_sq.data(), static_cast<int64_t>(params.size()),
                      stream_);
}

absl::StatusOr<double> CudaVectorOps::SumOfSquares(absl::Span<const float> x) {
  if (x.empty()) return 0.0;
  RM_RETURN_IF_ERROR(
      kc::SumOfSquares(x.data(), static_cast<int64_t>(x.size()), scratch_, result_, stream_));
  double sum = 0;
  RM_RETURN_IF_ERROR(ReadResults(1, &sum));
  return sum;
}

absl::StatusOr<bool> CudaVectorOps::ScaleAndFindNonFinite(absl::Span<float> x, float factor) {
  if (x.empty()) return false;
  return kc::ScaleAndFindNonFiniteSync(x.data(), static_cast<int64_t>(x.size()), factor, flag_,
                                       stream_);
}

}  // namespace ringmaster::train
