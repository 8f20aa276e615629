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

// A part of the flat index space kept in a rank's local buffer: flat indices `range` at
// local offsets [at, at + range.size()). Under ZeRO-2/3 (train/fsdp_layout.h) a rank holds
// one such piece of every wrapping unit, back to back in its shard buffer, so the flat
// index space and the local buffer differ; under ZeRO-0/1 the one piece is {range, at =
// range.begin} of a buffer as large as the flat space.
struct PlacedRange {
  FlatRange range;
  int64_t at = 0;

  bool operator==(const PlacedRange&) const = default;
};

// The one piece that keeps `range` at its own flat offsets.
inline PlacedRange InPlace(FlatRange range) { return {range, range.begin}; }

// OK when the pieces' ranges are inside the table's flat space, in increasing order and
// disjoint, and their local spans are disjoint and inside [0, local_elements);
// INVALID_ARGUMENT naming the first piece that is not.
absl::Status CheckPlacement(const TensorTable& table, absl::Span<const PlacedRange> pieces,
                            int64_t local_elements);

// Elements of the pieces' ranges together.
int64_t PlacedElements(absl::Span<const PlacedRange> pieces);

}  // namespace ringmaster::state

#endif  // RINGMASTER_STATE_RANGE_H_
