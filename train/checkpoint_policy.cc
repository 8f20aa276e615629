#include "train/checkpoint_policy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::train {

absl::Duration YoungDalyInterval(absl::Duration save_cost, double preemptions_per_hour,
                                 absl::Duration most) {
  if (!(preemptions_per_hour > 0)) return most;
  const double seconds =
      std::sqrt(2 * absl::ToDoubleSeconds(save_cost) * 3600 / preemptions_per_hour);
  return std::min(most, absl::Seconds(seconds));
}

namespace {

// "2m", "4.472s", "1.3ms": whole seconds from a minute up, else to a tenth of a millisecond.
std::string Readable(absl::Duration d) {
  return absl::FormatDuration(
      absl::Trunc(d, d >= absl::Minutes(1) ? absl::Seconds(1) : absl::Microseconds(100)));
}

}  // namespace

CheckpointPolicy::CheckpointPolicy(const CheckpointPolicyOptions& options)
    : options_(options),
      cs_(options.config->checkpoint),
      leader_(options.comm->rank() == 0),
      last_save_time_(options.clock->Now()) {
  if (cs_.every_auto) UpdateAutoInterval();
}

// Rank 0's interval under every: auto, said when it is first set, when λ changes and when it
// halves or doubles since last said (the measured costs vary from save to save).
void CheckpointPolicy::UpdateAutoInterval() {
  if (!cs_.every_auto || !leader_) return;
  const double configured = cs_.preemption_rate_per_hour;
  const double signalled = options_.signalled_preemption_rate != nullptr
                               ? options_.signalled_preemption_rate->load()
                               : 0.0;
  const double rate = std::max(configured, signalled);
  const absl::Duration most =
      cs_.every_seconds > 0 ? absl::Seconds(cs_.every_seconds) : kAutoMaxInterval;
  auto_interval_ = YoungDalyInterval(save_cost_, rate, most);
  const bool moved = said_interval_ == absl::ZeroDuration() ||
                     auto_interval_ <= said_interval_ / 2 || auto_interval_ >= said_interval_ * 2;
  if (rate == said_rate_ && !moved) return;
  const bool first = said_rate_ < 0;
  said_rate_ = rate;
  said_interval_ = auto_interval_;
  const std::string cost =
      absl::StrCat(save_cost_measured_ ? "measured save cost " : "assumed save cost ",
                   Readable(save_cost_));
  std::string why;
  if (rate <= 0) {
    why = absl::StrCat("no preemptions expected: the longest interval, ", cost);
  } else {
    why = absl::StrFormat("Young/Daly sqrt(2 x %s / %.3g preemptions/h), %s", cost, rate,
                          signalled > configured
                              ? absl::StrFormat("the cluster's preemption rate (configured %.3g)",
                                                configured)
                              : std::string("the configured preemption rate"));
    if (auto_interval_ == most) absl::StrAppend(&why, "; capped at ", absl::FormatDuration(most));
  }
  const std::string line =
      absl::StrCat(first ? "checkpoint interval " : "checkpoint interval now ",
                   Readable(auto_interval_), " (",
                   why, ")");
  LOG(INFO) << line;
  if (options_.say) options_.say(line);
}

void CheckpointPolicy::MeasuredSave(absl::Duration cost) {
  save_cost_ = save_cost_measured_ ? (save_cost_ + cost) / 2 : cost;
  save_cost_measured_ = true;
}

absl::StatusOr<std::unique_ptr<CheckpointPolicy>> CheckpointPolicy::Create(
    const CheckpointPolicyOptions& options) {
  std::unique_ptr<CheckpointPolicy> p(new CheckpointPolicy(options));
  const TrainConfig& config = *options.config;
  checkpoint::CheckpointWriterOptions wo;
  wo.root = config.checkpoint.dir;
  wo.job = config.name;
  if (options.env != nullptr) wo.env = options.env;
  wo.rank = options.comm->rank();
  wo.world_size = options.comm->size();
  wo.zero_stage = options.zero_stage;
  wo.spec_hash = config.checkpoint.spec_hash;
  wo.training_spec = config.checkpoint.training_spec;
  wo.table = options.table;
  wo.staging_reserve_bytes = options.staging_reserve_bytes;
  wo.retention.keep_last = config.checkpoint.keep_last;
  wo.retention.keep_every = config.checkpoint.keep_every;
  wo.on_busy = config.checkpoint.skip_when_busy ? checkpoint::OnBusy::kSkip
                                                : checkpoint::OnBusy::kWait;
  RM_ASSIGN_OR_RETURN(p->writer_, checkpoint::CheckpointWriter::Create(wo));
  return p;
}

