// The kernels of kernels/cuda/elementwise.h. Grid-stride loops over int64 indices; the
// arithmetic follows the CPU twins (kernels/gelu.h, kernels/optimizer.h) operation by
// operation, so the differences are those of tanhf/sqrtf/powf and fused multiply-adds.
// GELU and the residual addition are templates over the storage (float, __nv_bfloat16 or
// __half, kernels/cuda/bf16.cuh), fp32 arithmetic in all; the float instantiations are the fp32
// kernels. The casts between fp32 and the 16-bit formats are templates over the latter.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/grid.cuh"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = kGridStrideThreads;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;


template <typename T>
__global__ void GeluForwardKernel(T* out, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = LoadF32(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    StoreF32(&out[i], 0.5f * v * (1.0f + tanhf(u)));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dx, const T* x, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = LoadF32(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const float t = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    StoreF32(&dx[i], grad * LoadF32(dout[i]));
  }
}

template <typename T>
__global__ void ResidualForwardKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    StoreF32(&out[i], LoadF32(a[i]) + LoadF32(b[i]));
  }
}

// kernels/half.h's BFloat16ToFloat and Float16ToFloat on the device, in integer operations
// so that NaNs come out as on the host: bf16 is the top half of the float (a NaN keeps every
// bit); fp16 is internal::SoftFloat16ToFloat, which gives Float16ToFloat's bits (exact, a NaN
// keeps its sign and payload and is made quiet).
__device__ __forceinline__ float Widen(__nv_bfloat16 h) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(h)) << 16);
}

__device__ __forceinline__ float Widen(__half h) {
  const uint32_t bits = __half_as_ushort(h);
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf, NaN
    return __uint_as_float(sign | 0x7f800000u | (mantissa << 13) |
                           (mantissa != 0 ? 0x00400000u : 0u));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa 2^-24, exact (and normal) in fp32.
  return __uint_as_float(sign | __float_as_uint(static_cast<float>(mantissa) * 0x1p-24f));
}

// The casts between fp32 and T (__nv_bfloat16 or __half): StoreF32 rounds (bf16.cuh), Widen
// widens.
template <typename T>
__global__ void CastFloatTo16Kernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    StoreF32(&out[i], in[i]);
  }
}

template <typename T>
__global__ void Cast16ToFloatKernel(float* out, const T* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = Widen(in[i]);
  }
}

// kernels/cpu/precision.cc's rounding of a float to the nearest bf16 or fp16 value, kept
// in fp32, on the device: the same bit arithmetic, so the same bits (NaNs included).
template <int kDropped>
__device__ __forceinline__ uint32_t RoundMantissa(uint32_t magnitude) {
  constexpr uint32_t kHalf = (1u << (kDropped - 1)) - 1;
  constexpr uint32_t kMask = ~((1u << kDropped) - 1);
  return (magnitude + kHalf + ((magnitude >> kDropped) & 1u)) & kMask;
}

__device__ __forceinline__ float RoundedToBf16(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return __uint_as_float((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : RoundMantissa<16>(u));
}

__device__ __forceinline__ float RoundedToF16(float x) {
  constexpr uint32_t kMinNormal = 0x38800000u;  // 2^-14
  constexpr uint32_t kOverflow = 0x47800000u;   // 2^16: the first binade fp16 lacks
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t magnitude = u ^ sign;
  uint32_t normal = RoundMantissa<13>(magnitude);
  normal = normal >= kOverflow ? 0x7f800000u : normal;
  // Multiples of 2^-24: adding and subtracting 0.5 rounds to them (to nearest even), the
  // subtraction exact; __fadd_rn keeps the compiler from folding the pair.
  const float subnormal = __fadd_rn(__fadd_rn(__uint_as_float(magnitude), 0.5f), -0.5f);
  uint32_t result = magnitude < kMinNormal ? __float_as_uint(subnormal) : normal;
  if (magnitude > 0x7f800000u) result = (magnitude | 0x00400000u) & 0xffffe000u;
  return __uint_as_float(result | sign);
}

template <bool kBf16>
__device__ __forceinline__ float RoundedToHalf(float x) {
  if constexpr (kBf16) {
    return RoundedToBf16(x);
  } else {
    return RoundedToF16(x);
  }
}

template <bool kBf16>
__global__ void RoundToHalfKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = RoundedToHalf<kBf16>(x[i]);
  }
}

template <bool kBf16>
__global__ void AddRoundedHalfKernel(const float* x, float* sum, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    sum[i] = __fadd_rn(sum[i], RoundedToHalf<kBf16>(x[i]));
  }
}

