#include "train/gradient_backend.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace ringmaster::train {

absl::StatusOr<std::vector<std::string>> GatherGpuIds(comm::Communicator& comm,
                                                      absl::string_view mine,
                                                      absl::Time deadline) {
  if (mine.size() > kMaxGpuIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a GPU id of ", mine.size(),
                                                   " bytes; the most is ", kMaxGpuIdBytes));
  }
  // One fixed record per rank: a length byte, then the id.
  constexpr size_t kRecord = kMaxGpuIdBytes + 1;
  std::vector<uint8_t> send(kRecord, 0), all(kRecord * comm.size(), 0);
  send[0] = static_cast<uint8_t>(mine.size());
  std::memcpy(send.data() + 1, mine.data(), mine.size());
  RM_RETURN_IF_ERROR(comm.AllGather(send.data(), all.data(), kRecord, DataType::kUint8, deadline));
  std::vector<std::string> ids(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const uint8_t* record = all.data() + r * kRecord;
    const size_t n = record[0];
    if (n > kMaxGpuIdBytes) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a GPU id of ", n, " bytes"));
    }
    ids[r].assign(reinterpret_cast<const char*>(record + 1), n);
  }
  return ids;
}

absl::StatusOr<GradientBackendChoice> ChooseGradientBackend(
    TrainConfig::Backend backend, absl::Span<const std::string> gpu_ids) {
  GradientBackendChoice choice;
  if (backend == TrainConfig::Backend::kTcp) {
    choice.reason = "backend: tcp";
    return choice;
  }
  // What stops NCCL, if anything: a rank on the CPU, or two ranks on one GPU.
  std::string obstacle;
  std::map<std::string, int> first_rank_on;
  for (int r = 0; r < static_cast<int>(gpu_ids.size()) && obstacle.empty(); ++r) {
    if (gpu_ids[r].empty()) {
      obstacle = absl::StrCat("rank ", r, " trains on the CPU");
      continue;
    }
    auto [it, fresh] = first_rank_on.emplace(gpu_ids[r], r);
    if (!fresh) {
      obstacle = absl::StrCat("ranks ", it->second, " and ", r, " share GPU ", gpu_ids[r]);
    }
  }
  if (gpu_ids.empty()) obstacle = "no ranks";
  if (obstacle.empty()) {
    choice.nccl = true;
    choice.reason = gpu_ids.size() == 1 ? "the rank has a GPU" : "every rank has its own GPU";
    return choice;
  }
  if (backend == TrainConfig::Backend::kNccl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend: nccl needs every rank on its own GPU, but ", obstacle,
        "; give each rank a GPU (as many slots as GPUs per node) or set backend: auto or tcp"));
  }
  choice.reason = obstacle;
  return choice;
}

}  // namespace ringmaster::train
