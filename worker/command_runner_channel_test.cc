// The command runner and its program's channel (worker/program_channel.h) with real programs:
// a Python program that imports the ringmaster module (python/ringmaster) reports steps, which
// reach the coordinator as RankStats and rank 0's metrics.jsonl; it learns of a stop; frozen
// (SIGSTOP), it gets no keep-alive, and SIGCONT lets it handle its SIGTERM.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/command_runner.h"
#include "worker/command_runner_test_util.h"

namespace ringmaster::worker {
namespace {

using testing::AtEpoch;
using testing::EnvMap;
using testing::Joined;

TEST(BuildCommandEnvChannelTest, TheSocketAndTheModulesPathPrependedToPythonpath) {
  CommandEnvInput in;
  in.base_env = {"PYTHONPATH=/inherited", "PATH=/bin"};
  in.control_socket = "/run/x/control.sock";
  in.python_path = "/opt/ringmaster/python";
  std::map<std::string, std::string> env = EnvMap(BuildCommandEnv(in));
  EXPECT_EQ(env["RINGMASTER_CONTROL_SOCKET"], "/run/x/control.sock");
  EXPECT_EQ(env["PYTHONPATH"], "/opt/ringmaster/python:/inherited");

  in.user_env["PYTHONPATH"] = "/users";  // command.env's wins over the inherited one
  EXPECT_EQ(EnvMap(BuildCommandEnv(in))["PYTHONPATH"], "/opt/ringmaster/python:/users");

  in.base_env = {"PATH=/bin"};
  in.user_env.clear();
  EXPECT_EQ(EnvMap(BuildCommandEnv(in))["PYTHONPATH"], "/opt/ringmaster/python");

  in.control_socket.clear();
  in.python_path.clear();
  env = EnvMap(BuildCommandEnv(in));
  EXPECT_EQ(env.count("RINGMASTER_CONTROL_SOCKET"), 0u);
  EXPECT_EQ(env.count("PYTHONPATH"), 0u);
}

class ChannelRunTest : public testing::RunCommandJobFixture {
 protected:
  ChannelRunTest() : RunCommandJobFixture("command_runner_channel_test") {}

  // /usr/bin/python3 running `code`, with the module from this test's runfiles; a stop grace
  // of 20 s and heartbeats 0.8 s old taken for a frozen program.
  CommandRunnerOptions Python(const std::string& code) {
    Write("prog.py", code);
    CommandRunnerOptions o = Options({"/usr/bin/python3", "prog.py"});
    o.spec.mutable_command()->set_stop_grace_s(20);
    o.heartbeat_timeout = absl::Milliseconds(800);
    o.python_module_dir = absl::StrCat(getenv("TEST_SRCDIR"), "/ringmaster/python");
    return o;
  }
};

TEST_F(ChannelRunTest, ReportsReachTheCoordinatorAndRankZerosMetricsFile) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Python(R"(
import time, ringmaster
for step in range(1, 31):
    time.sleep(0.02)
    ringmaster.report(step, loss=1.0 / step, samples=8, lr=0.5, accuracy=0.25)
)");
  o.spec.mutable_metrics()->set_jsonl(dir_ + "/metrics/m.jsonl");
  o.spec.mutable_metrics()->set_run("run-1");
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t last = -1;
  for (const ProgressRequest& p : fake_.progress.requests()) {
    if (p.stats().step() < 0) continue;  // a keep-alive before the program connected
    EXPECT_GT(p.stats().step(), last);
    last = p.stats().step();
    EXPECT_DOUBLE_EQ(p.stats().loss(), 1.0 / p.stats().step());
    EXPECT_DOUBLE_EQ(p.stats().lr(), 0.5);
    if (p.stats().step() > 5) {
      EXPECT_GT(p.stats().step_time_s(), 0.01);
      EXPECT_GT(p.stats().samples_per_s(), 0);
      EXPECT_GT(p.stats().steps_per_s(), 0);
    }
  }
  EXPECT_GT(last, 0) << "no report reached the coordinator";
  ASSERT_EQ(fake_.finished.calls(), 1);
  const FinishedRequest finished = fake_.finished.requests()[0];
  EXPECT_EQ(finished.stats().step(), 30);  // the last report, though the program had ended
  EXPECT_DOUBLE_EQ(finished.stats().loss(), 1.0 / 30);
  std::istringstream lines(Read("metrics/m.jsonl"));
  std::vector<int> steps;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    steps.push_back(record["step"].get<int>());
    EXPECT_EQ(record["run"], "run-1");
    EXPECT_EQ(record["scalars"]["accuracy"], 0.25);
  }
  EXPECT_EQ(steps, (std::vector<int>{1, 11, 21}));
}

