// The coordinator's core, without gRPC: the membership state machine (membership.h) fed
// by the calls of users, agents and trainers, its decisions persisted in the job store
// (job_store.h) before they take effect, agents' commands queued for their next heartbeat,
// and the calls that wait (Join until the epoch commits, StoreGet until keys exist, Watch
// until the job changes) completed when their condition holds or their deadline passes.
//
// The gRPC services (grpc_service.h) only translate protos and hand these methods a
// completion callback; nothing here blocks a caller's thread on another caller.
//
// Persistence failure: a decision that cannot be persisted must not be announced, so a
// failed write to the job store stops the process (LOG(FATAL)); a restarted coordinator
// resumes from the last durable state, and agents and trainers reconnect by themselves.
//
// Thread-safe. Callbacks run on the thread of the call that satisfied them or of Tick(),
// never under the internal lock; each is called exactly once.
#ifndef RINGMASTER_COORDINATOR_COORDINATOR_H_
#define RINGMASTER_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job_history.h"
#include "coordinator/job_store.h"
#include "coordinator/membership.h"
#include "coordinator/preemption_rate.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::coordinator {

struct CoordinatorOptions {
  // The SQLite job database (created when missing; an empty one, or one without
  // ringmaster's tables, is refused unless store.start_fresh: job_store.h).
  std::string database;
  JobStoreOptions store;
  MembershipOptions membership;
  // What agents are told to use; the lease above is what the coordinator enforces.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Bootstrap store limits per job.
  int64_t max_store_value_bytes = 1 << 20;
  int64_t max_store_keys = 1 << 16;
  // Time source; null means the real clock.
  Clock* clock = nullptr;
  // What each job's history (its dashboard's curves and members per epoch) keeps.
  JobHistoryOptions history;
};

// What the HTTP port shows (metrics, dashboard): copies taken by Coordinator::Snapshot().
struct CoordinatorSnapshot {
  absl::Time taken;
  std::vector<Job> jobs;  // every job, in submission order, ended ones included
  // Per job id: the latest report of each rank of its current epoch, by rank.
  std::map<std::string, std::vector<RankStats>> ranks;
  ListNodesResponse nodes;
  // Per node: the round trip of its agent's last heartbeat, seconds, as the agent measured
  // it (HeartbeatRequest.last_heartbeat_rtt_s); absent until the agent has sent one.
  std::map<std::string, double> heartbeat_rtt_s;
};

class Coordinator {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  // Opens the job database and restores every job in it (Membership::Restore).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options);
  ~Coordinator();

  // --- JobService ---
  absl::StatusOr<Job> Submit(const JobSpec& spec);
  absl::StatusOr<Job> Get(const std::string& job);
  // One page of jobs in submission order (ListJobsRequest says how pages work).
  absl::StatusOr<ListJobsResponse> List(const ListJobsRequest& request);
  absl::StatusOr<Job> Cancel(const std::string& job);
  // The first state of the job with version > after_version (at once when there is one).
  void WatchNext(const std::string& job, int64_t after_version, absl::Time deadline,
                 Done<JobEvent> done);
  // Forgets a job that has ended (Membership::DeleteJob), in memory and in the database,
  // and asks the agents to remove its files (ForgetJobCommand). Its checkpoints stay.
  // NOT_FOUND; FAILED_PRECONDITION naming the phase of a live job.
  absl::StatusOr<DeleteJobResponse> Delete(const std::string& job);
  // Every node the state machine knows, with its slots and what runs on them.
  ListNodesResponse ListNodes();
  // Where the log a Logs call asks for is kept: the trainer's slot and its agent's log
  // service. NOT_FOUND for an unknown job or rank (naming the ranks there are);
  // UNAVAILABLE, naming the node, when its agent serves no logs (not registered now, or
  // without a log service).
  struct LogSource {
    ringmaster::SlotRef slot;
    std::string log_address;
  };
  absl::StatusOr<LogSource> FindLog(const LogsRequest& request);

  // --- WorkerService: agents ---
  // Each call for a node must carry that node's credential (PERMISSION_DENIED otherwise);
  // RegisterNode needs it only while the node's name is held (Membership::HoldsNode).
  absl::StatusOr<RegisterNodeResponse> RegisterNode(const RegisterNodeRequest& request);
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status DrainNode(const DrainNodeRequest& request);
  absl::Status TrainerExited(const TrainerExitedRequest& request);

  // --- WorkerService: trainers ---
  // Completes once the epoch is committed (with the caller's rank), or with ABORTED when a
  // later epoch formed, FAILED_PRECONDITION when the job ended, DEADLINE_EXCEEDED.
  void Join(const JoinRequest& request, absl::Time deadline, Done<JoinResponse> done);
  absl::Status Ready(const ReadyRequest& request);
  // A stale epoch is not an error here: the response names the current epoch. A report
  // with stats.step < 0 is a keep-alive: the process lives, no new step yet.
  absl::StatusOr<ProgressResponse> Progress(const ProgressRequest& request);
  absl::Status ReportError(const ReportErrorRequest& request);
  absl::Status Finished(const FinishedRequest& request);
  absl::Status ReportCheckpoint(const ReportCheckpointRequest& request);
  absl::Status StoreSet(const StoreSetRequest& request);
  void StoreGet(const StoreGetRequest& request, absl::Time deadline, Done<StoreGetResponse> done);
  absl::StatusOr<StoreAddResponse> StoreAdd(const StoreAddRequest& request);

