// The coordinator's decisions — placement, rendezvous, membership, failure and recovery —
// as a pure state machine: events and the current time in, actions out. No I/O, no
// threads, no clock of its own; the service layer feeds it RPCs and ticks, carries out its
// actions in order (a Persist before anything it decides is announced), and stores what
// the Persist actions say so that Restore() can rebuild it after a crash.
//
// Vocabulary (ARCHITECTURE.md, "The epoch protocol"):
//   - A node has `slots` (GPUs or CPU slots); an agent registers it and keeps its lease by
//     heartbeats. A slot runs at most one trainer.
//   - A job asks for between min_ranks and max_ranks slots. Its membership is versioned by
//     an epoch. Epoch e is first FORMING: the machine has chosen its candidate slots (and
//     asked agents to start trainers on the new ones); every candidate trainer calls
//     Join(e). When all candidates have joined, the epoch is COMMITTED: ranks are assigned
//     by (node, slot), persisted, and given to the joiners. When every member has reported
//     Ready (communicator built, state restored), the job is RUNNING(e).
//   - A failure (a trainer's exit seen by its agent, a collective error reported by a
//     trainer, a node's lease expiring, a member making no progress for hang_timeout, a
//     candidate not joining within join_timeout), a drain (SIGTERM on a node), or free slots
//     while the job is below max make the machine form epoch e+1 from the members that
//     remain plus free slots, and announce it: members abort their communicator and join
//     e+1. Failures spend the job's restart budget; drains and growth do not.
//   - A slot whose trainer failed is not offered again for slot_backoff; a node whose lease
//     expired is forgotten until its agent registers again.
//   - Below min_ranks the job waits (survivors keep their state and wait in Join) for at
//     most rendezvous_timeout, then fails with the reason.
//   - Placement is first come, first served over jobs in submission order, each gang-placed
//     (started only when min_ranks slots are free) on free slots in (node, slot) order. A
//     job that does not fit does not block later, smaller jobs.
//
// Errors returned by the event methods are for the caller of the RPC that caused them:
// NOT_FOUND (unknown job or node), ABORTED (stale epoch: rejoin the current one),
// INVALID_ARGUMENT (a field, named), ALREADY_EXISTS, FAILED_PRECONDITION (the job is over).
// An event that returns an error emits no actions.
//
// Thread-compatible: the service layer serialises calls.
#ifndef RINGMASTER_COORDINATOR_MEMBERSHIP_H_
#define RINGMASTER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::coordinator {

// Slots a node may register (and trainers a heartbeat may list).
inline constexpr int kMaxSlotsPerNode = 1024;

struct MembershipOptions {
  // A node whose agent has not heartbeaten for this long is dead, with its trainers.
  absl::Duration lease = absl::Seconds(3);
  // After Restore (a coordinator restart), the agents of restored nodes have this long
  // (or `lease`, if longer) to register again: they must first notice the restart.
  absl::Duration restore_grace = absl::Seconds(10);
  // Every candidate of a forming epoch must join within this; the missing are dropped.
  absl::Duration join_timeout = absl::Seconds(30);
  // Every member of a committed epoch must report Ready within this.
  absl::Duration ready_timeout = absl::Seconds(120);
  // A RUNNING member that sends nothing (no step, not even the keep-alive its trainer sends
  // every half second) is stopped or frozen (SIGSTOP, a hung host): it is hung after
  //   min(hang_timeout, max(silence_floor, silence_step_multiple x the job's median step
  //   time)),
  // the step time measured from the members' reports; so a job of fast steps finds a frozen
  // member in seconds, one of slow steps is given room, and hang_timeout is the ceiling.
  // Zero hang_timeout disables it. (A member alive but blocked in a collective keeps
  // sending: its peers' collectives time out and report the error.)
  absl::Duration hang_timeout = absl::Seconds(120);
  absl::Duration silence_floor = absl::Seconds(5);
  int silence_step_multiple = 10;
  // A job below min_ranks fails after waiting this long for capacity.
  absl::Duration rendezvous_timeout = absl::Seconds(300);
  // A slot whose trainer failed is not offered to any job for this long.
  absl::Duration slot_backoff = absl::Seconds(10);
  // A RUNNING job below max_ranks grows into free slots only after running this long
  // (so that a flapping node does not churn every job).
  absl::Duration grow_after = absl::Seconds(5);
  // A trainer's death reported this soon after the survivors' collective error re-formed
  // (or failed) the job is named as its cause, before what the survivors saw.
  absl::Duration blame_window = absl::Seconds(10);
};

