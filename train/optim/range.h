// Ranges of the flat index space, and the "sum across ranks" hook.
//
// Under ZeRO each rank updates one contiguous range [begin, end) of a TensorTable's flat
// index space (its shard) and keeps optimizer state only for it; plain data parallelism is
// the range [0, total_elements). A range may cut a tensor in two, so per-tensor quantities
// (LAMB's trust ratio, the global gradient norm) are computed as local partial sums that
// the caller's SumAcrossRanks adds up over the ranks.
#ifndef RINGMASTER_TRAIN_OPTIM_RANGE_H_
#define RINGMASTER_TRAIN_OPTIM_RANGE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "train/tensor.h"

namespace ringmaster::train {

// Flat indices [begin, end).
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

std::string RangeString(FlatRange range);  // "[begin, end)"

// [0, table.total_elements()).
FlatRange FullRange(const TensorTable& table);

// OK when 0 <= begin <= end <= table.total_elements(); INVALID_ARGUMENT otherwise.
absl::Status CheckRange(const TensorTable& table, FlatRange range);

// The part of `all` (a span of the whole flat index space) inside `range`. CHECK-fails when
// the range does not fit.
[[noreturn]] void SliceDoesNotFit(FlatRange range, size_t elements);  // LOG(FATAL)
template <typename T>
absl::Span<T> Slice(absl::Span<T> all, FlatRange range) {
  if (!(range.begin >= 0 && range.begin <= range.end &&
        range.end <= static_cast<int64_t>(all.size()))) {
    SliceDoesNotFit(range, all.size());
  }
  return all.subspan(range.begin, range.size());
}

// One tensor's elements inside a range: flat indices [begin, end) of tensor `tensor`.
struct TensorPiece {
  int tensor = 0;
  int64_t begin = 0;
  int64_t end = 0;

  bool operator==(const TensorPiece&) const = default;
};

// The non-empty pieces of the table's tensors inside `range`, in flat order (padding
// between tensors belongs to none).
std::vector<TensorPiece> PiecesInRange(const TensorTable& table, FlatRange range);

// Sums `values` element-wise across the ranks of the data-parallel group, in place. Every
// rank calls it at the same point with a span of the same length and receives the same
// totals; it blocks until all ranks have contributed (the trainer implements it with an
// all-reduce under the collective's deadline). An error (ABORTED when the group broke,
// DEADLINE_EXCEEDED) is returned to the caller of the operation that needed the sum.
using SumAcrossRanks = std::function<absl::Status(absl::Span<double> values)>;

// The hook for a group of one rank: the local sums are already the totals.
absl::Status SumOnOneRank(absl::Span<double> values);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_RANGE_H_
