#include "train/checkpoint_policy.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "common/fault_injection_env.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "state/range.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::CheckpointedJob;
using testing::ExpectOkOnRanks;

state::TensorTable Table() {
  state::TensorTable t;
  t.Add("w", {31, 17});
  t.Add("b", {31});
  return t;
}

// Parameter i after step `step`.
float Value(int64_t step, int64_t i) { return static_cast<float>(step * 1000 + i % 89); }

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// One rank of a job over forked ranks: its parameters, its policy, and what the policy
// said, pulled and reported. Step() is the trainer's step boundary.
class Rank {
 public:
  Rank(TcpCommunicator& comm, const TrainConfig& config, Env* env = nullptr,
       Clock* clock = Clock::Real())
      : comm_(comm), config_(config), params_(table_.total_elements()) {
    options_.config = &config_;
    options_.comm = &comm;
    options_.op_timeout = absl::Seconds(30);
    options_.env = env;
    options_.clock = clock;
    options_.table = &table_;
    options_.pull = [this] {
      ++pulls_;
      return absl::OkStatus();
    };
    options_.request = [this](int64_t done) {
      const int64_t n = table_.total_elements();
      const state::FlatRange saved = checkpoint::SaveSlice(n, comm_.rank(), comm_.size());
      checkpoint::SaveRequest req;
      req.step = done;
      req.buffers.push_back({"params", n, saved, state::Slice(params_.span(), saved)});
      req.state.step = done;
      return req;
    };
    options_.say = [this](const std::string& line) { said_.push_back(line); };
    options_.on_checkpoint = [this](const CommittedCheckpoint& c) { commits_.push_back(c); };
  }

  // Each save's pull takes `cost` on `clock` (what the save costs the training loop).
  void CostEachPull(FakeClock* clock, absl::Duration cost) {
    options_.pull = [this, clock, cost] {
      ++pulls_;
      clock->Advance(cost);
      return absl::OkStatus();
    };
  }
  void SignalPreemptionRate(const std::atomic<double>* rate) {
    options_.signalled_preemption_rate = rate;
  }

  absl::Status Create() {
    RM_ASSIGN_OR_RETURN(policy_, CheckpointPolicy::Create(options_));
    return absl::OkStatus();
  }

  // The optimizer writes the state of step `done`, the ranks sum their votes, and the
  // policy acts.
  absl::Status Step(int64_t done, bool drain = false, bool last_step = false) {
    policy_->FinishSnapshot();
    for (int64_t i = 0; i < params_.size(); ++i) params_.data()[i] = Value(done, i);
    double votes[2] = {policy_->TimeToSave() ? 1.0 : 0.0, policy_->own_failures()};
    RM_RETURN_IF_ERROR(comm_.AllReduce(votes, votes, 2, DataType::kFloat64, comm::ReduceOp::kSum,
                                       absl::Now() + absl::Seconds(30)));
    return policy_->AfterStep(done, drain, last_step, votes[0], votes[1]);
  }

  CheckpointPolicy& policy() { return *policy_; }
  bool leader() const { return comm_.rank() == 0; }
  int pulls() const { return pulls_; }
  std::string said() const { return absl::StrJoin(said_, "\n"); }
  std::vector<int64_t> committed_steps() const {
    std::vector<int64_t> steps;
    for (const CommittedCheckpoint& c : commits_) steps.push_back(c.step);
    return steps;
  }
  const std::vector<CommittedCheckpoint>& commits() const { return commits_; }

 private:
  TcpCommunicator& comm_;
  const TrainConfig config_;
  const state::TensorTable table_ = Table();
  state::FlatBuffer params_;
  CheckpointPolicyOptions options_;
  std::unique_ptr<CheckpointPolicy> policy_;
  int pulls_ = 0;
  std::vector<std::string> said_;
  std::vector<CommittedCheckpoint> commits_;
};

