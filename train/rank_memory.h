// The memory one rank's training state needs, by the ZeRO paper's formula
// (train/memory_estimate.h): what the trainer checks the machine against before allocating
// it, and what ringctl fills resources.memory_per_rank_mib with.
#ifndef RINGMASTER_TRAIN_RANK_MEMORY_H_
#define RINGMASTER_TRAIN_RANK_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "state/tensor.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace ringmaster::train {

// What this rank keeps: fp32 parameters, fp32 gradients, and the optimizer's moments
// (sharded by ZeRO-1/2; gradients stay whole on the CPU).
MemoryEstimateOptions RankMemoryOptions(const TrainConfig& config, const state::TensorTable& table,
                                        int world);

// RESOURCE_EXHAUSTED, marked permanent, when the state the `local_ranks` ranks on this host
// keep in its memory (the gradients only when `gradients_on_host`) is more than the machine
// has: allocating it would fail, or the kernel would kill the process later.
absl::Status CheckHostMemory(const TrainConfig& config, const state::TensorTable& table, int world,
                             bool gradients_on_host, int local_ranks);

// Host memory one rank's training state needs (parameters, gradients, optimizer state) in a
// world of `world` ranks; the model is described, not allocated, and no data is read.
absl::StatusOr<int64_t> EstimateRankStateBytes(const TrainConfig& config, int world);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_RANK_MEMORY_H_