  // Timeouts of the state machine and of waiting calls. The server calls it every ~50 ms.
  void Tick();

  // Completes every waiting call with UNAVAILABLE (the server is going away).
  void FailWaiters();

  // Copies of the jobs, their ranks' figures, the nodes and the agents' heartbeat round
  // trips (the nodes under one hold of the lock, the rest under another). Takes the lock
  // for the copies only: fit for an HTTP handler's thread.
  CoordinatorSnapshot Snapshot();
  // A copy of a job's history (job_history.h): rank 0's reports and the members of each
  // epoch since this process started; empty for a job it does not know.
  JobHistory::View History(const std::string& job);

  // The credential of a node's agent (given to it by RegisterNode).
  std::string NodeCredentialFor(const std::string& node) const;
  // The token a trainer of `job` on `slot` presents (given to it in StartTrainer).
  std::string MembershipTokenFor(const std::string& job, const ringmaster::SlotRef& slot) const;

 private:
  struct JoinWaiter {
    JoinRequest request;
    absl::Time deadline;
    Done<JoinResponse> done;
  };
  struct StoreWaiter {
    StoreGetRequest request;
    absl::Time deadline;
    Done<StoreGetResponse> done;
  };
  struct WatchWaiter {
    std::string job;
    int64_t after_version;
    absl::Time deadline;
    Done<JobEvent> done;
  };
  // Callbacks to run once the lock is released.
  using Completions = std::vector<std::function<void()>>;

  Coordinator(const CoordinatorOptions& options, std::unique_ptr<JobStore> store, Clock* clock,
              std::string secret);

  absl::Time Now() const { return clock_->Now(); }
  // Runs `decide(&actions)` under the lock; when it succeeds, applies the actions, then
  // completes the satisfied waiters outside the lock.
  template <typename Fn>
  absl::Status Decide(Fn&& decide);
  // Carries out the machine's actions in order, then completes whatever waiters they
  // satisfied into `completions`.
  void Apply(const std::vector<Action>& actions, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(const JobState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Resolve(Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Bump(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobEvent EventOf(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A bootstrap-store call of a trainer of `job` at `epoch`: INVALID_ARGUMENT (no epoch, or
  // one not formed yet), NOT_FOUND, FAILED_PRECONDITION (the job ended) or ABORTED (stale).
  absl::Status CheckStoreCaller(const std::string& job, int64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a ready trainer restored into the job's latest recovery (where from, steps lost
  // and why): the first to say it for the recovery's epoch.
  void RecordRestore(Job& job, const ReadyRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank's step report into the job's figures (step, loss, speed, length).
  void RecordStep(Job& job, const SlotRef& slot, const RankStats& stats, int64_t total_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a rank's report: which ranks of the job are stragglers (Job.stragglers).
  void UpdateStragglers(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Completions& completions);
  // Drops the in-memory bookkeeping of a job that is deleted or replaced.
  void ForgetJob(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  const std::unique_ptr<JobStore> store_;
  const std::string secret_;  // of the membership tokens, kept in the job database

  absl::Mutex mu_;
  Membership machine_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);  // the user-visible view
  std::map<std::string, std::vector<AgentCommand>> commands_ ABSL_GUARDED_BY(mu_);  // node →
  // Per job: the bootstrap store and the latest per-rank figures.
  std::map<std::string, std::map<std::string, std::string>> kv_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<int, RankStats>> rank_stats_ ABSL_GUARDED_BY(mu_);
  // Per job and rank: how many reports in a row found the rank slow (UpdateStragglers).
  std::map<std::string, std::map<int, int>> slow_reports_ ABSL_GUARDED_BY(mu_);
  // Per job: slots leaving after the drain save of the epoch being formed.
  std::map<std::string, std::set<SlotRef>> leaving_ ABSL_GUARDED_BY(mu_);
  // Per job: the world size of its last committed epoch.
  std::map<std::string, int> world_ ABSL_GUARDED_BY(mu_);
  std::vector<JoinWaiter> joins_ ABSL_GUARDED_BY(mu_);
  std::vector<StoreWaiter> store_waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<WatchWaiter> watches_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // What each node's agent told at registration, and when it was last heard from (since this
  // process started); kept after its lease lapses, for the logs of ended jobs.
  struct AgentInfo {
    std::string address;
    std::string log_address;
    std::vector<std::string> gpus;
    absl::Time last_seen = absl::InfinitePast();
    double heartbeat_rtt_s = 0;  // the agent's last measured heartbeat round trip (0: none)
  };
  std::map<std::string, AgentInfo> agents_ ABSL_GUARDED_BY(mu_);
  // Per job: rank 0's reports and the members of each epoch (History).
  std::map<std::string, JobHistory> history_ ABSL_GUARDED_BY(mu_);
  JobHistory& HistoryOf(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drains on a preemption notice, for ProgressResponse.preemption_rate_per_hour.
  PreemptionRate preemptions_ ABSL_GUARDED_BY(mu_);
};

// Conversions between the state machine's JobState and the persisted Job proto.
void ToProto(const JobState& state, Job* job);
JobState FromProto(const Job& job);

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_COORDINATOR_H_
