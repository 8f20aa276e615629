#include "train/init_from.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpoint/weights.h"
#include "common/status_macros.h"

namespace ringmaster::train {

absl::Status LoadInitialWeights(const InitFromOptions& o) {
  const state::TensorTable& table = *o.table;
  std::vector<state::PlacedRange> pieces = o.pieces;
  if (pieces.empty()) pieces.push_back(state::InPlace(state::FullRange(table)));
  if (absl::Status s = state::CheckPlacement(table, pieces, o.params->size()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("init_from: ", s.message()));
  }
  const absl::Span<float> params = o.params->span();
  auto receive = [&](int i, absl::Span<const float> values) {
    const state::TensorSpec& t = table.tensor(i);
    const int64_t end = t.offset + t.numel;
    for (const state::PlacedRange& p : pieces) {
      const int64_t lo = std::max(t.offset, p.range.begin);
      const int64_t hi = std::min(end, p.range.end);
      if (lo >= hi) continue;
      std::copy(values.begin() + (lo - t.offset), values.begin() + (hi - t.offset),
                params.begin() + p.at + (lo - p.range.begin));
    }
    return absl::OkStatus();
  };
  const absl::Status s = checkpoint::ReadWeights(o.path, table, receive, o.env, o.say);
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat("init_from: ", s.message()));
  if (absl::IsNotFound(s) || absl::IsDataLoss(s)) return MarkNodeLocal(out);
  if (absl::IsFailedPrecondition(s) || absl::IsInvalidArgument(s)) return MarkPermanent(out);
  return out;
}

}  // namespace ringmaster::train
