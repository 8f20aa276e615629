// The memory one rank's training state needs, by the ZeRO paper's formula
// (train/memory_estimate.h) or, where the model is at hand, by the plan of its buffers
// (train/memory_plan.h): what the trainer checks the machine against before allocating it,
// and what ringctl fills resources.memory_per_rank_mib with.
#ifndef RINGMASTER_TRAIN_RANK_MEMORY_H_
#define RINGMASTER_TRAIN_RANK_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "state/tensor.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/model.h"

namespace ringmaster::train {

// What this rank keeps: fp32 parameters, fp32 gradients, and the optimizer's moments, as
// the ZeRO paper shards them: ZeRO-1 the optimizer state, ZeRO-2 also the gradients (the
// sharded strategy keeps only a rank's gradient shard, on the CPU too), ZeRO-3 also the
// parameters. train/memory_plan.h has the exact buffers; this is the formula for them.
MemoryEstimateOptions RankMemoryOptions(const TrainConfig& config, const state::TensorTable& table,
                                        int world);

// RESOURCE_EXHAUSTED, marked permanent, when the state the `local_ranks` ranks on this host
// keep in its memory (the gradients only when `gradients_on_host`) is more than the machine
// has: allocating it would fail, or the kernel would kill the process later. This form
// knows only the table, so it counts by the formula (RankMemoryOptions).
absl::Status CheckHostMemory(const TrainConfig& config, const state::TensorTable& table, int world,
                             bool gradients_on_host, int local_ranks);

// The same for the model's buffers as train/memory_plan.h plans them for config.zero_stage
// and config.fsdp.wrap: the parameter buffer and its compute copy, the gradients (when on
// the host), the optimizer state and the unit buffers (activations are not known yet). The
// error is also INVALID_ARGUMENT when the plan's is (a bad stage or prefetch_limit).
absl::Status CheckHostMemory(const TrainConfig& config, const Model& model, int world,
                             bool gradients_on_host, int local_ranks);

// Host memory one rank's training state needs (parameters, gradients, optimizer state) in a
// world of `world` ranks, by the formula (RankMemoryOptions) for config.zero_stage; the
// model is described, not allocated, and no data is read.
absl::StatusOr<int64_t> EstimateRankStateBytes(const TrainConfig& config, int world);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_RANK_MEMORY_H_
