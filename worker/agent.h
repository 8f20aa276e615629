// The node agent (ringworker): registers the node's slots with the coordinator, keeps its
// lease by heartbeats, starts one trainer process per slot the coordinator assigns, kills
// the ones it is told to stop, reports every exit, and drains the node on request.
//
// What to do is decided by a Reconciler (worker/reconciler.h: the coordinator's commands
// and the exits seen in, actions out); the agent carries the actions out: processes through
// a Launcher (worker/launcher.h), reports through the client, files in the work directory.
//
// Loop (Step), every 50 ms; heartbeats every heartbeat interval (the coordinator's
// RegisterNode answer):
//   - reap exited trainers and report each (TrainerExited, with the tail of its log);
//   - heartbeat with the running slots; carry out the start/stop commands in order;
//   - NOT_FOUND (coordinator restarted, or lease lost): register again; running trainers
//     are left alone (the coordinator restored their job);
//   - UNAVAILABLE: keep going (the coordinator is not on the data path).
// Trainers die with the agent (LaunchSpec::parent_death_signal); each running one is
// recorded in trainer_records_dir, so that an agent started again on the same work
// directory ends what its predecessor left running and reports every trainer it started.
// Drain (SIGTERM, or the preemption notice file appears): DrainNode, then SIGTERM to the
// trainers (each takes part in the job's drain save and exits); the agent returns once
// they have all exited, or after drain_grace, killing what is left. A stop request (a
// second SIGTERM) kills the trainers and returns at once.
//
// Trainers run as `trainer_binary --coordinator ... --job J --epoch E --node N --slot S
// --membership_token_file F --spec F --local_ranks SLOTS --advertise_host ADDR
// [--tls_ca F [--tls_client_cert F --tls_client_key F]]`, each in
// its own process group under the trainers' memory limit (when set), with stdout and stderr appended to
// <work_dir>/<job>/slot-<S>.log; the spec and token files are written next to it (0600).
// The node's credential (the coordinator binds the node's name to it) is kept in
// <work_dir>/node.credential (0600).
//
// Logs: with `log_listen`, the agent serves its trainers' logs to the coordinator
// (worker/log_service.h) and registers the address; they stay readable after their job
// ends, until the coordinator says that the job was deleted (ForgetJobCommand): then the
// job's directory in the work directory is removed, once none of its trainers runs.
#ifndef RINGMASTER_WORKER_AGENT_H_
#define RINGMASTER_WORKER_AGENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator.h"
#include "common/clock.h"
#include "worker/launcher.h"
#include "worker/log_service.h"
#include "worker/reconciler.h"
#include "worker/trainer_records.h"

namespace ringmaster::worker {

struct AgentOptions {
  // Not owned; carries the node token.
  client::AgentCalls* client = nullptr;
  // Passed to trainers (--coordinator).
  std::string coordinator_address;
  // Files passed to trainers, which reach the coordinator the way the agent does: the
  // coordinator's CA (TLS), and for mutual TLS a client certificate and its key. Empty:
  // plaintext / no client certificate.
  std::string tls_ca_file;
  std::string tls_client_cert_file;
  std::string tls_client_key_file;
  std::string node;
  int slots = 1;
  // The node's memory for trainers, bytes, reported at registration (0: not reported): the
  // coordinator places ranks within it.
  int64_t memory_bytes = 0;
  // The address this node's trainers are reached at by their peers.
  std::string advertise_host = "127.0.0.1";
  std::string trainer_binary;
  std::string work_dir;
  // Extra flags for every trainer (e.g. --op_timeout_s=30).
  std::vector<std::string> trainer_flags;
  // When > 0, each trainer's memory limit, bytes (LaunchSpec::memory_limit_bytes: its
  // RLIMIT_DATA); a trainer whose state does not fit it fails with RESOURCE_EXHAUSTED.
  int64_t trainer_memory_limit_bytes = 0;
  absl::Duration drain_grace = absl::Seconds(120);
  // When this file appears (a cloud's preemption notice, written by a hook), drain.
  std::string preemption_notice_file;
  // Set by SIGTERM: drain. A second SIGTERM sets stop: leave at once.
  const std::atomic<bool>* drain_requested = nullptr;
  const std::atomic<bool>* stop_requested = nullptr;
  // host:port for the log service (port 0: any free one); empty: no log service. A
  // wildcard host (0.0.0.0, [::]) is registered as advertise_host.
  std::string log_listen;
  // Asked of the log service's callers (the coordinator); the agent's own node token.
  std::string node_token;
  // Line-oriented event log (stdout of ringworker).
  std::function<void(const std::string&)> log;
  // Asked when a registration fails with UNAVAILABLE (the coordinator cannot be reached):
  // a non-OK answer (FAILED_PRECONDITION: a person must fix the flags, e.g. a client
  // certificate that mutual TLS asks for and the agent lacks) ends the retries with it.
  // Null or OK: retry.
  std::function<absl::Status(const absl::Status& failure)> diagnose_unreachable;
  // Where the agent records each running trainer (worker/trainer_records.h), so that an
  // agent restarted on this work directory ends what its predecessor left running before it
  // registers, and reports each trainer its predecessor started as exited (those that died
  // with it too: the coordinator re-forms their jobs at once); ringworker gives
  // <work_dir>/@trainers. Empty: no records (a fake launcher's pids are no processes).
  std::string trainer_records_dir;
  // How a trainer left running by an earlier agent is ended (SIGTERM, then SIGKILL).
  EndOptions end_leftovers;
  // Starts and watches the trainers. Not owned; null: a ProcessLauncher of the agent's own.
  Launcher* launcher = nullptr;
  // Times heartbeats, retries and the drain grace. Not owned.
  Clock* clock = Clock::Real();
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();  // kills any trainer still running

