// Fingerprints: the ranks of a data-parallel job compare hashes of their parameters now and
// then (diagnostics.fingerprint_every), so a rank that silently diverged (a
// non-deterministic kernel, a lost update, memory corruption) stops the job, named.
#ifndef RINGMASTER_TRAIN_FINGERPRINT_H_
#define RINGMASTER_TRAIN_FINGERPRINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/tensor.h"

namespace ringmaster::train {

// Hashes (xxh3-64) of each tensor's bytes in `params`, in table order.
std::vector<uint64_t> TensorHashes(const state::TensorTable& table, const float* params);

// `gathered` holds every rank's fingerprint in rank order: TensorHashes then the loss's
// bits (table.size() + 1 values each). INTERNAL naming the first tensor (or the loss) in
// which some rank differs from rank 0, and the step; OK when all agree.
absl::Status CompareFingerprints(const state::TensorTable& table,
                                 absl::Span<const uint64_t> gathered, int world, int64_t step);

// A group of ranks that must hold equal copies of some tensors (the data-parallel replicas of
// a pipeline stage; a tensor-parallel group's replicated tensors).
struct FingerprintGroup {
  // The tensors of `table` to compare (indices, in order): all of them when empty.
  std::vector<int> tensors;
  // The group's members by their rank in the job (job_ranks[q] for group rank q), for the
  // error; empty: the group's own ranks.
  std::vector<int> job_ranks;
  // What the group is, for the error: "the data-parallel replicas of stage 1".
  std::string what;
};

// `gathered` as CompareFingerprints's, with group.tensors' hashes (or all) then the loss's
// bits per rank: INTERNAL naming the tensor, the two ranks of the job and the group.
absl::Status CompareGroupFingerprints(const state::TensorTable& table,
                                      absl::Span<const uint64_t> gathered, int size, int64_t step,
                                      const FingerprintGroup& group);

// The group's fingerprints (group.tensors' entries of `hashes`, TensorHashes of the
// parameters, then the loss's bits), every member's in rank order: one all-gather; its error.
absl::StatusOr<std::vector<uint64_t>> GatherGroupFingerprints(comm::Communicator& comm,
                                                              absl::Span<const uint64_t> hashes,
                                                              double loss,
                                                              const FingerprintGroup& group,
                                                              absl::Time deadline);

// CheckFingerprints over a group: GatherGroupFingerprints, then CompareGroupFingerprints.
absl::Status CheckGroupFingerprints(comm::Communicator& comm, const state::TensorTable& table,
                                    const float* params, double loss, int64_t step,
                                    const FingerprintGroup& group, absl::Time deadline);

// Every rank calls it with its parameters (host memory) and the step's (all-reduced, so
// common) loss: one small all-gather, then CompareFingerprints. The collective's errors too.
absl::Status CheckFingerprints(comm::Communicator& comm, const state::TensorTable& table,
                               const float* params, double loss, int64_t step,
                               absl::Time deadline);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_FINGERPRINT_H_
