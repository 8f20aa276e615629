// The agent against a scripted coordinator, a fake launcher and a fake clock, step by step:
// no process is started and nothing sleeps.
#include "worker/agent.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "client/testing/fake_coordinator.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "worker/trainer_records.h"

namespace ringmaster::worker {
namespace {

using client::testing::FakeCoordinator;

class FakeLauncher final : public Launcher {
 public:
  absl::StatusOr<int64_t> Launch(const LaunchSpec& spec) override {
    if (!fail_next.ok()) return std::exchange(fail_next, absl::OkStatus());
    launched.push_back(spec);
    const int64_t pid = next_pid_++;
    running.insert(pid);
    return pid;
  }
  void Signal(int64_t pid, int signal) override { signals.push_back({pid, signal}); }
  std::vector<ProcessExit> Reap() override { return std::exchange(exited_, {}); }
  int Wait(int64_t pid) override {
    running.erase(pid);
    return -SIGKILL;
  }

  // The process `pid` exits with `code`: the next Reap sees it.
  void Exit(int64_t pid, int code) {
    running.erase(pid);
    exited_.push_back({pid, code});
  }

  absl::Status fail_next = absl::OkStatus();
  std::vector<LaunchSpec> launched;
  std::vector<std::pair<int64_t, int>> signals;
  std::set<int64_t> running;

 private:
  int64_t next_pid_ = 1000;
  std::vector<ProcessExit> exited_;
};

AgentCommand Start(int slot, const std::string& job, int64_t epoch = 1) {
  AgentCommand c;
  StartTrainerCommand* s = c.mutable_start();
  s->mutable_slot()->set_node("node-a");
  s->mutable_slot()->set_slot(slot);
  s->set_job(job);
  s->set_epoch(epoch);
  s->set_membership_token(absl::StrCat("token-", job, "-", slot));
  s->mutable_spec()->set_name(job);
  return c;
}

AgentCommand Stop(int slot, const std::string& job) {
  AgentCommand c;
  c.mutable_stop()->mutable_slot()->set_slot(slot);
  c.mutable_stop()->set_job(job);
  c.mutable_stop()->set_reason("the job shrank");
  return c;
}

HeartbeatResponse Commands(std::vector<AgentCommand> commands) {
  HeartbeatResponse r;
  for (AgentCommand& c : commands) *r.add_commands() = std::move(c);
  return r;
}

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() {
    work_dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/",
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(work_dir_);
    RegisterNodeResponse registered;
    registered.set_heartbeat_interval_s(2);
    registered.set_node_credential("cred-1");
    fake_.register_node.Always(registered);
    fake_.heartbeat.Always(HeartbeatResponse());
    fake_.trainer_exited.Always(TrainerExitedResponse());
    fake_.drain_node.Always(DrainNodeResponse());
  }

  AgentOptions Options() {
    AgentOptions o;
    o.client = &fake_;
    o.coordinator_address = "coord:7070";
    o.node = "node-a";
    o.slots = 2;
    o.trainer_binary = "/bin/ringtrainer";
    o.work_dir = work_dir_;
    o.trainer_flags = {"--op_timeout_s=30"};
    o.drain_grace = absl::Seconds(60);
    o.drain_requested = &drain_;
    o.stop_requested = &stop_;
    o.log = [this](const std::string& line) { log_.push_back(line); };
    o.launcher = &launcher_;
    o.clock = &clock_;
    return o;
  }

  // One step, which must not end the agent.
  void StepOn(Agent& agent) {
    absl::StatusOr<bool> done = agent.Step();
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_FALSE(*done);
  }
  // Steps until the next heartbeat has been sent.
  void NextHeartbeat(Agent& agent) {
    const int before = fake_.heartbeat.calls();
    clock_.Advance(absl::Seconds(2));
    StepOn(agent);
    ASSERT_EQ(fake_.heartbeat.calls(), before + 1);
  }
  bool Logged(absl::string_view part) const {
    for (const std::string& line : log_) {
      if (absl::StrContains(line, part)) return true;
    }
    return false;
  }

