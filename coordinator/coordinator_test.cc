// The coordinator core driven as agents and trainers would drive it, with a fake clock:
// placement and agent commands, the join barrier with ranks, the bootstrap store, a
// trainer's death and the next epoch, recovery bookkeeping, waits that time out, Watch,
// and a coordinator restarted from its database.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
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

  // As the node's agent does: with the credential it was given before, if any.
  void Register(const std::string& node, int slots) {
    RegisterNodeRequest r;
    r.set_node(node);
    r.set_slots(slots);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    auto response = coordinator_->RegisterNode(r);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->lease_s(), 3);
  }

  HeartbeatResponse Heartbeat(const std::string& node) {
    HeartbeatRequest r;
    r.set_node(node);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    auto response = coordinator_->Heartbeat(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : HeartbeatResponse();
  }

  // A heartbeat from an agent running trainers of job "mlp" on `slots`.
  HeartbeatResponse HeartbeatRunning(const std::string& node, std::vector<int> slots) {
    HeartbeatRequest r;
    r.set_node(node);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
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

  // The agent of `node` reports that the trainer of job "mlp" on `slot` exited.
  TrainerExitedRequest Exited(const std::string& node, int slot, int exit_code) {
    TrainerExitedRequest r;
    r.set_node(node);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    r.set_slot(slot);
    r.set_job("mlp");
    r.set_exit_code(exit_code);
    return r;
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
    r.mutable_stats()->set_steps_per_s(4);  // the trainer's window's (1 / step time here)
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
      EXPECT_FALSE((*joins[k].value)->continues_run()) << "the first epoch starts the run";
      EXPECT_EQ((*joins[k].value)->restarts(), 0);
      EXPECT_EQ((*joins[k].value)->epoch_cause(), "start");
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
  unknown.set_node_credential(coordinator_->NodeCredentialFor("zzz"));
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
  get.set_epoch(1);
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
  get.set_epoch(1);
  get.add_keys("epoch-1/rank0");
  get.add_keys("epoch-1/rank1");
  Result<StoreGetResponse> got;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(10), got.Callback());
  StoreSetRequest set;
  set.set_job("mlp");
  set.set_epoch(1);
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
  add.set_epoch(1);
  add.set_key("arrived");
  add.set_delta(2);
  EXPECT_EQ(coordinator_->StoreAdd(add)->value(), 2);
  EXPECT_EQ(coordinator_->StoreAdd(add)->value(), 4);
  set.set_value(std::string((1 << 20) + 1, 'x'));
  EXPECT_EQ(coordinator_->StoreSet(set).code(), absl::StatusCode::kInvalidArgument);
}

// Everything one caller can make the coordinator keep or send is bounded (issue 17, point
// 7): StoreAdd obeys StoreSet's key rules and the key cap and does not overflow; a stale
// epoch's store calls are ABORTED; an oversized spec is refused; List pages.
TEST_F(CoordinatorTest, StoreAddObeysTheLimitsAndStaleEpochsAreRefused) {
  options_.max_store_keys = 3;
  Reopen();
  StartFourRanks();
  StoreAddRequest add;
  add.set_job("mlp");
  add.set_epoch(1);
  add.set_delta(1);
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kInvalidArgument)
      << "an empty key";
  add.set_key(std::string(3 << 20, 'k'));
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kInvalidArgument)
      << "a 3 MiB key";
  for (const char* key : {"a", "b", "c"}) {
    add.set_key(key);
    ASSERT_TRUE(coordinator_->StoreAdd(add).ok());
  }
  add.set_key("d");
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kResourceExhausted)
      << "a key past the cap";
  add.set_key("a");
  add.set_delta(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kOutOfRange)
      << "1 + (2^63 - 1) overflows";
  add.set_delta(0);
  EXPECT_EQ(coordinator_->StoreAdd(add)->value(), 1) << "the value is unchanged";
}

TEST_F(CoordinatorTest, StaleEpochStoreCallsAreAborted) {
  StartFourRanks();
  TrainerExitedRequest exited = Exited("b", 1, -9);
  ASSERT_TRUE(coordinator_->TrainerExited(exited).ok());
  ASSERT_EQ(coordinator_->Get("mlp")->epoch(), 2);
  StoreSetRequest set;
  set.set_job("mlp");
  set.set_epoch(1);
  set.set_key("epoch-1/rank0");
  set.set_value("x");
  EXPECT_EQ(coordinator_->StoreSet(set).code(), absl::StatusCode::kAborted);
  StoreAddRequest add;
  add.set_job("mlp");
  add.set_epoch(1);
  add.set_key("n");
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kAborted);
  StoreGetRequest get;
  get.set_job("mlp");
  get.set_epoch(1);
  get.add_keys("epoch-1/rank0");
  Result<StoreGetResponse> got;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(10), got.Callback());
  ASSERT_TRUE(got.value.has_value());
  EXPECT_EQ(got.value->status().code(), absl::StatusCode::kAborted);
  set.set_epoch(2);
  EXPECT_TRUE(coordinator_->StoreSet(set).ok());
}

// Epoch 0 once skipped the stale-epoch check ("an older trainer"): a trainer of any epoch
// could write the current epoch's bootstrap keys. Every store call must carry its epoch.
TEST_F(CoordinatorTest, StoreCallsWithoutAnEpochAreRefused) {
  StartFourRanks();
  ASSERT_TRUE(coordinator_->TrainerExited(Exited("b", 1, -9)).ok());
  ASSERT_EQ(coordinator_->Get("mlp")->epoch(), 2);
  StoreSetRequest set;
  set.set_job("mlp");
  set.set_key("epoch-2/rank0");
  set.set_value("from a trainer of epoch 1");
  const absl::Status s = coordinator_->StoreSet(set);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("epoch"), std::string::npos) << s;
  StoreAddRequest add;
  add.set_job("mlp");
  add.set_key("n");
  EXPECT_EQ(coordinator_->StoreAdd(add).status().code(), absl::StatusCode::kInvalidArgument);
  StoreGetRequest get;
  get.set_job("mlp");
  get.add_keys("epoch-2/rank0");
  Result<StoreGetResponse> got;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(10), got.Callback());
  ASSERT_TRUE(got.value.has_value());
  EXPECT_EQ(got.value->status().code(), absl::StatusCode::kInvalidArgument);
  // The live epoch's calls pass, and nothing was written by the refused one.
  get.set_epoch(2);
  Result<StoreGetResponse> none;
  coordinator_->StoreGet(get, clock_.Now() + absl::Seconds(1), none.Callback());
  EXPECT_FALSE(none.value.has_value()) << "the key was written without an epoch";
  set.set_epoch(2);
  set.set_value("rank 0 of epoch 2");
  ASSERT_TRUE(coordinator_->StoreSet(set).ok());
  ASSERT_TRUE(none.value.has_value());
  ASSERT_TRUE(none.value->ok()) << none.value->status();
  EXPECT_EQ((*none.value)->values(0), "rank 0 of epoch 2");
}

