// The bias gradient of kernels/cuda/matmul.h: column sums of dy without atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/matmul_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowLanes = 8;

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }

// Block (32 columns x 8 row lanes) over chunk blockIdx.y of the rows: lane ty sums rows
// ty, ty + 8, ... of the chunk in order, then the 8 lanes are summed in order.
template <typename T>
__global__ void BiasGradientPartialKernel(const T* dy, int64_t rows, int64_t columns,
                                          int64_t chunk_rows, float* partial) {
  __shared__ float sums[kRowLanes][kColumnsPerBlock];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t end = min(rows, begin + chunk_rows);
  float sum = 0.0f;
  if (column < columns) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      sum += Load(dy + r * columns + column);
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < columns) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += sums[lane][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * columns + column] = total;
  }
}

__global__ void BiasGradientSumKernel(const float* partial, int64_t columns, float* dbias,
                                      bool accumulate) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= columns) return;
  float total = 0.0f;
  for (int chunk = 0; chunk < kBiasGradientChunks; ++chunk) {
    total += partial[static_cast<int64_t>(chunk) * columns + column];
  }
  dbias[column] = accumulate ? dbias[column] + total : total;
}

template <typename T>
cudaError_t Launch(const T* dy, int64_t rows, int64_t columns, float* dbias, bool accumulate,
                   float* scratch, cudaStream_t stream) {
  const int64_t chunk_rows = (rows + kBiasGradientChunks - 1) / kBiasGradientChunks;
  const dim3 grid(static_cast<unsigned>((columns + kColumnsPerBlock - 1) / kColumnsPerBlock),
                  kBiasGradientChunks);
  BiasGradientPartialKernel<T>
      <<<grid, dim3(kColumnsPerBlock, kRowLanes), 0, stream>>>(dy, rows, columns, chunk_rows,
                                                               scratch);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kThreads = 256;
  BiasGradientSumKernel<<<static_cast<unsigned>((columns + kThreads - 1) / kThreads), kThreads,
                          0, stream>>>(scratch, columns, dbias, accumulate);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBiasGradient(int element, const void* dy, int64_t rows, int64_t columns,
                               float* dbias, bool accumulate, float* scratch,
                               cudaStream_t stream) {
  switch (element) {
    case 0:
      return Launch(static_cast<const float*>(dy), rows, columns, dbias, accumulate, scratch,
                    stream);
    case 1:
      return Launch(static_cast<const __nv_bfloat16*>(dy), rows, columns, dbias, accumulate,
                    scratch, stream);
    case 2:
      return Launch(static_cast<const __half*>(dy), rows, columns, dbias, accumulate, scratch,
                    stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ringmaster::kernels::cuda::internal