// A slot of a node. Ordered by node id, then slot index: the rank order.
struct SlotRef {
  std::string node;
  int slot = 0;
  friend bool operator<(const SlotRef& a, const SlotRef& b) {
    return a.node != b.node ? a.node < b.node : a.slot < b.slot;
  }
  friend bool operator==(const SlotRef& a, const SlotRef& b) {
    return a.node == b.node && a.slot == b.slot;
  }
};
std::string ToString(const SlotRef& s);  // "node/slot"

struct JobRequest {
  std::string id;
  int min_ranks = 1;
  int max_ranks = 1;
  // Failure-caused epochs allowed before the job fails; drains and growth are free.
  int restart_budget = 3;
  // Host memory one rank needs (the spec's resources.memory_per_rank_mib); 0: not stated.
  // A rank is placed only on a node with that much memory not yet taken by other ranks.
  int64_t memory_per_rank = 0;
  // Every world is a multiple of this many ranks (parallelism.mesh's tp × pp: one
  // data-parallel replica of the model-parallel layout): an epoch takes the largest multiple
  // the slots allow (up to max_ranks), at least min_ranks; a survivor beyond it is stopped.
  int rank_multiple = 1;
  // Non-empty: why the job never grows into free slots (its new ranks could not be given
  // the state: it is sharded over the ranks and there is no checkpoint to read it from). It
  // still shrinks and restarts. Empty: it grows up to max_ranks.
  std::string cannot_grow;
};

enum class JobPhase {
  kPending,    // waiting for min_ranks free slots (never ran, or fell below min)
  kForming,    // epoch chosen, waiting for every candidate to join
  kCommitted,  // ranks assigned, waiting for every member to report Ready
  kRunning,
  kSucceeded,
  kFailed,
  kCancelled,
};
const char* JobPhaseName(JobPhase phase);
bool IsTerminal(JobPhase phase);

// Why an epoch was formed. kResubmit: the first epoch of a job whose name was submitted again
// after an earlier job of that name ended (JobState::resubmitted); like kStart, it continues
// no run of its own (the program finds the earlier job's checkpoints, if it kept any).
enum class EpochCause { kStart, kFailure, kDrain, kGrow, kRestore, kResubmit };
const char* EpochCauseName(EpochCause cause);

struct Member {
  SlotRef slot;
  int rank = -1;  // assigned at commit; -1 while forming
  bool joined = false;
  bool ready = false;
  bool finished = false;
  // Started for this epoch (not carried over from the last one): its failure before the
  // epoch commits spends the restart budget (a trainer that cannot start must not be
  // restarted for ever).
  bool fresh = false;
  int64_t step = -1;          // last reported step
  absl::Time last_progress;   // when it last reported (Join, Ready or Progress)
};

// How a command job's program failed on one rank, as its runner reports it (ReportError with
// a RankFailure): what the job's status names as the epoch's first failure.
struct RankFailure {
  int64_t epoch = 0;
  int rank = -1;
  SlotRef slot;
  std::string program;  // command.argv[0]
  std::string how;      // "exit code 1", "killed by signal 9 (SIGKILL)", ...
  int exit_code = -1;   // -1: a signal ended it
  int signal = 0;       // 0: it exited
  std::string signal_name;
  std::string error_message;     // its TORCHELASTIC_ERROR_FILE's (@record); empty: none
  std::string last_output_line;  // its last non-empty line of output
  // Its error file's timestamp, else when its runner saw it exit: the earliest of an epoch's
  // failures is its first (as torchelastic's ChildFailedError.get_first_failure).
  absl::Time failed_at = absl::InfinitePast();
  bool failed_at_from_error_file = false;
  bool stopped_after = false;  // ringmaster stopped it, and found its error file
};
// One line: "rank 2 (node b, slot 0) failed first in membership epoch 3: python3: exit code
// 1; its error file says: RuntimeError: boom; its last output line: ..." (the last line only
// when it is not the error file's message).
std::string Describe(const RankFailure& failure);

