// The kernels of kernels/cuda/rows.h: one block of kThreads per row, block reductions in
// shared memory in a fixed tree (deterministic), the CPU twins' formulas
// (kernels/cpu/layernorm.cc, kernels/cpu/softmax_xent.cc) operation by operation where the
// order of a sum does not decide.
#include <cuda_runtime.h>

#include <cstdint>

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

__global__ void LayerNormForwardKernel(float* y, float* mean, float* rstd, const float* x,
                                       const float* gain, const float* bias, int64_t channels) {
  __shared__ float shared[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * channels;
  float* yr = y + r * channels;
  const float inv_c = 1.0f / static_cast<float>(channels);
  float s = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) s += xr[c];
  const float m = BlockSum(s, shared) * inv_c;
  float sq = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float d = xr[c] - m;
    sq += d * d;
  }
  const float rs = 1.0f / sqrtf(BlockSum(sq, shared) * inv_c + kEpsilon);
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    yr[c] = (xr[c] - m) * rs * gain[c] + bias[c];
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx += rstd * (g - mean_c(g) - n * mean_c(g * n)), g = gain * dy, n = (x - mean) * rstd.
__global__ void LayerNormBackwardDxKernel(float* dx, const float* dy, const float* x,
                                          const float* gain, const float* mean,
                                          const float* rstd, int64_t channels) {
  __shared__ float shared[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * channels;
  const float* dyr = dy + r * channels;
  float* dxr = dx + r * channels;
  const float m = mean[r];
  const float s = rstd[r];
  const float inv_c = 1.0f / static_cast<float>(channels);
  float g_sum = 0, gn_sum = 0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float g = gain[c] * dyr[c];
    g_sum += g;
    gn_sum += g * (xr[c] - m) * s;
  }
  const float g_mean = BlockSum(g_sum, shared) * inv_c;
  const float gn_mean = BlockSum(gn_sum, shared) * inv_c;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const float n = (xr[c] - m) * s;
    dxr[c] += s * (gain[c] * dyr[c] - g_mean - n * gn_mean);
  }
}

// Partials of dgain and dbias: block (column tile, chunk) sums its chunk's rows in
// ascending order for each of its columns.
__global__ void LayerNormBackwardPartialKernel(float* partial_dgain, float* partial_dbias,
                                               const float* dy, const float* x,
                                               const float* mean, const float* rstd,
                                               int64_t rows, int64_t channels) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= channels) return;
  const int64_t chunk = blockIdx.y;
  const int64_t per_chunk = (rows + kLayerNormChunks - 1) / kLayerNormChunks;
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < rows ? begin + per_chunk : rows;
  float dg = 0, db = 0;
  for (int64_t r = begin; r < end; ++r) {
    const float d = dy[r * channels + c];
    dg += d * ((x[r * channels + c] - mean[r]) * rstd[r]);
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

__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels,
                                          int64_t classes, float scale, float* loss,
                                          int32_t* predicted, float* dlogits) {
  __shared__ float shared[kThreads];
  __shared__ Candidate best[kThreads];
  const int64_t i = blockIdx.x;
  const float* row = logits + i * classes;
  Candidate mine{row[0], 0};
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const Candidate c{row[j], static_cast<int32_t>(j)};
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
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) s += expf(row[j] - max.value);
  const float sum = BlockSum(s, shared);
  const int32_t label = labels[i];
  if (dlogits != nullptr) {
    float* grad = dlogits + i * classes;
    const float factor = scale / sum;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
      const float g = expf(row[j] - max.value) * factor;
      grad[j] = j == label ? g - scale : g;
    }
  }
  if (threadIdx.x == 0) {
    predicted[i] = max.index;
    loss[i] = logf(sum) - (row[label] - max.value);
  }
}

int ColumnBlocks(int64_t channels) { return static_cast<int>((channels + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchLayerNormForward(float* y, float* mean, float* rstd, const float* x,
                                   const float* gain, const float* bias, int64_t rows,
                                   int64_t channels, cudaStream_t stream) {
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      y, mean, rstd, x, gain, bias, channels);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                                    const float* x, const float* gain, const float* mean,
                                    const float* rstd, int64_t rows, int64_t channels,
                                    float* scratch, cudaStream_t stream) {
  LayerNormBackwardDxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      dx, dy, x, gain, mean, rstd, channels);
  float* partial_dgain = scratch;
  float* partial_dbias = scratch + kLayerNormChunks * channels;
  const dim3 grid(ColumnBlocks(channels), kLayerNormChunks);
  LayerNormBackwardPartialKernel<<<grid, kThreads, 0, stream>>>(partial_dgain, partial_dbias, dy,
                                                                x, mean, rstd, rows, channels);
  LayerNormBackwardSumKernel<<<ColumnBlocks(channels), kThreads, 0, stream>>>(
      dgain, dbias, partial_dgain, partial_dbias, channels);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n,
                                      int64_t classes, float scale, float* loss,
                                      int32_t* predicted, float* dlogits, cudaStream_t stream) {
  SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      logits, labels, classes, scale, loss, predicted, dlogits);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
