#include "train/fingerprint.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "xxhash.h"

namespace ringmaster::train {

absl::Status CompareFingerprints(const state::TensorTable& table,
                                 absl::Span<const uint64_t> gathered, int world, int64_t step) {
  const size_t per_rank = static_cast<size_t>(table.size()) + 1;
  CHECK_EQ(gathered.size(), per_rank * world);
  for (int q = 1; q < world; ++q) {
    for (size_t t = 0; t < per_rank; ++t) {
      if (gathered[q * per_rank + t] == gathered[t]) continue;
      const std::string what = t < static_cast<size_t>(table.size())
                                   ? absl::StrCat("parameter tensor ", table.tensor(t).name)
                                   : std::string("the training loss");
      return absl::InternalError(absl::StrCat(
          "ranks diverged at step ", step, ": ", what, " differs between rank 0 and rank ", q,
          " (a non-deterministic kernel, a lost update, or memory corruption)"));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> TensorHashes(const state::TensorTable& table, const float* params) {
  std::vector<uint64_t> hashes;
  hashes.reserve(table.size());
  for (const state::TensorSpec& t : table.tensors()) {
    hashes.push_back(XXH3_64bits(params + t.offset, static_cast<size_t>(t.numel) * sizeof(float)));
  }
  return hashes;
}

absl::Status CheckFingerprints(comm::Communicator& comm, const state::TensorTable& table,
                               const float* params, double loss, int64_t step,
                               absl::Time deadline) {
  std::vector<uint64_t> mine = TensorHashes(table, params);
  uint64_t loss_bits;
  std::memcpy(&loss_bits, &loss, sizeof(loss_bits));
  mine.push_back(loss_bits);
  std::vector<uint64_t> all(mine.size() * comm.size());
  RM_RETURN_IF_ERROR(
      comm.AllGather(mine.data(), all.data(), mine.size(), DataType::kInt64, deadline));
  return CompareFingerprints(table, all, comm.size(), step);
}

}  // namespace ringmaster::train