// The parameters the checkpoint of `step` holds are those after `step`.
void ExpectCheckpointOf(const TrainConfig& config, int64_t step) {
  const state::TensorTable table = Table();
  checkpoint::LoadOptions lo;
  lo.root = config.checkpoint.dir;
  lo.job = config.name;
  lo.step = step;
  lo.table = &table;
  std::vector<float> params(table.total_elements());
  absl::StatusOr<checkpoint::LoadResult> r =
      checkpoint::LoadCheckpoint(lo, {{"params", state::FullRange(table), absl::MakeSpan(params)}});
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < table.total_elements(); ++i) {
    ASSERT_EQ(params[i], Value(step, i)) << "step " << step << ", element " << i;
  }
}

class CheckpointPolicyTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointPolicyTest, SavesEveryStepsAndTheLastStepSynchronously) {
  const int world = GetParam();
  TrainConfig config = CheckpointedJob(absl::StrCat("every_", world));
  config.checkpoint.every_steps = 2;
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    Rank rank(comm, config);
    RM_RETURN_IF_ERROR(rank.Create());
    for (int64_t done = 1; done <= 4; ++done) RM_RETURN_IF_ERROR(rank.Step(done));
    // The last step's save is done when AfterStep returns.
    RM_RETURN_IF_ERROR(rank.Step(5, /*drain=*/false, /*last_step=*/true));
    if (rank.leader()) {
      if (rank.committed_steps().empty() || rank.committed_steps().back() != 5) {
        return Fail(absl::StrCat("step 5 not committed when AfterStep returned: ", rank.said()));
      }
      if (!absl::StrContains(rank.said(), absl::StrCat("checkpoint of step 5 saved in ",
                                                       config.checkpoint.dir, "/job"))) {
        return Fail(rank.said());
      }
    }
    const CheckpointTotals totals = rank.policy().Finish();
    if (totals.saved != 3 || totals.failed != 0 || totals.skipped != 0 || rank.pulls() != 3) {
      return Fail(absl::StrCat("saved ", totals.saved, ", failed ", totals.failed, ", skipped ",
                               totals.skipped, ", pulled ", rank.pulls()));
    }
    if (!rank.leader()) return absl::OkStatus();
    if (rank.committed_steps() != std::vector<int64_t>{2, 4, 5}) {
      return Fail(absl::StrCat("committed ", absl::StrJoin(rank.committed_steps(), ", ")));
    }
    for (const CommittedCheckpoint& c : rank.commits()) {
      // How long it took is measured, and the training loop was blocked for part of it.
      if (c.world_size != world || c.bytes <= 0 ||
          c.path != absl::StrCat(config.checkpoint.dir, "/job/step-", c.step) ||
          c.save_time <= absl::ZeroDuration() || c.blocked_time < absl::ZeroDuration() ||
          c.blocked_time > c.save_time) {
        return Fail(absl::StrCat("commit of step ", c.step, ": ", c.path, ", ", c.world_size,
                                 " ranks, ", c.bytes, " bytes"));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_EQ(
      *checkpoint::ReadLatest(Env::Default(), checkpoint::JobDir(config.checkpoint.dir, "job")), 5);
  // The asynchronous saves copied the state of their step, not of a later one.
  ExpectCheckpointOf(config, 2);
  ExpectCheckpointOf(config, 4);
  ExpectCheckpointOf(config, 5);

  // A later run's policy tells of the latest checkpoint at start.
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    Rank rank(comm, config);
    RM_RETURN_IF_ERROR(rank.Create());
    rank.policy().ReportLatestCommitted();
    const std::vector<int64_t> want =
        rank.leader() ? std::vector<int64_t>{5} : std::vector<int64_t>{};
    if (rank.committed_steps() != want) {
      return Fail(absl::StrCat("reported ", absl::StrJoin(rank.committed_steps(), ", ")));
    }
    return absl::OkStatus();
  });
}