  std::string work_dir_;
  FakeCoordinator fake_;
  FakeLauncher launcher_;
  FakeClock clock_;
  std::atomic<bool> drain_{false}, stop_{false};
  std::vector<std::string> log_;
};

TEST_F(AgentTest, RegistersAndHeartbeatsAtTheIntervalWithTheCredential) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  ASSERT_EQ(fake_.register_node.calls(), 1);
  const RegisterNodeRequest reg = fake_.register_node.requests()[0];
  EXPECT_EQ(reg.node(), "node-a");
  EXPECT_EQ(reg.slots(), 2);
  auto kept = ReadFile(work_dir_ + "/node.credential");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "cred-1");

  StepOn(agent);
  EXPECT_EQ(fake_.heartbeat.calls(), 1) << "the first heartbeat goes at once";
  clock_.Advance(absl::Seconds(1));
  StepOn(agent);
  EXPECT_EQ(fake_.heartbeat.calls(), 1) << "not before the interval";
  clock_.Advance(absl::Seconds(1));
  StepOn(agent);
  ASSERT_EQ(fake_.heartbeat.calls(), 2);
  EXPECT_EQ(fake_.heartbeat.requests()[1].node_credential(), "cred-1");
}

// Each heartbeat carries the round trip of the one before (0 for the first), as the agent's
// clock measured it: the coordinator shows it in its metrics.
TEST_F(AgentTest, HeartbeatsCarryThePreviousRoundTrip) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.ThenCall([this](const HeartbeatRequest&) {
    clock_.Advance(absl::Milliseconds(30));
    return HeartbeatResponse();
  });
  fake_.heartbeat.ThenCall([this](const HeartbeatRequest&) {
    clock_.Advance(absl::Milliseconds(5));
    return HeartbeatResponse();
  });
  fake_.heartbeat.Then(absl::UnavailableError("coordinator away"));
  StepOn(agent);
  NextHeartbeat(agent);
  NextHeartbeat(agent);
  NextHeartbeat(agent);
  const std::vector<HeartbeatRequest> beats = fake_.heartbeat.requests();
  ASSERT_EQ(beats.size(), 4u);
  EXPECT_EQ(beats[0].last_heartbeat_rtt_s(), 0);
  EXPECT_DOUBLE_EQ(beats[1].last_heartbeat_rtt_s(), 0.030);
  EXPECT_DOUBLE_EQ(beats[2].last_heartbeat_rtt_s(), 0.005);
  EXPECT_DOUBLE_EQ(beats[3].last_heartbeat_rtt_s(), 0.005) << "a failed call measures nothing";
}

TEST_F(AgentTest, ARestartedAgentRegistersWithTheCredentialItKept) {
  { Agent(Options()).Connect().IgnoreError(); }
  Agent again(Options());
  ASSERT_TRUE(again.Connect().ok());
  ASSERT_EQ(fake_.register_node.calls(), 2);
  EXPECT_EQ(fake_.register_node.requests()[1].node_credential(), "cred-1");
}

TEST_F(AgentTest, ANodeTheCoordinatorRefusesIsAFailedPrecondition) {
  FakeCoordinator refusing;
  refusing.register_node.Always(absl::InvalidArgumentError("node name too long"));
  AgentOptions o = Options();
  o.client = &refusing;
  absl::Status s = Agent(o).Connect();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "node name too long")) << s;
}

TEST_F(AgentTest, BadOptionsAreInvalidArgument) {
  AgentOptions o = Options();
  o.slots = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Agent(o).Connect()));
}