TEST_F(CoordinatorTest, AnOversizedSpecIsRefusedAndListPages) {
  JobSpec big = spec_;
  big.set_name("big");
  big.mutable_data()->mutable_text()->set_path(std::string(70 << 10, 'p'));
  auto refused = coordinator_->Submit(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("at most 65536"), std::string::npos)
      << refused.status();
  for (int i = 0; i < 5; ++i) {
    JobSpec s = spec_;
    s.set_name(absl::StrCat("job", i));
    ASSERT_TRUE(coordinator_->Submit(s).ok());
  }
  ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto page = coordinator_->List(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 2);
    for (const Job& j : page->jobs()) seen.push_back(j.id());
    request.set_page_token(page->next_page_token());
    ++pages;
  } while (!request.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"job0", "job1", "job2", "job3", "job4"}));
  request.set_page_token("no-such-job");
  EXPECT_EQ(coordinator_->List(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// Start commands carry the spec: a node of many slots gets them over several heartbeats
// rather than in one answer its agent cannot receive (gRPC's 4 MiB limit).
TEST_F(CoordinatorTest, AHeartbeatAnswerStaysUnderTheReceiveLimit) {
  Register("a", 200);
  spec_.mutable_elastic()->set_min_ranks(200);
  spec_.mutable_elastic()->set_max_ranks(200);
  spec_.mutable_data()->mutable_fashion_mnist()->set_dir(std::string(30 << 10, 'd'));
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  int starts = 0, answers = 0;
  while (starts < 200 && answers < 10) {
    HeartbeatResponse hb = Heartbeat("a");
    EXPECT_LT(hb.ByteSizeLong(), size_t{4} << 20);
    starts += hb.commands_size();
    ++answers;
  }
  EXPECT_EQ(starts, 200);
  EXPECT_GT(answers, 1);
}

// A hang is detected after the member's silence bound (5 s here: the floor, over 10 x the
// 0.25 s steps); its recovery record says so: detection = last progress -> decision
// (it once said 0 s).
TEST_F(CoordinatorTest, AHangsRecoveryRecordGivesTheRealDetectionTime) {
  StartFourRanks();
  for (auto [node, slot, rank] : {std::tuple{"a", 0, 0}, std::tuple{"a", 1, 1},
                                  std::tuple{"b", 0, 2}, std::tuple{"b", 1, 3}}) {
    ASSERT_TRUE(Progress(node, slot, 1, rank, 1).ok());
  }
  // a/0 falls silent; the others go on, and both agents heartbeat.
  for (int second = 1; second <= 5 && coordinator_->Get("mlp")->epoch() == 1; ++second) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat("a");
    Heartbeat("b");
    for (auto [node, slot, rank] :
         {std::tuple{"a", 1, 1}, std::tuple{"b", 0, 2}, std::tuple{"b", 1, 3}}) {
      ASSERT_TRUE(Progress(node, slot, 1, rank, 1 + second).ok());
    }
    coordinator_->Tick();
  }
  const Job job = *coordinator_->Get("mlp");
  ASSERT_EQ(job.epoch(), 2) << "a/0 was not found hung";
  ASSERT_EQ(job.recoveries_size(), 1);
  const Recovery& r = job.recoveries(0);
  EXPECT_NE(r.reason().find("hung"), std::string::npos) << r.reason();
  EXPECT_DOUBLE_EQ(r.detect_s(), 5.0) << "a/0's last progress was 5 s before the decision";
}

// A node whose agent falls silent is lost when its lease (3 s) runs out: detection is the
// time from its last heartbeat.
TEST_F(CoordinatorTest, ALeasesRecoveryRecordGivesTheTimeSinceTheLastHeartbeat) {
  StartFourRanks();
  Heartbeat("b");
  for (int second = 1; second <= 4 && coordinator_->Get("mlp")->epoch() == 1; ++second) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat("a");
    coordinator_->Tick();
  }
  const Job job = *coordinator_->Get("mlp");
  ASSERT_EQ(job.epoch(), 2) << "b's lease did not expire";
  ASSERT_EQ(job.recoveries_size(), 1);
  EXPECT_NE(job.recoveries(0).reason().find("lease expired"), std::string::npos)
      << job.recoveries(0).reason();
  EXPECT_DOUBLE_EQ(job.recoveries(0).detect_s(), 3.0);
}

