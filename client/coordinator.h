// The coordinator (proto/coordinator.proto) as its callers see it: the calls of a user
// (ringctl), of a node agent (ringworker) and of a trainer, each group an interface of its
// own so that a caller takes only the calls it makes. `Coordinator` is all three: what a
// client implements (client/grpc_coordinator_client.h over gRPC; the scriptable fake of
// client/testing/fake_coordinator.h in tests).
//
// Errors are the coordinator's status codes, with its message (STYLE.md: UNAVAILABLE when
// it cannot be reached, after the implementation's own retries; ABORTED for a trainer call
// naming an epoch the job has left; FAILED_PRECONDITION when the job has ended; NOT_FOUND
// for an unknown job or node; INVALID_ARGUMENT for bad input).
//
// Thread-safety: implementations may be called from any thread.
#ifndef RINGMASTER_CLIENT_COORDINATOR_H_
#define RINGMASTER_CLIENT_COORDINATOR_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::client {

// JobService: what a user asks.
class UserCalls {
 public:
  virtual ~UserCalls() = default;

  virtual absl::StatusOr<Job> Submit(const JobSpec& spec) = 0;
  virtual absl::StatusOr<Job> Get(const std::string& job) = 0;
  // Every page.
  virtual absl::StatusOr<std::vector<Job>> List(bool include_finished) = 0;
  virtual absl::StatusOr<Job> Cancel(const std::string& job) = 0;
  // Streams the job's states to `on_event` until the job ends (OK), `on_event` returns
  // false (OK), or `deadline` (DEADLINE_EXCEEDED). Blocks.
  virtual absl::Status Watch(const std::string& job, absl::Time deadline,
                             const std::function<bool(const JobEvent&)>& on_event) = 0;
  virtual absl::StatusOr<DeleteJobResponse> Delete(const std::string& job) = 0;
  virtual absl::StatusOr<ListNodesResponse> ListNodes() = 0;
  // Streams a trainer's log to `on_chunk` until the log ends (or, with request.follow, the
  // job has ended: OK), `on_chunk` returns false (OK), or `deadline` (OK when following:
  // the caller asked to follow until then; else DEADLINE_EXCEEDED). Blocks. UNAVAILABLE
  // may also mean that the trainer's agent cannot be reached (the message says which).
  virtual absl::Status Logs(const LogsRequest& request, absl::Time deadline,
                            const std::function<bool(const LogChunk&)>& on_chunk) = 0;
};

// WorkerService, the node agent's calls (carrying the node's credential).
class AgentCalls {
 public:
  virtual ~AgentCalls() = default;

  virtual absl::StatusOr<RegisterNodeResponse> RegisterNode(const RegisterNodeRequest& request) = 0;
  // NOT_FOUND: the coordinator does not know the node (restarted, or the lease lapsed).
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) = 0;
  virtual absl::Status DrainNode(const DrainNodeRequest& request) = 0;
  virtual absl::Status TrainerExited(const TrainerExitedRequest& request) = 0;
};

// WorkerService, a trainer's calls (carrying its membership token and epoch).
class TrainerCalls {
 public:
  virtual ~TrainerCalls() = default;

  // Waits until `deadline` for the epoch to commit. ABORTED: the job moved past it.
  virtual absl::StatusOr<JoinResponse> Join(const JoinRequest& request, absl::Time deadline) = 0;
  virtual absl::Status Ready(const ReadyRequest& request) = 0;
  virtual absl::StatusOr<ProgressResponse> Progress(const ProgressRequest& request) = 0;
  virtual absl::Status ReportError(const ReportErrorRequest& request) = 0;
  virtual absl::Status Finished(const FinishedRequest& request) = 0;
  virtual absl::Status ReportCheckpoint(const ReportCheckpointRequest& request) = 0;
  // The job's bootstrap store (client/coordinator_store.h).
  virtual absl::Status StoreSet(const StoreSetRequest& request) = 0;
  // Waits until `deadline` for every key.
  virtual absl::StatusOr<StoreGetResponse> StoreGet(const StoreGetRequest& request,
                                                    absl::Time deadline) = 0;
  virtual absl::StatusOr<StoreAddResponse> StoreAdd(const StoreAddRequest& request) = 0;
};

class Coordinator : public UserCalls, public AgentCalls, public TrainerCalls {};

}  // namespace ringmaster::client

#endif  // RINGMASTER_CLIENT_COORDINATOR_H_
