// What a command job's runner makes of its program's messages on the program channel
// (worker/program_channel.h): the RankStats of its progress reports, for the coordinator's
// views (`ringctl top` and `status`, the dashboard's curves, /metrics, stragglers) as a
// built-in trainer's, the job's metrics JSONL (rank 0: a record every log_every steps, with
// the program's named scalars), and whether the program is alive (its heartbeats).
//
//   report {step, loss, samples, tokens, scalars, time} → RankStats: step, loss, step_time_s
//     (between the last two reports' times, per step), steps_per_s over the last 30 s of
//     reports (common/progress_rate.h, as a built-in trainer's progress line), samples_per_s
//     and tokens_per_s (the samples and tokens those reports' steps took, over that time:
//     `samples` is a step's, all ranks together), and from the scalars named lr, grad_norm,
//     comm_fraction (the step's share spent in collectives, which lets the coordinator tell
//     a slow rank's compute from its peers', a straggler) and exposed_comm_fraction.
//   hello, heartbeat, world_done: only that the program lives.
//
// Hang detection: a program that never said hello gets the keep-alive a program of old did
// (the runner cannot tell it is frozen); one that said hello is alive while its last message
// is at most heartbeat_timeout old. A SIGSTOPped program then goes silent, the runner stops
// its keep-alives, and the coordinator's silence detection re-forms the group.
//
// Thread-safety: not synchronised; the runner's thread owns it.
#ifndef RINGMASTER_WORKER_PROGRAM_PROGRESS_H_
#define RINGMASTER_WORKER_PROGRAM_PROGRESS_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/progress_rate.h"
#include "nlohmann/json.hpp"
#include "proto/coordinator.pb.h"

namespace ringmaster::worker {

struct ProgramProgressOptions {
  int rank = 0;
  // Rank 0 appends its records here (spec metrics.jsonl); empty: none. Other ranks write none.
  std::string metrics_jsonl;
  std::string job;  // the records' "job" and "run" (spec metrics.run)
  std::string run;
  // A record every this many steps (spec diagnostics.log_every): the first report, then the
  // first at or past the last record's step plus log_every.
  int64_t log_every = 10;
  // A program that said hello and sent nothing for longer is not alive (0.5 s heartbeats).
  absl::Duration heartbeat_timeout = absl::Milliseconds(750);
};

class ProgramProgress {
 public:
  // FAILED_PRECONDITION naming metrics.jsonl's file when rank 0 cannot append to it.
  static absl::StatusOr<std::unique_ptr<ProgramProgress>> Create(
      const ProgramProgressOptions& options);

  // One message from the program, received at `now`. A report whose fields are not of their
  // types (a step that is not a non-negative integer, a loss that is not a number) is logged,
  // naming the field, and dropped.
  void Take(const nlohmann::json& message, absl::Time now);

  // The stats of the newest report not yet taken; nullopt when no report came since.
  std::optional<RankStats> TakeStats();

  // The newest report's stats, taken or not; nullopt before any.
  std::optional<RankStats> last_stats() const {
    return step_ >= 0 ? std::optional<RankStats>(stats_) : std::nullopt;
  }

  // Whether the runner keeps sending keep-alives for the program at `now`.
  bool Alive(absl::Time now) const;
  bool said_hello() const { return said_hello_; }
  // The last report's step; -1 before any.
  int64_t step() const { return step_; }

 private:
  explicit ProgramProgress(const ProgramProgressOptions& options) : options_(options) {}
  void TakeReport(const nlohmann::json& message, absl::Time now);
  void WriteRecord(const nlohmann::json& message, const RankStats& stats, double window_s);

  ProgramProgressOptions options_;
  std::ofstream metrics_;
  bool said_hello_ = false;
  absl::Time last_message_ = absl::InfinitePast();
  int64_t step_ = -1;
  absl::Time step_at_ = absl::InfinitePast();
  ProgressRate rate_;
  // The samples and tokens counted up to each report, over the same window (the "steps" of
  // these rates are samples and tokens, as train/step_reporter's samples rate).
  ProgressRate sample_rate_, token_rate_;
  int64_t samples_ = 0, tokens_ = 0;
  RankStats stats_;
  bool fresh_ = false;
  int64_t recorded_step_ = -1;
  absl::Time recorded_at_ = absl::InfinitePast();
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_PROGRAM_PROGRESS_H_
