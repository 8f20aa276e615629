// When and how a rank's training state is saved (checkpoint.*): the writer, the triggers
// (every_steps, every_seconds, every: auto, SIGUSR1, the drain and the last step), and the
// ranks' agreement on how saves went (see trainer.h, "Checkpoints").
//
// checkpoint.every: auto (seed exercise 26.22a): rank 0 asks for a save when the interval
// that loses the least to saves and preemptions has passed, Young (1974) / Daly (2006)'s
// sqrt(2·C/λ), from
//   C  what a save costs the training loop, measured on rank 0's periodic saves: from the
//      step boundary through the snapshot's start, plus the optimizer's wait for the
//      snapshot copy (asynchronous saves); the mean of the last save and those before (an
//      exponential average, weight 1/2). Until a save is measured, kAssumedSaveCost.
//   λ  preemptions per hour expected to strike the job: the larger of
//      checkpoint.preemption_rate_per_hour and the rate the cluster signals
//      (CheckpointPolicyOptions::signalled_preemption_rate: the coordinator's, from its
//      agents' preemption notices).
// The interval is at most checkpoint.every_seconds when set, else kAutoMaxInterval (also the
// interval while λ is 0). Rank 0 says the interval when it is first set and whenever λ
// changes or the interval halves or doubles, with its reasons.
//
// Thread-safety: from the training thread only.
#ifndef RINGMASTER_TRAIN_CHECKPOINT_POLICY_H_
#define RINGMASTER_TRAIN_CHECKPOINT_POLICY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/writer.h"
#include "comm/communicator.h"
#include "common/clock.h"
#include "common/env.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/config.h"

namespace ringmaster::train {

// A committed checkpoint, as rank 0 knows it (TrainerOptions::on_checkpoint).
struct CommittedCheckpoint {
  int64_t step = 0;
  std::string path;    // <checkpoint.dir>/<job>/step-<N>
  int world_size = 0;  // the ranks that saved it
  int64_t bytes = 0;   // its shard files together
  absl::Time committed;
  // This run's saves: from the step it snapshots to its commit, and how long the training
  // loop was blocked by it (checkpoint::CommittedSave). Zero: not measured (a checkpoint
  // found at the start).
  absl::Duration save_time;
  absl::Duration blocked_time;
};

// Young/Daly's interval sqrt(2·save_cost/λ), λ per hour, capped at `most` (also the
// interval for λ <= 0).
absl::Duration YoungDalyInterval(absl::Duration save_cost, double preemptions_per_hour,
                                 absl::Duration most);

inline constexpr absl::Duration kAssumedSaveCost = absl::Seconds(10);
inline constexpr absl::Duration kAutoMaxInterval = absl::Hours(1);

struct CheckpointPolicyOptions {
  const TrainConfig* config = nullptr;  // checkpoint.dir is set
  // Host-memory collectives of the job's ranks (the agreement on failures). Not owned.
  comm::Communicator* comm = nullptr;
  absl::Duration op_timeout = absl::Seconds(120);
  Env* env = nullptr;  // null: the real filesystem
  // What checkpoint.every_seconds is measured on (not the writer's waits). Not owned.
  Clock* clock = Clock::Real();
  const state::TensorTable* table = nullptr;
  int zero_stage = 0;
  // Bytes a save's snapshot copies on this rank (reserved up front).
  int64_t staging_reserve_bytes = 0;
  // Makes the state a save reads current in host memory (train/host_view.h Pull).
  std::function<absl::Status()> pull;
  // What this rank saves at the end of step `done` (called after `pull`).
  std::function<checkpoint::SaveRequest(int64_t done)> request;
  // Rank 0's lines for the user; every committed checkpoint (rank 0).
  std::function<void(const std::string&)> say;
  std::function<void(const CommittedCheckpoint&)> on_checkpoint;
  // checkpoint.every: auto: the job's preemptions per hour as the cluster signals them (the
  // coordinator's ProgressResponse.preemption_rate_per_hour), read at each step. Not owned;
  // may be null (the configured rate only).
  const std::atomic<double>* signalled_preemption_rate = nullptr;
};

// What became of the saves of a run.
struct CheckpointTotals {
  int64_t saved = 0;
  int64_t failed = 0;
  int64_t skipped = 0;
};

class CheckpointPolicy {
 public:
  // Errors: the writer's (e.g. a checkpoint.dir that cannot be created).
  static absl::StatusOr<std::unique_ptr<CheckpointPolicy>> Create(
      const CheckpointPolicyOptions& options);

  // Rank 0: hands the job's latest committed checkpoint (e.g. one an earlier epoch saved) to
  // on_checkpoint.
  void ReportLatestCommitted();

  // This rank's votes for the step's control all-reduce: a save now (rank 0, when
  // every_seconds, or under every: auto the current interval, have passed) and the saves it
  // failed itself.
  bool TimeToSave() const;
  double own_failures() const;

  // After step `done` (1-based), once the ranks summed their votes: `save_votes` ranks asked
  // for a save now, `failures` is the sum of own_failures(). Saves synchronously when
  // `drain` or `last_step`, else begins an asynchronous save when due. Errors: the
  // collectives'; with checkpoint.on_failure: fail, the first failed save (permanent).
  absl::Status AfterStep(int64_t done, bool drain, bool last_step, double save_votes,
                         double failures);

  // The optimizer is about to write the state an asynchronous save may still be copying.
  void FinishSnapshot();

  // Rank 0: the last save that failed so far; step -1 while none has.
  int64_t last_failed_step() const;
  std::string last_failure() const;

  // Waits (up to 10 minutes) for the running save and says what became of the saves.
  CheckpointTotals Finish();

  const std::string& job_dir() const { return writer_->job_dir(); }

  // checkpoint.every: auto: the interval TimeToSave uses now, and the save cost it rests on
  // (kAssumedSaveCost until a save was measured). Rank 0's; updated at each AfterStep.
  absl::Duration auto_interval() const { return auto_interval_; }
  absl::Duration save_cost() const { return save_cost_; }

 private:
  explicit CheckpointPolicy(const CheckpointPolicyOptions& options);
  absl::Status ExchangeFailures();
  absl::StatusOr<bool> Settle(absl::Time until);
  void ReportSaves();
  void Committed(int64_t step, int world_size, int64_t bytes, absl::Time when,
                 absl::Duration save_time = absl::ZeroDuration(),
                 absl::Duration blocked_time = absl::ZeroDuration());
  absl::Time Deadline() const { return absl::Now() + options_.op_timeout; }
  void UpdateAutoInterval();
  void MeasuredSave(absl::Duration cost);

  const CheckpointPolicyOptions options_;
  const CheckpointConfig& cs_;
  const bool leader_;
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;
  int64_t failures_reported_ = 0;
  int64_t commit_reported_ = -1;
  double agreed_failures_ = 0;  // the ranks' own failures told, summed
  int64_t told_failures_ = 0;   // this rank's
  std::string unfinished_;      // why, when Settle returned false
  absl::Time last_save_time_;
  bool snapshot_pending_ = false;
  int64_t skipped_ = 0;
  // checkpoint.every: auto (rank 0).
  absl::Duration save_cost_ = kAssumedSaveCost;
  bool save_cost_measured_ = false;
  absl::Duration unfinished_save_cost_;  // of a save whose snapshot copy is still pending
  absl::Duration auto_interval_;
  absl::Duration said_interval_;  // zero: none said yet
  double said_rate_ = -1;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_CHECKPOINT_POLICY_H_
