// The kernels of kernels/cuda/conv.h (layouts in conv_launch.h): grid-stride loops over
// int64 indices, one output element per thread and iteration, each written by exactly one
// thread and summed in a fixed order, so every result is the same bits on every run. No
// shared memory, no atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/conv_launch.h"
#include "kernels/cuda/grid.cuh"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = kGridStrideThreads;


// columns [channels * k * k, batch * hw] from x [batch, channels, height, width]: one thread
// per column entry, so the writes are coalesced along the image positions.
__global__ void Im2ColKernel(const float* x, float* columns, int64_t batch, int64_t channels,
                             int64_t height, int64_t width, int64_t k, int64_t total) {
  const int64_t hw = height * width, positions = batch * hw, kk = k * k, pad = k / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / positions, column = i - row * positions;
    const int64_t n = column / hw, p = column - n * hw;
    const int64_t y = p / width, xo = p - y * width;
    const int64_t c = row / kk, tap = row - c * kk;
    const int64_t ky = tap / k, kx = tap - ky * k;
    const int64_t iy = y + ky - pad, ix = xo + kx - pad;
    const bool inside = iy >= 0 && iy < height && ix >= 0 && ix < width;
    columns[i] = inside ? x[((n * channels + c) * height + iy) * width + ix] : 0.0f;
  }
}

// dx [batch, channels, height, width] = the adjoint of Im2ColKernel: input (n, c, iy, ix)
// was copied to row (c, ky, kx), column (n, iy + pad - ky, ix + pad - kx) wherever that
// output position lies in the image; those entries are summed, ky then kx ascending.
__global__ void Col2ImKernel(const float* columns, float* dx, int64_t batch, int64_t channels,
                             int64_t height, int64_t width, int64_t k, int64_t total) {
  const int64_t hw = height * width, positions = batch * hw, pad = k / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ix = i % width, t = i / width;
    const int64_t iy = t % height, image_channel = t / height;
    const int64_t c = image_channel % channels, n = image_channel / channels;
    const float* column_base = columns + n * hw;
    float sum = 0.0f;
    for (int64_t ky = 0; ky < k; ++ky) {
      const int64_t y = iy + pad - ky;
      if (y < 0 || y >= height) continue;
      for (int64_t kx = 0; kx < k; ++kx) {
        const int64_t xo = ix + pad - kx;
        if (xo < 0 || xo >= width) continue;
        sum += column_base[((c * k + ky) * k + kx) * positions + y * width + xo];
      }
    }
    dx[i] = sum;
  }
}

// out [channels, batch * hw] from in [batch, channels, hw]; one thread per output element.
__global__ void ImagesToChannelMajorKernel(const float* in, float* out, int64_t batch,
                                           int64_t channels, int64_t hw, int64_t total) {
  const int64_t positions = batch * hw;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i / positions, column = i - c * positions;
    const int64_t n = column / hw, p = column - n * hw;
    out[i] = in[(n * channels + c) * hw + p];
  }
}

// out [batch, channels, hw] from in [channels, batch * hw], plus bias[c] when there is one;
// one thread per output element.
__global__ void ChannelMajorToImagesKernel(const float* in, const float* bias, float* out,
                                           int64_t batch, int64_t channels, int64_t hw,
                                           int64_t total) {
  const int64_t positions = batch * hw;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i % hw, image_channel = i / hw;
    const int64_t c = image_channel % channels, n = image_channel / channels;
    const float v = in[c * positions + n * hw + p];
    out[i] = bias != nullptr ? v + bias[c] : v;
  }
}

// partial[c * kChannelSumLanes + lane] = rows[c, lane] + rows[c, lane + lanes] + ..., in
// that order. Neighbouring threads read neighbouring elements of a row.
__global__ void ChannelSumPartialKernel(const float* rows, int64_t length, float* partial,
                                        int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i / kChannelSumLanes, lane = i - c * kChannelSumLanes;
    const float* row = rows + c * length;
    float sum = 0.0f;
    for (int64_t j = lane; j < length; j += kChannelSumLanes) sum += row[j];
    partial[i] = sum;
  }
}

// sums[c] (+)= the lanes of channel c, lane 0 first.
__global__ void ChannelSumFinalKernel(const float* partial, int64_t channels, float* sums,
                                      bool accumulate) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels;
       c += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int lane = 0; lane < kChannelSumLanes; ++lane) sum += partial[c * kChannelSumLanes + lane];
    sums[c] = accumulate ? sums[c] + sum : sum;
  }
}

// kernels/cpu/conv.cc's PoolKey: an integer that orders floats as max-pooling does: by
// value, -0 below +0, and every NaN above everything.
__device__ __forceinline__ int32_t PoolKey(float v) {
  const int32_t u = __float_as_int(v);
  const int32_t ordered = u >= 0 ? u : u ^ 0x7fffffff;
  return (u & 0x7fffffff) > 0x7f800000 ? 0x7fffffff : ordered;
}

