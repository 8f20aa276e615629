// The coordinator core driven as agents and trainers would drive it, with a fake clock:
// placement and agent commands, the join barrier with ranks, the bootstrap store, a
// trainer's death and the next epoch, recovery bookkeeping, waits that time out, Watch,
// and a coordinator restarted from its database.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::coordinator {
namespace {

template <typename T>
struct Result {
  std::optional<absl::StatusOr<T>> value;
  Coordinator::Done<T> Callback() {
    return [this](absl::StatusOr<T> v) {
      ASSERT_FALSE(value.has_value()) << "callback called twice";
      value = std::move(v);
    };
  }
};

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/coord-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    options_.database = dir_ + "/jobs.db";
    options_.clock = &clock_;
    options_.membership.lease = absl::Seconds(3);
    options_.membership.restore_grace = absl::Seconds(3);
    options_.membership.grow_after = absl::Seconds(1000);
    Reopen();
    auto spec = spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {});
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    spec_.set_name("mlp");
    spec_.mutable_elastic()->set_min_ranks(2);
    spec_.mutable_elastic()->set_max_ranks(4);
  }

  void Reopen() {
    coordinator_.reset();
    auto c = Coordinator::Create(options_);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }

  void Register(const std::string& node, int slots) {
    RegisterNodeRequest r;
    r.set_node(node);
    r.set_slots(slots);
    auto response = coordinator_->RegisterNode(r);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->lease_s(), 3);
  }

  HeartbeatResponse Heartbeat(const std::string& node) {
    HeartbeatRequest r;
    r.set_node(node);
    auto response = coordinator_->Heartbeat(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : HeartbeatResponse();
  }

  // A heartbeat from an agent running trainers of job "mlp" on `slots`.
  HeartbeatResponse HeartbeatRunning(const std::string& node, std::vector<int> slots) {
    HeartbeatRequest r;
    r.set_node(node);
    for (int slot : slots) {
      *r.add_running() = Slot(node, slot);
      RunningTrainer* t = r.add_trainers();
      t->set_slot(slot);
      t->set_job("mlp");
    }
    auto response = coordinator_->Heartbeat(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : HeartbeatResponse();
  }

  void Join(const std::string& node, int slot, int64_t epoch, Result<JoinResponse>* result,
            absl::Duration wait = absl::Seconds(30)) {
    JoinRequest r;
    r.set_job("mlp");
    r.set_epoch(epoch);
    *r.mutable_slot() = Slot(node, slot);
    coordinator_->Join(r, clock_.Now() + wait, result->Callback());
  }

  absl::Status Ready(const std::string& node, int slot, int64_t epoch) {
    ReadyRequest r;
    r.set_job("mlp");
    r.set_epoch(epoch);
    *r.mutable_slot() = Slot(node, slot);
    return coordinator_->Ready(r);
  }

  absl::StatusOr<ProgressResponse> Progress(const std::string& node, int slot, int64_t epoch,
                                            int rank, int64_t step) {
    ProgressRequest r;
    r.set_job("mlp");
    r.set_epoch(epoch);
    *r.mutable_slot() = Slot(node, slot);
    r.mutable_stats()->set_rank(rank);
    r.mutable_stats()->set_step(step);
    r.mutable_stats()->set_loss(1.5);
    r.mutable_stats()->set_step_time_s(0.25);
    return coordinator_->Progress(r);
  }

  // Registers a (2 slots) and b (2 slots), submits, joins and readies all four.
  void StartFourRanks() {
    Register("a", 2);
    Register("b", 2);
    auto job = coordinator_->Submit(spec_);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->phase(), JOB_PHASE_FORMING);
    Result<JoinResponse> joins[4];
    int i = 0;
    for (const char* node : {"a", "b"}) {
      for (int slot = 0; slot < 2; ++slot) Join(node, slot, 1, &joins[i++]);
    }
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(joins[k].value.has_value()) << "join " << k << " did not complete";
      ASSERT_TRUE(joins[k].value->ok()) << joins[k].value->status();
      EXPECT_EQ((*joins[k].value)->rank(), k);
      EXPECT_EQ((*joins[k].value)->world_size(), 4);
    }
    for (const char* node : {"a", "b"}) {
      for (int slot = 0; slot < 2; ++slot) ASSERT_TRUE(Ready(node, slot, 1).ok());
    }
    ASSERT_EQ(coordinator_->Get("mlp")->phase(), JOB_PHASE_RUNNING);
  }

  std::string dir_;
  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  JobSpec spec_;
};

