#include "comm/nccl/gpu_per_rank.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "comm/testing/multiproc.h"

namespace ringmaster::comm::testing {

#ifdef RINGMASTER_CUDA_EMU
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

bool GpuPerRankAvailable(int ranks) {
  if (kEmulated) return true;
  return RunInChild([] {
           int n = 0;
           return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
         }) >= ranks;
}

int UseOwnGpu(int rank) {
  if (!kEmulated) return rank;
  setenv("CUDA_VISIBLE_DEVICES", std::to_string(rank).c_str(), 1);
  return 0;
}

}  // namespace ringmaster::comm::testing
