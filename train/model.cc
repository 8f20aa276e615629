#include "train/model.h"

#include <algorithm>

#include "glog/logging.h"

namespace ringmaster::train {

void Model::Init(uint64_t seed, state::FlatBuffer& params) const {
  CHECK_GE(params.size(), table().total_elements());
  params.Zero();
  InitTensors(seed, [&](int tensor, absl::Span<const float> values) {
    std::copy(values.begin(), values.end(), params.data() + table().tensor(tensor).offset);
  });
}

void Model::InitPieces(uint64_t seed, absl::Span<const state::PlacedRange> pieces,
                       absl::Span<float> local) const {
  CHECK(state::CheckPlacement(table(), pieces, static_cast<int64_t>(local.size())).ok());
  InitTensors(seed, [&](int tensor, absl::Span<const float> values) {
    const int64_t begin = table().tensor(tensor).offset;
    const int64_t end = begin + static_cast<int64_t>(values.size());
    for (const state::PlacedRange& p : pieces) {
      const int64_t b = std::max(begin, p.range.begin), e = std::min(end, p.range.end);
      if (b < e) {
        std::copy(values.begin() + (b - begin), values.begin() + (e - begin),
                  local.begin() + p.at + (b - p.range.begin));
      }
    }
  });
}

}  // namespace ringmaster::train
