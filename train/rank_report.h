// Each rank's own figures at the end of a run (TrainResult.ranks): under a mesh the ranks
// hold different parts of the model (pipeline stages, tensor-parallel shards) and see
// different traffic, so rank 0's summary lists them all.
#ifndef RINGMASTER_TRAIN_RANK_REPORT_H_
#define RINGMASTER_TRAIN_RANK_REPORT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/result.pb.h"

namespace ringmaster::train {

// Every rank's `mine`, in rank order, on every rank of `comm` (one all-gather of host
// memory; every rank calls it). The communicator's error, as any collective's.
absl::StatusOr<std::vector<RankResult>> GatherRankResults(const RankResult& mine,
                                                          comm::Communicator& comm,
                                                          absl::Time deadline);

// This rank's figures from its result: every RankResult field TrainResult has by the same
// name (the rank and its mesh coordinates are the caller's to set).
RankResult RankFigures(const TrainResult& result);

// True for a tensor of a transformer block: a name "h<digits>.<...>" (train/nn/gpt.h).
bool IsBlockTensor(const state::TensorSpec& tensor);

// Elements of the blocks' tensors (IsBlockTensor) in `pieces`, ranges of `table`'s flat
// space (the padding between tensors not counted).
int64_t BlockElements(const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces);

// Elements of every block tensor of `table`.
int64_t BlockElements(const state::TensorTable& table);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_RANK_REPORT_H_
