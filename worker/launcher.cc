#include "worker/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ringmaster::worker {
namespace {

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : (WIFSIGNALED(status) ? -WTERMSIG(status) : -1);
}

}  // namespace

absl::StatusOr<int64_t> ProcessLauncher::Launch(const LaunchSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("no program to launch");
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Everything the child needs is prepared: after fork only async-signal-safe calls.
  struct rlimit data_limit = {};
  const bool limit_memory = spec.memory_limit_bytes > 0;
  if (limit_memory) {
    // At most the hard limit this process has: lowering is always allowed, raising is not.
    if (getrlimit(RLIMIT_DATA, &data_limit) != 0) data_limit.rlim_max = RLIM_INFINITY;
    const rlim_t want = static_cast<rlim_t>(spec.memory_limit_bytes);
    data_limit.rlim_cur = data_limit.rlim_max == RLIM_INFINITY
                              ? want
                              : std::min<rlim_t>(want, data_limit.rlim_max);
    data_limit.rlim_max = data_limit.rlim_cur;
  }
  const std::string limit_failed =
      absl::StrCat("cannot set the memory limit (RLIMIT_DATA) of ", spec.argv[0], " to ",
                   spec.memory_limit_bytes, " bytes\n");
  const std::string orphaned = absl::StrCat(
      "not starting ", spec.argv[0], ": its launcher (pid ", getpid(), ") exited first\n");
  const std::string no_death_signal =
      absl::StrCat("cannot set the parent-death signal of ", spec.argv[0], "\n");
  const pid_t launcher = getpid();
  const int log_fd = open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", spec.log_path));
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (spec.parent_death_signal != 0) {
      if (prctl(PR_SET_PDEATHSIG, spec.parent_death_signal) != 0) {
        (void)!write(STDERR_FILENO, no_death_signal.data(), no_death_signal.size());
        _exit(127);
      }
      // The launcher may have died between fork and prctl: the signal would never come.
      if (getppid() != launcher) {
        (void)!write(STDERR_FILENO, orphaned.data(), orphaned.size());
        _exit(127);
      }
    }
    if (limit_memory && setrlimit(RLIMIT_DATA, &data_limit) != 0) {
      (void)!write(STDERR_FILENO, limit_failed.data(), limit_failed.size());
      _exit(127);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  // Also here, so that the group exists when Launch returns (a signal to it at once must
  // not miss the child that has not run yet).
  setpgid(pid, pid);
  close(log_fd);
  return static_cast<int64_t>(pid);
}

void ProcessLauncher::Signal(int64_t pid, int signal) { kill(-static_cast<pid_t>(pid), signal); }

std::vector<ProcessExit> ProcessLauncher::Reap() {
  std::vector<ProcessExit> exits;
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return exits;
    exits.push_back({pid, ExitCode(status)});
  }
}

int ProcessLauncher::Wait(int64_t pid) {
  int status = 0;
  if (waitpid(static_cast<pid_t>(pid), &status, 0) != pid) return -1;
  return ExitCode(status);
}

}  // namespace ringmaster::worker
