// The distributed sampler: which samples make up each global batch
// (ARCHITECTURE.md "Training state is flat").
//
// The sequence of global batches is a deterministic function of the job's seed and of a
// SamplerState {data epoch, cursor}; it does not depend on the world size. Each rank asks
// for the same global batch and takes its contiguous share (train/data/partition.h), so the
// concatenation of the ranks' shares, in rank order, is the global batch for every world
// size, and after a shrink or growth no sample is lost or seen twice.
//
// Epoch e visits the permutation EpochOrder(e) of [0, dataset_size) (train/data/
// portable_random.h: the same on every machine) in consecutive slices of global_batch
// samples. The epoch's last batch is short when global_batch does not divide the data set
// (every sample is seen exactly once per epoch), or skipped with drop_last. The state
// returned with a batch already points into the next epoch when the batch ends one, so the
// epoch can never be left unchanged by mistake (PyTorch's DistributedSampler needs a
// set_epoch call each epoch, and repeats the first epoch's order without it).
//
// Thread-safety: not thread-safe (it caches the current epoch's order, 8 bytes a sample);
// each rank uses its own sampler from one thread.
#ifndef RINGMASTER_TRAIN_DATA_SAMPLER_H_
#define RINGMASTER_TRAIN_DATA_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/training_state.h"

namespace ringmaster::train::data {

struct SamplerOptions {
  uint64_t seed = 0;
  // Skip each epoch's final short batch: every global batch then has exactly
  // global_batch samples, and the dataset_size % global_batch samples at the end of each
  // epoch's order are not seen in that epoch (a new order is drawn for the next one).
  bool drop_last = false;
};

struct GlobalBatch {
  state::SamplerState start;     // where the batch begins (after any move to a new epoch)
  std::vector<int64_t> indices;  // sample indices, global_batch of them (fewer only in the
                                 // last batch of an epoch)
  state::SamplerState next;      // the state after this batch; pass it to the next call
};

class GlobalBatchSampler {
 public:
  // INVALID_ARGUMENT when dataset_size < 1.
  static absl::StatusOr<GlobalBatchSampler> Create(int64_t dataset_size,
                                                   const SamplerOptions& options);

  // The global batch of up to `global_batch` samples that starts at `state`, and the state
  // after it. A state whose cursor is at or past the epoch's end (e.g. saved with another
  // global batch size under drop_last) starts the next epoch.
  // INVALID_ARGUMENT when global_batch < 1, or drop_last is set and global_batch >
  // dataset_size (no batch would ever be produced); FAILED_PRECONDITION marked permanent
  // (common/status_macros.h), "data set mismatch: ...", when state.cursor is outside [0,
  // dataset_size]: the state came from another data set.
  absl::StatusOr<GlobalBatch> NextGlobalBatch(const state::SamplerState& state,
                                              int64_t global_batch);

  // The order in which epoch `epoch` visits the samples: a permutation of
  // [0, dataset_size). Valid until the next call on this sampler.
  absl::Span<const int64_t> EpochOrder(uint64_t epoch);

  // Samples consumed per epoch: dataset_size, or with drop_last the largest multiple of
  // global_batch not above it.
  int64_t EpochLength(int64_t global_batch) const;
  // Global batches per epoch: ceil(dataset_size / global_batch), or floor with drop_last.
  int64_t BatchesPerEpoch(int64_t global_batch) const;

  int64_t dataset_size() const { return dataset_size_; }
  const SamplerOptions& options() const { return options_; }

 private:
  GlobalBatchSampler(int64_t dataset_size, const SamplerOptions& options)
      : dataset_size_(dataset_size), options_(options) {}

  int64_t dataset_size_;
  SamplerOptions options_;
  std::optional<uint64_t> cached_epoch_;
  std::vector<int64_t> cached_order_;
};

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_SAMPLER_H_