TEST_F(AgentTest, StartsATrainerAsTheCoordinatorSaysAndReportsItRunning) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(1, "job-a", 4)}));
  StepOn(agent);
  ASSERT_EQ(launcher_.launched.size(), 1u);
  const LaunchSpec& spec = launcher_.launched[0];
  const std::string dir = work_dir_ + "/job-a";
  EXPECT_EQ(spec.log_path, dir + "/slot-1.log");
  const std::vector<std::string> want = {
      "/bin/ringtrainer",
      "--coordinator=coord:7070",
      "--job=job-a",
      "--epoch=4",
      "--node=node-a",
      "--slot=1",
      "--membership_token_file=" + dir + "/slot-1.token",
      "--spec=" + dir + "/spec.yaml",
      "--local_ranks=2",
      "--advertise_host=127.0.0.1",
      "--summary=" + dir + "/summary.json",
      "--op_timeout_s=30",
  };
  EXPECT_EQ(spec.argv, want);
  auto token = ReadFile(dir + "/slot-1.token");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "token-job-a-1");
  struct stat st;
  ASSERT_EQ(stat((dir + "/slot-1.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  ASSERT_EQ(stat((dir + "/spec.yaml").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);

  NextHeartbeat(agent);
  const HeartbeatRequest beat = fake_.heartbeat.requests().back();
  ASSERT_EQ(beat.trainers_size(), 1);
  EXPECT_EQ(beat.trainers(0).slot(), 1);
  EXPECT_EQ(beat.trainers(0).job(), "job-a");
  ASSERT_EQ(beat.running_size(), 1);
  EXPECT_EQ(beat.running(0).node(), "node-a");
}

TEST_F(AgentTest, TrainersGetTheMemoryLimit) {
  AgentOptions o = Options();
  EXPECT_EQ(o.trainer_memory_limit_bytes, 0) << "none unless asked for";
  o.trainer_memory_limit_bytes = int64_t{180} << 20;
  Agent agent(o);
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a"), Start(1, "job-a")}));
  StepOn(agent);
  ASSERT_EQ(launcher_.launched.size(), 2u);
  for (const LaunchSpec& spec : launcher_.launched) {
    EXPECT_EQ(spec.memory_limit_bytes, int64_t{180} << 20);
  }
  EXPECT_TRUE(Logged("memory limit 180 MiB"));
  o.trainer_memory_limit_bytes = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(Agent(o).Connect()));
}

TEST_F(AgentTest, AnExitIsReportedAtOnceWithTheTailOfItsLog) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")}));
  StepOn(agent);
  const std::string log_path = launcher_.launched.at(0).log_path;
  { std::ofstream(log_path) << std::string(5000, 'x') << "the last words\n"; }
  launcher_.Exit(1000, 3);
  StepOn(agent);  // no heartbeat due: the exit goes anyway
  ASSERT_EQ(fake_.trainer_exited.calls(), 1);
  const TrainerExitedRequest exited = fake_.trainer_exited.requests()[0];
  EXPECT_EQ(exited.node(), "node-a");
  EXPECT_EQ(exited.node_credential(), "cred-1");
  EXPECT_EQ(exited.slot(), 0);
  EXPECT_EQ(exited.job(), "job-a");
  EXPECT_EQ(exited.exit_code(), 3);
  EXPECT_FALSE(exited.stopped());
  EXPECT_EQ(exited.log_path(), log_path);
  EXPECT_EQ(exited.detail().size(), 2048u);
  EXPECT_TRUE(absl::EndsWith(exited.detail(), "the last words\n"));
  EXPECT_TRUE(Logged("trainer of job job-a on slot 0 exited with code 3"));
}

TEST_F(AgentTest, AnExitTheCoordinatorCannotTakeIsSentAgainInOrder) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a"), Start(1, "job-b")}));
  StepOn(agent);
  fake_.trainer_exited.Then(absl::UnavailableError("coordinator restarting"));
  launcher_.Exit(1000, 1);
  launcher_.Exit(1001, 2);
  StepOn(agent);
  ASSERT_EQ(fake_.trainer_exited.calls(), 1) << "the rest waits behind the first";
  StepOn(agent);
  const auto sent = fake_.trainer_exited.requests();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[1].job(), "job-a");
  EXPECT_EQ(sent[2].job(), "job-b");
  StepOn(agent);
  EXPECT_EQ(fake_.trainer_exited.calls(), 3) << "each reported once";
}

TEST_F(AgentTest, StopKillsTheTrainerAndItsExitIsReportedStopped) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")})).Then(Commands({Stop(0, "job-a")}));
  StepOn(agent);
  NextHeartbeat(agent);
  ASSERT_EQ(launcher_.signals.size(), 1u);
  EXPECT_EQ(launcher_.signals[0], std::make_pair(int64_t{1000}, SIGKILL));
  EXPECT_TRUE(Logged("stopping the trainer on slot 0: the job shrank"));
  launcher_.Exit(1000, -SIGKILL);
  StepOn(agent);
  ASSERT_EQ(fake_.trainer_exited.calls(), 1);
  EXPECT_TRUE(fake_.trainer_exited.requests()[0].stopped());
  EXPECT_EQ(fake_.trainer_exited.requests()[0].exit_code(), -SIGKILL);
  EXPECT_TRUE(Logged("killed by signal 9"));
}