struct PoolBest {
  float value;
  int32_t key;
  int32_t at;
};

// A later window element wins only if it is strictly greater: ties keep the first.
__device__ __forceinline__ void TakeIfGreater(float v, int32_t at, PoolBest& best) {
  const int32_t key = PoolKey(v);
  if (key > best.key) best = PoolBest{v, key, at};
}

// One thread per output: the window in row-major order, as the CPU scans it.
__global__ void MaxPool2x2ForwardKernel(const float* x, float* y, int32_t* argmax, int64_t height,
                                        int64_t width, int64_t total) {
  const int64_t out_h = height / 2, out_w = width / 2;
  const int32_t w = static_cast<int32_t>(width);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % out_w, t = i / out_w;
    const int64_t oy = t % out_h, plane = t / out_h;
    const float* in = x + plane * height * width;
    const int32_t at = static_cast<int32_t>(2 * oy * width + 2 * ox);
    PoolBest best{in[at], PoolKey(in[at]), at};
    TakeIfGreater(in[at + 1], at + 1, best);
    TakeIfGreater(in[at + w], at + w, best);
    TakeIfGreater(in[at + w + 1], at + w + 1, best);
    y[i] = best.value;
    argmax[i] = best.at;
  }
}

// One thread per input element (a gather, so every element of dx is written and no two
// threads write one place): dy of its window if the window's argmax names it, else 0; 0 in
// a dropped last row or column.
__global__ void MaxPool2x2BackwardKernel(const float* dy, const int32_t* argmax, float* dx,
                                         int64_t height, int64_t width, int64_t total) {
  const int64_t out_h = height / 2, out_w = width / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ix = i % width, t = i / width;
    const int64_t iy = t % height, plane = t / height;
    const int64_t oy = iy / 2, ox = ix / 2;
    float g = 0.0f;
    if (oy < out_h && ox < out_w) {
      const int64_t k = (plane * out_h + oy) * out_w + ox;
      if (argmax[k] == iy * width + ix) g = dy[k];
    }
    dx[i] = g;
  }
}

}  // namespace

cudaError_t LaunchIm2Col(const float* x, float* columns, int64_t batch, int64_t channels,
                         int64_t height, int64_t width, int64_t kernel_size, cudaStream_t stream) {
  const int64_t total = channels * kernel_size * kernel_size * batch * height * width;
  Im2ColKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(x, columns, batch, channels, height,
                                                          width, kernel_size, total);
  return cudaGetLastError();
}

cudaError_t LaunchCol2Im(const float* columns, float* dx, int64_t batch, int64_t channels,
                         int64_t height, int64_t width, int64_t kernel_size, cudaStream_t stream) {
  const int64_t total = batch * channels * height * width;
  Col2ImKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(columns, dx, batch, channels, height,
                                                          width, kernel_size, total);
  return cudaGetLastError();
}

cudaError_t LaunchImagesToChannelMajor(const float* in, float* out, int64_t batch, int64_t channels,
                                       int64_t hw, cudaStream_t stream) {
  const int64_t total = batch * channels * hw;
  ImagesToChannelMajorKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(in, out, batch, channels,
                                                                        hw, total);
  return cudaGetLastError();
}

cudaError_t LaunchChannelMajorToImages(const float* in, const float* bias, float* out,
                                       int64_t batch, int64_t channels, int64_t hw,
                                       cudaStream_t stream) {
  const int64_t total = batch * channels * hw;
  ChannelMajorToImagesKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(in, bias, out, batch,
                                                                        channels, hw, total);
  return cudaGetLastError();
}

cudaError_t LaunchChannelSums(const float* rows, int64_t channels, int64_t length, float* sums,
                              bool accumulate, float* partial, cudaStream_t stream) {
  const int64_t lanes = channels * kChannelSumLanes;
  ChannelSumPartialKernel<<<GridStrideBlocks(lanes), kThreads, 0, stream>>>(rows, length, partial, lanes);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ChannelSumFinalKernel<<<GridStrideBlocks(channels), kThreads, 0, stream>>>(partial, channels, sums,
                                                                      accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes,
                                    int64_t height, int64_t width, cudaStream_t stream) {
  const int64_t total = planes * (height / 2) * (width / 2);
  if (total == 0) return cudaSuccess;  // a plane of one row or column pools to nothing
  MaxPool2x2ForwardKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(x, y, argmax, height, width,
                                                                     total);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx,
                                     int64_t planes, int64_t height, int64_t width,
                                     cudaStream_t stream) {
  const int64_t total = planes * height * width;
  MaxPool2x2BackwardKernel<<<GridStrideBlocks(total), kThreads, 0, stream>>>(dy, argmax, dx, height, width,
                                                                      total);
  return cudaGetLastError();
}

}  // namespace ringmaster::kernels::cuda::internal
