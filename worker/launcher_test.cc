#include "worker/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR")) + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ProcessLauncherTest, RunsTheProgramWithItsOutputAppendedToTheLog) {
  ProcessLauncher launcher;
  const std::string log = TempPath("append.log");
  { std::ofstream(log) << "before\n"; }
  auto pid = launcher.Launch({{"/bin/sh", "-c", "echo out; echo err >&2"}, log});
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(launcher.Wait(*pid), 0);
  EXPECT_TRUE(launcher.Reap().empty()) << "Wait reaped it";
  EXPECT_EQ(ReadAll(log), "before\nout\nerr\n");
}

TEST(ProcessLauncherTest, ExitCodesAndSignals) {
  ProcessLauncher launcher;
  auto exits_3 = launcher.Launch({{"/bin/sh", "-c", "exit 3"}, TempPath("a.log")});
  ASSERT_TRUE(exits_3.ok());
  EXPECT_EQ(launcher.Wait(*exits_3), 3);
  // A process group of its own: the signal to the group reaches the shell's child too,
  // whose output would otherwise come after the kill.
  const std::string log = TempPath("b.log");
  auto group = launcher.Launch({{"/bin/sh", "-c", "sleep 60; echo late"}, log});
  ASSERT_TRUE(group.ok());
  launcher.Signal(*group, SIGKILL);
  EXPECT_EQ(launcher.Wait(*group), -SIGKILL);
  EXPECT_EQ(ReadAll(log), "");
}

TEST(ProcessLauncherTest, ReapReportsEachExitOnce) {
  ProcessLauncher launcher;
  auto pid = launcher.Launch({{"/bin/sh", "-c", "exit 5"}, TempPath("r.log")});
  ASSERT_TRUE(pid.ok());
  // Reap does not block: poll it until the exit shows, within a deadline.
  std::vector<ProcessExit> exits;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       exits.empty() && absl::Now() < give_up;) {
    exits = launcher.Reap();
    if (exits.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].pid, *pid);
  EXPECT_EQ(exits[0].exit_code, 5);
  EXPECT_TRUE(launcher.Reap().empty());
}

TEST(ProcessLauncherTest, AProgramThatCannotRunExits127) {
  ProcessLauncher launcher;
  auto pid = launcher.Launch({{"/nonexistent/trainer"}, TempPath("c.log")});
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(launcher.Wait(*pid), 127);
}

// `ulimit -d` and `ulimit -H -d` as the child sees them: the soft and hard RLIMIT_DATA in
// KiB, or "unlimited".
std::string ChildDataLimits(ProcessLauncher& launcher, int64_t memory_limit_bytes,
                            const std::string& log) {
  LaunchSpec spec{{"/bin/sh", "-c", "echo $(ulimit -S -d) $(ulimit -H -d)"}, log};
  spec.memory_limit_bytes = memory_limit_bytes;
  auto pid = launcher.Launch(spec);
  if (!pid.ok()) return pid.status().ToString();
  if (const int code = launcher.Wait(*pid); code != 0) return absl::StrCat("exit ", code);
  return ReadAll(log);
}

TEST(ProcessLauncherTest, TheMemoryLimitIsTheChildsDataLimit) {
  ProcessLauncher launcher;
  EXPECT_EQ(ChildDataLimits(launcher, int64_t{200} << 20, TempPath("limit.log")),
            "204800 204800\n");
}

TEST(ProcessLauncherTest, WithoutAMemoryLimitTheChildInheritsOurs) {
  ProcessLauncher launcher;
  struct rlimit ours;
  ASSERT_EQ(getrlimit(RLIMIT_DATA, &ours), 0);
  auto kib = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(v / 1024);
  };
  EXPECT_EQ(ChildDataLimits(launcher, 0, TempPath("nolimit.log")),
            absl::StrCat(kib(ours.rlim_cur), " ", kib(ours.rlim_max), "\n"));
}

TEST(ProcessLauncherTest, AMemoryLimitAboveOurHardLimitIsLoweredToIt) {
  // In a child of the test, so that the test's own limit stays as it was.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct rlimit hard = {int64_t{512} << 20, int64_t{512} << 20};
    if (setrlimit(RLIMIT_DATA, &hard) != 0) _exit(2);
    ProcessLauncher launcher;
    _exit(ChildDataLimits(launcher, int64_t{4} << 30, TempPath("lowered.log")) ==
                  "524288 524288\n"
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child saw: " << ReadAll(TempPath("lowered.log"));
}

// The launcher (an agent) is killed -9: the program it launched dies with it instead of
// running on unsupervised. The test adopts orphans (a child subreaper), so the program,
// once its launcher is gone, is reaped here and the way it died is seen.
TEST(ProcessLauncherTest, AProgramDoesNotOutliveItsLauncher) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string log = TempPath("orphan.log");
  int launched[2];
  ASSERT_EQ(pipe(launched), 0);
  const pid_t agent = fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    ProcessLauncher launcher;
    auto pid = launcher.Launch({{"/bin/sh", "-c", "echo started; exec sleep 600"}, log});
    const int64_t program = pid.ok() ? *pid : -1;
    (void)!write(launched[1], &program, sizeof(program));
    while (true) pause();  // until killed
  }
  int64_t program = -1;
  ASSERT_EQ(read(launched[0], &program, sizeof(program)), static_cast<ssize_t>(sizeof(program)));
  ASSERT_GT(program, 0);
  // Once it printed, it has exec'd: whatever the launcher set up before exec is in place.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       ReadAll(log).empty() && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(ReadAll(log), "started\n");
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(agent, &status, 0), agent);
  // Reparented here; it must die of SIGKILL within the deadline (without the parent-death
  // signal it sleeps on for 600 s).
  pid_t reaped = 0;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
       reaped == 0 && absl::Now() < give_up;) {
    reaped = waitpid(static_cast<pid_t>(program), &status, WNOHANG);
    if (reaped == 0) absl::SleepFor(absl::Milliseconds(2));
  }
  if (reaped == 0) {
    kill(static_cast<pid_t>(program), SIGKILL);
    waitpid(static_cast<pid_t>(program), &status, 0);
    FAIL() << "the program outlived its launcher by 10 s";
  }
  ASSERT_EQ(reaped, program);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
}

TEST(ProcessLauncherTest, AnUnopenableLogIsInternal) {
  ProcessLauncher launcher;
  auto pid = launcher.Launch({{"/bin/true"}, TempPath("no/such/dir/x.log")});
  EXPECT_TRUE(absl::IsInternal(pid.status())) << pid.status();
}

}  // namespace
}  // namespace ringmaster::worker