TEST_F(AgentTest, AStartAfterAStopOfTheSameSlotRunsOnceTheOldTrainerIsGone) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a", 1)}))
      .Then(Commands({Stop(0, "job-a"), Start(0, "job-a", 2)}));
  StepOn(agent);
  NextHeartbeat(agent);
  EXPECT_EQ(launcher_.launched.size(), 1u) << "the slot is still taken";
  StepOn(agent);
  EXPECT_EQ(launcher_.launched.size(), 1u);
  launcher_.Exit(1000, -SIGKILL);
  StepOn(agent);
  ASSERT_EQ(launcher_.launched.size(), 2u);
  EXPECT_EQ(launcher_.launched[1].argv[3], "--epoch=2");
  // The old trainer's exit went first.
  ASSERT_EQ(fake_.trainer_exited.calls(), 1);
  EXPECT_EQ(fake_.trainer_exited.requests()[0].job(), "job-a");
}

TEST_F(AgentTest, AStartThatCannotRunIsReportedAsAnExit127) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  launcher_.fail_next = absl::InternalError("fork failed");
  fake_.heartbeat.Then(Commands({Start(1, "job-a"), Start(7, "job-b")}));
  StepOn(agent);
  const auto sent = fake_.trainer_exited.requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].job(), "job-a");
  EXPECT_EQ(sent[0].exit_code(), 127);
  EXPECT_TRUE(absl::StrContains(sent[0].detail(), "fork failed"));
  EXPECT_EQ(sent[1].slot(), 7);
  EXPECT_TRUE(absl::StrContains(sent[1].detail(), "slot 7 is not on this node"));
  EXPECT_TRUE(Logged("cannot start a trainer"));
}

TEST_F(AgentTest, ANodeTheCoordinatorForgotRegistersAgainAndKeepsItsTrainers) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")})).Then(absl::NotFoundError("no node"));
  StepOn(agent);
  NextHeartbeat(agent);
  EXPECT_EQ(fake_.register_node.calls(), 2);
  EXPECT_TRUE(launcher_.signals.empty());
  NextHeartbeat(agent);
  EXPECT_EQ(fake_.heartbeat.requests().back().trainers_size(), 1);
}

// The coordinator restarts while a trainer dies: the report fails while it is down, and by
// the time the heartbeat reaches it again the node must register anew; the exit goes out
// before that registration (after it the coordinator would blame no one for the death).
TEST_F(AgentTest, AnExitKeptWhileTheCoordinatorWasDownGoesBeforeRegisteringAgain) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")}));
  StepOn(agent);
  std::vector<std::string> order;
  fake_.trainer_exited.ThenCall([&](const TrainerExitedRequest&) -> absl::StatusOr<TrainerExitedResponse> {
    order.push_back("exit refused");
    return absl::UnavailableError("coordinator down");
  });
  fake_.trainer_exited.Otherwise([&](const TrainerExitedRequest& r) -> absl::StatusOr<TrainerExitedResponse> {
    order.push_back(absl::StrCat("exit of ", r.job()));
    return TrainerExitedResponse();
  });
  fake_.heartbeat.Then(absl::NotFoundError("no node"));
  fake_.register_node.Otherwise([&](const RegisterNodeRequest&) -> absl::StatusOr<RegisterNodeResponse> {
    order.push_back("register");
    RegisterNodeResponse registered;
    registered.set_heartbeat_interval_s(2);
    registered.set_node_credential("cred-2");
    return registered;
  });
  launcher_.Exit(1000, -SIGKILL);
  NextHeartbeat(agent);
  EXPECT_EQ(order, (std::vector<std::string>{"exit refused", "exit of job-a", "register"}));
}

TEST_F(AgentTest, AHeartbeatThatFailsIsTriedAgainAtTheNextInterval) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(absl::UnavailableError("down")).Then(Commands({Start(0, "job-a")}));
  StepOn(agent);
  EXPECT_TRUE(launcher_.launched.empty());
  NextHeartbeat(agent);
  EXPECT_EQ(launcher_.launched.size(), 1u);
}