TEST_F(CoordinatorTest, TrainerDeathFormsTheNextEpochAndRecordsTheRecovery) {
  StartFourRanks();
  ASSERT_TRUE(Progress("a", 0, 1, 0, 10).ok());
  EXPECT_EQ(coordinator_->Get("mlp")->step(), 10);
  EXPECT_EQ(coordinator_->Get("mlp")->steps_per_s(), 4);

  TrainerExitedRequest exited = Exited("b", 0, -9);
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
  EXPECT_TRUE((*joins[2].value)->continues_run()) << "a re-formed epoch continues the run";
  EXPECT_EQ((*joins[2].value)->restarts(), 1) << "the failure spent a restart";
  EXPECT_EQ((*joins[2].value)->epoch_cause(), "failure");
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

// A job whose new ranks could not be given its state (sharded, no checkpoint.dir) says so
// and does not grow (coordinator/testdata/nogrow.txt); any other layout grows.
TEST_F(CoordinatorTest, AShardedJobWithoutCheckpointsSaysItCannotGrow) {
  JobSpec sharded = spec_;
  sharded.set_name("sharded");
  sharded.mutable_checkpoint()->clear_dir();
  sharded.mutable_parallelism()->set_zero_stage(2);
  auto job = coordinator_->Submit(sharded);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(absl::StrContains(job->cannot_grow(), "parallelism.zero_stage 2"))
      << job->cannot_grow();
  EXPECT_TRUE(absl::StrContains(job->cannot_grow(), "checkpoint.dir")) << job->cannot_grow();

  JobSpec whole = spec_;
  whole.set_name("whole");
  whole.mutable_checkpoint()->clear_dir();
  whole.mutable_parallelism()->set_zero_stage(0);
  job = coordinator_->Submit(whole);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->cannot_grow(), "") << "a whole state is given to new ranks from memory";

  JobSpec checkpointed = sharded;
  checkpointed.set_name("checkpointed");
  checkpointed.mutable_checkpoint()->set_dir(dir_ + "/ck");
  job = coordinator_->Submit(checkpointed);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->cannot_grow(), "");
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
  drain.set_node_credential(coordinator_->NodeCredentialFor("b"));
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
  EXPECT_LE(coordinator_->Get("mlp")->checkpoint_error().size(), 4096u);
  EXPECT_GT(coordinator_->Get("mlp")->checkpoint_error().size(), 4000u);
}

TEST_F(CoordinatorTest, DrainTellsLeaversToSaveAndLeave) {
  StartFourRanks();
  DrainNodeRequest drain;
  drain.set_node("b");
  drain.set_node_credential(coordinator_->NodeCredentialFor("b"));
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

// Drains on a preemption notice make the cluster's rate (per node-hour over 6 hours), which
// each trainer hears for its job's nodes; a drain asked for otherwise does not count.
TEST_F(CoordinatorTest, ProgressTellsTheJobThePreemptionRateOfTheCluster) {
  StartFourRanks();  // on a and b
  for (const char* node : {"c", "d", "e"}) Register(node, 1);
  auto before = Progress("a", 0, 1, 0, 5);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->preemption_rate_per_hour(), 0);
  auto drain = [&](const std::string& node, bool notice) {
    DrainNodeRequest r;
    r.set_node(node);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    r.set_preemption_notice(notice);
    ASSERT_TRUE(coordinator_->DrainNode(r).ok());
  };
  drain("c", true);
  // 1 notice / 6 h / 5 nodes, on the job's 2 nodes: 1/15 an hour.
  auto one = Progress("a", 0, 1, 0, 6);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(one->preemption_rate_per_hour(), 1.0 / 6 / 5 * 2);
  drain("d", false);
  EXPECT_DOUBLE_EQ(Progress("b", 1, 1, 3, 6)->preemption_rate_per_hour(), 1.0 / 6 / 5 * 2);
  clock_.Advance(absl::Seconds(1));
  drain("e", true);
  EXPECT_DOUBLE_EQ(Progress("a", 1, 1, 1, 7)->preemption_rate_per_hour(), 2.0 / 6 / 5 * 2);
}

// A finished job's last step, length and loss are in its record and survive a
// coordinator restart (issue 17, point 14: a short job showed "step 0/0, loss 0": it
// finished before its progress thread's first report, and later reports are refused).
TEST_F(CoordinatorTest, AFinishedJobKeepsItsLastStepAcrossARestart) {
  StartFourRanks();
  const std::pair<const char*, int> slots[] = {{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}};
  for (int rank = 0; rank < 4; ++rank) {
    FinishedRequest f;
    f.set_job("mlp");
    f.set_epoch(1);
    *f.mutable_slot() = Slot(slots[rank].first, slots[rank].second);
    f.mutable_stats()->set_rank(rank);
    f.mutable_stats()->set_step(20);
    f.mutable_stats()->set_loss(0.42);
    f.set_total_steps(20);
    ASSERT_TRUE(coordinator_->Finished(f).ok());
  }
  ASSERT_EQ(coordinator_->Get("mlp")->phase(), JOB_PHASE_SUCCEEDED);
  Reopen();
  const Job job = *coordinator_->Get("mlp");
  EXPECT_EQ(job.phase(), JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(job.step(), 20);
  EXPECT_EQ(job.total_steps(), 20);
  EXPECT_DOUBLE_EQ(job.loss(), 0.42);
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

// A job whose mesh puts 2 ranks in each data-parallel replica (parallelism.mesh.pp 2) forms
// worlds of whole replicas only: 3 free slots give 2 ranks; and so after a restart of the
// coordinator, which reads the rule back from the stored spec. A mesh no world can hold is
// refused at submission, naming the field.
TEST_F(CoordinatorTest, AMeshJobFormsWorldsOfWholeReplicasAcrossARestart) {
  auto gpt = spec::LoadJobSpecFile("examples/tiny_gpt.yaml", {"parallelism.mesh.pp=2"});
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  JobSpec spec = *gpt;
  spec.set_name("mlp");  // the fixture's helpers speak for job "mlp"
  spec.mutable_elastic()->set_min_ranks(1);
  spec.mutable_elastic()->set_max_ranks(1);
  absl::Status s = coordinator_->Submit(spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("elastic.max_ranks"), std::string::npos) << s;

  spec.mutable_elastic()->set_max_ranks(4);
  Register("a", 3);
  auto job = coordinator_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->members_size(), 2) << "3 slots hold one replica of 2";
  Reopen();
  Register("a", 3);
  Register("b", 1);
  // One of the two (still forming) dies: a/2 and b/0 are free, 3 slots in all: 2 of them.
  ASSERT_TRUE(coordinator_->TrainerExited(Exited("a", 1, -9)).ok());
  const Job after = *coordinator_->Get("mlp");
  EXPECT_EQ(after.members_size(), 2) << "after a restart too, whole replicas only";
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
    EXPECT_NE(c.stop().reason().find("went on without this node"), std::string::npos)
        << c.stop().reason();
  }
  EXPECT_EQ(stops, 2);
  HeartbeatRequest flood;
  flood.set_node("a");
  flood.set_node_credential(coordinator_->NodeCredentialFor("a"));
  for (int i = 0; i < 1025; ++i) flood.add_trainers()->set_slot(i);
  EXPECT_EQ(coordinator_->Heartbeat(flood).status().code(), absl::StatusCode::kInvalidArgument);
}

