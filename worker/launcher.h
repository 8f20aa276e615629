// Starting and watching the agent's trainer processes, as a seam: the agent (worker/agent.h)
// asks a Launcher; ProcessLauncher fork/execs, tests give a fake.
//
// Thread-safety: one thread (the agent's loop) calls it.
#ifndef RINGMASTER_WORKER_LAUNCHER_H_
#define RINGMASTER_WORKER_LAUNCHER_H_

#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster::worker {

struct LaunchSpec {
  std::vector<std::string> argv;  // argv[0]: the program's path
  std::string log_path;           // stdout and stderr are appended to it
  // When > 0, the most heap the program may have, bytes: its RLIMIT_DATA (soft and hard),
  // set in the child before exec. What malloc cannot get then fails cleanly (null, or
  // std::bad_alloc) instead of the kernel killing the process; thread stacks and mapped
  // files do not count against it (unlike RLIMIT_AS, which glibc's per-thread arenas fill
  // with reservations). A limit above the caller's own hard limit is lowered to it.
  int64_t memory_limit_bytes = 0;
  // The signal the program gets when the thread that launched it ends (its parent's death:
  // prctl PR_SET_PDEATHSIG, set in the child before exec, kept across exec), so that it
  // never outlives its launcher unsupervised; a launcher that died before the child set it
  // is seen at once (the child's parent is no longer the launcher) and the child exits 127
  // instead of running. Launch from a thread that lives as long as the programs should
  // (the agent's loop). 0: none.
  int parent_death_signal = SIGKILL;
};

struct ProcessExit {
  int64_t pid = 0;
  int exit_code = 0;  // a signal as its negative number
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts the program in a process group of its own. Returns its pid (which is also the
  // group's). INTERNAL when the log cannot be opened or the process cannot be made.
  virtual absl::StatusOr<int64_t> Launch(const LaunchSpec& spec) = 0;
  // Sends `signal` to the process group of `pid`.
  virtual void Signal(int64_t pid, int signal) = 0;
  // The processes that exited since the last call (reaped). Does not block.
  virtual std::vector<ProcessExit> Reap() = 0;
  // Blocks until `pid` has exited, reaps it, and returns its exit code (a signal as its
  // negative number).
  virtual int Wait(int64_t pid) = 0;
};

// fork/exec; the child's signal mask is cleared, its parent-death signal and memory limit
// set (a child that cannot set them writes why to its log and exits 127, as one that
// cannot exec). Reap() reaps every child of this process
// (waitpid(-1)): the agent's children are its trainers.
class ProcessLauncher final : public Launcher {
 public:
  absl::StatusOr<int64_t> Launch(const LaunchSpec& spec) override;
  void Signal(int64_t pid, int signal) override;
  std::vector<ProcessExit> Reap() override;
  int Wait(int64_t pid) override;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_LAUNCHER_H_
