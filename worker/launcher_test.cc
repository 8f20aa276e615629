#include "worker/launcher.h"

#include <signal.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

TEST(ProcessLauncherTest, AnUnopenableLogIsInternal) {
  ProcessLauncher launcher;
  auto pid = launcher.Launch({{"/bin/true"}, TempPath("no/such/dir/x.log")});
  EXPECT_TRUE(absl::IsInternal(pid.status())) << pid.status();
}

}  // namespace
}  // namespace ringmaster::worker
