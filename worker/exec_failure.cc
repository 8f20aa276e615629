#include "worker/exec_failure.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster::worker {

void PrepareForkedChild(pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGTERM, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
}

void ExitWithExecFailure(int fd, ExecStage stage) {
  const int err[2] = {static_cast<int>(stage), errno};
  (void)!write(fd, err, sizeof(err));
  _exit(127);
}

absl::Status AwaitExec(int fd, pid_t pid, absl::string_view argv0, absl::string_view workdir,
                       const ringmaster::SlotRef& slot) {
  int err[2] = {0, 0};
  ssize_t n;
  do {
    n = read(fd, err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n != static_cast<ssize_t>(sizeof(err))) return absl::OkStatus();
  waitpid(pid, nullptr, 0);
  const std::string where = absl::StrCat(" on node ", slot.node(), " (slot ", slot.slot(), ")");
  if (err[0] == static_cast<int>(ExecStage::kChdir)) {
    return MarkPermanent(absl::FailedPreconditionError(
        absl::StrCat("command.workdir ", workdir, " cannot be entered", where, ": ",
                     strerror(err[1]), "; it must exist on every node")));
  }
  return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
      "command.argv[0] ", argv0, " cannot be run", where, ": ", strerror(err[1]),
      argv0.find('/') == absl::string_view::npos ? " (looked up in PATH)" : "",
      "; install it there or fix command.argv")));
}

}  // namespace ringmaster::worker
