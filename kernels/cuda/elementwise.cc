// Argument checks of kernels/cuda/elementwise.h; the kernels are in elementwise.cu.
#include "kernels/cuda/elementwise.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/checks.h"
#include "kernels/cuda/elementwise_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

using internal::CheckCount;
using internal::CheckPointer;
using internal::Invalid;

absl::Status Launched(cudaError_t err, const char* what) { return CudaToStatus(err, what); }

// The Adam moment constants as kernels/cpu/optimizer_impl.inc prepares them (corrections in
// double, then float).
internal::MomentArgs MomentConstants(const AdamMomentArgs& moments) {
  const double correction1 = 1.0 - std::pow(double{moments.beta1}, double(moments.step));
  const double correction2 = 1.0 - std::pow(double{moments.beta2}, double(moments.step));
  internal::MomentArgs a;
  a.beta1 = moments.beta1;
  a.one_minus_beta1 = 1.0f - moments.beta1;
  a.beta2 = moments.beta2;
  a.one_minus_beta2 = 1.0f - moments.beta2;
  a.eps = moments.eps;
  a.inv_correction1 = static_cast<float>(1.0 / correction1);
  a.inv_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(correction2));
  return a;
}

// The checks shared by the Adam-family updates.
absl::Status CheckMoments(const char* fn, const AdamMomentArgs& moments, int64_t n,
                          const void* params, const void* grads, const void* exp_avg,
                          const void* exp_avg_sq) {
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  if (moments.step < 1) return Invalid(fn, "step must be >= 1, got ", moments.step);
  RM_RETURN_IF_ERROR(CheckPointer(fn, params, "params", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, grads, "grads", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, exp_avg, "exp_avg", n));
  return CheckPointer(fn, exp_avg_sq, "exp_avg_sq", n);
}

}  // namespace

absl::Status GeluForward(float* out, const float* x, int64_t n, cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckCount("GeluForward", n));
  RM_RETURN_IF_ERROR(CheckPointer("GeluForward", out, "out", n));
  RM_RETURN_IF_ERROR(CheckPointer("GeluForward", x, "x", n));
  return Launched(internal::LaunchGeluForward(out, x, n, stream), "GeluForward launch");
}

absl::Status GeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                          cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckCount("GeluBackward", n));
  RM_RETURN_IF_ERROR(CheckPointer("GeluBackward", dx, "dx", n));
  RM_RETURN_IF_ERROR(CheckPointer("GeluBackward", x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer("GeluBackward", dout, "dout", n));
  if (n > 0 && static_cast<const void*>(dx) == static_cast<const void*>(x)) {
    return Invalid("GeluBackward", "dx must not alias x (backward needs x whole)");
  }
  return Launched(internal::LaunchGeluBackward(dx, x, dout, n, stream), "GeluBackward launch");
}

absl::Status ResidualForward(float* out, const float* a, const float* b, int64_t n,
                             cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckCount("ResidualForward", n));
  RM_RETURN_IF_ERROR(CheckPointer("ResidualForward", out, "out", n));
  RM_RETURN_IF_ERROR(CheckPointer("ResidualForward", a, "a", n));
  RM_RETURN_IF_ERROR(CheckPointer("ResidualForward", b, "b", n));
  return Launched(internal::LaunchResidualForward(out, a, b, n, stream),
                  "ResidualForward launch");
}

namespace {

// The 16-bit twins' checks and launches, one body for bf16 and fp16: `fn` names the public
// function in errors, `launch` is its launcher.
template <typename T>
absl::Status Gelu16(const char* fn, T* out, const T* x, int64_t n, cudaStream_t stream,
                    cudaError_t (*launch)(T*, const T*, int64_t, cudaStream_t)) {
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, out, "out", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  return Launched(launch(out, x, n, stream), absl::StrCat(fn, " launch").c_str());
}

template <typename T>
absl::Status GeluBackward16(const char* fn, T* dx, const T* x, const T* dout, int64_t n,
                            cudaStream_t stream,
                            cudaError_t (*launch)(T*, const T*, const T*, int64_t, cudaStream_t)) {
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dx, "dx", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dout, "dout", n));
  if (n > 0 && static_cast<const void*>(dx) == static_cast<const void*>(x)) {
    return Invalid(fn, "dx must not alias x (backward needs x whole)");
  }
  return Launched(launch(dx, x, dout, n, stream), absl::StrCat(fn, " launch").c_str());
}

