#include "train/data/sampler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "train/data/portable_random.h"

namespace ringmaster::train::data {

absl::StatusOr<GlobalBatchSampler> GlobalBatchSampler::Create(int64_t dataset_size,
                                                              const SamplerOptions& options) {
  if (dataset_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: dataset_size ", dataset_size, " must be at least 1"));
  }
  return GlobalBatchSampler(dataset_size, options);
}

int64_t GlobalBatchSampler::EpochLength(int64_t global_batch) const {
  return options_.drop_last ? dataset_size_ - dataset_size_ % global_batch : dataset_size_;
}

int64_t GlobalBatchSampler::BatchesPerEpoch(int64_t global_batch) const {
  return options_.drop_last ? dataset_size_ / global_batch
                            : (dataset_size_ + global_batch - 1) / global_batch;
}

absl::Span<const int64_t> GlobalBatchSampler::EpochOrder(uint64_t epoch) {
  if (cached_epoch_ != epoch) {
    SplitMix64 rng = EpochGenerator(options_.seed, epoch);
    cached_order_ = RandomPermutation(dataset_size_, rng);
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

absl::StatusOr<GlobalBatch> GlobalBatchSampler::NextGlobalBatch(const state::SamplerState& state,
                                                                int64_t global_batch) {
  if (global_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: global_batch ", global_batch, " must be at least 1"));
  }
  if (options_.drop_last && global_batch > dataset_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: with drop_last, global_batch ", global_batch, " must not exceed the ",
        dataset_size_, " samples of the data set (no full batch exists)"));
  }
  if (state.cursor < 0 || state.cursor > dataset_size_) {
    // The same state on the same data after every restart: permanent, the cause first.
    return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
        "data set mismatch: the sampler state ", state::SamplerStateString(state),
        " (from a checkpoint or a rank's memory) has its cursor outside [0, ", dataset_size_,
        "], the data set's size: the state belongs to another data set (was the data replaced "
        "under the job?) or is corrupt; give the job the data it trained on, or start fresh "
        "(resume: never)")));
  }
  const int64_t epoch_length = EpochLength(global_batch);
  GlobalBatch batch;
  batch.start = state.cursor < epoch_length ? state : state::SamplerState{state.epoch + 1, 0};
  const int64_t end = std::min(batch.start.cursor + global_batch, epoch_length);
  absl::Span<const int64_t> order = EpochOrder(batch.start.epoch);
  batch.indices.assign(order.begin() + batch.start.cursor, order.begin() + end);
  batch.next = end < epoch_length ? state::SamplerState{batch.start.epoch, end}
                                  : state::SamplerState{batch.start.epoch + 1, 0};
  return batch;
}

}  // namespace ringmaster::train::data
