// A command job's rank: the user's own program, run under the coordinator's epoch
// protocol with torchrun's worker environment.
//
//   per membership epoch e:
//     join e → rank, world, the members (node, slot by rank)
//     rank 0 picks a free TCP port on its advertise host and publishes "host:port" in the
//     coordinator's store under the epoch's prefix; the others read it (MASTER_ADDR/PORT:
//     fresh for every epoch, so no stale store and no clash with the last epoch's)
//     fork/exec command.argv (no shell) in command.workdir, in its own process group, with
//     BuildCommandEnv's environment, after a header line in the output (EpochHeader); its
//     stdout and stderr pass through this trainer's own (worker/program_output), byte for
//     byte as they come, the last non-empty line remembered; report Ready
//     while it runs: keep-alive progress every progress_interval; the coordinator's answer
//     names a later epoch (failure elsewhere, resize, drain) or the job's end → SIGTERM to
//     the program's group, stop_grace, SIGKILL, then join that epoch; this trainer's own
//     SIGTERM (leave_requested) → the same, then leave.
//     the program exits by itself: 0 → Finished (the job succeeds when every rank of an
//     epoch did); a non-zero code or a signal ringmaster did not send → ReportError, with
//     the message of its TORCHELASTIC_ERROR_FILE when it wrote one (@record), and a
//     RankFailure (rank, slot, how it ended, that message, its last output line, and when:
//     the error file's timestamp, else when its exit was seen; the coordinator names the
//     earliest of an epoch the first failure), permanent for
//     command.permanent_exit_codes, and, unless permanent, the next epoch.
//   A program that cannot be started (not found, not executable, workdir missing) is a
//   permanent error naming the node and the path: the job fails once, no restart loop.
//   An exit after ringmaster's own SIGTERM is never a failure. But a program stopped (a later
//   epoch, the job's end, this trainer leaving) that had written an error file may have failed
//   by itself, only slower to exit than the rank whose report re-formed the job: its
//   RankFailure is reported for the epoch it ran in, as stopped_after, and the coordinator
//   names it only if it is the earliest failure of an epoch that failed.
//   A resubmit (`ringctl submit` of the name of a job that has ended, which the new job
//   replaces): the new job's first epoch has RINGMASTER_RESTART_REASON=resubmit and the same
//   RINGMASTER_CHECKPOINT_DIR (checkpoint.dir/<job>), where the program finds what the earlier
//   job saved; RINGMASTER_EPOCH starts at 1 and TORCHELASTIC_RESTART_COUNT at 0 again, as a
//   new torchrun run's does: they count the epochs and the restart budget of this submission.
//   (A name deleted with `ringctl delete` is forgotten: submitted again, its reason is start.)
//
// Not thread-safe; one call per trainer process. Blocks until the job is over for this rank.
//
// The program channel (worker/program_channel.h, python/ringmaster): before it starts the
// program the runner listens at RINGMASTER_CONTROL_SOCKET. The program's reports replace the
// keep-alive: they reach the coordinator as a built-in trainer's RankStats
// (worker/program_progress.h) and rank 0's metrics.jsonl. Once the program said hello,
// keep-alives go only while its heartbeats are fresh (heartbeat_timeout): a frozen program
// (SIGSTOP) falls silent and the coordinator's silence detection re-forms the group; a
// program that never connects gets keep-alives while it runs. A stop is
// {"type":"stop","reason":"drain"|"epoch"|"job_over"} on the channel, then SIGTERM and SIGCONT
// to its group (a stopped program must run to handle its SIGTERM).
#ifndef RINGMASTER_WORKER_COMMAND_RUNNER_H_
#define RINGMASTER_WORKER_COMMAND_RUNNER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/coordinator.h"
#include "proto/coordinator.pb.h"
#include "proto/job_spec.pb.h"

namespace ringmaster::worker {

// Where one rank sits in its epoch, as torchrun counts it: a group is a node (torchrun's
// agent), numbered in the order of the nodes' lowest ranks.
struct CommandPlacement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // among the epoch's ranks on this node
  int local_world_size = 1;  // the epoch's ranks on this node
  int group_rank = 0;        // this node's index
  int group_world_size = 1;  // nodes in the epoch
  // The agent's slots of this node's ranks, by local rank (slot i is GPU i on a GPU node).
  std::vector<int> local_slots;
};

// From a JoinResponse's members (which the coordinator sends for worlds of at most 64).
// INVALID_ARGUMENT when `self` is not among them or the members are missing.
absl::StatusOr<CommandPlacement> PlacementFromMembers(const JoinResponse& joined,
                                                      const ringmaster::SlotRef& self);

struct CommandEnvInput {
  // The trainer's own environment ("NAME=value"), inherited by the program.
  std::vector<std::string> base_env;
  CommandPlacement placement;
  std::string master_addr;
  int master_port = 0;
  std::string job;
  int64_t epoch = 1;
  // TORCHELASTIC_RESTART_COUNT (the same on every rank) and _MAX_RESTARTS.
  int64_t restart_count = 0;
  int64_t max_restarts = 0;
  std::string restart_reason = "start";  // RINGMASTER_RESTART_REASON (RestartReason)
  std::string error_file;      // TORCHELASTIC_ERROR_FILE
  std::string checkpoint_dir;  // RINGMASTER_CHECKPOINT_DIR; empty: not set
  ringmaster::SlotRef slot;
  double stop_grace_s = 30;
  // command.env (validated: no reserved names).
  std::map<std::string, std::string> user_env;
  // RINGMASTER_CONTROL_SOCKET: the program channel's socket (worker/program_channel.h);
  // empty: not set.
  std::string control_socket;
  // Prepended to the inherited (or command.env's) PYTHONPATH: the directory of the ringmaster
  // Python module (python/ringmaster); empty: PYTHONPATH as it is.
  std::string python_path;
};