TEST_F(CoordinatorTest, SubmitPlacesAndAgentsGetStartCommands) {
  Register("a", 2);
  auto job = coordinator_->Submit(spec_);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase(), JOB_PHASE_FORMING);
  EXPECT_EQ(job->epoch(), 1);
  EXPECT_EQ(job->min_ranks(), 2);
  EXPECT_EQ(job->max_ranks(), 4);
  EXPECT_EQ(job->restart_budget(), 3);
  HeartbeatResponse hb = Heartbeat("a");
  ASSERT_EQ(hb.commands_size(), 2);
  EXPECT_EQ(hb.commands(0).start().job(), "mlp");
  EXPECT_EQ(hb.commands(0).start().epoch(), 1);
  EXPECT_EQ(hb.commands(1).start().slot().slot(), 1);
  EXPECT_EQ(hb.commands(0).start().spec().name(), "mlp");
  EXPECT_EQ(hb.commands(1).start().membership_token(),
            coordinator_->MembershipTokenFor("mlp", Slot("a", 1)));
  EXPECT_NE(hb.commands(0).start().membership_token(), hb.commands(1).start().membership_token());
  EXPECT_EQ(Heartbeat("a").commands_size(), 0) << "commands are delivered once";

  EXPECT_EQ(coordinator_->Submit(spec_).status().code(), absl::StatusCode::kAlreadyExists);
  JobSpec bad = spec_;
  bad.set_name("other");
  bad.mutable_elastic()->set_max_ranks(1);
  absl::Status s = coordinator_->Submit(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("elastic.max_ranks"), std::string::npos) << s;
  HeartbeatRequest unknown;
  unknown.set_node("zzz");
  EXPECT_EQ(coordinator_->Heartbeat(unknown).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, JoinWaitsForEveryCandidateThenGivesRanks) {
  Register("a", 2);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  Result<JoinResponse> first, second;
  Join("a", 1, 1, &first);
  EXPECT_FALSE(first.value.has_value()) << "committed with one of two candidates";
  Join("a", 0, 1, &second);
  ASSERT_TRUE(first.value.has_value() && second.value.has_value());
  ASSERT_TRUE(first.value->ok()) << first.value->status();
  EXPECT_EQ((*first.value)->rank(), 1);
  EXPECT_EQ((*second.value)->rank(), 0);
  EXPECT_EQ((*first.value)->store_prefix(), "epoch-1/");
  EXPECT_EQ((*first.value)->members_size(), 2);
}

TEST_F(CoordinatorTest, WaitingCallsTimeOutOnTick) {
  Register("a", 2);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  Result<JoinResponse> join;
  Join("a", 0, 1, &join, absl::Seconds(1));
  StoreGetRequest get;
  get.set_job("mlp");
  get.add_keys("nobody-sets-this");
  Result<StoreGetResponse> got;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(1), got.Callback());
  Heartbeat("a");
  clock_.Advance(absl::Milliseconds(500));
  coordinator_->Tick();
  EXPECT_FALSE(join.value.has_value());
  clock_.Advance(absl::Milliseconds(600));
  Heartbeat("a");
  coordinator_->Tick();
  ASSERT_TRUE(join.value.has_value());
  EXPECT_EQ(join.value->status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(got.value.has_value());
  EXPECT_EQ(got.value->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.value->status().message().find("nobody-sets-this"), std::string::npos);
}

