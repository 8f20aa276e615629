// The kernels of kernels/cuda/rows.h: one block of kThreads per row, block reductions in
// shared memory in a fixed tree (deterministic), the CPU twins' formulas
// (kernels/cpu/layernorm.cc, kernels/cpu/softmax_xent.cc) operation by operation where the
// order of a sum does not decide. The kernels are templates over the activations' storage
// (float, __nv_bfloat16 or __half, kernels/cuda/bf16.cuh): the arithmetic is fp32 in all, and the
// float instantiations are the fp32 kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/rows_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr float kEpsilon = 1e-5f;  // kernels/layernorm.h kLayerNormEpsilon

// Sum of v over the block, the same fixed tree every time; every thread gets the result.
__device__ float BlockSum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();  // shared is reused by the next reduction
  return total;
}

// T: the storage of x and y (float, __nv_bfloat16 or __half); mean and rstd are fp32.
template <typename T>
__global__ void LayerNormForwardKernel(T* y, float* mean, float* rstd, const T* x,
                                       const float* gain, const float* bias, int64_t channels) {
  __shared__ float shared[kThreads];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * channels;
  T* yr = y + r * channels;
  const float inv_c = 1.0f / static_cast<float>(channels);
  float s = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) s += LoadF32(xr[c]);
  const float m = BlockSum(s, shared) * inv_c;
  float sq = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float d = LoadF32(xr[c]) - m;
    sq += d * d;
  }
  const float rs = 1.0f / sqrtf(BlockSum(sq, shared) * inv_c + kEpsilon);
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    StoreF32(&yr[c], (LoadF32(xr[c]) - m) * rs * gain[c] + bias[c]);
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx += rstd * (g - mean_c(g) - n * mean_c(g * n)), g = gain * dy, n = (x - mean) * rstd.
// T: the storage of dx, dy and x; for 16-bit T, dx = round(dx + the fp32 term).
template <typename T>
__global__ void LayerNormBackwardDxKernel(T* dx, const T* dy, const T* x, const float* gain,
                                          const float* mean, const float* rstd,
                                          int64_t channels) {
  __shared__ float shared[kThreads];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * channels;
  const T* dyr = dy + r * channels;
  T* dxr = dx + r * channels;
  const float m = mean[r];
  const float s = rstd[r];
  const float inv_c = 1.0f / static_cast<float>(channels);
  float g_sum = 0, gn_sum = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float g = gain[c] * LoadF32(dyr[c]);
    g_sum += g;
    gn_sum += g * (LoadF32(xr[c]) - m) * s;
  }
  const float g_mean = BlockSum(g_sum, shared) * inv_c;
  const float gn_mean = BlockSum(gn_sum, shared) * inv_c;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float n = (LoadF32(xr[c]) - m) * s;
    StoreF32(&dxr[c], LoadF32(dxr[c]) + s * (gain[c] * LoadF32(dyr[c]) - g_mean - n * gn_mean));
  }
}

// Partials of dgain and dbias: block (column tile, chunk) sums its chunk's rows in
// ascending order for each of its columns. T: the storage of dy and x.
template <typename T>
__global__ void LayerNormBackwardPartialKernel(float* partial_dgain, float* partial_dbias,
                                               const T* dy, const T* x, const float* mean,
                                               const float* rstd, int64_t rows,
                                               int64_t channels) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  const int64_t chunk = blockIdx.y;
  const int64_t per_chunk = (rows + kLayerNormChunks - 1) / kLayerNormChunks;
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < rows ? begin + per_chunk : rows;
  float dg = 0, db = 0;
  for (int64_t r = begin; r < end; ++r) {
    const float d = LoadF32(dy[r * channels + c]);
    dg += d * ((LoadF32(x[r * channels + c]) - mean[r]) * rstd[r]);
    db += d;
  }
  partial_dgain[chunk * channels + c] = dg;
  partial_dbias[chunk * channels + c] = db;
}

__global__ void LayerNormBackwardSumKernel(float* dgain, float* dbias, const float* partial_dgain,
                                           const float* partial_dbias, int64_t channels) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  float dg = 0, db = 0;
  for (int chunk = 0; chunk < kLayerNormChunks; ++chunk) {
    dg += partial_dgain[chunk * channels + c];
    db += partial_dbias[chunk * channels + c];
  }
  dgain[c] += dg;
  dbias[c] += db;
}

// The row maximum as kernels/cpu/softmax_xent.cc's scan finds it: the first NaN, else the
// first largest value. `Better` is that scan's choice between two candidates.
struct Candidate {
  float value;
  int32_t index;
};

__device__ bool Better(const Candidate& a, const Candidate& b) {
  const bool a_nan = isnan(a.value), b_nan = isnan(b.value);
  if (a_nan != b_nan) return a_nan;
  if (a_nan || a.value == b.value) return a.index < b.index;
  return a.value > b.value;
}