// Everything the machine knows about a job: what a Persist action carries and Restore takes.
struct JobState {
  JobRequest request;
  JobPhase phase = JobPhase::kPending;
  int64_t epoch = 0;  // 0 until the first epoch forms
  EpochCause cause = EpochCause::kStart;
  std::vector<Member> members;  // candidates while forming; sorted by slot
  int restarts = 0;             // failure-caused epochs so far
  absl::Time submitted;
  absl::Time phase_since;       // when the phase was entered
  absl::Time below_min_since;   // when it last fell below min (kPending after a start)
  bool ever_started = false;
  // Submitted under the name of an ended job, which it replaced (SubmitJob): its first epoch
  // is kResubmit instead of kStart.
  bool resubmitted = false;
  // The epoch in which a member reported its last step: the job is completing, so a slot
  // that a finished trainer frees is not a reason to grow. In memory only (after a
  // coordinator restart a finishing job may grow once more, harmlessly).
  int64_t finishing_epoch = -1;
  // The latest step times the members reported (at most 64; in memory only): what a silent
  // member is measured against (MembershipOptions::hang_timeout).
  std::vector<absl::Duration> step_times;
  std::string reason;           // why it is pending, failed or cancelled
  // Nodes the job is not placed on (an error no restart there fixes: its data is missing).
  std::set<std::string> excluded_nodes;
  // The first rank to fail (earliest RankFailure::failed_at) in the last epoch whose failure
  // was a command job's program's (ProgramFailed); kept after later epochs form.
  std::optional<RankFailure> first_failure;
  // In-process recovery (LeaveToRejoin): slots still the job's, whose trainers are alive and
  // restarting their programs out of the current epoch; each comes back by a Join (a growth
  // epoch). In memory only: after a coordinator restart the slot is no longer the job's and
  // its agent stops the trainer (the job grows into the slot again the ordinary way).
  std::vector<SlotRef> rejoining;
};

// How far an error reaches: a restart fixes it, or a restart on another node may, or none.
enum class ErrorScope { kRestartable, kNodeLocal, kPermanent };

// --- Actions, carried out by the service layer in the order given. ---

// Store this job state durably before carrying out any later action.
struct PersistJob {
  JobState job;
};
// Ask the node's agent to start a trainer for (job, epoch) on the slot.
struct StartTrainer {
  SlotRef slot;
  std::string job;
  int64_t epoch;
};
// Ask the node's agent to stop (kill) the trainer of `job` on the slot.
struct StopTrainer {
  SlotRef slot;
  std::string job;
  std::string reason;
};
// Tell the job's running trainers that epoch `epoch` is forming: abort the communicator and
// join it. `leaving` trainers (a drained node) take part in the drain save, then exit.
struct AnnounceEpoch {
  std::string job;
  int64_t epoch;
  EpochCause cause;
  std::vector<SlotRef> leaving;
  std::string reason;
  // When the failure happened, where the state machine knows it: a hung member's last
  // progress, an expired node's last heartbeat. InfinitePast: not known (a reported exit
  // or error is detected as it happens).
  absl::Time failed_at = absl::InfinitePast();
};
// Epoch committed: the joiners get their ranks (the members carry them).
struct CommitEpoch {
  std::string job;
  int64_t epoch;
  std::vector<Member> members;
};
// The job reached a terminal phase.
struct JobEnded {
  std::string job;
  JobPhase phase;
  std::string reason;
};
// The node's lease expired, or its drain finished: it holds no slots any more.
struct NodeGone {
  std::string node;
  std::string reason;
};

using Action =
    std::variant<PersistJob, StartTrainer, StopTrainer, AnnounceEpoch, CommitEpoch, JobEnded,
                 NodeGone>;
// One line per action, stable, for logs and scenario scripts.
std::string ToString(const Action& action);

class Membership {
 public:
  explicit Membership(const MembershipOptions& options);

