// Test helpers for train/optim: a small table whose tensors ZeRO-style cuts fall inside, the
// cuts themselves, and an in-process stand-in for the trainer's all-reduce.
#ifndef RINGMASTER_TRAIN_OPTIM_TESTING_H_
#define RINGMASTER_TRAIN_OPTIM_TESTING_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/optim/sum_across_ranks.h"

namespace ringmaster::train::testing {

// Matrices, a 3-D kernel, biases and a LayerNorm gain (1-D: no weight decay by default),
// 160 flat elements with padding.
state::TensorTable SmallModelTable();

// The table's flat space cut into `shards` (1..5) contiguous ranges; the cuts fall inside
// tensors and, for 4 shards, in padding.
std::vector<state::FlatRange> Shards(const state::TensorTable& table, int shards);

// A ZeRO-3 style layout for tests: each unit (a flat range) is padded to a multiple of
// world × state::kAlignElements and cut into `world` equal parts; a rank holds the r-th part
// of every unit, clipped to the unit's end (possibly empty), back to back in a local buffer
// of every unit's part size together, the clipped-off padding left as a gap.
struct UnitShard {
  std::vector<state::PlacedRange> pieces;  // one per unit, in unit order
  int64_t local_elements = 0;
};
UnitShard UnitShardOf(absl::Span<const state::FlatRange> units, int world, int rank);

// Units of whole tensors: unit u is tensors_per_unit[u] consecutive tensors, from the
// first one's offset to the last one's end (the padding after it belongs to no unit).
std::vector<state::FlatRange> WholeTensorUnits(const state::TensorTable& table,
                                               const std::vector<int>& tensors_per_unit);

// Normal(0, scale) values from `seed` in the table's tensors; padding stays 0.
void FillRandom(const state::TensorTable& table, uint64_t seed, float scale,
                state::FlatBuffer& buffer);

// `world` threads, one per rank, whose SumAcrossRanks hooks meet like an all-reduce: each call
// blocks until every rank made its matching call, then every rank gets the totals (added in
// rank order, so all ranks see the same bits).
class FakeRanks {
 public:
  explicit FakeRanks(int world);

  // Runs body(rank) for every rank on its own thread and waits for all of them.
  void Run(const std::function<void(int rank, const SumAcrossRanks& sum)>& body);
  // Rounds of summing completed so far.
  int64_t rounds() const;

 private:
  absl::Status Sum(int rank, absl::Span<double> values);

  const int world_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<double>> contributions_ ABSL_GUARDED_BY(mu_);
  std::vector<double> totals_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int departed_ ABSL_GUARDED_BY(mu_) = 0;
  bool summed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster::train::testing

#endif  // RINGMASTER_TRAIN_OPTIM_TESTING_H_