  // Runs until drained or stopped: Connect, then Step every 50 ms. Errors: as Connect and
  // Step.
  absl::Status Run();

  // Checks the options (INVALID_ARGUMENT), takes the work directory (<work_dir>/@agent.lock:
  // FAILED_PRECONDITION when another agent holds it), ends the trainers an earlier agent
  // left running (trainer_records_dir), starts the log service, and registers the node,
  // retrying every second until the coordinator answers. FAILED_PRECONDITION when the
  // coordinator refuses the node (bad name or slot count: a person must fix the flags),
  // when diagnose_unreachable finds such a cause of an UNAVAILABLE, or when a trainer left
  // running survives SIGKILL; CANCELLED when asked to drain or stop first (observed within
  // 50 ms of the agent's clock between attempts).
  absl::Status Connect();
  // One pass of the loop at the clock's now: reaps and reports exits, carries out a stop or
  // drain request, and heartbeats when one is due (registering again when the coordinator
  // does not know the node, as Connect). Does not block otherwise. True once drained or
  // stopped: the agent is done.
  absl::StatusOr<bool> Step();

 private:
  absl::Status Register();
  // Waits until `deadline`, in steps of 50 ms; false when a drain or stop was asked meanwhile.
  bool WaitUnlessAsked(absl::Time deadline);
  bool Asked() const;
  // One agent per work directory: an flock on <work_dir>/@agent.lock, held until the
  // agent is destroyed.
  absl::Status LockWorkDir();
  // Ends the trainers recorded in trainer_records_dir (an earlier agent's) and keeps their
  // exit reports for after registration.
  absl::Status EndLeftovers();
  // Starts the log service (AgentOptions::log_listen) and sets log_address_.
  absl::Status StartLogService();
  void Carry(std::vector<AgentAction> actions);
  // StartTrainer: writes the spec and token files and launches the trainer.
  absl::Status Start(const StartTrainerCommand& start);
  void Refuse(const StartTrainerCommand& start, const absl::Status& why);
  void Exited(const ReportExit& exit);
  void Forget(const std::string& job);
  // An exit report the coordinator has not taken yet (it was down): sent again each loop.
  void ReportExits();
  absl::Status Heartbeat();
  // Why the node drains: the agent was asked (SIGTERM), or the preemption notice file
  // appeared (the coordinator counts it in the cluster's preemption rate).
  enum class DrainCause { kAsked, kPreemptionNotice };
  void Drain(DrainCause cause);
  void KillAll(int signal);
  void Log(const std::string& line);

  AgentOptions options_;
  std::unique_ptr<Launcher> own_launcher_;
  Launcher* launcher_;
  Clock* const clock_;
  Reconciler reconciler_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  absl::Time next_heartbeat_ = absl::InfinitePast();
  // The round trip of the last heartbeat answered (on clock_), sent with the next one.
  absl::Duration last_heartbeat_rtt_ = absl::ZeroDuration();
  // This node's credential (RegisterNodeResponse), carried by every call for the node; kept
  // in <work_dir>/node.credential (0600) so that a restarted agent may register the node
  // again while its lease is still live.
  std::string credential_;
  std::vector<TrainerExitedRequest> unreported_;
  std::unique_ptr<LogService> logs_;
  std::string log_address_;  // registered with the node
  absl::Time drain_deadline_;
  int lock_fd_ = -1;  // <work_dir>/@agent.lock, flock'ed
  // Trainers an earlier agent started, ended by Connect or found gone: reported once
  // registered.
  std::vector<EndedTrainer> leftovers_;
  bool stopping_ = false;  // stop requested: the trainers were killed
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_AGENT_H_