void CheckpointPolicy::Committed(int64_t step, int world_size, int64_t bytes, absl::Time when,
                                 absl::Duration save_time, absl::Duration blocked_time) {
  if (!options_.on_checkpoint || step <= commit_reported_) return;
  commit_reported_ = step;
  options_.on_checkpoint(CommittedCheckpoint{
      step, JoinPath(writer_->job_dir(), checkpoint::StepDirName(step)), world_size, bytes, when,
      save_time, blocked_time});
}

void CheckpointPolicy::ReportLatestCommitted() {
  if (!leader_) return;
  Env* env = options_.env != nullptr ? options_.env : Env::Default();
  absl::StatusOr<int64_t> latest = checkpoint::ReadLatest(env, writer_->job_dir());
  if (!latest.ok()) return;
  absl::StatusOr<checkpoint::Manifest> m = checkpoint::ReadManifest(
      env, JoinPath(writer_->job_dir(), checkpoint::StepDirName(*latest)));
  if (!m.ok()) return;
  Committed(m->step(), m->world_size(), checkpoint::ManifestBytes(*m),
            absl::FromUnixMicros(m->created_unix_micros()));
  commit_reported_ = -1;  // this run's commits are told whatever their step
}

// Rank 0 says what became of the saves (failures, with their cause and path) and hands each
// committed checkpoint to on_checkpoint.
void CheckpointPolicy::ReportSaves() {
  const checkpoint::WriterStats ws = writer_->stats();
  if (ws.failed > failures_reported_) {
    failures_reported_ = ws.failed;
    options_.say(absl::StrCat("checkpoint of step ", ws.last_failed_step,
                              " failed (training goes on): ",
                              ws.last_failure.ToString(absl::StatusToStringMode::kWithNoExtraData)));
  }
  for (const checkpoint::CommittedSave& c : ws.recent_commits) {
    Committed(c.step, options_.comm->size(), c.bytes, c.time, c.save_time, c.blocked_time);
  }
}

bool CheckpointPolicy::TimeToSave() const {
  if (!leader_) return false;
  const absl::Duration since = options_.clock->Now() - last_save_time_;
  if (cs_.every_auto) return since >= auto_interval_;
  return cs_.every_seconds > 0 && since >= absl::Seconds(cs_.every_seconds);
}

double CheckpointPolicy::own_failures() const {
  return static_cast<double>(writer_->stats().own_failures);
}

int64_t CheckpointPolicy::last_failed_step() const {
  const checkpoint::WriterStats ws = writer_->stats();
  return ws.last_failure.ok() ? -1 : ws.last_failed_step;
}

std::string CheckpointPolicy::last_failure() const {
  const checkpoint::WriterStats ws = writer_->stats();
  return ws.last_failure.ok()
             ? std::string()
             : ws.last_failure.ToString(absl::StatusToStringMode::kWithNoExtraData);
}

