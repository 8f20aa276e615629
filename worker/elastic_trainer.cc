#include "worker/elastic_trainer.h"

#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/progress_rate.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "glog/logging.h"
#include "train/model_factory.h"
#include "worker/comm_report.h"
#include "worker/epoch_calls.h"
#include "client/coordinator_store.h"

namespace ringmaster::worker {
namespace {

bool JobIsOver(const absl::Status& s) { return absl::IsFailedPrecondition(s); }

// Sends the latest step report and the checkpoints committed to the coordinator from its
// own thread, so that a slow or restarting coordinator never stalls training, and watches
// the answers for a new epoch. A ring the coordinator fenced out (it formed a later epoch
// after a failure without asking this ring to save, or the job is over) is stopped at once
// by aborting its communicator: it must not train on, nor write checkpoints, beside the
// epoch that replaced it.
class ProgressReporter {
 public:
  // `preemption_rate`: where the coordinator's ProgressResponse.preemption_rate_per_hour
  // goes (the checkpoint policy's signal under checkpoint.every: auto). `comm`: this
  // epoch's communicator, aborted when the ring is fenced out (not owned; outlives this).
  ProgressReporter(const ElasticTrainerOptions& options, int64_t epoch, int rank,
                   std::atomic<bool>* drain, std::atomic<double>* preemption_rate,
                   const ProcessCommStats* comm_stats, comm::Communicator* comm)
      : options_(options), epoch_(epoch), rank_(rank), drain_(drain),
        preemption_rate_(preemption_rate), comm_stats_(comm_stats), comm_(comm),
        thread_([this] { Loop(); }) {}

  // Reports the checkpoints still queued (so that they are known before the job can
  // finish), then stops.
  ~ProgressReporter() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    SendCheckpoints();
  }

  void Report(const train::StepReport& report) {
    absl::MutexLock lock(&mu_);
    latest_ = report;
  }

  // Rank 0: a committed checkpoint, for `ringctl checkpoints`.
  void ReportCheckpoint(const train::CommittedCheckpoint& c) {
    ReportCheckpointRequest request;
    request.set_job(options_.job);
    request.set_epoch(epoch_);
    *request.mutable_slot() = options_.slot;
    CheckpointInfo* info = request.mutable_checkpoint();
    info->set_step(c.step);
    info->set_path(c.path);
    info->set_world_size(c.world_size);
    info->set_bytes(c.bytes);
    info->set_committed_ms(absl::ToUnixMillis(c.committed));
    info->set_save_seconds(absl::ToDoubleSeconds(c.save_time));
    info->set_blocked_seconds(absl::ToDoubleSeconds(c.blocked_time));
    absl::MutexLock lock(&mu_);
    checkpoints_.push_back(std::move(request));
  }

  // The newest epoch the coordinator named, and whether this trainer must leave.
  int64_t announced_epoch() const {
    absl::MutexLock lock(&mu_);
    return announced_;
  }
  bool leave() const {
    absl::MutexLock lock(&mu_);
    return leave_;
  }
  // Whether the ring was fenced out (its communicator aborted by this reporter).
  bool fenced() const { return fenced_.load(); }

 private:
  // Whether Loop has something to do: stop, a step to report or checkpoints to send.
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || latest_.has_value() || !checkpoints_.empty();
  }