// Cancel, then submit at once (issue 17, point 4): the new job is not started on slots whose
// cancelled trainers still run (the agent would refuse the start and the job would be
// charged a failure); it starts when the agent's heartbeat no longer lists them. The stops
// are not repeated with a reason that blames the node.
TEST_F(CoordinatorTest, ASlotIsFreeWhenItsTrainerIsGone) {
  Register("a", 2);
  spec_.mutable_elastic()->set_max_ranks(2);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  EXPECT_EQ(Heartbeat("a").commands_size(), 2) << "the two starts";
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  JobSpec next = spec_;
  next.set_name("next");
  ASSERT_TRUE(coordinator_->Submit(next).ok());
  EXPECT_EQ(coordinator_->Get("next")->phase(), JOB_PHASE_PENDING);
  // The agent has not carried out the stops yet: its trainers still run.
  HeartbeatResponse hb = HeartbeatRunning("a", {0, 1});
  for (const AgentCommand& c : hb.commands()) {
    ASSERT_TRUE(c.has_stop()) << "started a job on slots that still run trainers";
    EXPECT_EQ(c.stop().reason(), "cancelled by the user");
  }
  EXPECT_EQ(hb.commands_size(), 2);
  EXPECT_EQ(HeartbeatRunning("a", {0, 1}).commands_size(), 0) << "no stop twice at once";
  EXPECT_EQ(coordinator_->Get("next")->phase(), JOB_PHASE_PENDING);
  // Reaped: the next heartbeat lists none, and the next job starts, charged nothing.
  hb = Heartbeat("a");
  EXPECT_EQ(hb.commands_size(), 2);
  for (const AgentCommand& c : hb.commands()) {
    EXPECT_TRUE(c.has_start());
    EXPECT_EQ(c.start().job(), "next");
  }
  EXPECT_EQ(coordinator_->Get("next")->phase(), JOB_PHASE_FORMING);
  EXPECT_EQ(coordinator_->Get("next")->restarts(), 0);
}

// A node's identity is bound to its registration (issue 17, point 6): the node token lets a
// caller be *a* node, and only the credential that a node's registration returned lets it
// act for that node: heartbeat it, report or drain it, or register its name while its lease
// lives. After the lease lapses the name is free again.
TEST_F(CoordinatorTest, OnlyANodesOwnAgentActsForIt) {
  StartFourRanks();
  const std::string b = coordinator_->NodeCredentialFor("b");
  const std::string a = coordinator_->NodeCredentialFor("a");
  ASSERT_NE(a, b);
  TrainerExitedRequest exited;  // from a's agent (or anyone with the node token)
  exited.set_node("b");
  exited.set_slot(0);
  exited.set_job("mlp");
  exited.set_exit_code(-9);
  exited.set_node_credential(a);
  auto refused = coordinator_->TrainerExited(exited);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("node b"), std::string::npos) << refused;
  exited.clear_node_credential();
  EXPECT_EQ(coordinator_->TrainerExited(exited).code(), absl::StatusCode::kPermissionDenied);
  HeartbeatRequest hb;
  hb.set_node("b");
  hb.set_node_credential(a);
  EXPECT_EQ(coordinator_->Heartbeat(hb).status().code(), absl::StatusCode::kPermissionDenied);
  DrainNodeRequest drain;
  drain.set_node("b");
  EXPECT_EQ(coordinator_->DrainNode(drain).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(coordinator_->Get("mlp")->epoch(), 1) << "nothing happened to b's trainers";
  // Registering b's name while its lease lives needs b's credential.
  RegisterNodeRequest take;
  take.set_node("b");
  take.set_slots(2);
  auto taken = coordinator_->RegisterNode(take);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(taken.status().message().find("lease is live"), std::string::npos) << taken.status();
  take.set_node_credential(b);
  auto again = coordinator_->RegisterNode(take);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->node_credential(), b);
  // b's own agent carries on.
  hb.set_node_credential(b);
  EXPECT_TRUE(coordinator_->Heartbeat(hb).ok());
  // After b's lease lapses its name is free.
  clock_.Advance(absl::Seconds(4));
  coordinator_->Tick();
  take.clear_node_credential();
  EXPECT_TRUE(coordinator_->RegisterNode(take).ok());
}

// A command job: rank 1's report (a Gloo error, a second after rank 2 raised) arrives first and
// re-forms the job; rank 2's, earlier, arrives after. The job's first failure, the recovery and
// the reason name rank 2; a restarted coordinator still does.
TEST_F(CoordinatorTest, TheEarliestProgramFailureIsNamedWhateverTheOrderOfTheReports) {
  StartFourRanks();
  auto report = [&](const std::string& node, int slot, int rank, double at,
                    const std::string& message) {
    ReportErrorRequest error;
    error.set_job("mlp");
    error.set_epoch(1);
    *error.mutable_slot() = Slot(node, slot);
    error.set_detail("ABORTED: the runner's words");
    ringmaster::RankFailure* f = error.mutable_failure();
    f->set_rank(rank);
    f->set_program("python3");
    f->set_how("exit code 1");
    f->set_exit_code(1);
    f->set_error_message(message);
    f->set_last_output_line(absl::StrCat("rank ", rank, " was here"));
    f->set_failed_at_s(at);
    f->set_failed_at_from_error_file(true);
    return coordinator_->ReportError(error);
  };
  ASSERT_TRUE(report("a", 1, 1, 1700000001.5, "RuntimeError: Connection closed by peer").ok());
  EXPECT_TRUE(report("b", 0, 2, 1700000000.25, "ValueError: bad batch").ok());  // late: taken
  const std::string want =
      "rank 2 (node b, slot 0) failed first in membership epoch 1: python3: exit code 1; its "
      "error file says: ValueError: bad batch; its last output line: rank 2 was here";
  for (int restart = 0; restart < 2; ++restart) {
    const Job job = *coordinator_->Get("mlp");
    EXPECT_EQ(job.epoch(), 2);
    EXPECT_EQ(job.restarts(), 1);
    ASSERT_TRUE(job.has_first_failure());
    EXPECT_EQ(job.first_failure().rank(), 2);
    EXPECT_EQ(job.first_failure().epoch(), 1);
    EXPECT_EQ(job.first_failure().slot().node(), "b");
    EXPECT_DOUBLE_EQ(job.first_failure().failed_at_s(), 1700000000.25);
    EXPECT_EQ(job.reason(), want);
    ASSERT_EQ(job.recoveries_size(), 1);
    EXPECT_EQ(job.recoveries(0).reason(), want);
    Reopen();
  }
}

