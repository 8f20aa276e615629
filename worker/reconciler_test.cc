#include "worker/reconciler.h"

#include <variant>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

AgentCommand StartCommand(int slot, const std::string& job, int64_t epoch = 1) {
  AgentCommand c;
  c.mutable_start()->mutable_slot()->set_node("n");
  c.mutable_start()->mutable_slot()->set_slot(slot);
  c.mutable_start()->set_job(job);
  c.mutable_start()->set_epoch(epoch);
  return c;
}

AgentCommand StopCommand(int slot, const std::string& job) {
  AgentCommand c;
  c.mutable_stop()->mutable_slot()->set_slot(slot);
  c.mutable_stop()->set_job(job);
  c.mutable_stop()->set_reason("shrink");
  return c;
}

AgentCommand ForgetCommand(const std::string& job) {
  AgentCommand c;
  c.mutable_forget()->set_job(job);
  return c;
}

// The one action of `actions`, of kind T.
template <typename T>
T Only(const std::vector<AgentAction>& actions) {
  EXPECT_EQ(actions.size(), 1u);
  const T* action = actions.empty() ? nullptr : std::get_if<T>(&actions[0]);
  EXPECT_NE(action, nullptr) << "the action is of another kind (index "
                             << (actions.empty() ? -1 : static_cast<int>(actions[0].index()))
                             << ")";
  return action != nullptr ? *action : T{};
}

TEST(ReconcilerTest, StartsAFreeSlotAndReportsItsExit) {
  Reconciler r({.slots = 2});
  const auto start = Only<StartTrainer>(r.Want(StartCommand(1, "job-a", 3), kT0));
  EXPECT_EQ(start.command.job(), "job-a");
  EXPECT_EQ(start.command.epoch(), 3);
  r.Started(start.command, 100, "/w/job-a/slot-1.log");
  ASSERT_EQ(r.trainers().size(), 1u);
  EXPECT_EQ(r.trainers().at(1).pid, 100);

  EXPECT_TRUE(r.Exited(999, 0).empty()) << "not one of its trainers";
  const auto exit = Only<ReportExit>(r.Exited(100, 3));
  EXPECT_EQ(exit.slot, 1);
  EXPECT_EQ(exit.job, "job-a");
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_FALSE(exit.stopped);
  EXPECT_EQ(exit.log_path, "/w/job-a/slot-1.log");
  EXPECT_TRUE(r.trainers().empty());
}

TEST(ReconcilerTest, RefusesASlotNotOnTheNodeAndABusySlot) {
  Reconciler r({.slots = 2});
  const auto outside = Only<RefuseStart>(r.Want(StartCommand(2, "job-a"), kT0));
  EXPECT_TRUE(absl::IsInvalidArgument(outside.why));
  EXPECT_EQ(outside.why.message(), "slot 2 is not on this node");
  EXPECT_TRUE(absl::IsInvalidArgument(Only<RefuseStart>(r.Want(StartCommand(-1, "j"), kT0)).why));

  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  const auto busy = Only<RefuseStart>(r.Want(StartCommand(0, "job-b"), kT0));
  EXPECT_TRUE(absl::IsFailedPrecondition(busy.why));
  EXPECT_EQ(busy.why.message(), "slot 0 still runs a trainer of job job-a (pid 100)");
  EXPECT_EQ(busy.command.job(), "job-b");
}

TEST(ReconcilerTest, StopKillsOnlyThatJobsTrainerOnceAndItsExitIsReportedStopped) {
  Reconciler r({.slots = 1});
  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  EXPECT_TRUE(r.Want(StopCommand(0, "job-b"), kT0).empty()) << "another job's trainer";
  const auto stop = Only<StopTrainer>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_EQ(stop.pid, 100);
  EXPECT_EQ(stop.slot, 0);
  EXPECT_EQ(stop.reason, "shrink");
  EXPECT_TRUE(r.Want(StopCommand(0, "job-a"), kT0).empty()) << "already being stopped";
  EXPECT_TRUE(r.trainers().at(0).stopping);
  EXPECT_TRUE(Only<ReportExit>(r.Exited(100, -9)).stopped);
}

TEST(ReconcilerTest, AStartOnAStoppingSlotWaitsForTheExit) {
  Reconciler r({.slots = 1, .stop_wait = absl::Seconds(5)});
  r.Started(StartCommand(0, "job-a", 1).start(), 100, "log");
  Only<StopTrainer>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_TRUE(r.Want(StartCommand(0, "job-a", 2), kT0).empty());
  EXPECT_TRUE(r.Tick(kT0 + absl::Seconds(1)).empty()) << "still running";
  Only<ReportExit>(r.Exited(100, -9));
  const auto start = Only<StartTrainer>(r.Tick(kT0 + absl::Seconds(1)));
  EXPECT_EQ(start.command.epoch(), 2);
  EXPECT_TRUE(r.Tick(kT0 + absl::Seconds(2)).empty()) << "started once";
}