// This step's Adam moments of one element.
__device__ __forceinline__ void NewMoments(const MomentArgs& k, float g, float m_old, float v_old,
                                           float* m, float* v) {
  *m = k.beta1 * m_old + k.one_minus_beta1 * g;
  *v = k.beta2 * v_old + k.one_minus_beta2 * (g * g);
}

// m_hat / (sqrt(v_hat) + eps), as the CPU's Moments::Direction.
__device__ __forceinline__ float Direction(const MomentArgs& k, float m, float v) {
  return (m * k.inv_correction1) / (sqrtf(v) * k.inv_sqrt_correction2 + k.eps);
}

__global__ void AdamWKernel(AdamWArgs a, float* params, const float* grads, float* exp_avg,
                            float* exp_avg_sq, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float m, v;
    NewMoments(a.moments, grads[i], exp_avg[i], exp_avg_sq[i], &m, &v);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] = params[i] * a.decay - a.lr * Direction(a.moments, m, v);
  }
}

// LAMB's r for one element from its new moments, as kernels/cpu/optimizer_impl.inc.
__device__ __forceinline__ float LambUpdate(const LambArgs& a, float p, float m, float v) {
  return Direction(a.moments, m, v) + a.weight_decay * p;
}

// LAMB pass 1, like SumOfSquaresPartialKernel for two sums: p^2 into partials[b], r^2 into
// partials[gridDim.x + b].
__global__ void LambSquaresPartialKernel(LambArgs a, const float* params, const float* grads,
                                         const float* exp_avg, const float* exp_avg_sq,
                                         int64_t n, double* partials) {
  __shared__ double sums_p[kSumThreads];
  __shared__ double sums_r[kSumThreads];
  const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = begin + per_block < n ? begin + per_block : n;
  double sp = 0, sr = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float m, v;
    NewMoments(a.moments, grads[i], exp_avg[i], exp_avg_sq[i], &m, &v);
    const double p = params[i];
    const double r = LambUpdate(a, params[i], m, v);
    sp += p * p;
    sr += r * r;
  }
  sums_p[threadIdx.x] = sp;
  sums_r[threadIdx.x] = sr;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      sums_p[threadIdx.x] += sums_p[threadIdx.x + stride];
      sums_r[threadIdx.x] += sums_r[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sums_p[0];
    partials[gridDim.x + blockIdx.x] = sums_r[0];
  }
}

__global__ void LambStepKernel(LambArgs a, float* params, const float* grads, float* exp_avg,
                               float* exp_avg_sq, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float m, v;
    NewMoments(a.moments, grads[i], exp_avg[i], exp_avg_sq[i], &m, &v);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] -= a.scaled_lr * LambUpdate(a, params[i], m, v);
  }
}

// Pass 1: block b sums x^2 over its contiguous slice in a fixed order (each thread a
// strided sub-sequence, then a tree in shared memory): partials[b]. Deterministic.
__global__ void SumOfSquaresPartialKernel(const float* x, int64_t n, double* partials) {
  __shared__ double sums[kSumThreads];
  const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = begin + per_block < n ? begin + per_block : n;
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// Pass 2: one block adds the partials in the same fixed tree.
__global__ void SumOfSquaresFinalKernel(const double* partials, int count, double* result) {
  __shared__ double sums[kSumThreads];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = sums[0];
}

__global__ void ScaleAndFindNonFiniteKernel(float* x, int64_t n, float factor, int* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i] * factor;
    x[i] = v;
    bad = bad || !isfinite(v);
  }
  // One store per warp that saw a non-finite value (the flag only ever goes 0 -> 1).
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x % 32) == 0) *flag = 1;
}