TEST_P(CheckpointPolicyTest, TheDrainSaveIsSynchronous) {
  const int world = GetParam();
  const TrainConfig config = CheckpointedJob(absl::StrCat("drain_", world));
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    Rank rank(comm, config);
    RM_RETURN_IF_ERROR(rank.Create());
    RM_RETURN_IF_ERROR(rank.Step(1));  // no trigger: no save
    if (rank.pulls() != 0) return Fail("saved without a trigger");
    RM_RETURN_IF_ERROR(rank.Step(2, /*drain=*/true));
    if (rank.leader()) {
      if (rank.committed_steps() != std::vector<int64_t>{2}) {
        return Fail(absl::StrCat("committed ", absl::StrJoin(rank.committed_steps(), ", ")));
      }
      if (!absl::StrContains(rank.said(), "checkpoint of step 2 saved in ")) {
        return Fail(rank.said());
      }
    }
    const CheckpointTotals totals = rank.policy().Finish();
    if (totals.saved != 1 || totals.failed != 0) {
      return Fail(absl::StrCat("saved ", totals.saved, ", failed ", totals.failed));
    }
    return absl::OkStatus();
  });
  ExpectCheckpointOf(config, 2);
}

// Rank `world - 1`'s disk refuses its shard.
Env* ShardFailsOn(TcpCommunicator& comm, std::unique_ptr<FaultInjectionEnv>& env) {
  if (comm.rank() != comm.size() - 1) return nullptr;
  env = std::make_unique<FaultInjectionEnv>(Env::Default(), [](const FileOp& op) {
    if (op.kind == FileOp::Kind::kPWrite && absl::StrContains(op.path, "shard-")) {
      return absl::ResourceExhaustedError("No space left on device (injected)");
    }
    return absl::OkStatus();
  });
  return env.get();
}

TEST_P(CheckpointPolicyTest, AFailedSaveFailsTheJobWhenOnFailureIsFail) {
  const int world = GetParam();
  TrainConfig config = CheckpointedJob(absl::StrCat("fail_", world));
  config.checkpoint.fail_on_failure = true;
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    std::unique_ptr<FaultInjectionEnv> env;
    Rank rank(comm, config, ShardFailsOn(comm, env));
    RM_RETURN_IF_ERROR(rank.Create());
    absl::Status s = rank.Step(1, /*drain=*/false, /*last_step=*/true);
    // Every rank fails alike, naming the rank whose save failed.
    const std::string want =
        absl::StrCat("checkpoint.on_failure is fail and the checkpoint of step 1 failed on rank ",
                     world - 1, ": No space left on device (injected)");
    if (!absl::IsResourceExhausted(s) || !IsPermanent(s) || !absl::StrContains(s.message(), want)) {
      return Fail(absl::StrCat("AfterStep returned ", s.ToString()));
    }
    rank.policy().Finish();
    return absl::OkStatus();
  });
}

TEST_P(CheckpointPolicyTest, AFailedSaveIsCountedWhenOnFailureIsContinue) {
  const int world = GetParam();
  const TrainConfig config = CheckpointedJob(absl::StrCat("continue_", world));
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    std::unique_ptr<FaultInjectionEnv> env;
    Rank rank(comm, config, ShardFailsOn(comm, env));
    RM_RETURN_IF_ERROR(rank.Create());
    RM_RETURN_IF_ERROR(rank.Step(1, /*drain=*/false, /*last_step=*/true));
    const bool failing = comm.rank() == world - 1;
    if (rank.policy().own_failures() != (failing ? 1 : 0)) {
      return Fail(absl::StrCat("own failures: ", rank.policy().own_failures()));
    }
    if (rank.leader()) {
      if (rank.policy().last_failed_step() != 1 || !rank.committed_steps().empty() ||
          !absl::StrContains(rank.said(), "checkpoint of step 1 failed")) {
        return Fail(absl::StrCat("last failed step ", rank.policy().last_failed_step(), ": ",
                                 rank.policy().last_failure(), "; said: ", rank.said()));
      }
    }
    const CheckpointTotals totals = rank.policy().Finish();
    if (totals.saved != 0 || totals.failed != (rank.leader() || failing ? 1 : 0)) {
      return Fail(absl::StrCat("saved ", totals.saved, ", failed ", totals.failed));
    }
    return absl::OkStatus();
  });
  EXPECT_FALSE(
      checkpoint::ReadLatest(Env::Default(), checkpoint::JobDir(config.checkpoint.dir, "job"))
          .ok());
}

