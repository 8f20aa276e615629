#include "worker/exec_failure.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using ::testing::HasSubstr;

ringmaster::SlotRef Slot() {
  ringmaster::SlotRef s;
  s.set_node("n1");
  s.set_slot(2);
  return s;
}

// Forks a child that enters `workdir` and execs `argv0` (no arguments), as the runner does,
// and returns what its parent makes of it.
absl::Status ForkAndExec(const std::string& argv0, const std::string& workdir) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(workdir.c_str()) != 0) ExitWithExecFailure(fds[1], ExecStage::kChdir);
    char* const argv[] = {const_cast<char*>(argv0.c_str()), nullptr};
    execvp(argv[0], argv);
    ExitWithExecFailure(fds[1], ExecStage::kExec);
  }
  close(fds[1]);
  absl::Status status = AwaitExec(fds[0], pid, argv0, workdir, Slot());
  if (status.ok()) waitpid(pid, nullptr, 0);
  return status;
}

TEST(AwaitExecTest, AnExecThatHappensIsOk) { EXPECT_TRUE(ForkAndExec("true", "/").ok()); }

TEST(AwaitExecTest, AWorkdirThatCannotBeEnteredIsPermanentAndNamed) {
  const absl::Status s = ForkAndExec("true", "/nonexistent/dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsPermanent(s));
  EXPECT_EQ(s.message(),
            "command.workdir /nonexistent/dir cannot be entered on node n1 (slot 2): No such "
            "file or directory; it must exist on every node");
}

TEST(AwaitExecTest, AProgramThatCannotBeRunIsPermanentAndSaysWhereItWasLookedFor) {
  absl::Status s = ForkAndExec("no-such-program-for-exec-failure-test", "/");
  EXPECT_TRUE(IsPermanent(s));
  EXPECT_EQ(s.message(),
            "command.argv[0] no-such-program-for-exec-failure-test cannot be run on node n1 "
            "(slot 2): No such file or directory (looked up in PATH); install it there or fix "
            "command.argv");
  s = ForkAndExec("/nonexistent/prog", "/");
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/prog cannot be run on node n1 (slot 2): No "
                                     "such file or directory; install"));
}

// The child's exit code: 0 when it is a process group leader with no blocked signals and
// SIGTERM's default action, though its parent blocked and ignored SIGTERM before the fork.
int ExitCodeOfPreparedChild(pid_t parent_to_name) {
  sigset_t term, before;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, &before);
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGTERM, &ignore, &old_action);
  const pid_t parent = parent_to_name == 0 ? getpid() : parent_to_name;
  const pid_t pid = fork();
  if (pid == 0) {
    PrepareForkedChild(parent);
    sigset_t blocked;
    sigprocmask(SIG_SETMASK, nullptr, &blocked);
    struct sigaction action;
    sigaction(SIGTERM, nullptr, &action);
    const bool ok = getpgrp() == getpid() && !sigismember(&blocked, SIGTERM) &&
                    action.sa_handler == SIG_DFL;
    _exit(ok ? 0 : 1);
  }
  sigaction(SIGTERM, &old_action, nullptr);
  sigprocmask(SIG_SETMASK, &before, nullptr);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

TEST(PrepareForkedChildTest, ItsOwnGroupAndDefaultSignals) {
  EXPECT_EQ(ExitCodeOfPreparedChild(0), 0);
}

TEST(PrepareForkedChildTest, ExitsAtOnceWhenItsParentIsGone) {
  // A parent other than its own: as if the forking process had died before the child ran.
  EXPECT_EQ(ExitCodeOfPreparedChild(getpid() + 1000000), 127);
}

}  // namespace
}  // namespace ringmaster::worker