template <typename T>
absl::Status Residual16(const char* fn, T* out, const T* a, const T* b, int64_t n,
                        cudaStream_t stream,
                        cudaError_t (*launch)(T*, const T*, const T*, int64_t, cudaStream_t)) {
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, out, "out", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, a, "a", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, b, "b", n));
  return Launched(launch(out, a, b, n, stream), absl::StrCat(fn, " launch").c_str());
}

// The casts between fp32 and a 16-bit format, either way.
template <typename Out, typename In>
absl::Status Cast16(const char* fn, Out* out, const In* in, int64_t n, cudaStream_t stream,
                    cudaError_t (*launch)(Out*, const In*, int64_t, cudaStream_t)) {
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, out, "out", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, in, "in", n));
  if (n > 0 && static_cast<const void*>(out) == static_cast<const void*>(in)) {
    return Invalid(fn, "out must not overlap in");
  }
  return Launched(launch(out, in, n, stream), absl::StrCat(fn, " launch").c_str());
}

}  // namespace

absl::Status GeluForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* x, int64_t n,
                             cudaStream_t stream) {
  return Gelu16("GeluForwardBf16", out, x, n, stream, internal::LaunchGeluForwardBf16);
}

absl::Status GeluForwardF16(__half* out, const __half* x, int64_t n, cudaStream_t stream) {
  return Gelu16("GeluForwardF16", out, x, n, stream, internal::LaunchGeluForwardF16);
}

absl::Status GeluBackwardBf16(__nv_bfloat16* dx, const __nv_bfloat16* x,
                              const __nv_bfloat16* dout, int64_t n, cudaStream_t stream) {
  return GeluBackward16("GeluBackwardBf16", dx, x, dout, n, stream,
                        internal::LaunchGeluBackwardBf16);
}

absl::Status GeluBackwardF16(__half* dx, const __half* x, const __half* dout, int64_t n,
                             cudaStream_t stream) {
  return GeluBackward16("GeluBackwardF16", dx, x, dout, n, stream,
                        internal::LaunchGeluBackwardF16);
}

absl::Status ResidualForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* a,
                                 const __nv_bfloat16* b, int64_t n, cudaStream_t stream) {
  return Residual16("ResidualForwardBf16", out, a, b, n, stream,
                    internal::LaunchResidualForwardBf16);
}

absl::Status ResidualForwardF16(__half* out, const __half* a, const __half* b, int64_t n,
                                cudaStream_t stream) {
  return Residual16("ResidualForwardF16", out, a, b, n, stream,
                    internal::LaunchResidualForwardF16);
}

absl::Status CastFloatToBf16(__nv_bfloat16* out, const float* in, int64_t n,
                             cudaStream_t stream) {
  return Cast16("CastFloatToBf16", out, in, n, stream, internal::LaunchCastFloatToBf16);
}

absl::Status CastFloatToF16(__half* out, const float* in, int64_t n, cudaStream_t stream) {
  return Cast16("CastFloatToF16", out, in, n, stream, internal::LaunchCastFloatToF16);
}

absl::Status CastBf16ToFloat(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream) {
  return Cast16("CastBf16ToFloat", out, in, n, stream, internal::LaunchCastBf16ToFloat);
}

absl::Status CastF16ToFloat(float* out, const __half* in, int64_t n, cudaStream_t stream) {
  return Cast16("CastF16ToFloat", out, in, n, stream, internal::LaunchCastF16ToFloat);
}

absl::Status RoundToHalf(HalfFormat format, const float* x, float* y, int64_t n,
                         cudaStream_t stream) {
  const char* fn = "RoundToHalf";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, y, "y", n));
  if (n > 0 && x != y && x < y + n && y < x + n) {
    return Invalid(fn, "y must be x exactly or not overlap it");
  }
  return Launched(internal::LaunchRoundToHalf(format == HalfFormat::kBFloat16, x, y, n, stream),
                  "RoundToHalf launch");
}