// In-process recovery: rank 1's program was killed, its runner reports it with rejoin (its
// peers go on in their processes); rank 2's report of an earlier failure in the same epoch
// arrives after. As for a whole-group restart, the job's first failure and the recovery name
// the earliest, and the recovery still says its peers recover in-process.
TEST_F(CoordinatorTest, AnInProcessRecoveryNamesTheEarliestProgramFailure) {
  StartFourRanks();
  auto failure = [](ReportErrorRequest* error, int rank, double at, const std::string& how) {
    ringmaster::RankFailure* f = error->mutable_failure();
    f->set_rank(rank);
    f->set_program("python3");
    f->set_how(how);
    f->set_last_output_line(absl::StrCat("rank ", rank, " was here"));
    f->set_failed_at_s(at);
  };
  ReportErrorRequest rejoin;
  rejoin.set_job("mlp");
  rejoin.set_epoch(1);
  *rejoin.mutable_slot() = Slot("a", 1);
  rejoin.set_detail("ABORTED: killed by signal 9 (SIGKILL)");
  rejoin.set_rejoin(true);
  failure(&rejoin, 1, 1700000001.5, "killed by signal 9 (SIGKILL)");
  ASSERT_TRUE(coordinator_->ReportError(rejoin).ok());
  {
    const Job job = *coordinator_->Get("mlp");
    EXPECT_EQ(job.epoch(), 2);
    EXPECT_EQ(job.restarts(), 1);
    ASSERT_TRUE(job.has_first_failure());
    EXPECT_EQ(job.first_failure().rank(), 1);
    EXPECT_EQ(job.first_failure().slot().node(), "a");
    EXPECT_EQ(job.first_failure().slot().slot(), 1);
    ASSERT_EQ(job.recoveries_size(), 1);
    EXPECT_EQ(job.recoveries(0).reason(),
              "rank 1 (node a, slot 1) failed first in membership epoch 1: python3: killed by "
              "signal 9 (SIGKILL); its last output line: rank 1 was here; its peers recover "
              "in-process");
  }
  ReportErrorRequest late;
  late.set_job("mlp");
  late.set_epoch(1);
  *late.mutable_slot() = Slot("b", 0);
  late.set_detail("ABORTED: exit code 1");
  failure(&late, 2, 1700000000.25, "exit code 1");
  EXPECT_TRUE(coordinator_->ReportError(late).ok());
  for (int restart = 0; restart < 2; ++restart) {
    const Job job = *coordinator_->Get("mlp");
    EXPECT_EQ(job.epoch(), 2) << "the late report re-forms nothing";
    EXPECT_EQ(job.restarts(), 1);
    ASSERT_TRUE(job.has_first_failure());
    EXPECT_EQ(job.first_failure().rank(), 2);
    EXPECT_EQ(job.first_failure().epoch(), 1);
    ASSERT_EQ(job.recoveries_size(), 1);
    EXPECT_EQ(job.recoveries(0).reason(),
              "rank 2 (node b, slot 0) failed first in membership epoch 1: python3: exit code 1; "
              "its last output line: rank 2 was here; its peers recover in-process");
    Reopen();
  }
}