  void Loop() {
    while (true) {
      std::optional<train::StepReport> report;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(this, &ProgressReporter::HasWork),
                             absl::Milliseconds(500));
        if (stop_) return;
        report = std::exchange(latest_, std::nullopt);
      }
      SendCheckpoints();
      if (options_.leave_requested != nullptr && options_.leave_requested->load()) {
        drain_->store(true);
        absl::MutexLock lock(&mu_);
        leave_ = true;
      }
      // Without a new step the report is a keep-alive (step -1): this process lives. A
      // stopped process sends nothing and the coordinator finds it hung.
      ProgressRequest request;
      request.set_job(options_.job);
      request.set_epoch(epoch_);
      *request.mutable_slot() = options_.slot;
      RankStats* stats = request.mutable_stats();
      stats->set_rank(rank_);
      if (report) {
        stats->set_step(report->step);
        stats->set_loss(report->loss);
        stats->set_grad_norm(report->grad_norm);
        stats->set_step_time_s(absl::ToDoubleSeconds(report->step_time));
        const double step_s = absl::ToDoubleSeconds(report->step_time);
        stats->set_comm_fraction(step_s > 0 ? absl::ToDoubleSeconds(report->comm_time) / step_s
                                            : 0);
        stats->set_steps_per_s(report->steps_per_s);
        stats->set_samples_per_s(report->samples_per_s);
        stats->set_tokens_per_s(report->tokens_per_s);
        stats->set_exposed_comm_fraction(report->exposed_comm_fraction);
        stats->set_lr(report->lr);
        stats->set_loss_scale(report->loss_scale);
        request.set_total_steps(report->total_steps);
        comm_stats_->Fill(stats);
        if (!report->checkpoint_error.empty()) {
          request.set_checkpoint_error_step(report->checkpoint_error_step);
          request.set_checkpoint_error(report->checkpoint_error);
        }
      } else {
        stats->set_step(-1);  // a keep-alive between steps: nothing new to report
      }
      auto response = options_.client->Progress(request);
      if (absl::IsFailedPrecondition(response.status())) {
        Fence(absl::StrCat("the job is over: ", response.status().message()));
        continue;
      }
      if (!response.ok()) {
        LOG(WARNING) << "progress report failed: " << response.status();
        continue;
      }
      preemption_rate_->store(response->preemption_rate_per_hour());
      if (response->epoch() > epoch_) {
        const bool save = response->save_now() || response->leave();
        {
          absl::MutexLock lock(&mu_);
          announced_ = response->epoch();
          leave_ = leave_ || response->leave();
        }
        // A whole ring asked to save (drain, growth) stops at the next step boundary. Any
        // other later epoch was formed without this ring (a failure: a member died, hung,
        // or its node was cut off): the ring stops now, whole or not.
        if (save) {
          drain_->store(true);
        } else {
          Fence(absl::StrCat("the coordinator formed epoch ", response->epoch(),
                             " after a failure"));
        }
      }
    }
  }

  void Fence(const std::string& why) {
    if (fenced_.exchange(true)) return;
    LOG(WARNING) << "epoch " << epoch_ << " is over (" << why
                 << "): aborting this ring's communicator";
    comm_->Abort();
  }

  // A checkpoint reported after the epoch ended (a drain save) is refused as stale; the
  // next epoch's rank 0 reports the latest checkpoint when it starts.
  void SendCheckpoints() {
    std::vector<ReportCheckpointRequest> queued;
    {
      absl::MutexLock lock(&mu_);
      queued.swap(checkpoints_);
    }
    for (const ReportCheckpointRequest& request : queued) {
      absl::Status s = options_.client->ReportCheckpoint(request);
      if (absl::IsAborted(s) || absl::IsFailedPrecondition(s)) {
        LOG(INFO) << "checkpoint of step " << request.checkpoint().step()
                  << " not reported in epoch " << epoch_ << ": " << s;
      } else if (!s.ok()) {
        LOG(WARNING) << "reporting the checkpoint of step " << request.checkpoint().step()
                     << " failed: " << s;
      }
    }
  }

  const ElasticTrainerOptions& options_;
  const int64_t epoch_;
  const int rank_;
  std::atomic<bool>* const drain_;
  std::atomic<double>* const preemption_rate_;
  const ProcessCommStats* const comm_stats_;  // this process's communication (not owned)
  comm::Communicator* const comm_;
  std::atomic<bool> fenced_{false};
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<train::StepReport> latest_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportCheckpointRequest> checkpoints_ ABSL_GUARDED_BY(mu_);
  int64_t announced_ ABSL_GUARDED_BY(mu_) = 0;
  bool leave_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

absl::StatusOr<int64_t> NextEpoch(const ElasticTrainerOptions& o, int64_t epoch) {
  return worker::NextEpoch({o.client, o.job, o.slot}, epoch, o.join_timeout, o.clock);
}

void ReportCollectiveError(const ElasticTrainerOptions& o, int64_t epoch,
                           const absl::Status& error) {
  ReportEpochError({o.client, o.job, o.slot}, epoch, error);
}

// Reads the spec and loads the data once (the first epoch this trainer joins), and checks
// that a run continued in this epoch can be restored. An error is reported to the
// coordinator (permanent, or this node's) and ends the trainer.
absl::Status PrepareEpoch(const ElasticTrainerOptions& o, int64_t epoch, bool continues_run,
                          bool trained_an_epoch, std::optional<train::TrainConfig>& config,
                          std::optional<train::JobData>& data) {
  if (!config) {
    // A spec the engine cannot run fails the same way on every node and every restart.
    absl::StatusOr<train::TrainConfig> c = config::TrainConfigFromSpec(o.spec);
    if (!c.ok()) {
      const absl::Status s = MarkPermanent(c.status());
      ReportCollectiveError(o, epoch, s);
      return s;
    }
    config = *std::move(c);
  }
  if (!data) {
    absl::StatusOr<train::JobData> loaded =
        o.load_data ? o.load_data(*config) : train::LoadJobData(*config);
    if (!loaded.ok()) {
      // Out of memory, say: the epoch is committed, so the job fails at once instead of
      // restarting into it again. Any other failure to read the data (missing, unreadable,
      // corrupt) is this node's: another node may have it, a restart here would not.
      absl::Status s = loaded.status();
      if (!IsPermanent(s)) s = MarkNodeLocal(s);
      ReportCollectiveError(o, epoch, s);
      return s;
    }
    data = *std::move(loaded);
  }
  // A later epoch of the run continues it. Without checkpoint.dir only a survivor's memory
  // holds the state, and only a whole state (plain data parallelism) can be handed to every
  // rank of another world from it.
  if (continues_run && o.spec.checkpoint().dir().empty() && !spec::RanksHoldWholeState(o.spec)) {
    const std::string why = absl::StrCat(
        "job ", o.job, " has no checkpoint.dir and its state is sharded over its ranks, so "
        "no rank can restore it in another world; set checkpoint.dir in the job spec");
    if (trained_an_epoch) {
      // This trainer left its last epoch in order (a drain): the run would be thrown away.
      const absl::Status s = MarkPermanent(absl::FailedPreconditionError(why));
      ReportCollectiveError(o, epoch, s);
      return s;
    }
    LOG(WARNING) << why << "; epoch " << epoch << " restarts the training from step 0";
  }
  return absl::OkStatus();
}

