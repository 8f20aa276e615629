// The elastic trainer's epoch loop against a scripted coordinator. The epoch's training is
// a test function (ElasticTrainerOptions::train) that plays what a real one would do: it
// reports Ready and steps, fails, or waits for the drain the coordinator asked for. Each
// epoch has one rank, so the real TCP communicator bootstraps through the fake's store.
#include "worker/elastic_trainer.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "client/testing/fake_coordinator.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using client::testing::FakeCoordinator;

// A join of `epoch`; every epoch after the first continues the run (the coordinator's
// JoinResponse.continues_run), unless `continues` says otherwise.
JoinResponse Joined(int64_t epoch, std::optional<bool> continues = std::nullopt) {
  JoinResponse r;
  r.set_epoch(epoch);
  r.set_continues_run(continues.value_or(epoch > 1));
  r.set_rank(0);
  r.set_world_size(1);
  r.set_store_prefix(absl::StrCat("epoch-", epoch, "/"));
  return r;
}

ProgressResponse AtEpoch(int64_t epoch) {
  ProgressResponse r;
  r.set_epoch(epoch);
  return r;
}

// Waits (yielding, not sleeping) until `done`, for at most 30 s of real time.
bool Eventually(const std::function<bool()>& done) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

// A clock whose sleeps take no time: each moves it on to its deadline. (The loop's only
// sleep is its wait for the next epoch, on the trainer's thread.)
class InstantClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SleepUntil(absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    now_ = std::max(now_, deadline);
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1000);
};

// What one epoch's training does after Ready (on_restored).
using Epoch = std::function<absl::StatusOr<train::TrainResult>(const train::TrainerOptions&)>;

train::TrainResult Trained(int64_t steps, double loss = 0.25) {
  train::TrainResult r;
  r.set_steps(static_cast<int32_t>(steps));
  r.set_final_loss(loss);
  return r;
}

// An epoch that takes the step `report`, then stops once the loop asks for a drain (what
// the coordinator's answer to that report should cause), as drained.
Epoch StepThenDrain(train::StepReport report) {
  return [report](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    to.on_step(report);
    if (!Eventually([&] { return to.drain_requested->load(); })) {
      return absl::InternalError("no drain asked");
    }
    train::TrainResult r = Trained(report.step);
    r.set_drained(true);
    return r;
  };
}

class ElasticTrainerTest : public ::testing::Test {
 protected:
  ElasticTrainerTest() {
    fake_.ready.Always(ReadyResponse());
    fake_.finished.Always(FinishedResponse());
    fake_.report_error.Always(ReportErrorResponse());
    fake_.report_checkpoint.Always(ReportCheckpointResponse());
    fake_.progress.Always(AtEpoch(1));
  }

  ElasticTrainerOptions Options() {
    ElasticTrainerOptions o;
    o.client = &fake_;
    o.job = "job-a";
    o.slot.set_node("node-a");
    o.slot.set_slot(0);
    o.spec.set_name("job-a");
    o.spec.mutable_checkpoint()->set_dir("/ckpt");
    // What the trainer's options need (config/train_config.h); the data is never loaded.
    o.spec.mutable_model()->mutable_mlp();
    o.spec.mutable_data()->mutable_fashion_mnist();
    o.spec.mutable_optimizer()->mutable_sgd();
    o.spec.set_resume("extend");
    o.connect_timeout = absl::Seconds(30);
    o.load_data = [this](const train::TrainConfig&) -> absl::StatusOr<train::JobData> {
      ++loads_;
      return train::JobData();
    };
    o.train = [this](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
      seen_.push_back(to.config);
      EXPECT_NE(to.comm, nullptr);
      EXPECT_EQ(to.comm->size(), 1);
      if (to.on_restored) RM_RETURN_IF_ERROR(to.on_restored(0));
      if (epochs_.empty()) return absl::InternalError("no epoch scripted");
      Epoch epoch = epochs_.front();
      epochs_.erase(epochs_.begin());
      return epoch(to);
    };
    o.clock = &clock_;
    return o;
  }

  FakeCoordinator fake_;
  InstantClock clock_;
  std::vector<Epoch> epochs_;
  std::vector<train::TrainConfig> seen_;
  int loads_ = 0;
};