TEST(ReconcilerTest, AStartOnAStoppingSlotIsRefusedAfterTheWait) {
  Reconciler r({.slots = 1, .stop_wait = absl::Seconds(5)});
  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  Only<StopTrainer>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_TRUE(r.Want(StartCommand(0, "job-b"), kT0).empty());
  EXPECT_TRUE(r.Tick(kT0 + absl::Seconds(4)).empty());
  const auto refused = Only<RefuseStart>(r.Tick(kT0 + absl::Seconds(5)));
  EXPECT_EQ(refused.command.job(), "job-b");
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.why));
  Only<ReportExit>(r.Exited(100, -9));
  EXPECT_TRUE(r.Tick(kT0 + absl::Seconds(6)).empty()) << "refused for good";
}

TEST(ReconcilerTest, AStartForALaterEpochStopsTheJobsStaleTrainerFirst) {
  // A partition cut the node off: the coordinator counted its trainer (epoch 2) gone and,
  // once the node came back, started the job on it again for epoch 4.
  Reconciler r({.slots = 1, .stop_wait = absl::Seconds(5)});
  r.Started(StartCommand(0, "job-a", 2).start(), 100, "log");
  const auto stop = Only<StopTrainer>(r.Want(StartCommand(0, "job-a", 4), kT0));
  EXPECT_EQ(stop.pid, 100);
  EXPECT_EQ(stop.reason,
            "superseded: the job started this slot again for epoch 4 (this trainer was started "
            "for epoch 2)");
  EXPECT_TRUE(r.Tick(kT0 + absl::Seconds(1)).empty()) << "still running";
  const auto exit = Only<ReportExit>(r.Exited(100, -15));
  EXPECT_TRUE(exit.stopped);
  EXPECT_EQ(exit.start_epoch, 2) << "the coordinator tells the stale exit by its epoch";
  EXPECT_EQ(Only<StartTrainer>(r.Tick(kT0 + absl::Seconds(1))).command.epoch(), 4);

  // The same epoch again, an older one or another job's start is no reason to stop it.
  r.Started(StartCommand(0, "job-a", 4).start(), 101, "log");
  EXPECT_TRUE(
      absl::IsFailedPrecondition(Only<RefuseStart>(r.Want(StartCommand(0, "job-a", 4), kT0)).why));
  Only<RefuseStart>(r.Want(StartCommand(0, "job-a", 3), kT0));
  Only<RefuseStart>(r.Want(StartCommand(0, "job-b", 9), kT0));
  EXPECT_FALSE(r.trainers().at(0).stopping);
}

TEST(ReconcilerTest, AStopOfAWaitingStartDropsItAndReportsItStopped) {
  Reconciler r({.slots = 1});
  r.Started(StartCommand(0, "job-a", 1).start(), 100, "log");
  Only<StopTrainer>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_TRUE(r.Want(StartCommand(0, "job-a", 2), kT0).empty());
  const auto dropped = Only<ReportExit>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_TRUE(dropped.stopped);
  EXPECT_EQ(dropped.job, "job-a");
  EXPECT_TRUE(dropped.log_path.empty());
  Only<ReportExit>(r.Exited(100, -9));
  EXPECT_TRUE(r.Tick(kT0).empty()) << "the dropped start does not come back";
}

TEST(ReconcilerTest, ADrainingNodeTakesNoStart) {
  Reconciler r({.slots = 2});
  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  Only<StopTrainer>(r.Want(StopCommand(0, "job-a"), kT0));
  EXPECT_TRUE(r.Want(StartCommand(0, "job-a", 2), kT0).empty());
  r.Drain();
  EXPECT_TRUE(r.Want(StartCommand(1, "job-a", 2), kT0).empty());
  Only<ReportExit>(r.Exited(100, -9));
  EXPECT_TRUE(r.Tick(kT0).empty()) << "the waiting start is dropped too";
}

TEST(ReconcilerTest, ForgetsAJobOnceNoneOfItsTrainersRuns) {
  Reconciler r({.slots = 2});
  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  r.Started(StartCommand(1, "job-a").start(), 101, "log");
  EXPECT_TRUE(r.Want(ForgetCommand("job-a"), kT0).empty());
  Only<ReportExit>(r.Exited(100, 0));
  EXPECT_TRUE(r.Tick(kT0).empty());
  Only<ReportExit>(r.Exited(101, 0));
  EXPECT_EQ(Only<ForgetJob>(r.Tick(kT0)).job, "job-a");
  EXPECT_TRUE(r.Tick(kT0).empty()) << "forgotten once";
  EXPECT_EQ(Only<ForgetJob>(r.Want(ForgetCommand("job-b"), kT0)).job, "job-b");
}

TEST(ReconcilerTest, AStartOfAJobKeepsItsFiles) {
  Reconciler r({.slots = 1});
  r.Started(StartCommand(0, "job-a").start(), 100, "log");
  EXPECT_TRUE(r.Want(ForgetCommand("job-a"), kT0).empty());
  Only<ReportExit>(r.Exited(100, 0));
  // Submitted again under the same name before the agent looked.
  r.Started(StartCommand(0, "job-a").start(), 101, "log");
  Only<ReportExit>(r.Exited(101, 0));
  EXPECT_TRUE(r.Tick(kT0).empty());
}

}  // namespace
}  // namespace ringmaster::worker