// T: the storage of logits and dlogits; loss is fp32. Rows are `stride` elements apart (>=
// classes); the logits' columns past `classes` are not read, dlogits' are written with zeros.
template <typename T>
__global__ void SoftmaxCrossEntropyKernel(const T* logits, const int32_t* labels, int64_t classes,
                                          int64_t stride, float scale, float* loss,
                                          int32_t* predicted, T* dlogits) {
  __shared__ float shared[kThreads];
  __shared__ Candidate best[kThreads];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * stride;
  Candidate mine{LoadF32(row[0]), 0};
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const Candidate c{LoadF32(row[j]), static_cast<int32_t>(j)};
    if (Better(c, mine)) mine = c;
  }
  best[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride && Better(best[threadIdx.x + stride], best[threadIdx.x])) {
      best[threadIdx.x] = best[threadIdx.x + stride];
    }
    __syncthreads();
  }
  const Candidate max = best[0];
  float s = 0;
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    s += expf(LoadF32(row[j]) - max.value);
  }
  const float sum = BlockSum(s, shared);
  const int32_t label = labels[i];
  if (dlogits != nullptr) {
    T* grad = dlogits + i * stride;
    const float factor = scale / sum;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
      const float g = expf(LoadF32(row[j]) - max.value) * factor;
      StoreF32(&grad[j], j == label ? g - scale : g);
    }
    for (int64_t j = classes + threadIdx.x; j < stride; j += blockDim.x) StoreF32(&grad[j], 0.0f);
  }
  if (threadIdx.x == 0) {
    predicted[i] = max.index;
    loss[i] = logf(sum) - (LoadF32(row[label]) - max.value);
  }
}

int ColumnBlocks(int64_t channels) { return static_cast<int>((channels + kThreads - 1) / kThreads); }

template <typename T>
cudaError_t LayerNormForward(T* y, float* mean, float* rstd, const T* x, const float* gain,
                             const float* bias, int64_t rows, int64_t channels,
                             cudaStream_t stream) {
  LayerNormForwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      y, mean, rstd, x, gain, bias, channels);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LayerNormBackward(T* dx, float* dgain, float* dbias, const T* dy, const T* x,
                              const float* gain, const float* mean, const float* rstd,
                              int64_t rows, int64_t channels, float* scratch,
                              cudaStream_t stream) {
  LayerNormBackwardDxKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      dx, dy, x, gain, mean, rstd, channels);
  float* partial_dgain = scratch;
  float* partial_dbias = scratch + kLayerNormChunks * channels;
  const dim3 grid(ColumnBlocks(channels), kLayerNormChunks);
  LayerNormBackwardPartialKernel<T><<<grid, kThreads, 0, stream>>>(
      partial_dgain, partial_dbias, dy, x, mean, rstd, rows, channels);
  LayerNormBackwardSumKernel<<<ColumnBlocks(channels), kThreads, 0, stream>>>(
      dgain, dbias, partial_dgain, partial_dbias, channels);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SoftmaxCrossEntropy(const T* logits, const int32_t* labels, int64_t n, int64_t classes,
                                int64_t stride, float scale, float* loss, int32_t* predicted,
                                T* dlogits, cudaStream_t stream) {
  SoftmaxCrossEntropyKernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      logits, labels, classes, stride, scale, loss, predicted, dlogits);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchLayerNormForward(float* y, float* mean, float* rstd, const float* x,
                                   const float* gain, const float* bias, int64_t rows,
                                   int64_t channels, cudaStream_t stream) {
  return LayerNormForward(y, mean, rstd, x, gain, bias, rows, channels, stream);
}

cudaError_t LaunchLayerNormForwardBf16(__nv_bfloat16* y, float* mean, float* rstd,
                                       const __nv_bfloat16* x, const float* gain,
                                       const float* bias, int64_t rows, int64_t channels,
                                       cudaStream_t stream) {
  return LayerNormForward(y, mean, rstd, x, gain, bias, rows, channels, stream);
}

cudaError_t LaunchLayerNormForwardF16(__half* y, float* mean, float* rstd, const __half* x,
                                      const float* gain, const float* bias, int64_t rows,
                                      int64_t channels, cudaStream_t stream) {
  return LayerNormForward(y, mean, rstd, x, gain, bias, rows, channels, stream);
}

cudaError_t LaunchLayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                                    const float* x, const float* gain, const float* mean,
                                    const float* rstd, int64_t rows, int64_t channels,
                                    float* scratch, cudaStream_t stream) {
  return LayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch,
                           stream);
}

cudaError_t LaunchLayerNormBackwardBf16(__nv_bfloat16* dx, float* dgain, float* dbias,
                                        const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                        const float* gain, const float* mean, const float* rstd,
                                        int64_t rows, int64_t channels, float* scratch,
                                        cudaStream_t stream) {
  return LayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch,
                           stream);
}

cudaError_t LaunchLayerNormBackwardF16(__half* dx, float* dgain, float* dbias, const __half* dy,
                                       const __half* x, const float* gain, const float* mean,
                                       const float* rstd, int64_t rows, int64_t channels,
                                       float* scratch, cudaStream_t stream) {
  return LayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch,
                           stream);
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n,
                                      int64_t classes, int64_t stride, float scale, float* loss,
                                      int32_t* predicted, float* dlogits, cudaStream_t stream) {
  return SoftmaxCrossEntropy(logits, labels, n, classes, stride, scale, loss, predicted, dlogits,
                             stream);
}

cudaError_t LaunchSoftmaxCrossEntropyBf16(const __nv_bfloat16* logits, const int32_t* labels,
                                          int64_t n, int64_t classes, int64_t stride, float scale,
                                          float* loss, int32_t* predicted, __nv_bfloat16* dlogits,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropy(logits, labels, n, classes, stride, scale, loss, predicted, dlogits,
                             stream);
}

cudaError_t LaunchSoftmaxCrossEntropyF16(const __half* logits, const int32_t* labels, int64_t n,
                                         int64_t classes, int64_t stride, float scale, float* loss,
                                         int32_t* predicted, __half* dlogits, cudaStream_t stream) {
  return SoftmaxCrossEntropy(logits, labels, n, classes, stride, scale, loss, predicted, dlogits,
                             stream);
}

}  // namespace ringmaster::kernels::cuda::internal