TEST_F(ElasticTrainerTest, JoinsTrainsAndReportsFinished) {
  fake_.join.Then(Joined(1));
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(10, 0.5); });
  ElasticTrainerOptions o = Options();
  int before_finished = 0;
  o.before_finished = [&](const ElasticResult& r) {
    ++before_finished;
    EXPECT_EQ(fake_.finished.calls(), 0) << "before the coordinator hears";
    EXPECT_EQ(r.last.steps(), 10);
    return absl::OkStatus();
  };
  auto result = RunElasticTrainer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->epochs, 1);
  EXPECT_EQ(result->last_rank, 0);
  EXPECT_FALSE(result->left);
  EXPECT_EQ(before_finished, 1);
  ASSERT_EQ(fake_.join.calls(), 1);
  EXPECT_EQ(fake_.join.requests()[0].epoch(), 1);
  EXPECT_EQ(fake_.join.requests()[0].slot().node(), "node-a");
  ASSERT_EQ(fake_.ready.calls(), 1);
  EXPECT_EQ(fake_.ready.requests()[0].epoch(), 1);
  ASSERT_EQ(fake_.finished.calls(), 1);
  const FinishedRequest finished = fake_.finished.requests()[0];
  EXPECT_EQ(finished.epoch(), 1);
  EXPECT_EQ(finished.total_steps(), 10);
  EXPECT_EQ(finished.stats().step(), 10);
  EXPECT_DOUBLE_EQ(finished.stats().loss(), 0.5);
  EXPECT_NE(seen_.at(0).checkpoint.resume.text, "auto") << "the first epoch resumes as the spec says";
}

TEST_F(ElasticTrainerTest, AnAbortedJoinAsksForTheNextEpochAndJoinsIt) {
  fake_.join.Then(absl::AbortedError("epoch 1 is over")).Then(Joined(3));
  fake_.progress.Then(AtEpoch(1)).Then(AtEpoch(3));
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(4); });
  ElasticTrainerOptions o = Options();
  auto result = RunElasticTrainer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  const auto joins = fake_.join.requests();
  ASSERT_EQ(joins.size(), 2u);
  EXPECT_EQ(joins[1].epoch(), 3);
  EXPECT_EQ(fake_.finished.requests().at(0).epoch(), 3);
}

TEST_F(ElasticTrainerTest, NoNextEpochWithinTheJoinTimeoutIsDeadlineExceeded) {
  fake_.join.Then(absl::AbortedError("epoch 1 is over"));
  ElasticTrainerOptions o = Options();
  o.join_timeout = absl::Seconds(1);
  auto result = RunElasticTrainer(o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  // Asked every 100 ms of the clock, from 0 to the second the timeout gives.
  EXPECT_EQ(fake_.progress.calls(), 11);
  EXPECT_EQ(clock_.Now(), absl::FromUnixSeconds(1001));
}

TEST_F(ElasticTrainerTest, AFailedEpochIsReportedAndTheNextOneResumes) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  fake_.progress.Always(AtEpoch(2));
  epochs_.push_back([](const train::TrainerOptions&) -> absl::StatusOr<train::TrainResult> {
    return absl::UnavailableError("peer 1 died");
  });
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(8); });
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->epochs, 1) << "trained to the end in one epoch";
  ASSERT_EQ(fake_.report_error.calls(), 1);
  const ReportErrorRequest error = fake_.report_error.requests()[0];
  EXPECT_EQ(error.epoch(), 1);
  EXPECT_TRUE(absl::StrContains(error.detail(), "peer 1 died"));
  EXPECT_FALSE(error.permanent());
  EXPECT_EQ(seen_.size(), 2u);
  EXPECT_EQ(loads_, 1) << "the data is loaded once";
  EXPECT_EQ(fake_.finished.requests().at(0).epoch(), 2);
}

