#include "train/tensor_places.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ringmaster::train {

absl::Status AppendTensorPlaces(const nn::GptModel& part, const state::TensorTable& whole_table,
                                int64_t base, bool tensor_parallel,
                                std::vector<TensorPlace>* places) {
  const state::TensorTable& table = part.table();
  for (int i = 0; i < table.size(); ++i) {
    const state::TensorSpec& t = table.tensor(i);
    const nn::TensorShard& shard = part.shard(i);
    absl::StatusOr<int> index = whole_table.Find(t.name);
    if (!index.ok() || whole_table.tensor(*index).numel != shard.whole_rows * shard.whole_cols) {
      return absl::InternalError(
          absl::StrCat("tensor ", t.name, " is not a part of the whole model's"));
    }
    const state::TensorSpec& whole = whole_table.tensor(*index);
    if (shard.whole()) {
      const bool tied_copy = part.options().tied_head && !part.has_embeddings() && t.name == "wte";
      places->push_back({{whole.offset, whole.offset + whole.numel},
                         base + t.offset,
                         tensor_parallel,
                         tied_copy});
      continue;
    }
    // Each of its rows of the whole tensor, cut to its columns, is a run (consecutive whole
    // rows make one).
    int64_t local = base + t.offset;
    const int64_t width = shard.col_end - shard.col_begin;
    for (const auto& [lo, hi] : shard.row_ranges) {
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t begin = whole.offset + row * shard.whole_cols + shard.col_begin;
        TensorPlace* last = places->empty() ? nullptr : &places->back();
        if (last != nullptr && !last->replicated && last->whole.end == begin &&
            last->local + last->whole.size() == local) {
          last->whole.end += width;
        } else {
          places->push_back({{begin, begin + width}, local, false});
        }
        local += width;
      }
    }
  }
  return absl::OkStatus();
}

std::vector<state::PlacedRange> MapTensorPlaces(const std::vector<TensorPlace>& places,
                                                state::FlatRange local, int64_t origin,
                                                bool replicas, int tp_rank) {
  std::vector<state::PlacedRange> out;
  for (const TensorPlace& t : places) {
    if (!replicas && (t.tied_copy || (t.replicated && tp_rank != 0))) continue;
    const int64_t lo = std::max(local.begin, t.local);
    const int64_t hi = std::min(local.end, t.local + t.whole.size());
    if (lo >= hi) continue;
    const int64_t shift = t.whole.begin - t.local;
    out.push_back({{lo + shift, hi + shift}, lo - origin});
  }
  return out;
}

void ScatterToWhole(const std::vector<TensorPlace>& places, const float* local, int tp_rank,
                    absl::Span<float> whole) {
  std::fill(whole.begin(), whole.end(), 0.0f);
  for (const TensorPlace& t : places) {
    if (t.tied_copy || (t.replicated && tp_rank != 0)) continue;
    std::copy_n(local + t.local, t.whole.size(), whole.data() + t.whole.begin);
  }
}

std::vector<state::FlatRange> ReplicatedRanges(const std::vector<TensorPlace>& places,
                                               state::FlatRange window, int tp_rank) {
  std::vector<state::FlatRange> out;
  for (const TensorPlace& t : places) {
    if (!t.tied_copy && !(t.replicated && tp_rank != 0)) continue;
    const int64_t lo = std::max(window.begin, t.local);
    const int64_t hi = std::min(window.end, t.local + t.whole.size());
    if (lo < hi) out.push_back({lo - window.begin, hi - window.begin});
  }
  return out;
}

}  // namespace ringmaster::train
