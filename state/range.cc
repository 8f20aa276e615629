#include "state/range.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::state {

std::string RangeString(FlatRange range) {
  return absl::StrCat("[", range.begin, ", ", range.end, ")");
}

void SliceDoesNotFit(FlatRange range, size_t elements) {
  LOG(FATAL) << "Slice: " << RangeString(range) << " of " << elements << " elements";
}

FlatRange FullRange(const TensorTable& table) { return {0, table.total_elements()}; }

absl::Status CheckRange(const TensorTable& table, FlatRange range) {
  if (range.begin < 0 || range.begin > range.end || range.end > table.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("range ", RangeString(range),
                                                   " is not inside the flat index space ",
                                                   RangeString(FullRange(table))));
  }
  return absl::OkStatus();
}

std::vector<TensorPiece> PiecesInRange(const TensorTable& table, FlatRange range) {
  std::vector<TensorPiece> pieces;
  for (int i = 0; i < table.size(); ++i) {
    const TensorSpec& t = table.tensor(i);
    const int64_t begin = std::max(range.begin, t.offset);
    const int64_t end = std::min(range.end, t.offset + t.numel);
    if (begin < end) pieces.push_back({i, begin, end});
  }
  return pieces;
}

absl::Status CheckPlacement(const TensorTable& table, absl::Span<const PlacedRange> pieces,
                            int64_t local_elements) {
  int64_t flat_end = 0;
  std::vector<FlatRange> local;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PlacedRange& p = pieces[i];
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", i, " (", RangeString(p.range),
                                                     " at ", p.at, "): ", what));
    };
    if (absl::Status s = CheckRange(table, p.range); !s.ok()) return bad(std::string(s.message()));
    if (p.range.begin < flat_end) {
      return bad(absl::StrCat("overlaps or comes before the previous piece (ending at ",
                              flat_end, ")"));
    }
    flat_end = p.range.end;
    if (p.at < 0 || p.at + p.range.size() > local_elements) {
      return bad(absl::StrCat("its local span is not inside a buffer of ", local_elements,
                              " elements"));
    }
    if (p.range.size() > 0) local.push_back({p.at, p.at + p.range.size()});
  }
  std::sort(local.begin(), local.end(),
            [](FlatRange a, FlatRange b) { return a.begin < b.begin; });
  for (size_t i = 1; i < local.size(); ++i) {
    if (local[i].begin < local[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat("local spans ", RangeString(local[i - 1]),
                                                     " and ", RangeString(local[i]),
                                                     " overlap"));
    }
  }
  return absl::OkStatus();
}

int64_t PlacedElements(absl::Span<const PlacedRange> pieces) {
  int64_t n = 0;
  for (const PlacedRange& p : pieces) n += p.range.size();
  return n;
}

}  // namespace ringmaster::state