// The job's configuration for an epoch: one that continues the run resumes it (from a
// survivor's memory, else the latest checkpoint), whatever spec.resume says.
train::TrainConfig EpochConfig(const train::TrainConfig& config, bool continues_run) {
  train::TrainConfig c = config;
  if (continues_run) c.checkpoint.resume = {train::ResumeConfig::Kind::kAuto, 0, "auto"};
  return c;
}

// Where the epoch's trainer finds its data, communicators and progress output.
void SetEpochPlaces(const ElasticTrainerOptions& o, const train::JobData& data,
                    comm::Communicator* comm, client::CoordinatorStore* store,
                    const std::string& store_prefix, int rank, train::TrainerOptions* to) {
  to->comm = comm;
  to->train_data = data.train;
  to->test_data = data.test;
  to->local_ranks = o.local_ranks;
  to->gpu = o.slot.slot();
  // NCCL for the gradients when every rank has its own GPU; its unique id goes through the
  // coordinator under this epoch's prefix.
  to->nccl_store = store;
  to->nccl_prefix = absl::StrCat(store_prefix, "nccl");
  to->op_timeout = o.op_timeout;
  if (rank == 0) to->progress = o.progress;
}

// Tells the coordinator that this rank trained the job to its end in `epoch`: the last step
// (the job's length) and its loss, whether or not the progress thread reported them yet.
absl::Status ReportFinished(const ElasticTrainerOptions& o, int64_t epoch, int rank,
                            const train::TrainResult& trained) {
  FinishedRequest finished;
  finished.set_job(o.job);
  finished.set_epoch(epoch);
  *finished.mutable_slot() = o.slot;
  finished.mutable_stats()->set_rank(rank);
  finished.mutable_stats()->set_step(trained.steps());
  finished.mutable_stats()->set_loss(trained.final_loss());
  finished.set_total_steps(trained.steps());
  return o.client->Finished(finished);
}

// Sets the trainer's restore callbacks: where the state came from is kept in `restored` (for
// the coordinator's recovery record; rank 0 says it, and the steps lost when the job had gone
// further, in its progress lines), and Ready is reported once the state is restored
// (`ready_refused` when the coordinator refused it).
void SetReadyReport(const ElasticTrainerOptions& o, int64_t epoch, int rank,
                    const JoinResponse& joined, std::optional<train::Restored>* restored,
                    bool* ready_refused, train::TrainerOptions* to) {
  to->on_resumed = [&o, epoch, rank, joined, restored](const train::Restored& r) {
    *restored = r;
    if (!joined.has_step_before()) return;
    const std::string line = ResumeText(joined.step_before(), r.step,
                                        train::RestoredFromText(r), r.not_from_memory);
    LOG(INFO) << "membership epoch " << epoch << ": " << line;
    if (rank == 0 && o.progress) o.progress(line);
  };
  to->on_restored = [&o, epoch, restored, ready_refused](int64_t) -> absl::Status {
    ReadyRequest ready;
    ready.set_job(o.job);
    ready.set_epoch(epoch);
    *ready.mutable_slot() = o.slot;
    if (*restored) {
      ready.set_restored_step((*restored)->step);
      ready.set_restored_from(train::RestoredFromText(**restored));
      ready.set_restore_note((*restored)->not_from_memory);
    }
    absl::Status s = o.client->Ready(ready);
    *ready_refused = !s.ok();
    return s;
  };
}

}  // namespace

