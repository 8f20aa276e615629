#include "train/restore.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "common/plural.h"
#include "common/status_macros.h"
#include "state/range.h"

namespace ringmaster::train {
namespace {

// Whether `resident` holds a state this run can restore: the same training spec, the
// table's size, and the optimizer's buffers by name and size.
bool ResidentFits(const ResidentState& resident, uint64_t spec_hash,
                  const state::TensorTable& table, const std::vector<StateBuffer>& buffers) {
  if (resident.step < 0 || resident.spec_hash != spec_hash) return false;
  if (static_cast<int64_t>(resident.params.size()) != table.total_elements()) return false;
  if (resident.optimizer.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (resident.optimizer[i].first != buffers[i].name ||
        resident.optimizer[i].second.size() != buffers[i].data.size()) {
      return false;
    }
  }
  return true;
}

// What the ranks agreed on at start (TrainerOptions::resident).
struct MemoryRestore {
  int source = -1;              // the rank whose memory the state came from; -1: none
  int64_t newest = -1;          // the newest step any rank kept; -1: none kept one
  int64_t checkpoint_step = -1;  // rank 0's latest checkpoint; -1: none seen
  int64_t step = 0;
  int64_t optimizer_step = 0;
  state::SamplerState sampler;
  std::optional<state::LossScalerState> loss_scaler;
};

// TrainerOptions::resident, on entry (ZeRO-0): every rank tells the step it holds in memory
// (-1: none) and its view of the latest checkpoint; when some rank holds a step at least as
// recent as rank 0's latest checkpoint, the first such rank broadcasts its state into
// `params` and the optimizer's buffers, and the rest of it comes back. Otherwise source is
// -1 and the caller reads the checkpoint.
absl::StatusOr<MemoryRestore> RestoreFromMemory(
    comm::Communicator* comm, const ResidentState& resident, uint64_t spec_hash,
    const state::TensorTable& table, state::FlatBuffer& params,
    const std::vector<StateBuffer>& buffers, int64_t latest_checkpoint, absl::Duration op_timeout) {
  auto deadline = [&] { return absl::Now() + op_timeout; };
  const int world = comm->size();
  const bool fits = ResidentFits(resident, spec_hash, table, buffers);
  int64_t mine[2] = {fits ? resident.step : -1, latest_checkpoint};
  std::vector<int64_t> all(2 * world);
  RM_RETURN_IF_ERROR(comm->AllGather(mine, all.data(), 2, DataType::kInt64, deadline()));
  MemoryRestore out;
  out.checkpoint_step = all[1];
  int64_t best = -1;
  for (int r = 0; r < world; ++r) {
    if (all[2 * r] > best) {
      best = all[2 * r];
      out.source = r;
    }
  }
  out.newest = best;
  if (best < 0 || best < out.checkpoint_step) {
    out.source = -1;
    return out;
  }
  const int64_t n = table.total_elements();
  // The small state: step, optimizer step, sampler epoch and cursor, loss scaler (present,
  // the scale's bits, good steps, steps, skipped steps).
  int64_t small[9] = {};
  if (comm->rank() == out.source) {
    std::memcpy(params.data(), resident.params.data(), n * sizeof(float));
    for (size_t i = 0; i < buffers.size(); ++i) {
      std::memcpy(buffers[i].data.data(), resident.optimizer[i].second.data(),
                  buffers[i].data.size() * sizeof(float));
    }
    small[0] = resident.step;
    small[1] = resident.optimizer_step;
    small[2] = static_cast<int64_t>(resident.sampler.epoch);
    small[3] = resident.sampler.cursor;
    if (resident.loss_scaler) {
      small[4] = 1;
      std::memcpy(&small[5], &resident.loss_scaler->scale, sizeof(double));
      small[6] = resident.loss_scaler->good_steps;
      small[7] = resident.loss_scaler->steps;
      small[8] = resident.loss_scaler->skipped_steps;
    }
  }
  RM_RETURN_IF_ERROR(comm->Broadcast(params.data(), params.data(), static_cast<size_t>(n),
                                     DataType::kFloat32, out.source, deadline()));
  for (const StateBuffer& b : buffers) {
    RM_RETURN_IF_ERROR(comm->Broadcast(b.data.data(), b.data.data(), b.data.size(),
                                       DataType::kFloat32, out.source, deadline()));
  }
  RM_RETURN_IF_ERROR(comm->Broadcast(small, small, 9, DataType::kInt64, out.source, deadline()));
  out.step = small[0];
  out.optimizer_step = small[1];
  out.sampler.epoch = static_cast<uint64_t>(small[2]);
  out.sampler.cursor = small[3];
  if (small[4] != 0) {
    state::LossScalerState ls;
    std::memcpy(&ls.scale, &small[5], sizeof(double));
    ls.good_steps = small[6];
    ls.steps = small[7];
    ls.skipped_steps = small[8];
    out.loss_scaler = ls;
  }
  return out;
}

// A resume error as the trainer returns it: FAILED_PRECONDITION from the checkpoint reader
// means the checkpoint and this job disagree (another job's spec hash, other tensors, a
// missing buffer, a newer format), and DATA_LOSS that the checkpoint is damaged (a checksum
// mismatch, a truncated or missing shard): every restart would meet either again, so they are
// marked permanent (common/status_macros.h), the damage named first. I/O errors are left
// restartable.
absl::Status UnlessRestartable(const absl::Status& status) {
  if (absl::IsDataLoss(status)) {
    return MarkPermanent(absl::DataLossError(absl::StrCat(
        "the checkpoint to resume from is damaged: ", status.message(),
        "; every restart would read it again: `ringctl checkpoint verify` names each damaged "
        "file; resume from an earlier checkpoint (resume: its step) or start fresh "
        "(resume: never)")));
  }
  if (!absl::IsFailedPrecondition(status)) return status;
  return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
      status.message(),
      "; resuming cannot work until checkpoint.dir points elsewhere or resume is set to never")));
}