TEST_F(ChannelRunTest, ANewEpochSendsTheStopThatTheProgramSees) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  const std::string reported = dir_ + "/reported";
  fake_.progress.Otherwise([reported](const ProgressRequest& p) {
    return AtEpoch(p.epoch() == 1 && access(reported.c_str(), F_OK) == 0 ? 2 : p.epoch());
  });
  CommandRunnerOptions o = Python(R"(
import os, time, ringmaster
if os.environ["RINGMASTER_EPOCH"] == "1":
    step = 0
    while not ringmaster.stop_requested():
        step += 1
        ringmaster.report(step)
        if step == 3:
            open("reported", "w").close()
        time.sleep(0.02)
    open("stopped", "w").write(ringmaster.stop_reason())
)");
  const absl::Time start = absl::Now();
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epochs, 2);
  EXPECT_EQ(Read("stopped"), "epoch");  // the channel's message came before the SIGTERM
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));  // it exited by itself, not at the grace
}

TEST_F(ChannelRunTest, AFrozenProgramGetsNoKeepAliveAndSigcontLetsItStop) {
  fake_.join.Then(Joined(1));
  std::atomic<bool> leave{false};
  CommandRunnerOptions o = Python(R"(
import os, time, ringmaster
ringmaster.report(1)
open("pid", "w").write(str(os.getpid()))
while not ringmaster.stop_requested():
    time.sleep(0.01)
open("stopped", "w").write(ringmaster.stop_reason())
)");
  o.leave_requested = &leave;
  std::atomic<int> calls_when_frozen{-1}, calls_later{-1};
  std::thread freezer([&] {
    for (int i = 0; i < 400 && !Exists("pid"); ++i) absl::SleepFor(absl::Milliseconds(25));
    absl::SleepFor(absl::Milliseconds(300));  // its keep-alives flow meanwhile
    const pid_t pid = std::stoi(Read("pid"));
    kill(pid, SIGSTOP);
    // Keep-alives go until its heartbeat is heartbeat_timeout (0.8 s) old, then none.
    absl::SleepFor(absl::Milliseconds(1300));
    calls_when_frozen = fake_.progress.calls();
    absl::SleepFor(absl::Milliseconds(1500));
    calls_later = fake_.progress.calls();
    leave = true;  // the runner stops it: stop message, SIGTERM, SIGCONT
  });
  const absl::Time start = absl::Now();
  auto r = RunCommandJob(o);
  freezer.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->left);
  EXPECT_GT(calls_when_frozen, 5);
  EXPECT_EQ(calls_later, calls_when_frozen) << "keep-alives went on for a frozen program";
  // Stopped (SIGSTOP) it could handle neither; SIGCONT let it see the stop, well within the
  // 20 s grace (the SIGTERM or the stop message first: both come when it runs again).
  EXPECT_THAT(Read("stopped"), ::testing::AnyOf("drain", "sigterm"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST_F(ChannelRunTest, AProgramThatNeverConnectsKeepsItsKeepAlives) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Python("import time\ntime.sleep(1.5)\n");
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<ProgressRequest> calls = fake_.progress.requests();
  EXPECT_GT(calls.size(), 10u);  // every 50 ms for 1.5 s (and python's start)
  for (const ProgressRequest& p : calls) EXPECT_EQ(p.stats().step(), -1);
  EXPECT_EQ(fake_.finished.requests()[0].stats().step(), -1);  // no step to record
}

// A job directory deeper than a socket address holds (a test's TMPDIR): the socket is made
// there all the same, and the module reaches it.
TEST_F(ChannelRunTest, ASocketPathTooLongForASocketAddressWorks) {
  fake_.join.Then(Joined(1));
  const std::string deep = dir_ + "/" + std::string(100, 'd');
  std::filesystem::create_directories(deep);
  CommandRunnerOptions o = Python(R"(
import os, ringmaster
ringmaster.report(7)
open("socket", "w").write(os.environ["RINGMASTER_CONTROL_SOCKET"])
)");
  o.error_file_dir = deep;
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Read("socket"), deep + "/control-n1-0.sock");
  EXPECT_EQ(fake_.finished.requests()[0].stats().step(), 7);
  EXPECT_FALSE(std::filesystem::exists(deep + "/control-n1-0.sock"));  // gone with the epoch
}

}  // namespace
}  // namespace ringmaster::worker
