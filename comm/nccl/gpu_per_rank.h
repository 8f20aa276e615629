// For tests that fork NCCL ranks (testonly, --config=cuda builds): whether every rank can
// have a GPU of its own, and giving it one. Under --config=cudaemu each process has its own
// emulated GPU (tools/cuda_emu: the one CUDA_VISIBLE_DEVICES names), so any number of ranks
// can; on real GPUs a rank uses the GPU of its rank's ordinal.
#ifndef RINGMASTER_COMM_NCCL_GPU_PER_RANK_H_
#define RINGMASTER_COMM_NCCL_GPU_PER_RANK_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/testing/multiproc.h"

namespace ringmaster::comm::testing {

// Whether `ranks` forked ranks can each have a GPU. Asks in a forked child: the caller, which
// forks the ranks, must never initialise CUDA itself (CUDA does not survive fork).
bool GpuPerRankAvailable(int ranks);

// In a forked rank, before its first CUDA call: gives it its own GPU and returns the CUDA
// ordinal that is that GPU in this process.
int UseOwnGpu(int rank);

// Forks `ranks` ranks (RunRanks), each with a GPU of its own (UseOwnGpu) and an NCCL
// communicator over all of them, bootstrapped through a FileStore in a fresh directory under
// keys `prefix`, and runs `fn(nccl, tcp)` on each (`tcp`: the rank's TCP communicator, for
// host collectives). The ranks' results, as RunRanks's; the caller checks GpuPerRankAvailable
// first.
using NcclRankFn = std::function<absl::Status(NcclCommunicator& nccl, TcpCommunicator& tcp)>;
std::vector<RankResult> RunNcclRanks(int ranks, const std::string& prefix, absl::Duration timeout,
                                     const NcclRankFn& fn);

}  // namespace ringmaster::comm::testing

#endif  // RINGMASTER_COMM_NCCL_GPU_PER_RANK_H_