  // --- Nodes (from agents) ---
  // A node and its slot count (first registration, or again after a restart of the agent or
  // coordinator). A node already known keeps its assignments if `slots` still covers them.
  // `memory`: the node's memory in bytes (0: not reported; then memory is not checked).
  absl::Status RegisterNode(const std::string& node, int slots, absl::Time now,
                            std::vector<Action>* actions, int64_t memory = 0);
  // The largest memory a live node reported (0: none did).
  int64_t LargestNodeMemory(absl::Time now) const;
  // `running`: the trainers the agent runs now (slot, job). A slot exiting for a job whose
  // trainer is no longer listed is free again. A listed trainer whose slot is not its job's
  // (the node was cut off and declared gone meanwhile, say) is stopped and its slot exiting
  // until it is gone; one still listed a lease after it was told to stop is told again (the
  // command may have been lost).
  absl::Status Heartbeat(const std::string& node,
                         const std::vector<std::pair<int, std::string>>& running, absl::Time now,
                         std::vector<Action>* actions);
  // The job a node's slot is assigned to; empty when none (or no such node). An agent
  // running a trainer of another job there runs a stale one (e.g. its lease lapsed while it
  // was cut off, and the job went on without it).
  std::string AssignedJob(const std::string& node, int slot) const;
  // The node is going away (SIGTERM, spot notice): its slots take no new work and every job
  // on it re-forms without it; its trainers are told to leave after the drain save. A job
  // whose last step is done is left to finish (its trainers exit on their own).
  absl::Status DrainNode(const std::string& node, absl::Time now, std::vector<Action>* actions);
  // The agent's trainer for `job` on `slot` exited (code, or signal as negative number).
  // `detail` (e.g. the last line of its log) goes into the reason. `stopped`: the agent
  // killed it as told (a stop), so it is no culprit. Exit status kExitCodePermanent
  // (common/out_of_memory.h: memory ran out where it could not be reported) fails the job.
  // `start_epoch`: the epoch the trainer was started for (0: unknown); the exit of a trainer
  // older than the one last started on the slot for the job is a stale trainer's (cut off by
  // a partition while its node's lease lapsed, the slot since given to a new epoch): ignored.
  absl::Status TrainerExited(const SlotRef& slot, const std::string& job, int exit_code,
                             absl::Time now, std::vector<Action>* actions,
                             const std::string& detail = "", bool stopped = false,
                             int64_t start_epoch = 0);

  // --- Jobs (from users) ---
  // A job id that names a job that has ended replaces it (the old one is forgotten, as by
  // DeleteJob; the new one is `resubmitted`, its first epoch kResubmit); one that names a
  // live job is ALREADY_EXISTS.
  absl::Status SubmitJob(const JobRequest& request, absl::Time now, std::vector<Action>* actions);
  // A job whose last step is done (a rank reported Finished in the current epoch) is not
  // cancelled but succeeds: what the user asked to stop has completed.
  absl::Status CancelJob(const std::string& job, absl::Time now, std::vector<Action>* actions);

  // --- Trainers ---
  absl::Status Join(const std::string& job, int64_t epoch, const SlotRef& slot, absl::Time now,
                    std::vector<Action>* actions);
  absl::Status Ready(const std::string& job, int64_t epoch, const SlotRef& slot, absl::Time now,
                     std::vector<Action>* actions);
  // `step_time`: how long the reported step took (zero: not known, or a keep-alive).
  absl::Status Progress(const std::string& job, int64_t epoch, const SlotRef& slot, int64_t step,
                        absl::Time now, std::vector<Action>* actions,
                        absl::Duration step_time = absl::ZeroDuration());
  // How long a RUNNING member of the job may send nothing before it is hung.
  absl::Duration SilenceBound(const JobState& job) const;
  // A collective failed under this trainer (a peer died or hung); it stays alive and will
  // join the next epoch. A kPermanent error (one no restart can fix: the checkpoint is
  // another job's, say) fails the job at once, spending no restart budget. A kNodeLocal one
  // (its data is missing on this node) takes the node out of the job's placement and
  // re-forms it on other nodes, once: a second such error, or no other node with enough
  // slots, fails the job.
  absl::Status CollectiveError(const std::string& job, int64_t epoch, const SlotRef& slot,
                               const std::string& detail, absl::Time now,
                               std::vector<Action>* actions,
                               ErrorScope scope = ErrorScope::kRestartable);
  // In-process recovery: the program of this member died, but its peers' programs carry on
  // in their own processes (they tear down their process group and build one for the next
  // epoch). The job re-forms without the slot (cause kFailure, spending one restart when the
  // epoch was committed or running, as a whole-group restart would; while it forms, only when
  // the slot was new to it, as LoseMembers counts), but the slot stays the job's, in
  // `rejoining`: its trainer
  // stays alive, restarts the program and, once the program is up (its heavy imports done),
  // calls Join with the job's current epoch, which forms a growth epoch (kGrow, no restart
  // spent) with the slot back in (the Join, of the superseded epoch, is then answered
  // ABORTED by the service, as any: join the new one); or, while an epoch forms or the job
  // waits below min_ranks, takes the slot into it. A rejoining slot's trainer that exits
  // frees the slot; one on a draining node is refused (FAILED_PRECONDITION: leave).
  // `failure` (a command job's program's, as ProgramFailed's; its epoch and slot are the
  // report's) is kept in JobState::first_failure as ProgramFailed keeps it, unless the epoch
  // already has an earlier one, and the job's reason (and so the recovery's) is
  // Describe(failure); it changes nothing of what is re-formed or spent.
  // Errors: those of Join, and NOT_FOUND when the slot is no member.
  absl::Status LeaveToRejoin(const std::string& job, int64_t epoch, const SlotRef& slot,
                             const std::string& detail, absl::Time now,
                             std::vector<Action>* actions,
                             std::optional<RankFailure> failure = std::nullopt);
  // A command job's program failed on this member (worker/command_runner's report): as
  // CollectiveError, but the job's reason is Describe(failure), naming the rank, how its
  // program ended and what it said. Each epoch's earliest failure is kept in
  // JobState::first_failure, whatever order the reports arrive in: a report of an epoch that
  // already failed (re-formed since, or the job failed) replaces the recorded one when it
  // failed earlier, and the job's reason then names it instead; it causes nothing else, and is
  // answered OK (taken: a late report is no error of the caller's). So is a report with
  // `stopped_after` (the program had failed, but ringmaster stopped it: it may name the first
  // failure, it causes none), also in the current epoch.
  // `failure`'s epoch and slot are the report's.
  absl::Status ProgramFailed(const std::string& job, int64_t epoch, const SlotRef& slot,
                             RankFailure failure, absl::Time now, std::vector<Action>* actions,
                             ErrorScope scope = ErrorScope::kRestartable);
  // The trainer finished the job's last step.
  absl::Status Finished(const std::string& job, int64_t epoch, const SlotRef& slot,
                        absl::Time now, std::vector<Action>* actions);

