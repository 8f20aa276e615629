#include "train/data/partition.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::train::data {
namespace {

// For a >= 0, b >= 1, without the overflow of (a + b - 1) / b.
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

Range SplitEvenly(int64_t count, int64_t parts, int64_t part) {
  CHECK_GE(count, 0);
  CHECK_GE(parts, 1);
  CHECK(part >= 0 && part < parts) << "part " << part << " of " << parts;
  const int64_t base = count / parts;
  const int64_t extra = count % parts;
  const int64_t begin = part * base + std::min(part, extra);
  return Range{begin, begin + base + (part < extra ? 1 : 0)};
}

Range RankShare(int64_t global_count, int world_size, int rank) {
  return SplitEvenly(global_count, world_size, rank);
}

Range MicroShare(Range rank_share, int accumulation_steps, int micro) {
  const Range within = SplitEvenly(rank_share.size(), accumulation_steps, micro);
  return Range{rank_share.begin + within.begin, rank_share.begin + within.end};
}

Range BatchPlan::MicroBatch(int64_t global_count, int rank, int micro) const {
  CHECK_LE(global_count, global_batch);
  return MicroShare(RankShare(global_count, world_size, rank), accumulation_steps, micro);
}

std::string BatchPlan::DebugString() const {
  return absl::StrCat("B=", global_batch, " W=", world_size, ": ", accumulation_steps,
                      " micro-batches of <= ", max_micro_batch, " per rank");
}

absl::StatusOr<BatchPlan> PlanBatches(const BatchPlanOptions& options) {
  const int64_t b = options.global_batch;
  const int64_t w = options.world_size;
  if (b < 1) {
    return absl::InvalidArgumentError(absl::StrCat("global_batch ", b, " must be at least 1"));
  }
  if (w < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", w, " must be at least 1"));
  }
  if ((options.max_micro_batch > 0) == (options.accumulation_steps > 0) ||
      options.max_micro_batch < 0 || options.accumulation_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "set exactly one of max_micro_batch (", options.max_micro_batch,
        ") and accumulation_steps (", options.accumulation_steps, ") to a positive value"));
  }
  BatchPlan plan;
  plan.global_batch = b;
  plan.world_size = static_cast<int>(w);
  plan.max_rank_share = CeilDiv(b, w);
  // ceil(ceil(B / W) / m) == ceil(B / (W * m)), without overflowing W * m.
  const int64_t steps = options.max_micro_batch > 0
                            ? CeilDiv(plan.max_rank_share, options.max_micro_batch)
                            : options.accumulation_steps;
  if (steps > plan.max_rank_share) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accumulation_steps ", steps, " exceeds the largest rank share ", plan.max_rank_share,
        " (global_batch ", b, " over ", w, " ranks): micro-batches would be empty on every rank"));
  }
  plan.accumulation_steps = static_cast<int>(steps);
  plan.max_micro_batch = CeilDiv(plan.max_rank_share, steps);
  return plan;
}

std::vector<Range> EvaluationBatches(int64_t dataset_size, int64_t batch_size, int world_size,
                                     int rank) {
  CHECK_GE(batch_size, 1);
  const Range share = SplitEvenly(dataset_size, world_size, rank);
  std::vector<Range> batches;
  for (int64_t begin = share.begin; begin < share.end; begin += batch_size) {
    batches.push_back(Range{begin, std::min(begin + batch_size, share.end)});
  }
  return batches;
}

std::vector<int64_t> RangeIndices(Range range) {
  std::vector<int64_t> indices(static_cast<size_t>(range.size()));
  std::iota(indices.begin(), indices.end(), range.begin);
  return indices;
}

}  // namespace ringmaster::train::data