TEST_F(CoordinatorTest, BootstrapStoreWakesWaitingReaders) {
  StartFourRanks();
  StoreGetRequest get;
  get.set_job("mlp");
  get.add_keys("epoch-1/rank0");
  get.add_keys("epoch-1/rank1");
  Result<StoreGetResponse> got;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(10), got.Callback());
  StoreSetRequest set;
  set.set_job("mlp");
  set.set_key("epoch-1/rank0");
  set.set_value("10.0.0.1:5000");
  ASSERT_TRUE(coordinator_->StoreSet(set).ok());
  EXPECT_FALSE(got.value.has_value());
  set.set_key("epoch-1/rank1");
  set.set_value("10.0.0.2:5000");
  ASSERT_TRUE(coordinator_->StoreSet(set).ok());
  ASSERT_TRUE(got.value.has_value());
  ASSERT_TRUE(got.value->ok()) << got.value->status();
  EXPECT_EQ((*got.value)->values(1), "10.0.0.2:5000");
  StoreAddRequest add;
  add.set_job("mlp");
  add.set_key("arrived");
  add.set_delta(2);
  EXPECT_EQ(coordinator_->StoreAdd(add)->value(), 2);
  EXPECT_EQ(coordinator_->StoreAdd(add)->value(), 4);
  set.set_value(std::string((1 << 20) + 1, 'x'));
  EXPECT_EQ(coordinator_->StoreSet(set).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, TrainerDeathFormsTheNextEpochAndRecordsTheRecovery) {
  StartFourRanks();
  ASSERT_TRUE(Progress("a", 0, 1, 0, 10).ok());
  EXPECT_EQ(coordinator_->Get("mlp")->step(), 10);
  EXPECT_EQ(coordinator_->Get("mlp")->steps_per_s(), 4);

  TrainerExitedRequest exited;
  exited.set_node("b");
  exited.set_slot(0);
  exited.set_job("mlp");
  exited.set_exit_code(-9);
  clock_.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(coordinator_->TrainerExited(exited).ok());
  Job job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.phase(), JOB_PHASE_FORMING);
  EXPECT_EQ(job.epoch(), 2);
  ASSERT_EQ(job.recoveries_size(), 1);
  EXPECT_EQ(job.recoveries(0).cause(), "failure");
  EXPECT_EQ(job.recoveries(0).old_world(), 4);

  // A survivor still in epoch 1 learns of epoch 2 from its progress report.
  auto progress = Progress("a", 1, 1, 1, 11);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->epoch(), 2);
  EXPECT_FALSE(progress->leave());
  EXPECT_FALSE(progress->save_now()) << "a broken ring cannot save";

  Result<JoinResponse> joins[3];
  clock_.Advance(absl::Milliseconds(200));
  Join("a", 0, 2, &joins[0]);
  Join("a", 1, 2, &joins[1]);
  Join("b", 1, 2, &joins[2]);
  ASSERT_TRUE(joins[2].value.has_value() && joins[2].value->ok());
  EXPECT_EQ((*joins[2].value)->rank(), 2);
  EXPECT_EQ((*joins[2].value)->world_size(), 3);
  clock_.Advance(absl::Milliseconds(300));
  for (auto [node, slot] : {std::pair{"a", 0}, std::pair{"a", 1}, std::pair{"b", 1}}) {
    ASSERT_TRUE(Ready(node, slot, 2).ok());
  }
  clock_.Advance(absl::Milliseconds(400));
  ASSERT_TRUE(Progress("a", 0, 2, 0, 11).ok());
  job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.phase(), JOB_PHASE_RUNNING);
  EXPECT_EQ(job.recoveries(0).new_world(), 3);
  EXPECT_DOUBLE_EQ(job.recoveries(0).rendezvous_s(), 0.2);
  EXPECT_DOUBLE_EQ(job.recoveries(0).restore_s(), 0.3);
  EXPECT_NEAR(job.recoveries(0).first_step_s(), 0.4, 1e-9);

  // A report about the old epoch is stale.
  ReportErrorRequest error;
  error.set_job("mlp");
  error.set_epoch(1);
  *error.mutable_slot() = Slot("a", 0);
  EXPECT_EQ(coordinator_->ReportError(error).code(), absl::StatusCode::kAborted);
}

