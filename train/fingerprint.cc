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
  return CompareGroupFingerprints(table, gathered, world, step, {});
}

absl::Status CompareGroupFingerprints(const state::TensorTable& table,
                                      absl::Span<const uint64_t> gathered, int size, int64_t step,
                                      const FingerprintGroup& group) {
  std::vector<int> tensors = group.tensors;
  if (tensors.empty()) {
    for (int t = 0; t < table.size(); ++t) tensors.push_back(t);
  }
  const size_t per_rank = tensors.size() + 1;
  CHECK_EQ(gathered.size(), per_rank * size);
  auto job_rank = [&](int q) {
    return static_cast<size_t>(q) < group.job_ranks.size() ? group.job_ranks[q] : q;
  };
  for (int q = 1; q < size; ++q) {
    for (size_t t = 0; t < per_rank; ++t) {
      if (gathered[q * per_rank + t] == gathered[t]) continue;
      const std::string what =
          t < tensors.size() ? absl::StrCat("parameter tensor ", table.tensor(tensors[t]).name)
                             : std::string("the training loss");
      return absl::InternalError(absl::StrCat(
          "ranks diverged at step ", step, ": ", what, " differs between rank ", job_rank(0),
          " and rank ", job_rank(q), group.what.empty() ? "" : absl::StrCat(" (", group.what, ")"),
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
  return CheckGroupFingerprints(comm, table, params, loss, step, {}, deadline);
}

absl::Status CheckGroupFingerprints(comm::Communicator& comm, const state::TensorTable& table,
                                    const float* params, double loss, int64_t step,
                                    const FingerprintGroup& group, absl::Time deadline) {
  RM_ASSIGN_OR_RETURN(
      const std::vector<uint64_t> all,
      GatherGroupFingerprints(comm, TensorHashes(table, params), loss, group, deadline));
  return CompareGroupFingerprints(table, all, comm.size(), step, group);
}

absl::StatusOr<std::vector<uint64_t>> GatherGroupFingerprints(comm::Communicator& comm,
                                                              absl::Span<const uint64_t> hashes,
                                                              double loss,
                                                              const FingerprintGroup& group,
                                                              absl::Time deadline) {
  std::vector<uint64_t> mine;
  if (group.tensors.empty()) {
    mine.assign(hashes.begin(), hashes.end());
  } else {
    for (int t : group.tensors) mine.push_back(hashes[t]);
  }
  uint64_t loss_bits;
  std::memcpy(&loss_bits, &loss, sizeof(loss_bits));
  mine.push_back(loss_bits);
  std::vector<uint64_t> all(mine.size() * comm.size());
  RM_RETURN_IF_ERROR(
      comm.AllGather(mine.data(), all.data(), mine.size(), DataType::kInt64, deadline));
  return all;
}

}  // namespace ringmaster::train