// A step report's and a committed checkpoint's figures reach the coordinator as they were
// (RankStats, CheckpointInfo): what its metrics show.
TEST_F(ElasticTrainerTest, ProgressAndCheckpointsCarryTheTrainersFigures) {
  fake_.join.Then(Joined(1));
  train::StepReport report;
  report.step = 7;
  report.total_steps = 100;
  report.step_time = absl::Milliseconds(100);
  report.comm_time = absl::Milliseconds(25);
  report.steps_per_s = 5;
  report.samples_per_s = 640;
  report.tokens_per_s = 81920;
  report.exposed_comm_fraction = 0.125;
  report.lr = 0.003;
  report.loss_scale = 1024;
  train::CommittedCheckpoint checkpoint;
  checkpoint.step = 5;
  checkpoint.path = "/ckpt/job-a/step-5";
  checkpoint.world_size = 1;
  checkpoint.save_time = absl::Milliseconds(1500);
  checkpoint.blocked_time = absl::Milliseconds(250);
  const auto stepped = [this] {
    for (const ProgressRequest& r : fake_.progress.requests()) {
      if (r.stats().step() == 7) return true;  // (keep-alives, step -1, may come first)
    }
    return false;
  };
  epochs_.push_back([&](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    to.on_checkpoint(checkpoint);
    to.on_step(report);
    if (!Eventually([&] { return stepped() && fake_.report_checkpoint.calls() > 0; })) {
      return absl::InternalError("the step and the checkpoint were not reported");
    }
    return Trained(100);
  });
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  RankStats stats;
  for (const ProgressRequest& r : fake_.progress.requests()) {
    if (r.stats().step() == 7) stats = r.stats();
  }
  EXPECT_DOUBLE_EQ(stats.comm_fraction(), 0.25);
  EXPECT_DOUBLE_EQ(stats.steps_per_s(), 5);
  EXPECT_DOUBLE_EQ(stats.samples_per_s(), 640);
  EXPECT_DOUBLE_EQ(stats.tokens_per_s(), 81920);
  EXPECT_DOUBLE_EQ(stats.exposed_comm_fraction(), 0.125);
  EXPECT_DOUBLE_EQ(stats.lr(), 0.003);
  EXPECT_DOUBLE_EQ(stats.loss_scale(), 1024);
  const CheckpointInfo info = fake_.report_checkpoint.requests().at(0).checkpoint();
  EXPECT_EQ(info.step(), 5);
  EXPECT_DOUBLE_EQ(info.save_seconds(), 1.5);
  EXPECT_DOUBLE_EQ(info.blocked_seconds(), 0.25);
}

TEST_F(ElasticTrainerTest, AMembershipChangeDrainsTheEpochAndRejoins) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  // The first step's report is answered with epoch 2 and a save: the ring is whole.
  ProgressResponse change = AtEpoch(2);
  change.set_save_now(true);
  fake_.progress.Then(change).Always(AtEpoch(2));
  epochs_.push_back(StepThenDrain(train::StepReport{.step = 5, .total_steps = 100, .loss = 1.5}));
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(100); });
  ElasticTrainerOptions o = Options();
  o.spec.set_resume("never");
  auto result = RunElasticTrainer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->epochs, 2);
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_EQ(seen_[0].checkpoint.resume.text, "never");
  EXPECT_EQ(seen_[1].checkpoint.resume.text, "auto") << "after an epoch, from the latest state";
  EXPECT_EQ(fake_.report_error.calls(), 0) << "a drain is no failure";
  const ProgressRequest first = fake_.progress.requests().at(0);
  EXPECT_EQ(first.epoch(), 1);
  EXPECT_EQ(first.stats().step(), 5);
  EXPECT_DOUBLE_EQ(first.stats().loss(), 1.5);
  EXPECT_EQ(first.total_steps(), 100);
  EXPECT_EQ(fake_.join.requests().at(1).epoch(), 2);
  EXPECT_EQ(fake_.finished.requests().at(0).epoch(), 2);
}

// The coordinator's preemption rate for the job reaches the trainer's checkpoint policy
// (checkpoint.every: auto).
TEST_F(ElasticTrainerTest, TheClustersPreemptionRateReachesTheTrainer) {
  fake_.join.Then(Joined(1));
  ProgressResponse rate = AtEpoch(1);
  rate.set_preemption_rate_per_hour(0.75);
  fake_.progress.Always(rate);
  epochs_.push_back([](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    if (to.preemption_rate_per_hour == nullptr) return absl::InternalError("no rate signal");
    to.on_step(train::StepReport{.step = 1, .total_steps = 10, .loss = 1.5});
    if (!Eventually([&] { return to.preemption_rate_per_hour->load() == 0.75; })) {
      return absl::InternalError("the coordinator's rate did not arrive");
    }
    return Trained(10);
  });
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
}