  // Timeouts: leases, joins, readiness, hangs, backoffs, below-min waits, growth.
  void Tick(absl::Time now, std::vector<Action>* actions);

  // After a coordinator restart: the persisted jobs. Nodes hosting members are assumed
  // alive until `now` + max(lease, restore_grace), by when their agents must have
  // registered again; forming and committed epochs restart their timers from `now`.
  absl::Status Restore(const std::vector<JobState>& jobs, absl::Time now);

  // Forgets a job that has ended (a user deletes it, or submits its name again). NOT_FOUND
  // for an unknown job; FAILED_PRECONDITION, naming the phase, for a live one. Emits no
  // action: its slots were let go when it ended (an exiting one stays so until its trainer
  // is gone, and a late exit report of that trainer still frees it).
  absl::Status DeleteJob(const std::string& job);

  // --- Queries ---
  // The check every trainer call's (job, epoch) passes: NOT_FOUND, FAILED_PRECONDITION (the
  // job ended), ABORTED (a stale epoch), INVALID_ARGUMENT (an epoch not formed yet).
  absl::Status CheckLiveEpoch(const std::string& job, int64_t epoch) const;
  // A node as the machine sees it.
  struct NodeView {
    std::string node;
    int slots = 0;
    bool draining = false;
    bool restored = false;  // known from restored jobs only: its agent must register again
    absl::Time lease_expiry;
    std::map<int, std::string> assigned;      // slot → job
    std::map<int, std::string> exiting;       // slot → job whose trainer may still run
    std::map<int, absl::Time> backoff_until;  // slot → when it is offered again (future only)
  };
  // Every node, in name order.
  std::vector<NodeView> Nodes(absl::Time now) const;
  const JobState* job(const std::string& id) const;
  std::vector<std::string> job_ids() const;  // in submission order
  // Free slots now (not assigned, not backing off, node not draining).
  int free_slots(absl::Time now) const;
  // True while the node's name is taken: its lease is live, or a restarted coordinator
  // expects its agent back (restored from the jobs).
  bool HoldsNode(const std::string& node, absl::Time now) const;
  // One line per job and node, for scenario scripts and debugging.
  std::string DebugString(absl::Time now) const;