TEST_F(AgentTest, DrainTellsTheCoordinatorTerminatesTheTrainersAndEndsWhenTheyAreGone) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")})).Then(Commands({Start(1, "job-b")}));
  StepOn(agent);
  drain_ = true;
  clock_.Advance(absl::Seconds(2));
  StepOn(agent);
  ASSERT_EQ(fake_.drain_node.calls(), 1);
  EXPECT_EQ(fake_.drain_node.requests()[0].node_credential(), "cred-1");
  EXPECT_FALSE(fake_.drain_node.requests()[0].preemption_notice());
  ASSERT_EQ(launcher_.signals.size(), 1u);
  EXPECT_EQ(launcher_.signals[0], std::make_pair(int64_t{1000}, SIGTERM));
  EXPECT_EQ(launcher_.launched.size(), 1u) << "a draining node takes no work";
  launcher_.Exit(1000, 0);
  absl::StatusOr<bool> done = agent.Step();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(fake_.trainer_exited.calls(), 1) << "its exit was reported before leaving";
  EXPECT_TRUE(Logged("drained: every trainer has exited"));
}

TEST_F(AgentTest, DrainKillsWhatIsLeftAfterTheGrace) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a")}));
  StepOn(agent);
  drain_ = true;
  StepOn(agent);
  clock_.Advance(absl::Seconds(59));
  StepOn(agent);
  EXPECT_EQ(launcher_.signals.size(), 1u);
  clock_.Advance(absl::Seconds(1));
  StepOn(agent);
  ASSERT_EQ(launcher_.signals.size(), 2u);
  EXPECT_EQ(launcher_.signals[1], std::make_pair(int64_t{1000}, SIGKILL));
}

TEST_F(AgentTest, APreemptionNoticeDrains) {
  AgentOptions o = Options();
  o.preemption_notice_file = work_dir_ + "/notice";
  Agent agent(o);
  ASSERT_TRUE(agent.Connect().ok());
  StepOn(agent);
  EXPECT_EQ(fake_.drain_node.calls(), 0);
  { std::ofstream(o.preemption_notice_file) << "spot\n"; }
  absl::StatusOr<bool> done = agent.Step();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done) << "nothing runs: drained at once";
  ASSERT_EQ(fake_.drain_node.calls(), 1);
  // The coordinator counts it in the cluster's preemption rate.
  EXPECT_TRUE(fake_.drain_node.requests()[0].preemption_notice());
}

TEST_F(AgentTest, StopKillsEveryTrainerAndLeavesOnceTheyAreReaped) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  fake_.heartbeat.Then(Commands({Start(0, "job-a"), Start(1, "job-b")}));
  StepOn(agent);
  stop_ = true;
  StepOn(agent);
  EXPECT_EQ(launcher_.signals.size(), 2u);
  launcher_.Exit(1000, -SIGKILL);
  StepOn(agent);
  launcher_.Exit(1001, -SIGKILL);
  absl::StatusOr<bool> done = agent.Step();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(fake_.trainer_exited.calls(), 0) << "a stop reports nothing more";
  EXPECT_EQ(fake_.heartbeat.calls(), 1);
}

TEST_F(AgentTest, ADeletedJobsFilesGoOnceItsTrainersAreGone) {
  Agent agent(Options());
  ASSERT_TRUE(agent.Connect().ok());
  AgentCommand forget;
  forget.mutable_forget()->set_job("job-a");
  fake_.heartbeat.Then(Commands({Start(0, "job-a")})).Then(Commands({forget}));
  StepOn(agent);
  NextHeartbeat(agent);
  EXPECT_TRUE(std::filesystem::exists(work_dir_ + "/job-a/spec.yaml")) << "still running";
  launcher_.Exit(1000, 0);
  StepOn(agent);
  EXPECT_FALSE(std::filesystem::exists(work_dir_ + "/job-a"));
  EXPECT_TRUE(std::filesystem::exists(work_dir_ + "/node.credential"));
  EXPECT_TRUE(Logged("job job-a was deleted: removed its files"));
}

TEST_F(AgentTest, TheDestructorKillsAndReapsTheTrainersLeft) {
  {
    Agent agent(Options());
    ASSERT_TRUE(agent.Connect().ok());
    fake_.heartbeat.Then(Commands({Start(0, "job-a")}));
    StepOn(agent);
  }
  ASSERT_EQ(launcher_.signals.size(), 1u);
  EXPECT_EQ(launcher_.signals[0].second, SIGKILL);
  EXPECT_TRUE(launcher_.running.empty());
}