TEST_P(CheckpointPolicyTest, EverySecondsAsksRankZeroForASave) {
  const int world = GetParam();
  TrainConfig config = CheckpointedJob(absl::StrCat("seconds_", world));
  config.checkpoint.every_seconds = 60;
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    FakeClock clock;
    Rank rank(comm, config, /*env=*/nullptr, &clock);
    RM_RETURN_IF_ERROR(rank.Create());
    auto expect_vote = [&](bool want, const char* when) -> absl::Status {
      if (rank.policy().TimeToSave() != (want && rank.leader())) {
        return Fail(absl::StrCat("TimeToSave ", when, ": ", rank.policy().TimeToSave()));
      }
      return absl::OkStatus();
    };
    RM_RETURN_IF_ERROR(expect_vote(false, "at start"));
    clock.Advance(absl::Seconds(59));
    RM_RETURN_IF_ERROR(expect_vote(false, "after 59 s"));
    RM_RETURN_IF_ERROR(rank.Step(1));  // no vote yet: no save
    clock.Advance(absl::Seconds(1));
    RM_RETURN_IF_ERROR(expect_vote(true, "after 60 s"));
    RM_RETURN_IF_ERROR(rank.Step(2));  // rank 0's vote: a save
    RM_RETURN_IF_ERROR(expect_vote(false, "after the save"));
    clock.Advance(absl::Seconds(60));
    RM_RETURN_IF_ERROR(expect_vote(true, "60 s after the save"));
    const CheckpointTotals totals = rank.policy().Finish();
    if (totals.saved != 1 || rank.pulls() != 1) {
      return Fail(absl::StrCat("saved ", totals.saved, ", pulled ", rank.pulls()));
    }
    if (rank.leader() && rank.committed_steps() != std::vector<int64_t>{2}) {
      return Fail(absl::StrCat("committed ", absl::StrJoin(rank.committed_steps(), ", ")));
    }
    return absl::OkStatus();
  });
  ExpectCheckpointOf(config, 2);
}

TEST(YoungDalyIntervalTest, SquareRootOfTwiceTheSaveCostOverTheRate) {
  // 2 s saves, one preemption an hour: sqrt(2 x 2 x 3600) = 120 s.
  EXPECT_EQ(YoungDalyInterval(absl::Seconds(2), 1, absl::Hours(1)), absl::Seconds(120));
  // Four times the rate halves it; the cap and a zero rate give the cap.
  EXPECT_EQ(YoungDalyInterval(absl::Seconds(2), 4, absl::Hours(1)), absl::Seconds(60));
  EXPECT_EQ(YoungDalyInterval(absl::Seconds(2), 1, absl::Seconds(100)), absl::Seconds(100));
  EXPECT_EQ(YoungDalyInterval(absl::Seconds(2), 0, absl::Hours(1)), absl::Hours(1));
}

