// A warm Python interpreter for a command job's rank (command.preload): started once, it
// imports the program's heavy modules (torch, ...) and then forks the program for every
// membership epoch, so a restarted rank does not pay for `import torch` again.
//
//   zygote = Zygote::Start({argv, preload, first epoch's env, workdir, slot})
//   per epoch: pid = zygote->Spawn(env, workdir, {0, out, err})   // the program runs
//   waitpid(pid) / kill(-pid, SIGTERM) as for a program this process fork/exec'd
//
// Only for argv of the form [PYTHON, SCRIPT, ARGS...] (IsPythonScriptCommand). The program
// then runs as `PYTHON SCRIPT ARGS` would, with these differences (documented in the README):
// its modules in `preload` were imported once, before the first epoch, in the first epoch's
// environment and workdir (what they read at import, e.g. OpenMP's OMP_NUM_THREADS, keeps the
// first epoch's value); the script runs through runpy.run_path(SCRIPT, run_name="__main__")
// (a traceback shows runpy's frames above the script's); the interpreter's options are
// argv[0]'s defaults (no -X, -u: use PYTHONUNBUFFERED and friends in command.env).
//
// How the program becomes this process's child: this process is made a child subreaper
// (PR_SET_CHILD_SUBREAPER); the zygote forks a helper that forks the program, puts it in a
// process group of its own and exits, so the program is reparented to this process (waitpid
// works, its exit status is its own), and only then sets its parent-death signal (SIGKILL),
// takes its stdin/stdout/stderr (passed with SCM_RIGHTS), environment, workdir and sys.argv.
// An orphan of the program's own children is reparented here too and stays a zombie until
// this process exits.
//
// Not thread-safe.
#ifndef RINGMASTER_WORKER_ZYGOTE_H_
#define RINGMASTER_WORKER_ZYGOTE_H_

#include <sys/types.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::worker {

// argv is [PYTHON, SCRIPT, ARGS...]: PYTHON's file name is python, python3 or python3.11
// (with or without a directory) and SCRIPT does not start with '-' (not -m, -c, -u, ...).
bool IsPythonScriptCommand(const std::vector<std::string>& argv);

// The Python source the zygote runs (python -c), for tests and the README.
const char* ZygoteSource();

// Whether `host`:`port` accepts a TCP connection before `deadline`, tried every 5 ms (each
// connection closed at once). A rank other than 0 waits so for rank 0's program to host the
// torch.distributed store at MASTER_PORT before its program starts: a warm program reaches
// init_process_group within milliseconds, and torch's store client that finds no listener
// sleeps a whole second before it tries again.
bool WaitForListener(const std::string& host, int port, absl::Time deadline);

struct ZygoteOptions {
  // [PYTHON, SCRIPT, ARGS...] (IsPythonScriptCommand).
  std::vector<std::string> argv;
  // Modules to import before the first fork (command.preload), e.g. {"torch"}.
  std::vector<std::string> preload;
  // The zygote's environment ("NAME=value") and workdir (empty: this process's).
  std::vector<std::string> env;
  std::string workdir;
  // Named in errors.
  ringmaster::SlotRef slot;
  // How long a Spawn waits for the zygote's answer (the first includes the preload).
  absl::Duration reply_timeout = absl::Minutes(5);
};

class Zygote {
 public:
  // Starts the interpreter (it begins importing at once). A PYTHON that cannot be run, or a
  // workdir that cannot be entered: FAILED_PRECONDITION marked permanent (MarkPermanent),
  // naming the node and path, as a program's would be.
  static absl::StatusOr<std::unique_ptr<Zygote>> Start(const ZygoteOptions& options);
  ~Zygote();  // closes its socket (it exits), SIGKILL, reaps it
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Forks the program from the warm interpreter with this environment, workdir (empty: the
  // zygote's) and stdin/stdout/stderr (not taken: the caller closes its own). Returns its
  // pid, this process's child, leader of its own process group. UNAVAILABLE when the zygote
  // is gone (a preload that raised: its traceback is on the zygote's stderr) or did not
  // answer within reply_timeout; the zygote is then of no further use.
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& env, const std::string& workdir,
                              const std::array<int, 3>& stdio);

  // Waits until the preload is done (Spawn waits for it too). UNAVAILABLE as Spawn.
  absl::Status WaitReady();

  pid_t pid() const { return pid_; }

 private:
  Zygote(const ZygoteOptions& options, pid_t pid, int socket)
      : options_(options), pid_(pid), socket_(socket) {}
  absl::Status Gone(const std::string& what);
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);

  ZygoteOptions options_;
  pid_t pid_ = -1;
  int socket_ = -1;
  bool ready_ = false;  // its "ready" was read
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_ZYGOTE_H_