absl::Status AddRoundedHalf(HalfFormat format, const float* x, float* sum, int64_t n,
                            cudaStream_t stream) {
  const char* fn = "AddRoundedHalf";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, sum, "sum", n));
  if (n > 0 && x < sum + n && sum < x + n) return Invalid(fn, "sum must not overlap x");
  return Launched(
      internal::LaunchAddRoundedHalf(format == HalfFormat::kBFloat16, x, sum, n, stream),
      "AddRoundedHalf launch");
}

absl::Status AdamWStep(const AdamMomentArgs& moments, float lr, float weight_decay,
                       float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                       int64_t n, cudaStream_t stream) {
  const char* fn = "AdamWStep";
  RM_RETURN_IF_ERROR(CheckMoments(fn, moments, n, params, grads, exp_avg, exp_avg_sq));
  internal::AdamWArgs a;
  a.moments = MomentConstants(moments);
  a.lr = lr;
  a.decay = static_cast<float>(1.0 - double{lr} * weight_decay);
  return Launched(internal::LaunchAdamW(a, params, grads, exp_avg, exp_avg_sq, n, stream),
                  "AdamWStep launch");
}

int64_t LambSquaresScratchDoubles() { return 2 * internal::kSumBlocks; }

absl::Status LambSquares(const AdamMomentArgs& moments, float weight_decay, const float* params,
                         const float* grads, const float* exp_avg, const float* exp_avg_sq,
                         int64_t n, double* scratch, double* result, cudaStream_t stream) {
  const char* fn = "LambSquares";
  RM_RETURN_IF_ERROR(CheckMoments(fn, moments, n, params, grads, exp_avg, exp_avg_sq));
  RM_RETURN_IF_ERROR(CheckPointer(fn, scratch, "scratch", 1));
  RM_RETURN_IF_ERROR(CheckPointer(fn, result, "result", 1));
  const internal::LambArgs a{MomentConstants(moments), weight_decay, 0.0f};
  return Launched(internal::LaunchLambSquares(a, params, grads, exp_avg, exp_avg_sq, n, scratch,
                                              result, stream),
                  "LambSquares launch");
}

absl::Status LambStep(const AdamMomentArgs& moments, float weight_decay, float scaled_lr,
                      float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                      int64_t n, cudaStream_t stream) {
  const char* fn = "LambStep";
  RM_RETURN_IF_ERROR(CheckMoments(fn, moments, n, params, grads, exp_avg, exp_avg_sq));
  const internal::LambArgs a{MomentConstants(moments), weight_decay, scaled_lr};
  return Launched(
      internal::LaunchLambStep(a, params, grads, exp_avg, exp_avg_sq, n, stream),
      "LambStep launch");
}

int64_t SumOfSquaresScratchDoubles() { return internal::kSumBlocks; }

absl::Status SumOfSquares(const float* x, int64_t n, double* scratch, double* result,
                          cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckCount("SumOfSquares", n));
  RM_RETURN_IF_ERROR(CheckPointer("SumOfSquares", x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer("SumOfSquares", scratch, "scratch", 1));
  RM_RETURN_IF_ERROR(CheckPointer("SumOfSquares", result, "result", 1));
  return Launched(internal::LaunchSumOfSquares(x, n, scratch, result, stream),
                  "SumOfSquares launch");
}

absl::Status ScaleAndFindNonFinite(float* x, int64_t n, float factor, int* flag,
                                   cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckCount("ScaleAndFindNonFinite", n));
  RM_RETURN_IF_ERROR(CheckPointer("ScaleAndFindNonFinite", x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer("ScaleAndFindNonFinite", flag, "flag", 1));
  RM_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  return Launched(internal::LaunchScaleAndFindNonFinite(x, n, factor, flag, stream),
                  "ScaleAndFindNonFinite launch");
}

absl::StatusOr<bool> ScaleAndFindNonFiniteSync(float* x, int64_t n, float factor, int* flag,
                                               cudaStream_t stream) {
  RM_RETURN_IF_ERROR(ScaleAndFindNonFinite(x, n, factor, flag, stream));
  int found = 0;
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(&found, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return found != 0;
}

}  // namespace ringmaster::kernels::cuda