// checkpoint.every: auto: rank 0's interval starts from the assumed save cost, follows the
// measured one, and shortens when the cluster signals more preemptions than configured.
TEST_P(CheckpointPolicyTest, EveryAutoFollowsTheSaveCostAndThePreemptionRate) {
  const int world = GetParam();
  TrainConfig config = CheckpointedJob(absl::StrCat("auto_", world));
  config.checkpoint.every_auto = true;
  config.checkpoint.preemption_rate_per_hour = 1;
  ExpectOkOnRanks(world, [&](TcpCommunicator& comm) -> absl::Status {
    FakeClock clock;
    std::atomic<double> signalled{0};
    Rank rank(comm, config, /*env=*/nullptr, &clock);
    rank.CostEachPull(&clock, absl::Seconds(2));
    rank.SignalPreemptionRate(&signalled);
    RM_RETURN_IF_ERROR(rank.Create());
    auto expect = [&](absl::Duration want, bool vote, const char* when) -> absl::Status {
      if (!rank.leader()) return absl::OkStatus();
      if (absl::AbsDuration(rank.policy().auto_interval() - want) > absl::Milliseconds(1) ||
          rank.policy().TimeToSave() != vote) {
        return Fail(absl::StrCat(when, ": interval ",
                                 absl::FormatDuration(rank.policy().auto_interval()), ", vote ",
                                 rank.policy().TimeToSave(), "\n", rank.said()));
      }
      return absl::OkStatus();
    };
    // Before a save: the assumed 10 s, sqrt(2 x 10 x 3600) = 268.33 s.
    const absl::Duration assumed = absl::Seconds(std::sqrt(2.0 * 10 * 3600));
    RM_RETURN_IF_ERROR(expect(assumed, false, "at start"));
    clock.Advance(assumed - absl::Seconds(1));
    RM_RETURN_IF_ERROR(rank.Step(1));  // no save yet
    RM_RETURN_IF_ERROR(expect(assumed, false, "before the interval"));
    clock.Advance(absl::Seconds(1));
    RM_RETURN_IF_ERROR(expect(assumed, true, "after the interval"));
    RM_RETURN_IF_ERROR(rank.Step(2));  // the save: 2 s in the loop
    // Measured once the optimizer waited for its snapshot (the next step): 2 s, 120 s.
    RM_RETURN_IF_ERROR(rank.Step(3));
    RM_RETURN_IF_ERROR(expect(absl::Seconds(120), false, "after a 2 s save"));
    if (rank.leader() &&
        !absl::StrContains(rank.said(), "checkpoint interval now 2m (Young/Daly sqrt(2 x "
                                        "measured save cost 2s / 1 preemptions/h), the "
                                        "configured preemption rate)")) {
      return Fail(rank.said());
    }
    // The cluster sees spot notices: 4 an hour, above the configured 1: 60 s.
    signalled.store(4);
    RM_RETURN_IF_ERROR(rank.Step(4));
    RM_RETURN_IF_ERROR(expect(absl::Seconds(60), false, "at 4 preemptions/h"));
    if (rank.leader() &&
        !absl::StrContains(rank.said(), "checkpoint interval now 1m (Young/Daly sqrt(2 x "
                                        "measured save cost 2s / 4 preemptions/h), the "
                                        "cluster's preemption rate (configured 1))")) {
      return Fail(rank.said());
    }
    clock.Advance(absl::Seconds(59));
    RM_RETURN_IF_ERROR(expect(absl::Seconds(60), false, "59 s after the save"));
    clock.Advance(absl::Seconds(1));
    RM_RETURN_IF_ERROR(expect(absl::Seconds(60), true, "60 s after the save"));
    RM_RETURN_IF_ERROR(rank.Step(5));
    // A signal below the configured rate leaves the configured one.
    signalled.store(0.5);
    RM_RETURN_IF_ERROR(rank.Step(6));
    // The second save cost 2 s too: the average stays; the rate is back to 1: 120 s.
    RM_RETURN_IF_ERROR(expect(absl::Seconds(120), false, "at the configured rate again"));
    const CheckpointTotals totals = rank.policy().Finish();
    if (totals.saved != 2 || rank.pulls() != 2) {
      return Fail(absl::StrCat("saved ", totals.saved, ", pulled ", rank.pulls()));
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CheckpointPolicyTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

}  // namespace
}  // namespace ringmaster::train