// A step report whose trainer has run `steps` steps and all-reduced `calls` times.
train::StepReport WithComm(int64_t step, int64_t steps, uint64_t calls) {
  train::StepReport r{.step = step, .total_steps = 100, .loss = 1.5};
  train::CommGroupCounters world{"world", 1, {}};
  comm::OpCounters& c = world.counters.of(comm::OpKind::kAllReduce);
  c.calls = calls;
  c.bytes_sent = 1000 * calls;
  c.formula_bytes_sent = 1000 * calls;
  c.payload_bytes = 2000 * calls;
  r.comm.push_back(world);
  r.buckets.push_back(
      {/*payload_bytes=*/2000, calls, 1000 * calls, 1000 * calls, absl::Milliseconds(calls)});
  r.steps_run = steps;
  return r;
}

TEST_F(ElasticTrainerTest, CommunicationIsReportedSinceTheProcessStartedAcrossEpochs) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  ProgressResponse change = AtEpoch(2);
  change.set_save_now(true);
  fake_.progress.Then(change).Always(AtEpoch(2));
  epochs_.push_back(StepThenDrain(WithComm(5, 5, 10)));
  // The next epoch's trainer counts from zero again: 3 more steps, 6 more all-reduces.
  epochs_.push_back([this](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    to.on_step(WithComm(8, 3, 6));
    if (!Eventually([&] {
          for (const ProgressRequest& r : fake_.progress.requests()) {
            if (r.stats().step() == 8) return true;
          }
          return false;
        })) {
      return absl::InternalError("step 8 not reported");
    }
    return Trained(100);
  });
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<ProgressRequest> sent = fake_.progress.requests();
  const RankStats& first = sent.at(0).stats();
  EXPECT_EQ(first.process_steps(), 5);
  ASSERT_EQ(first.comm_ops_size(), 1);
  EXPECT_EQ(first.comm_ops(0).calls(), 10);
  // The report of step 8 (keep-alives, step -1, may follow it).
  auto step8 = std::find_if(sent.begin(), sent.end(),
                            [](const ProgressRequest& r) { return r.stats().step() == 8; });
  ASSERT_NE(step8, sent.end());
  const RankStats& last = step8->stats();
  EXPECT_EQ(last.process_steps(), 8);
  ASSERT_EQ(last.comm_ops_size(), 1);
  EXPECT_EQ(last.comm_ops(0).group(), "world");
  EXPECT_EQ(last.comm_ops(0).op(), "all_reduce");
  EXPECT_EQ(last.comm_ops(0).calls(), 16);
  EXPECT_EQ(last.comm_ops(0).bytes_sent(), 16000);
  EXPECT_EQ(last.comm_ops(0).formula_bytes_sent(), 16000);
  EXPECT_EQ(last.comm_ops(0).payload_bytes(), 32000);
  ASSERT_EQ(last.buckets_size(), 1);
  EXPECT_EQ(last.buckets(0).calls(), 16);
  EXPECT_EQ(last.buckets(0).bytes(), 2000);
  EXPECT_DOUBLE_EQ(last.buckets(0).seconds(), 0.016);
}

TEST_F(ElasticTrainerTest, ATrainerToldToLeaveLeavesAfterTheDrain) {
  fake_.join.Then(Joined(1));
  ProgressResponse leave = AtEpoch(2);
  leave.set_leave(true);
  fake_.progress.Then(leave).Always(AtEpoch(2));
  epochs_.push_back(StepThenDrain(train::StepReport{.step = 1}));
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->left);
  EXPECT_EQ(fake_.join.calls(), 1);
  EXPECT_EQ(fake_.finished.calls(), 0);
}

TEST_F(ElasticTrainerTest, APermanentErrorIsReportedSoAndEndsTheTrainer) {
  fake_.join.Then(Joined(1));
  epochs_.push_back([](const train::TrainerOptions&) -> absl::StatusOr<train::TrainResult> {
    return MarkPermanent(absl::ResourceExhaustedError("out of memory"));
  });
  auto result = RunElasticTrainer(Options());
  EXPECT_TRUE(IsPermanent(result.status())) << result.status();
  ASSERT_EQ(fake_.report_error.calls(), 1);
  EXPECT_TRUE(fake_.report_error.requests()[0].permanent());
  EXPECT_EQ(fake_.join.calls(), 1) << "no restart";
}

