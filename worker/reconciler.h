// The node agent's decisions (worker/agent.h), apart from its I/O: what the coordinator
// wants (the commands of its heartbeat answers) and what the agent observes (the trainers it
// started, their exits, the clock) in; the actions to carry out, in order, out. No I/O, no
// threads: the agent carries the actions out (a Launcher starts and signals processes, the
// client reports), and tests drive a Reconciler step by step.
//
// The rules:
//   - start: a slot of this node that runs nothing is started. A slot whose trainer was told
//     to stop and has not exited yet is started once that exit is seen, or refused after
//     `stop_wait`. A slot that runs a trainer of the same job started for an older epoch
//     has a stale trainer (the coordinator counted it gone: a partition cut the node off and
//     it came back): it is stopped, and the start waits for its exit the same way. Any other
//     slot that runs a trainer (not stopping) is refused; a slot not on this
//     node is refused. A draining node takes no start (ignored, not refused). A second start
//     for a slot still waiting replaces the first.
//   - stop (slot, job): the trainer of that job on that slot is killed (one of another job
//     is left alone); a start of that job still waiting for the slot is dropped and reported
//     as stopped, as if it had started and been killed at once.
//   - forget (job): the job's files go once none of its trainers runs (a start of the job
//     before then keeps them: its name is in use again).
//   - an exit: the trainer's slot is free; the exit is reported (stopped: the agent killed
//     it as the coordinator asked).
//
// Not thread-safe: one thread (the agent's loop) calls it.
#ifndef RINGMASTER_WORKER_RECONCILER_H_
#define RINGMASTER_WORKER_RECONCILER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::worker {

// Start a trainer as `command` says; then tell the reconciler Started() (or, when it
// cannot be started, report that as a RefuseStart).
struct StartTrainer {
  StartTrainerCommand command;
};
// Kill the trainer `pid` (its process group) on `slot`.
struct StopTrainer {
  int slot = 0;
  int64_t pid = 0;
  std::string job;
  std::string reason;
};
// A start that cannot be carried out: report it as an exit (code 127) with `why`.
struct RefuseStart {
  StartTrainerCommand command;
  absl::Status why;
};
// A trainer is gone: report its exit.
struct ReportExit {
  int slot = 0;
  std::string job;
  int exit_code = 0;  // a signal as its negative number
  bool stopped = false;
  int64_t start_epoch = 0;  // the epoch it was started for (0: it never started)
  std::string log_path;  // empty: it never ran (detail says why)
  std::string detail;
};
// Remove the files of a deleted job.
struct ForgetJob {
  std::string job;
};
using AgentAction = std::variant<StartTrainer, StopTrainer, RefuseStart, ReportExit, ForgetJob>;

class Reconciler {
 public:
  struct Options {
    int slots = 1;
    // How long a start waits for its slot's stopping trainer to exit.
    absl::Duration stop_wait = absl::Seconds(5);
  };
  struct Trainer {
    int64_t pid = 0;
    std::string job;
    int64_t epoch = 0;  // the epoch it was started for
    std::string log_path;
    bool stopping = false;  // told to stop (killed), not exited yet
  };

  explicit Reconciler(Options options) : options_(options) {}

  // One command of the coordinator, at `now`. Carry its actions out before the next.
  std::vector<AgentAction> Want(const AgentCommand& command, absl::Time now);
  // What was started for a StartTrainer.
  void Started(const StartTrainerCommand& command, int64_t pid, std::string log_path);
  // An exit the agent saw. Empty when `pid` is none of its trainers.
  std::vector<AgentAction> Exited(int64_t pid, int exit_code);
  // What time alone decides at `now`: waiting starts whose slot is free or whose wait is
  // over, deleted jobs whose trainers have all gone.
  std::vector<AgentAction> Tick(absl::Time now);

  // Draining: from now on starts are ignored.
  void Drain() { draining_ = true; }
  bool draining() const { return draining_; }

  // The running trainers, by slot (those told to stop included, until they exit).
  const std::map<int, Trainer>& trainers() const { return trainers_; }

 private:
  struct Waiting {
    StartTrainerCommand command;
    absl::Time give_up;
  };
  std::vector<AgentAction> Start(const StartTrainerCommand& start, absl::Time now);
  std::vector<AgentAction> Stop(const StopTrainerCommand& stop);

  const Options options_;
  std::map<int, Trainer> trainers_;  // by slot
  std::map<int, Waiting> waiting_;   // starts waiting for their slot, by slot
  std::set<std::string> forget_;     // deleted jobs whose files are still to be removed
  bool draining_ = false;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_RECONCILER_H_
