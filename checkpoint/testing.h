// Test helpers: a small model's flat state with known contents, saved and loaded by
// simulated ranks (one thread and one writer or reader per rank), with ZeRO-style shards or
// plain slices. The expected contents come from a formula (PatternValue), not from the
// code under test.
#ifndef RINGMASTER_CHECKPOINT_TESTING_H_
#define RINGMASTER_CHECKPOINT_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "common/env.h"
#include "state/tensor.h"

namespace ringmaster::checkpoint::testing {

// An empty directory $TEST_TMPDIR/<name> (removed first if it exists).
std::string FreshDir(absl::string_view name);

// The buffers of an AdamW model.
inline const std::vector<std::string> kBuffers = {"params", "exp_avg", "exp_avg_sq"};

// A table whose tensors have odd sizes, so that shard boundaries cut through tensors;
// `scale` multiplies the sizes (1: about 5,000 elements).
state::TensorTable TestTable(int scale);

// The flat size of every buffer at `world` ranks: table elements rounded up to a multiple
// of world × 16 (train/grad_sync.h PaddedElements).
int64_t PaddedElements(const state::TensorTable& table, int world);

// Element i of buffer `name` at `step`: a pseudo-random bit pattern (never NaN) below
// `used` elements, 0 from `used` on (the padding).
float PatternValue(absl::string_view name, int64_t step, int64_t i, int64_t used);
std::vector<float> PatternBuffer(absl::string_view name, int64_t step, int64_t elements,
                                 int64_t used);

// The training state saved with `step` (every field set from the step).
TrainingState PatternState(int64_t step);

// The range of `buffer` rank `rank` saves at `zero_stage`: ZeRO 0: its SaveSlice of every
// buffer; ZeRO 1, 2: its shard [r·S, (r+1)·S) of the padded space, for every buffer.
state::FlatRange SavedRange(int64_t elements, int rank, int world, int zero_stage);
// The range of `buffer` rank `rank` needs at `zero_stage`: everything, except the optimizer
// moments under ZeRO 1, 2 (its shard).
state::FlatRange NeededRange(absl::string_view buffer, int64_t elements, int rank, int world,
                             int zero_stage);

// ZeRO-2/3 style: the flat space [0, elements) is cut into `units` units of
// ceil(elements / units) elements each (the last shorter, some maybe empty), and rank
// `rank` holds SaveSlice(unit size, rank, world) of each unit: one range per unit,
// ascending, some maybe empty. units >= 1.
std::vector<state::FlatRange> UnitPieces(int64_t elements, int units, int rank, int world);

struct WorldOptions {
  std::string root;
  std::string job = "job";
  const state::TensorTable* table = nullptr;
  int world = 1;
  int zero_stage = 0;
  // > 0: every rank saves (and, loading, needs) its UnitPieces(elements, units, rank, world)
  // of every buffer, each piece a BufferShard (LoadTarget) of its own, instead of the
  // ranges of zero_stage; the request lists the buffers unit by unit, as an FSDP trainer
  // holding its pieces back to back would.
  int units = 0;
  uint64_t spec_hash = 0x5eed;
  // Applied to every rank's writer options (env, retention, block sizes, ...).
  CheckpointWriterOptions base;
  absl::Duration deadline = absl::Seconds(60);
};

// One writer per rank of `world`: `base` with rank and world_size set, created in rank
// order (rank 0 first: it removes temporaries before any rank saves). The first error.
absl::StatusOr<std::vector<std::unique_ptr<CheckpointWriter>>> CreateWriters(
    const CheckpointWriterOptions& base, int world);

// Saves the pattern state of `step` with `world` ranks on threads (SaveSync); one status
// per rank. The writers are created in rank order first (rank 0 cleans up), then save.
std::vector<absl::Status> SaveWorld(const WorldOptions& options, int64_t step);

struct LoadCheck {
  int64_t step = -1;                    // what was loaded
  std::vector<ReadStats> stats;         // per rank
  std::vector<std::string> mismatches;  // buffers that differ from the pattern, and where
};

// Loads with `world` ranks on threads at `zero_stage` or in `units` (each rank only what it
// needs), then
// checks every rank's buffers against the pattern of the step loaded, bit for bit, and
// the training state. Fails with the first rank's load error.
absl::StatusOr<LoadCheck> LoadWorld(const WorldOptions& options, const LoadOptions& load);

}  // namespace ringmaster::checkpoint::testing

#endif  // RINGMASTER_CHECKPOINT_TESTING_H_