// Issue 36: SIGTERM while the coordinator cannot be reached. The agent says why it cannot
// register, and leaves at the first SIGTERM (a drain: nothing runs yet, nothing to drain)
// instead of retrying on.
TEST_F(AgentTest, ADrainBeforeRegisteringEndsTheRetriesAtOnceSayingWhy) {
  FakeCoordinator away;
  away.register_node.Always(absl::UnavailableError(
      "the coordinator at coord:7070 cannot be reached: Connection refused"));
  AgentOptions o = Options();
  o.client = &away;
  Agent agent(o);
  absl::Status connected = absl::UnknownError("Connect did not return");
  std::atomic<bool> done{false};
  std::thread connecting([&] {
    connected = agent.Connect();
    done = true;
  });
  // Moves the agent's clock on while it waits, until `until` or 30 s of real time.
  auto run_until = [&](const std::function<bool()>& until) {
    for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
         !until() && absl::Now() < give_up;) {
      if (clock_.sleepers() > 0) clock_.Advance(absl::Milliseconds(10));
      std::this_thread::yield();
    }
  };
  // Two attempts (retried on the agent's clock), then the SIGTERM.
  run_until([&] { return away.register_node.calls() >= 2; });
  ASSERT_GE(away.register_node.calls(), 2);
  const int calls_before = away.register_node.calls();
  drain_ = true;
  run_until([&] { return done.load(); });
  const bool left = done;
  const int calls = away.register_node.calls();
  if (!left) {
    stop_ = true;  // the agent before the fix: end it, so the test fails instead of hanging
    run_until([&] { return done.load(); });
  }
  connecting.join();
  EXPECT_TRUE(left) << "still retrying 30 s after the SIGTERM";
  EXPECT_TRUE(absl::IsCancelled(connected)) << connected;
  EXPECT_TRUE(absl::StrContains(connected.message(), "asked to drain")) << connected;
  EXPECT_TRUE(absl::StrContains(connected.message(), "Connection refused")) << connected;
  EXPECT_LE(calls, calls_before + 1) << "it kept retrying after the SIGTERM";
  EXPECT_TRUE(Logged("cannot register node node-a with the coordinator at coord:7070: "
                     "the coordinator at coord:7070 cannot be reached: Connection refused"));
}

TEST_F(AgentTest, TwoAgentsCannotShareAWorkDirectory) {
  Agent first(Options());
  ASSERT_TRUE(first.Connect().ok());
  absl::Status second = Agent(Options()).Connect();
  EXPECT_TRUE(absl::IsFailedPrecondition(second)) << second;
  EXPECT_TRUE(absl::StrContains(second.message(), absl::StrCat("(pid ", getpid(), ")")))
      << second;
  EXPECT_TRUE(absl::StrContains(second.message(), "--work_dir")) << second;
  EXPECT_EQ(fake_.register_node.calls(), 1) << "the second one registered";
}