absl::StatusOr<ElasticResult> RunElasticTrainer(const ElasticTrainerOptions& o) {
  if (o.client == nullptr || o.clock == nullptr) {
    return absl::InvalidArgumentError("no coordinator client or no clock");
  }
  // Loaded once, in the first epoch joined: every epoch trains on the same data (a recovery
  // then pays no reload).
  std::optional<train::JobData> data;
  std::optional<train::TrainConfig> config;
  ElasticResult result;
  // The state after this trainer's last completed step, across epochs: after a failure the
  // survivors restore from it (TrainerOptions::resident) instead of the checkpoint.
  train::ResidentState resident;
  // The cluster's preemption rate for this job as the coordinator last told it, across
  // epochs (checkpoint.every: auto).
  std::atomic<double> preemption_rate{0};
  ProcessCommStats comm_stats;  // RankStats.comm_ops, buckets, process_steps
  int64_t epoch = o.first_epoch;
  while (true) {
    JoinRequest join;
    join.set_job(o.job);
    join.set_epoch(epoch);
    *join.mutable_slot() = o.slot;
    auto joined = o.client->Join(join, absl::Now() + o.join_timeout);
    if (absl::IsAborted(joined.status())) {
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
      continue;
    }
    if (!joined.ok()) return joined.status();
    epoch = joined->epoch();
    const int rank = joined->rank(), world = joined->world_size();
    result.last_rank = rank;
    LOG(INFO) << "job " << o.job << " membership epoch " << epoch << ": rank " << rank << " of "
              << world;
    if (absl::Status s = PrepareEpoch(o, epoch, joined->continues_run(), result.epochs > 0,
                                      config, data);
        !s.ok()) {
      return s;
    }

    client::CoordinatorStore store(o.client, o.job, o.slot, epoch);
    comm::TcpCommunicatorOptions co;
    co.rank = rank;
    co.size = world;
    co.store = &store;
    co.prefix = absl::StrCat(joined->store_prefix(), "tcp");
    co.listen_host = o.advertise_host;
    co.connect_timeout = o.connect_timeout;
    auto comm = comm::TcpCommunicator::Create(co);
    if (!comm.ok()) {
      LOG(WARNING) << "epoch " << epoch << " bootstrap failed: " << comm.status();
      ReportCollectiveError(o, epoch, comm.status());
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
      continue;
    }
    std::atomic<bool> drain{false};
    train::TrainerOptions to;
    to.config = EpochConfig(*config, joined->continues_run());
    SetEpochPlaces(o, *data, comm->get(), &store, joined->store_prefix(), rank, &to);
    to.drain_requested = &drain;
    to.preemption_rate_per_hour = &preemption_rate;
    to.resident = &resident;
    // Ready once the state is restored (checkpoint read, data loaded): the coordinator's
    // restore phase ends here.
    bool ready_refused = false;
    std::optional<train::Restored> restored;
    SetReadyReport(o, epoch, rank, *joined, &restored, &ready_refused, &to);
    absl::StatusOr<train::TrainResult> trained;
    int64_t announced = 0;
    bool leave = false;
    bool fenced = false;
    {
      ProgressReporter reporter(o, epoch, rank, &drain, &preemption_rate, &comm_stats,
                                comm->get());
      to.on_step = [&reporter, &comm_stats](const train::StepReport& r) {
        comm_stats.Update(r);
        reporter.Report(r);
      };
      to.on_checkpoint = [&reporter](const train::CommittedCheckpoint& c) {
        reporter.ReportCheckpoint(c);
      };
      trained = o.train ? o.train(to) : train::RunTraining(to);
      announced = reporter.announced_epoch();
      leave = reporter.leave();
      fenced = reporter.fenced();
    }
    comm_stats.EndEpoch();
    leave = leave || (o.leave_requested != nullptr && o.leave_requested->load());
    if (!trained.ok() && ready_refused && JobIsOver(trained.status())) return trained.status();
    if (!trained.ok()) {
      (*comm)->Abort();
      LOG(WARNING) << "epoch " << epoch << " failed: " << trained.status();
      if (leave) {
        result.left = true;
        return result;
      }
      // A ring stopped because the coordinator fenced it out has nothing to report: the
      // coordinator has moved on.
      if (!(fenced && absl::IsAborted(trained.status()))) {
        ReportCollectiveError(o, epoch, trained.status());
      }
      if (IsPermanent(trained.status())) return trained.status();  // the job has failed
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, std::max(epoch, announced - 1)));
      continue;
    }
    result.last = *trained;
    ++result.epochs;
    if (!trained->drained()) {
      if (o.before_finished) RM_RETURN_IF_ERROR(o.before_finished(result));
      RM_RETURN_IF_ERROR(ReportFinished(o, epoch, rank, *trained));
      return result;
    }
    if (leave) {
      result.left = true;
      return result;
    }
    RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, std::max(epoch, announced - 1)));
  }
}

}  // namespace ringmaster::worker