// Whether any rank found its part of the checkpoint damaged. Every rank calls it after its
// read, so that all of them go on from the same checkpoint.
absl::StatusOr<bool> DamagedOnAnyRank(const RestoreOptions& o, bool damaged_here) {
  if (o.comm == nullptr || o.comm->size() == 1) return damaged_here;
  const int64_t mine = damaged_here ? 1 : 0;
  int64_t any = 0;
  RM_RETURN_IF_ERROR(o.comm->AllReduce(&mine, &any, 1, DataType::kInt64, comm::ReduceOp::kMax,
                                       absl::Now() + o.op_timeout));
  return any != 0;
}

// The newest committed checkpoint of the job before `step`; nullopt when there is none.
std::optional<int64_t> CommittedStepBefore(const RestoreOptions& o, int64_t step) {
  const TrainConfig& config = *o.config;
  absl::StatusOr<std::vector<int64_t>> steps = checkpoint::ListCommittedSteps(
      o.env != nullptr ? o.env : Env::Default(),
      checkpoint::JobDir(config.checkpoint.dir, config.name));
  std::optional<int64_t> before;
  if (!steps.ok()) return before;
  for (int64_t s : *steps) {
    if (s < step) before = s;
  }
  return before;
}

absl::StatusOr<std::optional<Restored>> FromCheckpoint(const RestoreOptions& o,
                                                       int64_t agreed_step) {
  const TrainConfig& config = *o.config;
  const CheckpointConfig& cs = config.checkpoint;
  const bool extend = cs.resume.kind == ResumeConfig::Kind::kExtend;
  checkpoint::LoadOptions lo;
  if (o.env != nullptr) lo.env = o.env;
  lo.root = cs.dir;
  lo.job = config.name;
  lo.spec_hash = cs.spec_hash;
  lo.training_spec = cs.training_spec;
  for (const std::string& field : cs.length_fields) {
    if (extend) {
      lo.spec_changes_allowed.emplace(field);
    } else {
      lo.spec_change_hints.emplace(field,
                                   "to train this job longer from its checkpoint, submit it with "
                                   "resume: extend, or ringctl submit --extend");
    }
  }
  lo.table = o.table;
  if (cs.resume.kind == ResumeConfig::Kind::kStep) lo.step = cs.resume.step;
  // The ranks agreed on rank 0's latest checkpoint (they all read that one).
  if (agreed_step >= 0) lo.step = agreed_step;
  std::vector<checkpoint::LoadTarget> targets;
  if (o.param_pieces.empty()) {
    const state::FlatRange all = state::FullRange(*o.table);
    targets.push_back({"params", all, state::Slice(o.params->span(), all)});
  }
  for (const state::PlacedRange& p : o.param_pieces) {
    targets.push_back({"params", p.range, o.params->span().subspan(p.at, p.range.size())});
  }
  for (StateBuffer& b : *o.optimizer_buffers) targets.push_back({b.name, b.range, b.data});
  // A damaged checkpoint (DATA_LOSS on any rank) is passed over for the newest one before it,
  // on every rank alike, unless resume names the step; with none before it, the damage is
  // the job's permanent error (UnlessRestartable).
  absl::StatusOr<checkpoint::OpenedCheckpoint> opened;
  absl::StatusOr<checkpoint::ReadStats> read_or;
  bool fell_back = false;
  while (true) {
    opened = checkpoint::OpenCheckpoint(lo);
    read_or = opened.ok() ? checkpoint::ReadBuffers(lo, *opened, targets)
                          : absl::StatusOr<checkpoint::ReadStats>(opened.status());
    const bool damaged_here = absl::IsDataLoss(read_or.status());
    RM_ASSIGN_OR_RETURN(const bool damaged, DamagedOnAnyRank(o, damaged_here));
    if (!damaged || cs.resume.kind == ResumeConfig::Kind::kStep) break;
    const int64_t step =
        opened.ok() ? opened->state.step
                    : lo.step.value_or(checkpoint::ReadLatest(
                                           o.env, checkpoint::JobDir(cs.dir, config.name))
                                           .value_or(-1));
    const std::optional<int64_t> before =
        step >= 0 ? CommittedStepBefore(o, step) : std::optional<int64_t>();
    if (!before) {
      if (damaged_here) break;
      return MarkPermanent(absl::DataLossError(absl::StrCat(
          "the checkpoint to resume from (step ", step, ") is damaged on another rank, and "
          "there is none before it; `ringctl checkpoint verify` names each damaged file")));
    }
    o.say(absl::StrCat("checkpoint step-", step, " is damaged (",
                       damaged_here ? read_or.status().message() : "on another rank",
                       "): resuming from step-", *before,
                       ", the newest before it; `ringctl checkpoint verify` names each damaged "
                       "file"));
    lo.step = *before;
    fell_back = true;
  }
  if (absl::IsNotFound(opened.status()) && !fell_back &&
      (cs.resume.kind == ResumeConfig::Kind::kAuto || extend)) {
    o.say(absl::StrCat("resume: ", cs.resume.text, ": no checkpoint of job ", config.name, " in ",
                       cs.dir, " yet; starting from scratch"));
    return std::optional<Restored>();
  }
  RM_RETURN_IF_ERROR(UnlessRestartable(opened.status()));
  RM_RETURN_IF_ERROR(UnlessRestartable(read_or.status()));
  const checkpoint::ReadStats& read = *read_or;
  const checkpoint::TrainingState& ts = opened->state;
  RM_RETURN_IF_ERROR(o.optimizer->RestoreStep(ts.optimizer_step));
  if (o.scaler != nullptr && ts.loss_scaler) RM_RETURN_IF_ERROR(o.scaler->Restore(*ts.loss_scaler));
  Restored r;
  r.sampler = ts.sampler;
  r.step = ts.step;
  r.resumed_from_step = ts.step;
  o.say(absl::StrFormat(
      "resumed from %s (step %d, saved by %s, ZeRO-%d; %s): read %.2f MiB for "
      "%.2f MiB needed",
      opened->dir, ts.step, Plural(opened->manifest.world_size(), "rank"),
      opened->manifest.zero_stage(),
      state::SamplerStateString(ts.sampler), read.bytes_read / 1048576.0,
      read.bytes_needed / 1048576.0));
  if (!opened->spec_changes.empty()) {
    // The schedule is the new length's: warm-up and decay laid out over total_steps as if
    // the job had been submitted with it (a warm restart for a decaying one).
    o.say(absl::StrFormat(
        "resume: extend: the checkpoint's job was %s; training on to step %d with the "
        "learning-rate schedule of the new length (lr %g at step %d)",
        absl::StrJoin(opened->spec_changes, ", "), o.total_steps, o.schedule->LrAt(ts.step),
        ts.step));
  }
  return std::optional<Restored>(r);
}

}  // namespace

