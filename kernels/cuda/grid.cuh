// Internal to the CUDA kernels (.cu files only): the launch shape of a grid-stride loop.
#ifndef RINGMASTER_KERNELS_CUDA_GRID_CUH_
#define RINGMASTER_KERNELS_CUDA_GRID_CUH_

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// Threads per block of the element-wise kernels.
inline constexpr int kGridStrideThreads = 256;

// Blocks for n elements at kGridStrideThreads each, at least 1 and at most 65536: enough to
// fill an H100 several times over; the kernels' loops stride over the rest.
inline int GridStrideBlocks(int64_t n) {
  const int64_t blocks = (n + kGridStrideThreads - 1) / kGridStrideThreads;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_GRID_CUH_