// Without checkpoint.dir a whole state (plain data parallelism) goes on after a membership
// change from the survivors' memory (train::RestoreTrainingState broadcasts it to the new
// ranks): the next epoch resumes, whatever spec.resume says.
TEST_F(ElasticTrainerTest, WithoutACheckpointDirAWholeStateResumesAfterAMembershipChange) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  ProgressResponse change = AtEpoch(2);
  change.set_save_now(true);
  fake_.progress.Then(change).Always(AtEpoch(2));
  ElasticTrainerOptions o = Options();
  o.spec.mutable_checkpoint()->clear_dir();
  o.spec.set_resume("never");
  epochs_.push_back(StepThenDrain(train::StepReport{.step = 1}));
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(100); });
  auto result = RunElasticTrainer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->epochs, 2);
  EXPECT_EQ(fake_.report_error.calls(), 0) << "a growth is no failure";
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_EQ(seen_[0].checkpoint.resume.text, "never");
  EXPECT_EQ(seen_[1].checkpoint.resume.text, "auto") << "epoch 2 continues the run";
  EXPECT_EQ(fake_.finished.requests().at(0).epoch(), 2);
}

// A newcomer that joins a running job (its first epoch, but not the job's) resumes too, as
// its peers do: every rank of an epoch restores the same way.
TEST_F(ElasticTrainerTest, ANewcomerToARunningJobResumesAsItsPeersDo) {
  fake_.join.Then(Joined(3));
  fake_.progress.Always(AtEpoch(3));
  ElasticTrainerOptions o = Options();
  o.first_epoch = 3;
  o.spec.set_resume("never");
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(100); });
  ASSERT_TRUE(RunElasticTrainer(o).ok());
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].checkpoint.resume.text, "auto");
}

// A sharded state (ZeRO-1 here) cannot be handed to another world from memory: without
// checkpoint.dir a drained trainer fails the job rather than throw the run away. (The
// coordinator does not grow such a job: Job.cannot_grow.)
TEST_F(ElasticTrainerTest, WithoutACheckpointDirAShardedStateFailsTheJobAfterADrain) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  ProgressResponse change = AtEpoch(2);
  change.set_save_now(true);
  fake_.progress.Always(change);
  ElasticTrainerOptions o = Options();
  o.spec.mutable_checkpoint()->clear_dir();
  o.spec.mutable_parallelism()->set_zero_stage(1);
  epochs_.push_back(StepThenDrain(train::StepReport{.step = 1}));
  auto result = RunElasticTrainer(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "checkpoint.dir"));
  EXPECT_TRUE(absl::StrContains(result.status().message(), "sharded"));
  ASSERT_EQ(fake_.report_error.calls(), 1);
  EXPECT_EQ(fake_.report_error.requests()[0].epoch(), 2);
  EXPECT_TRUE(fake_.report_error.requests()[0].permanent());
  EXPECT_EQ(seen_.size(), 1u) << "epoch 2 does not train";
}

TEST_F(ElasticTrainerTest, AJobThatEndedRefusesReadyAndTheTrainerEndsQuietly) {
  fake_.join.Then(Joined(1));
  fake_.ready.Then(absl::FailedPreconditionError("job job-a was cancelled"));
  auto result = RunElasticTrainer(Options());
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_EQ(fake_.report_error.calls(), 0);
  EXPECT_EQ(fake_.finished.calls(), 0);
}

TEST_F(ElasticTrainerTest, DataThatCannotBeReadIsThisNodesFailure) {
  fake_.join.Then(Joined(1));
  ElasticTrainerOptions o = Options();
  o.load_data = [](const train::TrainConfig&) -> absl::StatusOr<train::JobData> {
    return absl::NotFoundError("/data/train.bin: no such file");
  };
  auto result = RunElasticTrainer(o);
  EXPECT_TRUE(absl::IsNotFound(result.status()));
  ASSERT_EQ(fake_.report_error.calls(), 1);
  EXPECT_TRUE(fake_.report_error.requests()[0].node_local());
  EXPECT_FALSE(fake_.report_error.requests()[0].permanent());
  EXPECT_TRUE(seen_.empty());
}

TEST_F(ElasticTrainerTest, AFailedBeforeFinishedKeepsTheCoordinatorUntold) {
  fake_.join.Then(Joined(1));
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(3); });
  ElasticTrainerOptions o = Options();
  o.before_finished = [](const ElasticResult&) {
    return absl::PermissionDeniedError("cannot write the summary");
  };
  auto result = RunElasticTrainer(o);
  EXPECT_TRUE(absl::IsPermissionDenied(result.status()));
  EXPECT_EQ(fake_.finished.calls(), 0);
}