 private:
  struct NodeState {
    int slots = 0;
    int64_t memory = 0;  // bytes; 0: not reported
    absl::Time lease_expiry;
    bool draining = false;
    // Known only from restored jobs: its agent must register (with its slot count) again.
    bool restored = false;
    std::map<int, std::string> assigned;       // slot → job
    std::map<int, int64_t> started;            // slot → the epoch its trainer was started for
    std::map<int, absl::Time> backoff_until;   // slot → time it is offered again
    struct Exiting {
      std::string job;
      absl::Time since;  // told to stop (or found stale), or finishing
    };
    std::map<int, Exiting> exiting;            // slot → the trainer that may still run
  };

  NodeState* FindNode(const std::string& node);
  JobState* FindJob(const std::string& job);
  absl::StatusOr<JobState*> LiveJob(const std::string& job, int64_t epoch);
  Member* FindMember(JobState& job, const SlotRef& slot);
  // The live job at `epoch` and the slot's member in it, or the error for the caller.
  absl::StatusOr<std::pair<JobState*, Member*>> LiveMember(const std::string& job,
                                                           int64_t epoch, const SlotRef& slot);
  std::vector<SlotRef> FreeSlots(absl::Time now) const;
  // The free slots the job may be placed on, all together: not on its excluded nodes, and on
  // each node only as many as its memory not taken by other ranks holds.
  std::vector<SlotRef> FreeSlotsFor(const JobState& job, absl::Time now) const;
  // The world an epoch of `job` forms from `available` ranks: at most max_ranks, a multiple
  // of rank_multiple; 0 when that is below min_ranks.
  static int WorldFor(const JobState& job, int64_t available);
  int64_t MemoryPerRank(const std::string& job) const;

  // How members were lost.
  struct Loss {
    EpochCause cause = EpochCause::kFailure;  // kFailure spends the restart budget
    std::string reason;
    bool backoff = false;  // keep the slots from being offered for slot_backoff
    bool stop = false;     // the trainers may still run (hung, late): stop them
    bool trainer_gone = false;  // the agent saw the trainers exit: the slots are free at once
    absl::Time failed_at = absl::InfinitePast();  // AnnounceEpoch::failed_at
    bool keep_slots = false;  // the slots stay the job's (LeaveToRejoin): nothing released
  };
  // Join of a rejoining slot (LeaveToRejoin).
  absl::Status Rejoin(JobState& job, int64_t epoch, const SlotRef& slot, absl::Time now,
                      std::vector<Action>* actions);
  // Removes the members on `lost` slots (freeing them), stops their trainers when asked
  // (after the decision is persisted), and re-forms the job.
  void LoseMembers(JobState& job, const std::set<SlotRef>& lost, const Loss& loss,
                   absl::Time now, std::vector<Action>* actions);
  // Forms epoch+1 from the remaining members plus free slots (up to max); or goes pending
  // when below min; or fails when the budget is spent.
  // `failed_at`: AnnounceEpoch::failed_at.
  void Reform(JobState& job, EpochCause cause, const std::vector<SlotRef>& leaving,
              const std::string& reason, absl::Time now, std::vector<Action>* actions,
              absl::Time failed_at = absl::InfinitePast());
  void MaybeCommit(JobState& job, absl::Time now, std::vector<Action>* actions);
  void End(JobState& job, JobPhase phase, const std::string& reason, absl::Time now,
           std::vector<Action>* actions);
  // A node-local error of a member (CollectiveError): exclude its node and re-form, or fail.
  void NodeLocalError(JobState& job, const SlotRef& slot, const std::string& detail,
                      absl::Time now, std::vector<Action>* actions);
  // When the job's reason is a survivor's collective error of the last blame_window, puts
  // the culprit (a trainer's death) first. True when it changed the reason.
  bool BlameCulprit(JobState& job, const std::string& culprit, absl::Time now);
  // Frees the job's slot. Unless `trainer_gone`, the slot is exiting until the agent reports
  // the trainer gone.
  void Release(const JobState& job, const SlotRef& slot, bool backoff, bool trainer_gone,
               absl::Time now);
  // The agent says the job's trainer on the slot is gone: an exiting slot is free.
  void TrainerGone(NodeState& node, int slot, const std::string& job);
  // True when the slot is exiting for a trainer of `job`.
  static bool ExitingFor(const NodeState& node, int slot, const std::string& job);
  // Places pending jobs, then grows running ones.
  void Schedule(absl::Time now, std::vector<Action>* actions);

  MembershipOptions options_;
  std::map<std::string, NodeState> nodes_;
  std::map<std::string, JobState> jobs_;
  std::vector<std::string> order_;  // job ids in submission order
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_MEMBERSHIP_H_