// RINGMASTER_RESTART_REASON for an epoch formed for JoinResponse.epoch_cause: start,
// failure, drain, resize (the coordinator's "grow"), coordinator_restart ("restore") or
// resubmit (the first epoch of a job submitted again under the name of one that ended).
std::string RestartReason(absl::string_view epoch_cause);

// The program's environment, sorted by name: base_env, then command.env, then torchrun's
// worker variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME=default, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID (the job),
// TORCHELASTIC_USE_AGENT_STORE=False (rank 0's program hosts the store at MASTER_PORT, as
// init_process_group(init_method="env://") does), TORCHELASTIC_ERROR_FILE,
// NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_ASYNC_ERROR_HANDLING (inherited, else 1),
// OMP_NUM_THREADS (inherited, else 1 when the node runs more than one rank, as torchrun)),
// CUDA_VISIBLE_DEVICES (the node's ranks' slots in local-rank order, each mapped through the
// inherited CUDA_VISIBLE_DEVICES when there is one: a torchrun program's cuda:LOCAL_RANK is
// then its own slot's GPU, whichever slots the epoch got) and
// RINGMASTER_JOB, RINGMASTER_EPOCH, RINGMASTER_NODE, RINGMASTER_SLOT,
// RINGMASTER_STOP_GRACE_S, RINGMASTER_RESTART_REASON, RINGMASTER_CHECKPOINT_DIR and
// RINGMASTER_CONTROL_SOCKET, and python_path prepended to PYTHONPATH. Later entries win.
std::vector<std::string> BuildCommandEnv(const CommandEnvInput& input);

// The message of a TORCHELASTIC_ERROR_FILE as torchelastic's @record writes it
// ({"message": {"message": "RuntimeError: ...", "extraInfo": {...}}}), at most 2000
// characters; empty when the file is missing, unreadable or not of that form.
std::string ErrorFileMessage(const std::string& path);

// What a TORCHELASTIC_ERROR_FILE says: ErrorFileMessage's message, and when the program failed:
// torchelastic's timestamp (message.extraInfo.timestamp; the top-level "timestamp" where
// "message" is a string; whole seconds, as a string or a number), refined by the file's
// modification time when that lies within the same second (@record writes the file just after
// reading the clock); InfinitePast when the file has no timestamp or is not of that form.
struct ErrorFile {
  std::string message;
  absl::Time timestamp = absl::InfinitePast();
};
ErrorFile ReadErrorFile(const std::string& path);

// The line the runner writes to the program's output before starting it in an epoch, e.g.
// "==== ringmaster: job J membership epoch 3: rank 1 of 4 on node-b slot 0 (restart 1,
// reason failure) ====" (with a newline): where each epoch starts in `ringctl logs`.
std::string EpochHeader(const CommandEnvInput& input);

struct CommandRunnerOptions {
  // Not owned; carries this trainer's membership token.
  client::TrainerCalls* client = nullptr;
  std::string job;
  ringmaster::SlotRef slot;
  int64_t first_epoch = 1;
  // Effective and validated, with `command` set.
  JobSpec spec;
  std::string advertise_host = "127.0.0.1";
  // The program channel (worker/program_channel.h): its socket goes in error_file_dir; the
  // ringmaster Python module's directory (python_module_dir, empty: none) is prepended to the
  // program's PYTHONPATH. A program that said hello is alive while its messages are at most
  // heartbeat_timeout apart; silent longer, it gets no keep-alive.
  std::string python_module_dir;
  absl::Duration heartbeat_timeout = absl::Milliseconds(750);
  // This process's environment, passed on to the program.
  std::vector<std::string> base_env;
  // Where TORCHELASTIC_ERROR_FILE files go (one per epoch); must exist.
  std::string error_file_dir = ".";
  // Between keep-alives, whose answers tell the rank of a new epoch: a survivor of another
  // rank's failure stops its program this long after the coordinator formed the epoch, at
  // most (measured with 500 ms: 0.14–0.48 s of a 0.6 s recovery).
  absl::Duration progress_interval = absl::Milliseconds(100);
  // Rank 0's publication of MASTER_ADDR:MASTER_PORT is awaited this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration join_timeout = absl::Minutes(30);
  // Set (SIGTERM) to leave: the program gets SIGTERM, then this trainer exits.
  const std::atomic<bool>* leave_requested = nullptr;
  // Where the program's stdout and stderr go (not owned), and each epoch's header line.
  int output_fd = 1;
  int error_fd = 2;
};

struct CommandResult {
  int64_t epochs = 0;  // epochs in which the program ran
  bool left = false;   // left (drain) before the job finished
};

// Errors: FAILED_PRECONDITION when the job ended without this rank (cancelled, failed
// elsewhere) or the program cannot be started here (permanent); the program's exit with a
// permanent code; DEADLINE_EXCEEDED when no epoch formed within join_timeout.
absl::StatusOr<CommandResult> RunCommandJob(const CommandRunnerOptions& options);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_COMMAND_RUNNER_H_
