#include "comm/nccl/gpu_per_rank.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"

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

std::vector<RankResult> RunNcclRanks(int ranks, const std::string& prefix, absl::Duration timeout,
                                     const NcclRankFn& fn) {
  const std::string dir = FreshStoreDir();
  MultiProcOptions options;
  options.world_size = ranks;
  options.timeout = timeout;
  return RunRanks(options, [&](TcpCommunicator& tcp, absl::Duration*) -> absl::Status {
    const int device = UseOwnGpu(tcp.rank());
    RM_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Create({dir}));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                        NcclCommunicator::Create({.rank = tcp.rank(),
                                                  .size = ranks,
                                                  .store = store.get(),
                                                  .prefix = prefix,
                                                  .device = device}));
    return fn(*nccl, tcp);
  });
}

}  // namespace ringmaster::comm::testing