// The ranks agree on the saves' outcomes (see trainer.h). Each rank tells its own failures
// not told yet, at most kRecentOwnFailures, as kFailureWords int64 words each: the step, the
// status code, and the message's bytes.
absl::Status CheckpointPolicy::ExchangeFailures() {
  constexpr int kRecent = checkpoint::CheckpointWriter::kRecentOwnFailures;
  constexpr int kFailureWords = 128;
  constexpr int kRecordWords = 1 + kRecent * kFailureWords;  // [0]: failures told, in all
  const int world = options_.comm->size();
  const checkpoint::WriterStats ws = writer_->stats();
  std::vector<int64_t> mine(kRecordWords, -1);
  const int64_t fresh = std::min<int64_t>(ws.own_failures - told_failures_,
                                          static_cast<int64_t>(ws.recent_own_failures.size()));
  for (int64_t i = 0; i < fresh; ++i) {
    const checkpoint::SaveFailure& f =
        ws.recent_own_failures[ws.recent_own_failures.size() - fresh + i];
    int64_t* entry = mine.data() + 1 + i * kFailureWords;
    entry[0] = f.step;
    entry[1] = static_cast<int64_t>(f.status.code());
    char* text = reinterpret_cast<char*>(entry + 2);
    const size_t room = (kFailureWords - 2) * sizeof(int64_t);
    std::memset(text, 0, room);
    std::memcpy(text, f.status.message().data(), std::min(room - 1, f.status.message().size()));
  }
  told_failures_ = ws.own_failures;
  mine[0] = told_failures_;
  std::vector<int64_t> all(static_cast<size_t>(kRecordWords) * world);
  RM_RETURN_IF_ERROR(options_.comm->AllGather(mine.data(), all.data(), kRecordWords,
                                              DataType::kInt64, Deadline()));
  agreed_failures_ = 0;
  absl::Status first;  // the lowest rank's first failure
  for (int r = 0; r < world; ++r) {
    const int64_t* record = all.data() + static_cast<size_t>(r) * kRecordWords;
    agreed_failures_ += static_cast<double>(record[0]);
    for (int i = 0; i < kRecent; ++i) {
      const int64_t* entry = record + 1 + i * kFailureWords;
      if (entry[0] < 0) continue;
      const absl::Status status(static_cast<absl::StatusCode>(entry[1]),
                                reinterpret_cast<const char*>(entry + 2));
      if (leader_ && r != 0) writer_->ReportPeerFailure(r, entry[0], status);
      if (first.ok()) {
        first = absl::Status(status.code(), absl::StrCat("the checkpoint of step ", entry[0],
                                                         " failed on rank ", r, ": ",
                                                         status.message()));
      }
    }
  }
  if (!first.ok() && cs_.fail_on_failure) {
    return MarkPermanent(absl::Status(
        first.code(), absl::StrCat("checkpoint.on_failure is fail and ", first.message())));
  }
  return absl::OkStatus();
}

// Every rank waits (by `until`, at most half op_timeout, so that the others' collective does
// not time out meanwhile) for its own part of the running save, then the ranks agree on the
// failures; true when every rank's part is done. Where some rank's disk is so slow that it is
// not, the caller skips the save at hand on every rank (waiting for it would stall the
// others' collectives) and says why.
absl::StatusOr<bool> CheckpointPolicy::Settle(absl::Time until) {
  absl::Status part =
      writer_->WaitOwnPart(std::min(until, absl::Now() + options_.op_timeout / 2));
  LOG_IF(WARNING, absl::IsDeadlineExceeded(part)) << "checkpoint.dir " << cs_.dir << ": " << part;
  double votes[2] = {static_cast<double>(writer_->stats().own_failures),
                     absl::IsDeadlineExceeded(part) ? 1.0 : 0.0};
  RM_RETURN_IF_ERROR(options_.comm->AllReduce(votes, votes, 2, DataType::kFloat64,
                                              comm::ReduceOp::kSum, Deadline()));
  if (votes[0] != agreed_failures_) RM_RETURN_IF_ERROR(ExchangeFailures());
  if (votes[1] == 0) return true;
  unfinished_ = absl::StrCat(votes[1],
                             " rank(s) still write their shard of the previous save "
                             "(a slow or stuck disk under checkpoint.dir ",
                             cs_.dir, "?)");
  return false;
}

void CheckpointPolicy::FinishSnapshot() {
  if (snapshot_pending_) {
    // The optimizer's wait for the snapshot copy is part of what the save cost the loop.
    const absl::Time start = options_.clock->Now();
    writer_->FinishSnapshot();
    MeasuredSave(unfinished_save_cost_ + (options_.clock->Now() - start));
  }
  snapshot_pending_ = false;
}

