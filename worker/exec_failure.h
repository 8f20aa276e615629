// A child forked to run a command job's program (or its preloaded interpreter): how it is
// set up, how it tells its parent that it never became that program, and the error the
// parent makes of it.
//
//   int fds[2]; pipe2(fds, O_CLOEXEC);
//   fork(); in the child:  PrepareForkedChild(parent);
//                          if (chdir(workdir) != 0) ExitWithExecFailure(fds[1], ExecStage::kChdir);
//                          execvp(...); ExitWithExecFailure(fds[1], ExecStage::kExec);
//   in the parent:         close(fds[1]); RM_RETURN_IF_ERROR(AwaitExec(fds[0], pid, ...));
//
// The pipe is close-on-exec: a successful exec closes the child's end and the parent reads
// end-of-file; a failure sends {stage, errno} first.
#ifndef RINGMASTER_WORKER_EXEC_FAILURE_H_
#define RINGMASTER_WORKER_EXEC_FAILURE_H_

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::worker {

// In the forked child, first (`parent`: the forking process's pid, taken before the fork):
// a process group of its own (a signal to -pid reaches the program's own children too),
// SIGKILL when the parent dies (exits with code 127 at once if it already has), no blocked
// signals, SIGTERM and SIGUSR1 back to their defaults. Async-signal-safe.
void PrepareForkedChild(pid_t parent);

// Where the child failed.
enum class ExecStage : int { kChdir = 0, kExec = 1 };

// In the forked child, right after the failed chdir or exec (it reads errno): writes
// {stage, errno} to `fd` and exits with code 127. Async-signal-safe.
[[noreturn]] void ExitWithExecFailure(int fd, ExecStage stage);

// In the parent, once it has closed its copy of the pipe's write end: blocks until the
// child's exec closes `fd`'s other end (OK) or the child's failure arrives, then closes `fd`.
// On a failure the child is reaped and the error is FAILED_PRECONDITION marked permanent
// (MarkPermanent), naming command.workdir or command.argv[0] (`argv0`, whether it was looked
// up in PATH), the node and slot, and what to fix.
absl::Status AwaitExec(int fd, pid_t pid, absl::string_view argv0, absl::string_view workdir,
                       const ringmaster::SlotRef& slot);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_EXEC_FAILURE_H_