absl::StatusOr<Restored> RestoreTrainingState(const RestoreOptions& o) {
  if (!o.param_pieces.empty()) {
    if (o.whole_state) {
      return absl::InvalidArgumentError(
          "RestoreOptions: param_pieces (a rank's shard of the parameters) with whole_state "
          "set; a sharded state is not whole: set whole_state = false");
    }
    if (absl::Status s = state::CheckPlacement(*o.table, o.param_pieces, o.params->size());
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("RestoreOptions.param_pieces: ", s.message()));
    }
  }
  const TrainConfig& config = *o.config;
  const CheckpointConfig& cs = config.checkpoint;
  const bool checkpointing = !cs.dir.empty();
  const bool auto_resume =
      cs.resume.kind == ResumeConfig::Kind::kAuto || cs.resume.kind == ResumeConfig::Kind::kExtend;
  int64_t agreed_step = -1;  // rank 0's latest, when the ranks agreed on a checkpoint
  std::string not_from_memory;  // Restored::not_from_memory
  if (o.resident != nullptr && auto_resume && o.whole_state) {
    int64_t latest = -1;
    if (checkpointing) {
      latest = checkpoint::ReadLatest(o.env, checkpoint::JobDir(cs.dir, config.name)).value_or(-1);
    }
    RM_ASSIGN_OR_RETURN(MemoryRestore m, RestoreFromMemory(o.comm, *o.resident, cs.spec_hash,
                                                           *o.table, *o.params,
                                                           *o.optimizer_buffers, latest,
                                                           o.op_timeout));
    agreed_step = m.checkpoint_step;
    if (m.source >= 0) {
      o.resident->Clear();
      RM_RETURN_IF_ERROR(o.optimizer->RestoreStep(m.optimizer_step));
      if (o.scaler != nullptr && m.loss_scaler) RM_RETURN_IF_ERROR(o.scaler->Restore(*m.loss_scaler));
      o.say(absl::StrFormat(
          "restored step %d from the memory of rank %d (%s; latest checkpoint: %s): %.2f MiB "
          "broadcast, nothing read from disk",
          m.step, m.source, state::SamplerStateString(m.sampler),
          m.checkpoint_step >= 0 ? absl::StrCat("step ", m.checkpoint_step) : "none",
          o.table->total_elements() * (1.0 + o.optimizer_buffers->size()) * 4 / 1048576.0));
      Restored r;
      r.step = m.step;
      r.sampler = m.sampler;
      r.resumed_from_step = m.step;
      r.resumed_from_memory_of = m.source;
      return r;
    }
    not_from_memory =
        m.newest < 0
            ? "no trainer of this epoch kept the state in memory (each one started anew)"
            : absl::StrCat("the newest state kept in memory (step ", m.newest,
                           ") is older than the latest checkpoint");
  } else if (o.resident != nullptr && !o.whole_state) {
    not_from_memory = absl::StrCat(
        "its state is sharded over the ranks",
        config.zero_stage > 0 ? absl::StrCat(" (ZeRO-", config.zero_stage, ")") : "",
        ": a rank keeps only its own shards, and those of the ranks that left are gone");
  }
  // Not usable: the memory is not held twice while training.
  if (o.resident != nullptr) o.resident->Clear();
  Restored out;
  if (checkpointing && cs.resume.kind != ResumeConfig::Kind::kNever) {
    RM_ASSIGN_OR_RETURN(std::optional<Restored> r, FromCheckpoint(o, agreed_step));
    if (r) out = *std::move(r);
  }
  out.not_from_memory = std::move(not_from_memory);
  return out;
}

std::string RestoredFromText(const Restored& r) {
  if (r.resumed_from_memory_of >= 0) {
    return absl::StrCat("rank ", r.resumed_from_memory_of, "'s memory");
  }
  if (r.resumed_from_step >= 0) {
    return absl::StrCat("step ", r.resumed_from_step, "'s checkpoint");
  }
  return "scratch";
}

void KeepResident(ResidentState& r, int64_t step, uint64_t spec_hash,
                  const state::TensorTable& table, const state::FlatBuffer& params,
                  const std::vector<StateBuffer>& optimizer_buffers, int64_t optimizer_step,
                  const state::SamplerState& sampler,
                  const std::optional<state::LossScalerState>& loss_scaler) {
  r.step = step;
  r.spec_hash = spec_hash;
  r.params.assign(params.data(), params.data() + table.total_elements());
  r.optimizer.clear();
  for (const StateBuffer& b : optimizer_buffers) {
    r.optimizer.emplace_back(b.name, std::vector<float>(b.data.begin(), b.data.end()));
  }
  r.optimizer_step = optimizer_step;
  r.sampler = sampler;
  r.loss_scaler = loss_scaler;
}

}  // namespace ringmaster::train