absl::Status CheckpointPolicy::AfterStep(int64_t done, bool drain, bool last_step,
                                         double save_votes, double failures) {
  if (failures != agreed_failures_) RM_RETURN_IF_ERROR(ExchangeFailures());
  ReportSaves();
  UpdateAutoInterval();
  if (drain || last_step) {
    // The drain save (and the last one) is synchronous: the job may end right after.
    const absl::Time limit =
        absl::Now() + (drain ? absl::Seconds(cs_.drain_grace_seconds) : absl::Minutes(10));
    FinishSnapshot();
    RM_RETURN_IF_ERROR(options_.pull());
    // The previous save, this one's parts (so that rank 0 waits for no one in vain), and its
    // commit; a save some rank cannot finish in time is given up by every rank.
    RM_ASSIGN_OR_RETURN(bool done_everywhere, Settle(limit));
    absl::Status saved = absl::DeadlineExceededError(unfinished_);
    if (done_everywhere) {
      saved = writer_->SaveWhenIdle(options_.request(done), limit);
      RM_ASSIGN_OR_RETURN(done_everywhere, Settle(limit));
      if (!done_everywhere) saved = absl::DeadlineExceededError(unfinished_);
    }
    if (done_everywhere) {
      if (saved.ok()) saved = writer_->Wait(limit);
      RM_RETURN_IF_ERROR(Settle(limit).status());
    }
    ReportSaves();
    if (!saved.ok()) {
      options_.say(absl::StrCat("checkpoint of step ", done, " failed: ",
                                saved.ToString(absl::StatusToStringMode::kWithNoExtraData)));
    } else {
      options_.say(absl::StrCat("checkpoint of step ", done, " saved in ", writer_->job_dir()));
    }
    return absl::OkStatus();
  }
  if (!((cs_.every_steps > 0 && done % cs_.every_steps == 0) || save_votes > 0)) {
    return absl::OkStatus();
  }
  FinishSnapshot();
  const absl::Time save_start = options_.clock->Now();
  RM_RETURN_IF_ERROR(options_.pull());
  // Waiting for the previous save must not wait for a rank that failed it.
  bool done_everywhere = true;
  if (!cs_.skip_when_busy) {
    RM_ASSIGN_OR_RETURN(done_everywhere, Settle(absl::InfiniteFuture()));
  }
  if (done_everywhere) {
    // An asynchronous save's snapshot is copied by the writer's thread while the next step's
    // forward and backward run (they only read the state); the optimizer waits for it.
    RM_ASSIGN_OR_RETURN(checkpoint::SaveOutcome outcome,
                        writer_->BeginSave(options_.request(done)));
    snapshot_pending_ = outcome == checkpoint::SaveOutcome::kStarted;
    if (outcome == checkpoint::SaveOutcome::kSkipped) ++skipped_;
    // What the loop paid so far; a pending snapshot's copy is added when it is waited for.
    unfinished_save_cost_ = options_.clock->Now() - save_start;
    if (outcome != checkpoint::SaveOutcome::kSkipped && !snapshot_pending_) {
      MeasuredSave(unfinished_save_cost_);
    }
  } else {
    ++skipped_;
    options_.say(absl::StrCat("checkpoint of step ", done, " skipped: ", unfinished_));
  }
  last_save_time_ = options_.clock->Now();
  return absl::OkStatus();
}

CheckpointTotals CheckpointPolicy::Finish() {
  FinishSnapshot();
  absl::Status last = writer_->Wait(absl::Now() + absl::Minutes(10));
  ReportSaves();
  const checkpoint::WriterStats ws = writer_->stats();
  if (!last.ok() && !absl::IsDeadlineExceeded(last)) {
    LOG(WARNING) << "the last checkpoint save failed: " << last;
  }
  return CheckpointTotals{ws.succeeded, ws.failed, skipped_ + ws.skipped};
}

}  // namespace ringmaster::train
