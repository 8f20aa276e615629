// Restoring a rank's training state at the start of a run (ARCHITECTURE.md "Recovery"): from
// the survivors' memory (an elastic job's new epoch) or from a checkpoint, and keeping the
// state in memory for the next epoch when the run ends.
#ifndef RINGMASTER_TRAIN_RESTORE_H_
#define RINGMASTER_TRAIN_RESTORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "common/env.h"
#include "state/range.h"
#include "state/tensor.h"
#include "state/training_state.h"
#include "train/config.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"

namespace ringmaster::train {

// A trainer's state kept in memory between the epochs of an elastic job
// (worker/elastic_trainer.h): after a membership change the survivors restore from it instead
// of from the checkpoint, so the steps since the last checkpoint are not trained again.
// RunTraining fills it when it returns (with an error too) with the state after the last
// step it completed; only with plain data parallelism (ZeRO-0), where every rank holds the
// whole state. A failure mid-step leaves the state of the step before: the optimizer, the
// only writer of the parameters and moments, runs after the step's last collective that can
// fail before it, and a rank whose gradient all-reduce completed has the same reduced
// gradient as every other rank that completed it.
struct ResidentState {
  int64_t step = -1;  // steps the state is after; -1: nothing kept
  uint64_t spec_hash = 0;
  std::vector<float> params;  // the table's elements (no padding)
  std::vector<std::pair<std::string, std::vector<float>>> optimizer;  // whole buffers
  int64_t optimizer_step = 0;
  state::SamplerState sampler;
  std::optional<state::LossScalerState> loss_scaler;

  void Clear() { *this = ResidentState(); }
};

struct RestoreOptions {
  const TrainConfig* config = nullptr;
  // Host-memory collectives of the job's ranks (the memory restore's all-gather and
  // broadcasts). Not owned.
  comm::Communicator* comm = nullptr;
  absl::Duration op_timeout = absl::Seconds(120);
  // The filesystem checkpoints are read through. Not owned.
  Env* env = nullptr;
  // The state to fill: the parameters (host memory), the optimizer's buffers in host memory
  // (train/host_view.h), the optimizer's step and the loss scaler (null without fp16). Not
  // owned.
  const state::TensorTable* table = nullptr;
  // Without param_pieces: the whole flat space (padded); [0, table->total_elements()) is
  // read into it at its own offsets. With param_pieces: this rank's local shard buffer.
  state::FlatBuffer* params = nullptr;
  // ZeRO-2/3, where a rank holds a piece of every wrapping unit back to back in its shard
  // buffer: the pieces of "params" it holds, as train/fsdp_layout.h places them (flat
  // indices p.range at offsets [p.at, p.at + p.range.size()) of `params`). Only they are
  // read, each into its place; the rest of `params` is left as it was. Each piece must pass
  // state::CheckPlacement(*table, param_pieces, params->size()), and whole_state must be
  // false (the memory restore holds whole states): INVALID_ARGUMENT otherwise, before
  // anything is read. Empty: the whole flat space, as above.
  std::vector<state::PlacedRange> param_pieces;
  // One entry per buffer range the optimizer holds, each read as it is into its own `data`
  // (StateBuffer::range: flat indices): a name may come several times, once per piece of a
  // sharded optimizer.
  std::vector<StateBuffer>* optimizer_buffers = nullptr;
  Optimizer* optimizer = nullptr;
  LossScaler* scaler = nullptr;
  // In: every rank passes one or none (see TrainerOptions::resident); cleared once looked at
  // (the memory is not held twice while training). Used only when `whole_state`.
  ResidentState* resident = nullptr;
  // Every rank holds the whole state (ZeRO-0): `params` and each optimizer buffer the whole
  // flat space. Only then can a survivor's memory be restored from.
  bool whole_state = true;
  // For the messages of `resume: extend`: the new length and its schedule.
  int64_t total_steps = 0;
  const LrSchedule* schedule = nullptr;
  // Rank 0's lines for the user (restored from whom, what was read).
  std::function<void(const std::string&)> say;
};

struct Restored {
  int64_t step = 0;  // steps already trained: the first step this run takes
  state::SamplerState sampler;
  int64_t resumed_from_step = -1;  // -1: from scratch
  int resumed_from_memory_of = -1;  // the rank whose memory it came from; -1: none
  // Why no survivor's memory was restored from, when trainers keep it (an elastic job's
  // later epochs; `resident` given) and it was not: the state is sharded over the ranks, no
  // trainer of this run kept one, or the one kept is older than the checkpoint. Empty
  // otherwise.
  std::string not_from_memory;
};

// Where `restored` came from, for people: "step 200's checkpoint", "rank 1's memory",
// "scratch".
std::string RestoredFromText(const Restored& restored);

// The state to start from: a survivor's memory when some rank holds a step at least as
// recent as rank 0's latest checkpoint (resume auto or extend, whole_state), else the
// checkpoint that checkpoint.resume names (none: from scratch, said so for auto/extend).
// A damaged checkpoint (DATA_LOSS: a checksum mismatch, a truncated or missing shard, on any
// rank) is passed over by every rank alike for the newest committed one before it, said so,
// unless resume names its step. Every rank calls it. Errors: the collectives'; a checkpoint
// that does not belong to this job (another spec, other tensors, a newer format) is
// FAILED_PRECONDITION, and a damaged one with none before it (or named by resume) DATA_LOSS,
// both marked permanent; I/O errors are left restartable.
absl::StatusOr<Restored> RestoreTrainingState(const RestoreOptions& options);

// Fills `resident` with the state after `step`: the parameters (host copy, unpadded), the
// optimizer's buffers, its step, the sampler and the loss scaler.
void KeepResident(ResidentState& resident, int64_t step, uint64_t spec_hash,
                  const state::TensorTable& table, const state::FlatBuffer& params,
                  const std::vector<StateBuffer>& optimizer_buffers, int64_t optimizer_step,
                  const state::SamplerState& sampler,
                  const std::optional<state::LossScalerState>& loss_scaler);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_RESTORE_H_
