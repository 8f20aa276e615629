// Which communicator reduces a rank's gradients (TrainConfig::backend, the spec's backend). NCCL needs device memory
// and one rank per GPU (it refuses two ranks on one GPU); the TCP backend takes anything,
// staging device buffers through host memory.
//
// Every rank contributes what it trains on — its GPU's UUID, or "" for the CPU — and
// GatherGpuIds all-gathers these over the host communicator, so every rank decides from
// the same list and all pick the same backend (a rank alone on NCCL would wait forever).
//
//   RM_ASSIGN_OR_RETURN(auto ids, GatherGpuIds(host_comm, my_uuid, deadline));
//   RM_ASSIGN_OR_RETURN(GradientBackendChoice c, ChooseGradientBackend(config.backend, ids));
//   if (c.nccl) ... CreateNcclGradients (train/device.h)
#ifndef RINGMASTER_TRAIN_GRADIENT_BACKEND_H_
#define RINGMASTER_TRAIN_GRADIENT_BACKEND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "train/config.h"

namespace ringmaster::train {

// The longest id GatherGpuIds carries (a UUID is 32 hex digits).
inline constexpr size_t kMaxGpuIdBytes = 64;

// Every rank's id, indexed by rank; `mine` is this rank's ("" for the CPU).
// INVALID_ARGUMENT when `mine` is longer than kMaxGpuIdBytes; else the collective's errors.
absl::StatusOr<std::vector<std::string>> GatherGpuIds(comm::Communicator& comm,
                                                      absl::string_view mine,
                                                      absl::Time deadline);

struct GradientBackendChoice {
  bool nccl = false;
  // Why, for the log: "every rank has its own GPU", "ranks 0 and 2 share a GPU (…)", ...
  std::string reason;
};

// backend auto: NCCL when every rank has its own GPU, else TCP. tcp: TCP. nccl: NCCL, or
// FAILED_PRECONDITION that names `backend` and the rank(s) that stop it.
absl::StatusOr<GradientBackendChoice> ChooseGradientBackend(TrainConfig::Backend backend,
                                                            absl::Span<const std::string> gpu_ids);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_GRADIENT_BACKEND_H_