TEST_F(ElasticTrainerTest, AJobThatIsOverWhenJoiningEndsTheTrainer) {
  fake_.join.Then(absl::FailedPreconditionError("job job-a failed"));
  auto result = RunElasticTrainer(Options());
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status()));
  EXPECT_TRUE(seen_.empty());
}

// A recovery that resumes behind the step the job had reached (JoinResponse.step_before):
// rank 0 says once, in its progress lines, where it resumed from, the steps lost and why,
// and every rank's Ready tells the coordinator the same (Recovery.resumed_from and the rest).
TEST_F(ElasticTrainerTest, AResumeBehindTheJobSaysTheStepsLostAndTellsTheCoordinator) {
  JoinResponse join = Joined(2);
  join.set_step_before(265);
  fake_.join.Then(join);
  ElasticTrainerOptions o = Options();
  std::vector<std::string> said;
  o.progress = [&said](const std::string& line) { said.push_back(line); };
  o.train = [](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    train::Restored restored;
    restored.step = 200;
    restored.resumed_from_step = 200;
    restored.not_from_memory = "its state is sharded over the ranks (ZeRO-2)";
    to.on_resumed(restored);
    RM_RETURN_IF_ERROR(to.on_restored(200));
    return Trained(300);
  };
  ASSERT_TRUE(RunElasticTrainer(o).ok());
  EXPECT_EQ(said, std::vector<std::string>{
                      "resumed from step 200's checkpoint: 65 steps lost (the job had reached "
                      "step 265), because its state is sharded over the ranks (ZeRO-2)"});
  ASSERT_EQ(fake_.ready.requests().size(), 1u);
  const ReadyRequest ready = fake_.ready.requests()[0];
  EXPECT_EQ(ready.restored_step(), 200);
  EXPECT_EQ(ready.restored_from(), "step 200's checkpoint");
  EXPECT_EQ(ready.restore_note(), "its state is sharded over the ranks (ZeRO-2)");

  // The job's first epoch (no step before): nothing said.
  fake_.join.Then(Joined(1));
  said.clear();
  ASSERT_TRUE(RunElasticTrainer(o).ok());
  EXPECT_TRUE(said.empty()) << said[0];
}

// An epoch that takes a step, then trains on (as a whole ring would) until its
// communicator is aborted, and fails with that.
Epoch StepUntilAborted() {
  return [](const train::TrainerOptions& to) -> absl::StatusOr<train::TrainResult> {
    to.on_step(train::StepReport{.step = 5, .total_steps = 100, .loss = 1.5});
    if (!Eventually([&] { return absl::IsAborted(to.comm->GetAsyncError()); })) {
      return absl::InternalError("the ring trained on for 30 s");
    }
    return to.comm->GetAsyncError();
  };
}

// Issue 36: a ring the coordinator fenced out (it formed a later epoch after a failure and
// did not ask this ring to save: the ring may be whole, e.g. its agent was killed or cut
// off) stops at once instead of training on beside the new epoch: its communicator is
// aborted, no collective error is reported for it, and the trainer joins the next epoch.
TEST_F(ElasticTrainerTest, ARingFencedOutByALaterEpochStopsAtOnceAndJoinsIt) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  fake_.progress.Then(AtEpoch(1)).Always(AtEpoch(2));
  epochs_.push_back(StepUntilAborted());
  epochs_.push_back([](const train::TrainerOptions&) { return Trained(100); });
  auto result = RunElasticTrainer(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(fake_.join.calls(), 2);
  EXPECT_EQ(fake_.join.requests()[1].epoch(), 2);
  EXPECT_EQ(fake_.report_error.calls(), 0) << "the coordinator has moved on: nothing to report";
  EXPECT_EQ(fake_.finished.requests().at(0).epoch(), 2);
}

// The job ended (cancelled, failed) while the ring trains: it stops, and the trainer ends.
TEST_F(ElasticTrainerTest, ARingWhoseJobIsOverStopsAtOnce) {
  fake_.join.Then(Joined(1));
  fake_.progress.Always(absl::FailedPreconditionError("job job-a is cancelled: stop"));
  epochs_.push_back(StepUntilAborted());
  const absl::Time began = absl::Now();
  auto result = RunElasticTrainer(Options());
  EXPECT_LT(absl::Now() - began, absl::Seconds(10)) << "the ring trained on";
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_EQ(fake_.join.calls(), 1);
  EXPECT_EQ(fake_.report_error.calls(), 0) << "the ring failed on its own, not stopped";
}

}  // namespace
}  // namespace ringmaster::worker
