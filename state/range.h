// Ranges of the flat index space.
//
// Under ZeRO each rank updates one contiguous range [begin, end) of a TensorTable's flat
// index space (its shard) and keeps optimizer state only for it; plain data parallelism is
// the range [0, total_elements). A range may cut a tensor in two (per-tensor quantities are
// then partial sums that train/optim/sum_across_ranks.h adds up over the ranks).
#ifndef RINGMASTER_STATE_RANGE_H_
#define RINGMASTER_STATE_RANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "state/tensor.h"

namespace ringmaster::state {

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

}  // namespace ringmaster::state

#endif  // RINGMASTER_STATE_RANGE_H_