// kill -9 of a trainer: a survivor's collective error arrives first, the agent's exit report
// a moment later. The recovery names the member that died, how, its last log line and
// where its log is, then what the survivors saw (issue 17, point 12).
TEST_F(CoordinatorTest, TheRecoveryNamesTheMemberThatDied) {
  StartFourRanks();
  ReportErrorRequest error;
  error.set_job("mlp");
  error.set_epoch(1);
  *error.mutable_slot() = Slot("b", 0);
  error.set_detail("UNAVAILABLE: all_reduce: rank 0 closed its connection");
  ASSERT_TRUE(coordinator_->ReportError(error).ok());
  TrainerExitedRequest exited = Exited("a", 0, -9);
  const std::string long_line(400, 'x');  // not cut at 300 characters any more
  exited.set_detail(absl::StrCat("I1124 glog line\nstep 40 loss 0.61 ", long_line, "\n"));
  exited.set_log_path("/var/lib/ringworker/mlp/slot-0.log");
  ASSERT_TRUE(coordinator_->TrainerExited(exited).ok());
  const Job job = *coordinator_->Get("mlp");
  ASSERT_EQ(job.recoveries_size(), 1);
  const std::string& reason = job.recoveries(0).reason();
  EXPECT_EQ(reason.find("trainer on a/0 was killed by signal 9; its last log line: step 40"), 0u)
      << reason;
  EXPECT_NE(reason.find(long_line + " (log: a:/var/lib/ringworker/mlp/slot-0.log)"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("; the survivors saw: collective error on b/0"), std::string::npos)
      << reason;
  EXPECT_EQ(job.reason(), reason);
  EXPECT_EQ(job.restarts(), 1) << "one failure, one restart";
}

// A rank that computes much longer than the others, report after report, is named a
// straggler (issue 17, point 11); one slow report is not enough, and it is cleared when the
// rank catches up. The ranks step together, so the others' extra time is in the all-reduce.
TEST_F(CoordinatorTest, AConsistentlySlowRankIsNamedAStraggler) {
  StartFourRanks();
  const std::pair<const char*, int> slots[] = {{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}};
  auto report = [&](int64_t step, double slow_compute_share) {
    for (int rank = 0; rank < 4; ++rank) {
      ProgressRequest r;
      r.set_job("mlp");
      r.set_epoch(1);
      *r.mutable_slot() = Slot(slots[rank].first, slots[rank].second);
      r.mutable_stats()->set_rank(rank);
      r.mutable_stats()->set_step(step);
      r.mutable_stats()->set_step_time_s(0.2);
      // b/0 computes `slow_compute_share` of the step; the others 0.25 of it.
      r.mutable_stats()->set_comm_fraction(rank == 2 ? 1 - slow_compute_share : 0.75);
      ASSERT_TRUE(coordinator_->Progress(r).ok());
    }
  };
  report(1, 0.9);
  EXPECT_EQ(coordinator_->Get("mlp")->stragglers_size(), 0) << "one slow report is noise";
  for (int step = 2; step <= 6; ++step) report(step, 0.9);
  Job job = *coordinator_->Get("mlp");
  ASSERT_EQ(job.stragglers_size(), 1);
  EXPECT_EQ(job.stragglers(0), "b/0 (rank 2, compute 3.6x the median)");
  Result<JobEvent> event;
  coordinator_->WatchNext("mlp", 0, clock_.Now() + absl::Seconds(1), event.Callback());
  ASSERT_TRUE(event.value.has_value() && event.value->ok());
  for (const RankStats& r : (*event.value)->ranks()) EXPECT_EQ(r.straggler(), r.rank() == 2);
  report(7, 0.25);
  EXPECT_EQ(coordinator_->Get("mlp")->stragglers_size(), 0) << "caught up";
}

// A job whose rank needs more memory than any registered node has is refused at Submit,
// with the numbers and the field (issue 17, point 8: a memory bomb used to be placed, and
// its trainers died of an uncaught bad_alloc, restart after restart).
TEST_F(CoordinatorTest, AJobNoNodeHasTheMemoryForIsRefused) {
  RegisterNodeRequest r;
  r.set_node("a");
  r.set_slots(2);
  r.set_memory_bytes(int64_t{16} << 30);
  ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  spec_.mutable_resources()->set_memory_per_rank_mib(int64_t{20} << 10);
  auto refused = coordinator_->Submit(spec_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("resources.memory_per_rank_mib"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("needs 20480 MiB, and the largest node has 16384"),
            std::string::npos)
      << refused.status();
  spec_.mutable_resources()->set_memory_per_rank_mib(4096);
  auto placed = coordinator_->Submit(spec_);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->phase(), JOB_PHASE_FORMING);
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

// Jobs a user manages: delete, resubmit, nodes, where a rank's log is.

TEST_F(CoordinatorTest, DeleteForgetsAnEndedJobButKeepsItsCheckpoints) {
  spec_.mutable_checkpoint()->set_dir("/shared/ckpt");
  Register("a", 2);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  absl::Status live = coordinator_->Delete("mlp").status();
  EXPECT_EQ(live.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(live.message().find("is forming: cancel it first"), std::string::npos) << live;
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  Result<JobEvent> watch;
  coordinator_->WatchNext("mlp", 1 << 30, clock_.Now() + absl::Seconds(30), watch.Callback());

  auto deleted = coordinator_->Delete("mlp");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->checkpoints_kept(), "/shared/ckpt/mlp");
  EXPECT_EQ(coordinator_->Get("mlp").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->Delete("mlp").status().code(), absl::StatusCode::kNotFound);
  ListJobsRequest all;
  all.set_include_finished(true);
  EXPECT_EQ(coordinator_->List(all)->jobs_size(), 0);
  ASSERT_TRUE(watch.value.has_value()) << "a watcher learns that the job is gone";
  EXPECT_EQ(watch.value->status().code(), absl::StatusCode::kNotFound);
  // The agent removes the job's files: after the stops of the cancel, a forget.
  HeartbeatResponse hb = Heartbeat("a");
  ASSERT_GE(hb.commands_size(), 1);
  EXPECT_EQ(hb.commands(hb.commands_size() - 1).forget().job(), "mlp");
  // Gone from the database too.
  Reopen();
  EXPECT_EQ(coordinator_->Get("mlp").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, SubmittingTheNameOfAnEndedJobReplacesIt) {
  StartFourRanks();
  ReportCheckpointRequest checkpoint;
  checkpoint.set_job("mlp");
  checkpoint.set_epoch(1);
  *checkpoint.mutable_slot() = Slot("a", 0);
  checkpoint.mutable_checkpoint()->set_step(10);
  checkpoint.mutable_checkpoint()->set_path("/ckpt/mlp/step-10");
  checkpoint.mutable_checkpoint()->set_world_size(4);
  ASSERT_TRUE(coordinator_->ReportCheckpoint(checkpoint).ok());
  absl::Status live = coordinator_->Submit(spec_).status();
  EXPECT_EQ(live.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(live.message().find("is running"), std::string::npos) << live;
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  // The cancelled trainers are gone; the name is submitted again.
  Heartbeat("a");
  Heartbeat("b");
  spec_.set_steps(spec_.steps() + 100);
  auto again = coordinator_->Submit(spec_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->phase(), JOB_PHASE_FORMING);
  EXPECT_EQ(again->epoch(), 1);
  EXPECT_EQ(again->restarts(), 0);
  EXPECT_EQ(again->checkpoints_size(), 0) << "the old job's record is not carried over";
  EXPECT_EQ(again->recoveries_size(), 0);
  EXPECT_EQ(again->spec().steps(), spec_.steps());
  // Its trainers are started (join epoch 1 again, as the new job's).
  Result<JoinResponse> joins[4];
  int i = 0;
  for (const char* node : {"a", "b"}) {
    for (int slot = 0; slot < 2; ++slot) Join(node, slot, 1, &joins[i++]);
  }
  ASSERT_TRUE(joins[3].value.has_value() && joins[3].value->ok());
  EXPECT_EQ(coordinator_->Get("mlp")->phase(), JOB_PHASE_COMMITTED);
  // Its first epoch is a resubmit (a command job's RINGMASTER_RESTART_REASON), for every
  // rank; like a start, it continues no run of its own and has spent no restart.
  for (const Result<JoinResponse>& join : joins) {
    ASSERT_TRUE(join.value.has_value() && join.value->ok());
    EXPECT_EQ((*join.value)->epoch_cause(), "resubmit");
    EXPECT_FALSE((*join.value)->continues_run());
    EXPECT_EQ((*join.value)->restarts(), 0);
  }
  EXPECT_TRUE(coordinator_->Get("mlp")->resubmitted());
  EXPECT_EQ(coordinator_->Get("mlp")->epoch_cause(), "resubmit");
  // One job of that name, in memory and after a restart.
  ListJobsRequest all;
  all.set_include_finished(true);
  EXPECT_EQ(coordinator_->List(all)->jobs_size(), 1);
  Reopen();
  EXPECT_EQ(coordinator_->List(all)->jobs_size(), 1);
  EXPECT_EQ(coordinator_->Get("mlp")->spec().steps(), spec_.steps());
  EXPECT_TRUE(coordinator_->Get("mlp")->resubmitted());
  EXPECT_EQ(coordinator_->Get("mlp")->epoch_cause(), "resubmit");
}

TEST_F(CoordinatorTest, ListNodesShowsSlotsRanksExitingTrainersAndHeartbeatAge) {
  RegisterNodeRequest r;
  r.set_node("a");
  r.set_slots(2);
  r.set_address("10.0.0.1");
  r.set_log_address("10.0.0.1:7071");
  r.add_gpus("GPU-0");
  r.add_gpus("GPU-1");
  ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  Register("b", 1);
  spec_.mutable_elastic()->set_max_ranks(2);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  Result<JoinResponse> j0, j1;
  Join("a", 1, 1, &j1);
  Join("a", 0, 1, &j0);
  clock_.Advance(absl::Seconds(2));
  Heartbeat("b");
  ListNodesResponse nodes = coordinator_->ListNodes();
  ASSERT_EQ(nodes.nodes_size(), 2);
  const NodeInfo& a = nodes.nodes(0);
  EXPECT_EQ(a.node(), "a");
  EXPECT_EQ(a.address(), "10.0.0.1");
  EXPECT_EQ(a.log_address(), "10.0.0.1:7071");
  EXPECT_DOUBLE_EQ(a.last_heartbeat_age_s(), 2);
  EXPECT_DOUBLE_EQ(a.lease_left_s(), 1);
  EXPECT_FALSE(a.draining());
  ASSERT_EQ(a.slots_size(), 2);
  EXPECT_EQ(a.slots(1).job(), "mlp");
  EXPECT_EQ(a.slots(1).rank(), 1);
  EXPECT_EQ(a.slots(1).gpu(), "GPU-1");
  EXPECT_EQ(a.slots(0).rank(), 0);
  const NodeInfo& b = nodes.nodes(1);
  EXPECT_DOUBLE_EQ(b.last_heartbeat_age_s(), 0);
  ASSERT_EQ(b.slots_size(), 1);
  EXPECT_EQ(b.slots(0).job(), "");
  EXPECT_EQ(b.slots(0).rank(), -1);
  // Cancelled: a's slots hold exiting trainers until its agent reports them gone.
  Heartbeat("a");
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  nodes = coordinator_->ListNodes();
  EXPECT_EQ(nodes.nodes(0).slots(0).job(), "");
  EXPECT_EQ(nodes.nodes(0).slots(0).exiting_job(), "mlp");
  EXPECT_EQ(nodes.nodes(0).last_heartbeat_age_s(), 0);
  // A coordinator restarted from the database has heard from no agent yet.
  Reopen();
  EXPECT_EQ(coordinator_->ListNodes().nodes_size(), 0) << "the job ended: no node to expect";
}

TEST_F(CoordinatorTest, FindLogMapsARankToItsSlotAndItsAgent) {
  RegisterNodeRequest r;
  r.set_node("a");
  r.set_slots(2);
  r.set_log_address("127.0.0.1:7071");
  ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  Register("b", 2);  // serves no logs
  LogsRequest request;
  request.set_job("mlp");
  EXPECT_EQ(coordinator_->FindLog(request).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(coordinator_->Submit(spec_).ok());
  absl::Status early = coordinator_->FindLog(request).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(early.message().find("no ranks yet"), std::string::npos) << early;
  Result<JoinResponse> joins[4];
  int i = 0;
  for (const char* node : {"a", "b"}) {
    for (int slot = 0; slot < 2; ++slot) Join(node, slot, 1, &joins[i++]);
  }
  auto rank0 = coordinator_->FindLog(request);  // no rank given: rank 0
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_EQ(rank0->slot.node(), "a");
  EXPECT_EQ(rank0->slot.slot(), 0);
  EXPECT_EQ(rank0->log_address, "127.0.0.1:7071");
  request.set_rank(1);
  EXPECT_EQ(coordinator_->FindLog(request)->slot.slot(), 1);
  request.set_rank(4);
  absl::Status none = coordinator_->FindLog(request).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.message().find("ranks are 0 to 3"), std::string::npos) << none;
  request.set_rank(2);
  absl::Status b = coordinator_->FindLog(request).status();
  EXPECT_EQ(b.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(b.message().find("node b serves no logs"), std::string::npos) << b;
  *request.mutable_slot() = Slot("a", 1);
  EXPECT_EQ(coordinator_->FindLog(request)->slot.slot(), 1);
  // The ranks stay known after the job ends (a finished rank leaves the members), and
  // after a restart.
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  Reopen();
  ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  request.set_rank(1);
  auto after = coordinator_->FindLog(request);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->slot.node(), "a");
  EXPECT_EQ(after->slot.slot(), 1);
}

TEST_F(CoordinatorTest, TheHistoryKeepsRankZerosCurveAndTheMembersOfEachEpoch) {
  StartFourRanks();
  for (int step = 1; step <= 3; ++step) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Progress("a", 0, 1, 0, step).ok());
    ASSERT_TRUE(Progress("a", 1, 1, 1, step).ok()) << "rank 1's reports are not the curve";
  }
  ASSERT_TRUE(coordinator_->TrainerExited(Exited("b", 0, -9)).ok());
  Result<JoinResponse> joins[3];
  Join("a", 0, 2, &joins[0]);
  Join("a", 1, 2, &joins[1]);
  Join("b", 1, 2, &joins[2]);
  for (auto [node, slot] : {std::pair{"a", 0}, std::pair{"a", 1}, std::pair{"b", 1}}) {
    ASSERT_TRUE(Ready(node, slot, 2).ok());
  }
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Progress("a", 0, 2, 0, 3).ok());  // epoch 2 restored step 2

  const JobHistory::View history = coordinator_->History("mlp");
  ASSERT_EQ(history.points.size(), 3u);
  EXPECT_EQ(history.points[1].step, 2);
  EXPECT_EQ(history.points[1].epoch, 1);
  EXPECT_EQ(history.points[2].step, 3);
  EXPECT_EQ(history.points[2].epoch, 2) << "step 3 again, in epoch 2";
  EXPECT_EQ(history.points[2].step_time_s, 0.25);
  EXPECT_EQ(history.points[1].time - history.points[0].time, absl::Seconds(1));
  ASSERT_EQ(history.epochs.size(), 2u);
  EXPECT_EQ(history.epochs[0].cause, EpochCause::kStart);
  EXPECT_EQ(history.epochs[0].ranks.size(), 4u);
  EXPECT_EQ(history.epochs[1].epoch, 2);
  EXPECT_EQ(history.epochs[1].cause, EpochCause::kFailure);
  EXPECT_EQ(history.epochs[1].ranks, (std::vector<SlotRef>{{"a", 0}, {"a", 1}, {"b", 1}}));
  EXPECT_TRUE(coordinator_->History("nosuchjob").epochs.empty());

  // A restarted coordinator knows the current epoch's members; the curve starts again.
  Reopen();
  const JobHistory::View restarted = coordinator_->History("mlp");
  ASSERT_EQ(restarted.epochs.size(), 1u);
  EXPECT_EQ(restarted.epochs[0].epoch, 2);
  EXPECT_EQ(restarted.epochs[0].ranks.size(), 3u);
  EXPECT_TRUE(restarted.points.empty());
}

// The job's rate is rank 0's as its progress line says it (common/progress_rate.h, over a
// window of steps), the same figure every view shows: never 1 / the last report's step time,
// nor another rank's.
TEST_F(CoordinatorTest, TheJobsRateIsRankZerosWindowedRate) {
  StartFourRanks();
  ProgressRequest r;
  r.set_job("mlp");
  r.set_epoch(1);
  *r.mutable_slot() = Slot("a", 0);
  r.mutable_stats()->set_rank(0);
  r.mutable_stats()->set_step(265);
  r.mutable_stats()->set_step_time_s(0.82);  // one slow step
  r.mutable_stats()->set_steps_per_s(7.84);
  r.mutable_stats()->set_samples_per_s(7.84 * 128);
  r.set_total_steps(1000);
  ASSERT_TRUE(coordinator_->Progress(r).ok());
  EXPECT_DOUBLE_EQ(coordinator_->Get("mlp")->steps_per_s(), 7.84);
  // Rank 1 ahead by a step, with a rate of its own: the job's stays rank 0's.
  *r.mutable_slot() = Slot("a", 1);
  r.mutable_stats()->set_rank(1);
  r.mutable_stats()->set_step(266);
  r.mutable_stats()->set_steps_per_s(3);
  ASSERT_TRUE(coordinator_->Progress(r).ok());
  EXPECT_DOUBLE_EQ(coordinator_->Get("mlp")->steps_per_s(), 7.84);
}

// A recovery that restores an older step than the job had reached (a ZeRO-2 rank's shards
// lost with it: back to the checkpoint): the new epoch's trainers learn the step the job had
// reached, and their Ready says where they resumed from and why not from memory, so that the
// recovery records the steps lost and why before the first step.
TEST_F(CoordinatorTest, ARecoveryRecordsWhereItResumedTheStepsLostAndWhy) {
  StartFourRanks();
  ASSERT_TRUE(Progress("a", 0, 1, 0, 265).ok());
  ASSERT_TRUE(coordinator_->TrainerExited(Exited("b", 0, -9)).ok());
  ASSERT_EQ(coordinator_->Get("mlp")->recoveries(0).step_before(), 265);
  EXPECT_EQ(coordinator_->Get("mlp")->recoveries(0).resumed_from_step(), -1);

  Result<JoinResponse> joins[3];
  Join("a", 0, 2, &joins[0]);
  Join("a", 1, 2, &joins[1]);
  Join("b", 1, 2, &joins[2]);
  for (auto& j : joins) {
    ASSERT_TRUE(j.value.has_value() && j.value->ok());
    ASSERT_TRUE((*j.value)->has_step_before());
    EXPECT_EQ((*j.value)->step_before(), 265);
  }
  for (auto [node, slot] : {std::pair{"a", 0}, std::pair{"a", 1}, std::pair{"b", 1}}) {
    ReadyRequest ready;
    ready.set_job("mlp");
    ready.set_epoch(2);
    *ready.mutable_slot() = Slot(node, slot);
    ready.set_restored_step(200);
    ready.set_restored_from("step 200's checkpoint");
    ready.set_restore_note(slot == 0 ? "its state is sharded over the ranks (ZeRO-2)"
                                     : "said second");
    ASSERT_TRUE(coordinator_->Ready(ready).ok());
  }
  Recovery rec = coordinator_->Get("mlp")->recoveries(0);
  EXPECT_EQ(rec.resumed_from_step(), 200);
  EXPECT_EQ(rec.resumed_from(), "step 200's checkpoint");
  EXPECT_EQ(rec.lost_because(), "its state is sharded over the ranks (ZeRO-2)");
  EXPECT_EQ(rec.lost_steps(), 65) << "known once ready, before the first step";
  // The first step (201) agrees; a late report of the old epoch changes nothing.
  ASSERT_TRUE(Progress("a", 0, 2, 0, 201).ok());
  rec = coordinator_->Get("mlp")->recoveries(0);
  EXPECT_EQ(rec.lost_steps(), 65);
  EXPECT_EQ(rec.resumed_from_step(), 200);
}

}  // namespace
}  // namespace ringmaster::coordinator