TEST_F(CoordinatorTest, PermanentErrorFailsTheJobAtOnce) {
  StartFourRanks();
  ReportErrorRequest error;
  error.set_job("mlp");
  error.set_epoch(1);
  *error.mutable_slot() = Slot("b", 1);
  error.set_detail("FAILED_PRECONDITION: /ckpt/mlp/step-20 was written by another job");
  error.set_permanent(true);
  ASSERT_TRUE(coordinator_->ReportError(error).ok());
  const Job job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.phase(), JOB_PHASE_FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_NE(job.reason().find("no restart can fix"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("written by another job"), std::string::npos) << job.reason();
}

// Checkpoints reported by the current epoch's trainers are listed, newest last, one entry
// per step; a stale epoch is ABORTED, a path too long or empty INVALID_ARGUMENT naming the
// field, and a job that has ended takes none.
TEST_F(CoordinatorTest, ReportCheckpointListsCurrentOnesAndRefusesStaleOversizedAndLate) {
  StartFourRanks();
  auto report = [&](int64_t epoch, int64_t step, const std::string& path) {
    ReportCheckpointRequest r;
    r.set_job("mlp");
    r.set_epoch(epoch);
    *r.mutable_slot() = Slot("a", 0);
    CheckpointInfo* c = r.mutable_checkpoint();
    c->set_step(step);
    c->set_path(path);
    c->set_world_size(4);
    c->set_bytes(1000);
    c->set_committed_ms(5);
    return coordinator_->ReportCheckpoint(r);
  };
  ASSERT_TRUE(report(1, 20, "/ckpt/mlp/step-20").ok());
  ASSERT_TRUE(report(1, 10, "/ckpt/mlp/step-10").ok());
  ASSERT_TRUE(report(1, 20, "/ckpt/mlp/step-20").ok());  // again: one entry
  Job job = *coordinator_->Get("mlp");
  ASSERT_EQ(job.checkpoints_size(), 2);
  EXPECT_EQ(job.checkpoints(0).step(), 10);
  EXPECT_EQ(job.checkpoints(1).step(), 20);
  EXPECT_EQ(job.checkpoints(1).bytes(), 1000);

  absl::Status s = report(1, 30, std::string(3 << 20, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("checkpoint.path"), std::string::npos) << s;
  EXPECT_EQ(report(1, 30, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(report(2, 30, "/ckpt/mlp/step-30").code(), absl::StatusCode::kInvalidArgument);

  // Epoch 2 forms (a node drains): epoch 1's reports are stale.
  DrainNodeRequest drain;
  drain.set_node("b");
  ASSERT_TRUE(coordinator_->DrainNode(drain).ok());
  s = report(1, 30, "/ckpt/mlp/step-30");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;

  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  s = report(2, 30, "/ckpt/mlp/step-30");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(coordinator_->Get("mlp")->checkpoints_size(), 2);
}

// Rank 0's report of a failed save reaches the job's status, cause and path included, and
// stays bounded.
TEST_F(CoordinatorTest, ProgressCarriesTheLastFailedCheckpointToTheJob) {
  StartFourRanks();
  ProgressRequest r;
  r.set_job("mlp");
  r.set_epoch(1);
  *r.mutable_slot() = Slot("a", 0);
  r.mutable_stats()->set_rank(0);
  r.mutable_stats()->set_step(41);
  r.set_checkpoint_error_step(40);
  r.set_checkpoint_error(
      "RESOURCE_EXHAUSTED: checkpoint step 40 (rank 0): pwrite of /ckpt/mlp/tmp-step-40-save-2/"
      "shard-0-of-4.bin: No space left on device (errno 28)");
  ASSERT_TRUE(coordinator_->Progress(r).ok());
  Job job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.checkpoint_error_step(), 40);
  EXPECT_EQ(job.checkpoint_error(), r.checkpoint_error());

  r.mutable_stats()->set_step(42);
  r.set_checkpoint_error(std::string(1 << 20, 'x'));
  ASSERT_TRUE(coordinator_->Progress(r).ok());
  EXPECT_EQ(coordinator_->Get("mlp")->checkpoint_error().size(), 4096u);
}

TEST_F(CoordinatorTest, DrainTellsLeaversToSaveAndLeave) {
  StartFourRanks();
  DrainNodeRequest drain;
  drain.set_node("b");
  ASSERT_TRUE(coordinator_->DrainNode(drain).ok());
  auto leaver = Progress("b", 0, 1, 2, 5);
  ASSERT_TRUE(leaver.ok());
  EXPECT_EQ(leaver->epoch(), 2);
  EXPECT_TRUE(leaver->leave());
  EXPECT_TRUE(leaver->save_now());
  auto stayer = Progress("a", 0, 1, 0, 5);
  EXPECT_FALSE(stayer->leave());
  EXPECT_TRUE(stayer->save_now());
  EXPECT_EQ(coordinator_->Get("mlp")->restarts(), 0);
}

TEST_F(CoordinatorTest, RestartFromTheDatabaseKnowsEveryJobAndEpoch) {
  StartFourRanks();
  ReportCheckpointRequest ckpt;
  ckpt.set_job("mlp");
  ckpt.set_epoch(1);
  ckpt.mutable_checkpoint()->set_step(40);
  ckpt.mutable_checkpoint()->set_world_size(4);
  ckpt.mutable_checkpoint()->set_path("/ckpt/mlp/step-40");
  ASSERT_TRUE(coordinator_->ReportCheckpoint(ckpt).ok());
  const int64_t version = coordinator_->Get("mlp")->version();

  const std::string token = coordinator_->MembershipTokenFor("mlp", Slot("b", 1));
  Reopen();  // as after kill -9: only what was persisted is known
  EXPECT_EQ(coordinator_->MembershipTokenFor("mlp", Slot("b", 1)), token)
      << "trainers' tokens must survive a coordinator restart";
  Job job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.phase(), JOB_PHASE_RUNNING);
  EXPECT_EQ(job.epoch(), 1);
  EXPECT_EQ(job.members_size(), 4);
  EXPECT_EQ(job.members(3).rank(), 3);
  EXPECT_EQ(job.checkpoints(0).step(), 40);
  EXPECT_GE(job.version(), version);
  // Running trainers carry on: their progress reports are accepted.
  auto progress = Progress("b", 1, 1, 3, 41);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->epoch(), 1);
  // Agents re-register within the lease; their running trainers are members: not stopped.
  Register("a", 2);
  const HeartbeatResponse after_restart = HeartbeatRunning("a", {0, 1});
  for (const AgentCommand& c : after_restart.commands()) {
    EXPECT_FALSE(c.has_stop()) << "a restarted coordinator stopped a member";
  }
  // One that does not re-register is lost like a dead node.
  clock_.Advance(absl::Seconds(2));
  Heartbeat("a");
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.epoch(), 2);
  EXPECT_EQ(job.members_size(), 2);
  EXPECT_EQ(job.phase(), JOB_PHASE_FORMING);
}

