// Splitting a global batch over ranks and micro-batches, and the evaluation set over ranks.
//
// Every split is contiguous and balanced: part p of `count` items over `parts` parts is
// [begin, end) with sizes that differ by at most one, the earlier parts taking the extra
// item. Positions index GlobalBatch::indices (train/data/sampler.h), so the concatenation
// over ranks, in rank order, of their micro-batches, in order, is the global batch for
// every world size and accumulation count.
//
// Any global batch B works with any world size W: ranks get unequal shares when W does not
// divide B, and shares or micro-batches are empty when B < W * accumulation_steps. That is
// why the loss divisor is the global batch's count, not the rank's (train/model.h); a rank
// with an empty micro-batch skips its forward/backward but still takes part in the
// gradient all-reduce.
//
// Thread-safety: values and pure functions.
#ifndef RINGMASTER_TRAIN_DATA_PARTITION_H_
#define RINGMASTER_TRAIN_DATA_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster::train::data {

// The half-open range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  bool operator==(const Range&) const = default;
};

// Part `part` of [0, count) split into `parts` balanced contiguous ranges.
// CHECK-fails unless count >= 0, parts >= 1 and 0 <= part < parts (programming errors).
Range SplitEvenly(int64_t count, int64_t parts, int64_t part);

// Rank `rank`'s share of a global batch of `global_count` samples, as positions in it.
Range RankShare(int64_t global_count, int world_size, int rank);

// Micro-batch `micro` (0-based, of `accumulation_steps`) of a rank's share, as positions
// in the global batch.
Range MicroShare(Range rank_share, int accumulation_steps, int micro);

struct BatchPlanOptions {
  int64_t global_batch = 0;  // B, fixed by the job
  int world_size = 0;        // W, the current number of ranks
  // Set exactly one of the two:
  int64_t max_micro_batch = 0;  // m: the largest micro-batch one rank can run (memory)
  int accumulation_steps = 0;   // or the number of micro-batches per step, chosen directly
};

// How one training step of a global batch runs on the current world.
struct BatchPlan {
  int64_t global_batch = 0;
  int world_size = 0;
  // Micro-batches per rank and step: ceil(B / (W * m)) from max_micro_batch, the smallest
  // count that keeps every micro-batch within m; or the requested count.
  int accumulation_steps = 0;
  int64_t max_rank_share = 0;   // ceil(B / W): rank 0's share of a full global batch
  int64_t max_micro_batch = 0;  // ceil(max_rank_share / accumulation_steps): buffer size

  // Positions (in a global batch of `global_count` <= global_batch samples, e.g. the
  // short last batch of an epoch) of rank `rank`'s micro-batch `micro`.
  Range MicroBatch(int64_t global_count, int rank, int micro) const;
  std::string DebugString() const;  // "B=1000 W=3: 6 micro-batches of <= 56 per rank"
};

// INVALID_ARGUMENT naming the field when B < 1, W < 1, not exactly one of
// max_micro_batch / accumulation_steps is positive, or accumulation_steps > ceil(B / W)
// (every rank would run an empty micro-batch in every step).
absl::StatusOr<BatchPlan> PlanBatches(const BatchPlanOptions& options);

// Evaluation of a data set of `dataset_size` samples in their stored order: rank `rank` of
// `world_size` takes the contiguous share SplitEvenly(dataset_size, world_size, rank) and
// walks it in consecutive batches of at most `batch_size` samples (the last may be
// shorter; a rank with an empty share gets none). The trainer sums the ranks' correct counts
// with an all-reduce. CHECK-fails unless batch_size >= 1 and the rank/world are valid.
std::vector<Range> EvaluationBatches(int64_t dataset_size, int64_t batch_size, int world_size,
                                     int rank);

// begin, begin + 1, ..., end - 1: the sample indices of an evaluation batch, for
// Dataset::Gather.
std::vector<int64_t> RangeIndices(Range range);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_PARTITION_H_