// Issue 36, point 15: an agent restarted on the same work directory (its predecessor was
// killed -9) finds the trainer that one left running, ends it before it registers, and
// reports it gone. The trainer is a real process (a child of the test, reaped here).
TEST_F(AgentTest, ARestartedAgentEndsTheTrainersItsPredecessorLeftAndReportsThem) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t left = fork();
  ASSERT_GE(left, 0);
  if (left == 0) {
    setpgid(0, 0);
    dup2(ready[1], 3);
    execl("/bin/sh", "sh", "-c", "echo >&3; exec sleep 600", nullptr);
    _exit(127);
  }
  setpgid(left, left);
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  const std::string records = work_dir_ + "/@trainers";
  ASSERT_TRUE(RecordTrainer(records, 1, left, 4, "job-a").ok());
  // And one that died with the earlier agent: its record is all that is left of it.
  const pid_t died = fork();
  ASSERT_GE(died, 0);
  if (died == 0) {
    pause();
    _exit(0);
  }
  ASSERT_TRUE(RecordTrainer(records, 0, died, 3, "job-b").ok());
  kill(died, SIGKILL);
  ASSERT_EQ(waitpid(died, nullptr, 0), died);

  AgentOptions o = Options();
  o.trainer_records_dir = records;
  o.end_leftovers = {.term_grace = absl::Seconds(20), .kill_wait = absl::Seconds(5)};
  Agent agent(o);
  fake_.register_node.ThenCall([&](const RegisterNodeRequest&) {
    // Ended before the node registers: the coordinator never sees it with the new agent.
    int status = 0;
    EXPECT_EQ(waitpid(left, &status, WNOHANG), left) << "still running at registration";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
    RegisterNodeResponse r;
    r.set_heartbeat_interval_s(2);
    r.set_node_credential("cred-1");
    return r;
  });
  ASSERT_TRUE(agent.Connect().ok());
  if (waitpid(left, nullptr, WNOHANG) == 0) {
    kill(-left, SIGKILL);
    waitpid(left, nullptr, 0);
    FAIL() << "the trainer left running was not ended";
  }
  EXPECT_TRUE(ReadTrainerRecords(records).empty());
  EXPECT_TRUE(Logged(absl::StrCat("ended the trainer of job job-a epoch 4 on slot 1 (pid ", left,
                                  "), left running by an earlier agent of this node, with "
                                  "SIGTERM")));
  StepOn(agent);
  ASSERT_EQ(fake_.trainer_exited.calls(), 2);
  const TrainerExitedRequest gone = fake_.trainer_exited.requests()[0];
  EXPECT_EQ(gone.slot(), 0);
  EXPECT_EQ(gone.job(), "job-b");
  EXPECT_EQ(gone.start_epoch(), 3);
  EXPECT_EQ(gone.exit_code(), -SIGKILL);
  EXPECT_TRUE(absl::StrContains(gone.detail(), "died with the earlier agent")) << gone.detail();
  const TrainerExitedRequest exited = fake_.trainer_exited.requests()[1];
  EXPECT_EQ(exited.slot(), 1);
  EXPECT_EQ(exited.job(), "job-a");
  EXPECT_EQ(exited.start_epoch(), 4);
  EXPECT_EQ(exited.exit_code(), -SIGTERM);
  EXPECT_FALSE(exited.stopped());
  EXPECT_EQ(exited.node_credential(), "cred-1");
  EXPECT_TRUE(absl::StrContains(exited.detail(), "left running by an earlier agent"))
      << exited.detail();
}

// The records a restarted agent reads: written when a trainer starts (a real process here),
// removed when it is gone.
TEST_F(AgentTest, EachRunningTrainerIsRecordedUntilItIsGone) {
  const std::string trainer = work_dir_ + "-trainer.sh";
  {
    std::ofstream(trainer) << "#!/bin/sh\nexec sleep 600\n";
  }
  ASSERT_EQ(chmod(trainer.c_str(), 0755), 0);
  AgentOptions o = Options();
  o.trainer_records_dir = work_dir_ + "/@trainers";
  o.trainer_binary = trainer;
  o.launcher = nullptr;  // real processes
  {
    Agent agent(o);
    ASSERT_TRUE(agent.Connect().ok());
    fake_.heartbeat.Then(Commands({Start(1, "job-a", 3)}));
    StepOn(agent);
    const std::vector<TrainerRecord> records = ReadTrainerRecords(o.trainer_records_dir);
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].slot, 1);
    EXPECT_EQ(records[0].job, "job-a");
    EXPECT_EQ(records[0].epoch, 3);
    auto start = ProcessStartTime(records[0].pid);
    EXPECT_TRUE(start.ok()) << "the record names no running process: " << start.status();
  }
  EXPECT_TRUE(ReadTrainerRecords(o.trainer_records_dir).empty());
}

// Issue 36: a failure the agent's diagnosis finds a person must fix (ringworker's: the
// coordinator asks for a client certificate the agent lacks) ends the retries with it.
TEST_F(AgentTest, AnUnreachableCoordinatorThatNeedsAPersonEndsTheRetries) {
  FakeCoordinator away;
  away.register_node.Always(absl::UnavailableError("failed to connect: Socket closed"));
  AgentOptions o = Options();
  o.client = &away;
  absl::Status diagnosed;
  o.diagnose_unreachable = [&](const absl::Status& failure) {
    diagnosed = failure;
    return absl::FailedPreconditionError("it asks for a client certificate");
  };
  absl::Status s = Agent(o).Connect();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(s.message(), "it asks for a client certificate");
  EXPECT_TRUE(absl::StrContains(diagnosed.message(), "Socket closed")) << diagnosed;
  EXPECT_EQ(away.register_node.calls(), 1);
}

}  // namespace
}  // namespace ringmaster::worker
