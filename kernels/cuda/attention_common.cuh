// Device helpers shared by attention_f32.cu and attention_bf16.cu (internal).
#ifndef RINGMASTER_KERNELS_CUDA_ATTENTION_COMMON_CUH_
#define RINGMASTER_KERNELS_CUDA_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "kernels/cuda/attention_launch.h"

namespace ringmaster::kernels::cuda::internal {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

// Offsets (in elements) of head (b, h)'s slices: q in qkv (k and v follow at +C and +2C,
// row stride 3C), its columns in out / dout (row stride C), its rows in lse / dsum.
struct HeadOffsets {
  size_t qkv;
  size_t out;
  size_t row;
};

__device__ __forceinline__ HeadOffsets HeadAt(const AttnShape& s, int bh) {
  const int b = bh / s.heads;
  const int h = bh % s.heads;
  const size_t t0 = static_cast<size_t>(b) * s.seq_len;
  return HeadOffsets{t0 * 3 * s.channels + static_cast<size_t>(h) * s.head_size,
                     t0 * s.channels + static_cast<size_t>(h) * s.head_size,
                     static_cast<size_t>(bh) * s.seq_len};
}

// Head (b, h)'s q, k and v slices of qkv (row stride 3C).
template <typename T>
struct QkvSlices {
  const T* q;
  const T* k;
  const T* v;
};

template <typename T>
__device__ __forceinline__ QkvSlices<T> SlicesAt(const T* qkv, const HeadOffsets& head,
                                                 const AttnShape& s) {
  const T* q = qkv + head.qkv;
  return QkvSlices<T>{q, q + s.channels, q + 2 * s.channels};
}

// What every kernel derives from its arguments and blockIdx.x (= b * NH + h).
template <typename T>
struct HeadContext {
  int seq_len;
  int ld;  // row stride of qkv / dqkv: 3C
  HeadOffsets head;
  QkvSlices<T> slices;
};

template <typename T>
__device__ __forceinline__ HeadContext<T> ContextOf(const T* qkv, const AttnShape& s) {
  const HeadOffsets head = HeadAt(s, blockIdx.x);
  return HeadContext<T>{s.seq_len, 3 * s.channels, head, SlicesAt(qkv, head, s)};
}

// Dynamic shared memory above the 48 KiB default needs opting in, per kernel.
template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// dsum[bh, i] = dout_i . out_i over the head's columns, one warp per (bh, i): the D_i of
// softmax backward (sum_j p_ij dp_ij = dout_i . sum_j p_ij v_j = dout_i . out_i).
// Grid: x = B * NH, y = ceil(T / warps per block).
template <typename T>
__global__ void RowDotKernel(float* dsum, const T* dout, const T* out, AttnShape s) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int i = blockIdx.y * (blockDim.x / kWarpSize) + warp;
  if (i >= s.seq_len) return;
  const HeadOffsets head = HeadAt(s, blockIdx.x);
  const size_t at = head.out + static_cast<size_t>(i) * s.channels;
  float acc = 0.0f;
  for (int d = lane; d < s.head_size; d += kWarpSize) {
    acc = fmaf(ToFloat(dout[at + d]), ToFloat(out[at + d]), acc);
  }
  acc = WarpSum(acc);
  if (lane == 0) dsum[head.row + i] = acc;
}

inline constexpr int kRowDotWarps = 8;

template <typename T>
cudaError_t LaunchRowDot(float* dsum, const T* dout, const T* out, const AttnShape& s,
                         cudaStream_t stream) {
  const dim3 grid(s.batch * s.heads, (s.seq_len + kRowDotWarps - 1) / kRowDotWarps);
  RowDotKernel<T><<<grid, kRowDotWarps * kWarpSize, 0, stream>>>(dsum, dout, out, s);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_ATTENTION_COMMON_CUH_