// A node cut off past its lease is declared gone and the job goes on without it; when it
// comes back its old trainers are stale: the heartbeat tells the agent to stop them.
TEST_F(CoordinatorTest, ANodeBackFromAPartitionStopsItsStaleTrainers) {
  StartFourRanks();
  const HeartbeatResponse first = HeartbeatRunning("b", {0, 1});  // the queued starts
  for (const AgentCommand& c : first.commands()) {
    EXPECT_FALSE(c.has_stop()) << "members are not stopped";
  }
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(1));
    HeartbeatRunning("a", {0, 1});
    coordinator_->Tick();
  }
  ASSERT_EQ(coordinator_->Get("mlp")->epoch(), 2) << "b's lease lapsed";
  Register("b", 2);
  HeartbeatResponse hb = HeartbeatRunning("b", {0, 1});
  int stops = 0;
  for (const AgentCommand& c : hb.commands()) {
    if (!c.has_stop()) continue;
    ++stops;
    EXPECT_EQ(c.stop().job(), "mlp");
    EXPECT_EQ(c.stop().slot().node(), "b");
    EXPECT_NE(c.stop().reason().find("declared gone"), std::string::npos) << c.stop().reason();
  }
  EXPECT_EQ(stops, 2);
  HeartbeatRequest flood;
  flood.set_node("a");
  for (int i = 0; i < 1025; ++i) flood.add_trainers()->set_slot(i);
  EXPECT_EQ(coordinator_->Heartbeat(flood).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, WatchReturnsTheNextChangeOrTimesOut) {
  Register("a", 2);
  auto job = coordinator_->Submit(spec_);
  ASSERT_TRUE(job.ok());
  Result<JobEvent> now;
  coordinator_->WatchNext("mlp", 0, clock_.Now() + absl::Seconds(5), now.Callback());
  ASSERT_TRUE(now.value.has_value() && now.value->ok());
  const int64_t version = (*now.value)->version();
  Result<JobEvent> next;
  coordinator_->WatchNext("mlp", version, clock_.Now() + absl::Seconds(5), next.Callback());
  EXPECT_FALSE(next.value.has_value());
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  ASSERT_TRUE(next.value.has_value() && next.value->ok());
  EXPECT_EQ((*next.value)->job().phase(), JOB_PHASE_CANCELLED);
  EXPECT_EQ(Heartbeat("a").commands_size(), 2 + 2) << "two starts, then two stops";
  Result<JobEvent> idle;
  coordinator_->WatchNext("mlp", (*next.value)->version(), clock_.Now() + absl::Seconds(1),
                          idle.Callback());
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  ASSERT_TRUE(idle.value.has_value());
  EXPECT_EQ(idle.value->status().code(), absl::StatusCode::kDeadlineExceeded);
  Result<JobEvent> missing;
  coordinator_->WatchNext("nope", 0, clock_.Now(), missing.Callback());
  EXPECT_EQ(missing.value->status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ringmaster::coordinator