template <typename T>
cudaError_t GeluForward(T* out, const T* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;  // nothing to do: not even the runtime is touched
  GeluForwardKernel<T><<<GridStrideBlocks(n), kThreads, 0, stream>>>(out, x, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GeluBackward(T* dx, const T* x, const T* dout, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<T><<<GridStrideBlocks(n), kThreads, 0, stream>>>(dx, x, dout, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ResidualForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ResidualForwardKernel<T><<<GridStrideBlocks(n), kThreads, 0, stream>>>(out, a, b, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t CastFloatTo16(T* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastFloatTo16Kernel<T><<<GridStrideBlocks(n), kThreads, 0, stream>>>(out, in, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Cast16ToFloat(float* out, const T* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Cast16ToFloatKernel<T><<<GridStrideBlocks(n), kThreads, 0, stream>>>(out, in, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGeluForward(float* out, const float* x, int64_t n, cudaStream_t stream) {
  return GeluForward(out, x, n, stream);
}

cudaError_t LaunchGeluForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* x, int64_t n,
                                  cudaStream_t stream) {
  return GeluForward(out, x, n, stream);
}

cudaError_t LaunchGeluForwardF16(__half* out, const __half* x, int64_t n, cudaStream_t stream) {
  return GeluForward(out, x, n, stream);
}

cudaError_t LaunchGeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                               cudaStream_t stream) {
  return GeluBackward(dx, x, dout, n, stream);
}

cudaError_t LaunchGeluBackwardBf16(__nv_bfloat16* dx, const __nv_bfloat16* x,
                                   const __nv_bfloat16* dout, int64_t n, cudaStream_t stream) {
  return GeluBackward(dx, x, dout, n, stream);
}

cudaError_t LaunchGeluBackwardF16(__half* dx, const __half* x, const __half* dout, int64_t n,
                                  cudaStream_t stream) {
  return GeluBackward(dx, x, dout, n, stream);
}

cudaError_t LaunchResidualForward(float* out, const float* a, const float* b, int64_t n,
                                  cudaStream_t stream) {
  return ResidualForward(out, a, b, n, stream);
}

cudaError_t LaunchResidualForwardBf16(__nv_bfloat16* out, const __nv_bfloat16* a,
                                      const __nv_bfloat16* b, int64_t n, cudaStream_t stream) {
  return ResidualForward(out, a, b, n, stream);
}

cudaError_t LaunchResidualForwardF16(__half* out, const __half* a, const __half* b, int64_t n,
                                     cudaStream_t stream) {
  return ResidualForward(out, a, b, n, stream);
}

cudaError_t LaunchCastFloatToBf16(__nv_bfloat16* out, const float* in, int64_t n,
                                  cudaStream_t stream) {
  return CastFloatTo16(out, in, n, stream);
}

cudaError_t LaunchCastFloatToF16(__half* out, const float* in, int64_t n, cudaStream_t stream) {
  return CastFloatTo16(out, in, n, stream);
}

cudaError_t LaunchCastBf16ToFloat(float* out, const __nv_bfloat16* in, int64_t n,
                                  cudaStream_t stream) {
  return Cast16ToFloat(out, in, n, stream);
}

cudaError_t LaunchCastF16ToFloat(float* out, const __half* in, int64_t n, cudaStream_t stream) {
  return Cast16ToFloat(out, in, n, stream);
}

cudaError_t LaunchRoundToHalf(bool bf16, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    RoundToHalfKernel<true><<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, y, n);
  } else {
    RoundToHalfKernel<false><<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddRoundedHalf(bool bf16, const float* x, float* sum, int64_t n,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    AddRoundedHalfKernel<true><<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, sum, n);
  } else {
    AddRoundedHalfKernel<false><<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, sum, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAdamW(const AdamWArgs& a, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(a, params, grads, exp_avg, exp_avg_sq, n);
  return cudaGetLastError();
}

cudaError_t LaunchLambSquares(const LambArgs& a, const float* params, const float* grads,
                              const float* exp_avg, const float* exp_avg_sq, int64_t n,
                              double* partials, double* result, cudaStream_t stream) {
  LambSquaresPartialKernel<<<kSumBlocks, kSumThreads, 0, stream>>>(a, params, grads, exp_avg,
                                                                   exp_avg_sq, n, partials);
  SumOfSquaresFinalKernel<<<1, kSumThreads, 0, stream>>>(partials, kSumBlocks, result);
  SumOfSquaresFinalKernel<<<1, kSumThreads, 0, stream>>>(partials + kSumBlocks, kSumBlocks,
                                                         result + 1);
  return cudaGetLastError();
}

cudaError_t LaunchLambStep(const LambArgs& a, float* params, const float* grads, float* exp_avg,
                           float* exp_avg_sq, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LambStepKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(a, params, grads, exp_avg, exp_avg_sq, n);
  return cudaGetLastError();
}

cudaError_t LaunchSumOfSquares(const float* x, int64_t n, double* partials, double* result,
                               cudaStream_t stream) {
  SumOfSquaresPartialKernel<<<kSumBlocks, kSumThreads, 0, stream>>>(x, n, partials);
  SumOfSquaresFinalKernel<<<1, kSumThreads, 0, stream>>>(partials, kSumBlocks, result);
  return cudaGetLastError();
}

cudaError_t LaunchScaleAndFindNonFinite(float* x, int64_t n, float factor, int* flag,
                                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleAndFindNonFiniteKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, n, factor, flag);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
