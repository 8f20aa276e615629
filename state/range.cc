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

}  // namespace ringmaster::state
