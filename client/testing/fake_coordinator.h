// An in-memory client::Coordinator for tests, scripted call by call.
//
// Every call has a `Script`: answers queued with Then() are given in order, one per call;
// when none is queued, the handler set with Otherwise() answers; without one, the call
// fails with UNIMPLEMENTED naming the call, so that a test sees a call it did not expect.
// Every request is recorded (requests()), and a test may wait for the n-th one
// (AwaitCalls), which is how a test meets a call made on another thread without sleeping.
//
// The bootstrap store (StoreSet/StoreGet/StoreAdd) is unscripted: a real in-memory store
// shared by every caller, so that trainers bootstrap through it as through a coordinator
// (StoreGet waits for its keys until its deadline, on the real clock, as the coordinator
// does). Its requests are not recorded.
//
// The streaming calls (Watch, Logs) answer a `Stream`: the items given to the callback in
// order (stopping early when it returns false), then the status.
//
// Thread-safe.
#ifndef RINGMASTER_CLIENT_TESTING_FAKE_COORDINATOR_H_
#define RINGMASTER_CLIENT_TESTING_FAKE_COORDINATOR_H_

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator.h"

namespace ringmaster::client::testing {

template <typename Item>
struct Stream {
  std::vector<Item> items;
  absl::Status status;
};

template <typename Request, typename Response>
class Script {
 public:
  using Handler = std::function<absl::StatusOr<Response>(const Request&)>;

  explicit Script(std::string name) : name_(std::move(name)) {}

  // Queues the answer of the next call not yet answered by an earlier Then().
  Script& Then(absl::StatusOr<Response> answer) {
    return ThenCall([answer](const Request&) { return answer; });
  }
  // Queues a handler for the next call (to compute the answer from the request).
  Script& ThenCall(Handler handler) {
    absl::MutexLock lock(&mu_);
    queued_.push_back(std::move(handler));
    return *this;
  }
  // Answers every call once the queue is empty.
  Script& Otherwise(Handler handler) {
    absl::MutexLock lock(&mu_);
    otherwise_ = std::move(handler);
    return *this;
  }
  Script& Always(absl::StatusOr<Response> answer) {
    return Otherwise([answer](const Request&) { return answer; });
  }

  absl::StatusOr<Response> Answer(const Request& request) {
    Handler handler;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
      if (!queued_.empty()) {
        handler = std::move(queued_.front());
        queued_.pop_front();
      } else {
        handler = otherwise_;
      }
    }
    if (!handler) return absl::UnimplementedError(absl::StrCat("unscripted call of ", name_));
    return handler(request);  // outside the lock: a handler may call the fake again
  }

  std::vector<Request> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(requests_.size());
  }
  // Blocks until `n` calls were made or `timeout` passed (false then).
  bool AwaitCalls(int n, absl::Duration timeout = absl::Seconds(30)) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(requests_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<Handler> queued_ ABSL_GUARDED_BY(mu_);
  Handler otherwise_ ABSL_GUARDED_BY(mu_);
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
};

class FakeCoordinator final : public Coordinator {
 public:
  // --- UserCalls ---
  absl::StatusOr<Job> Submit(const JobSpec& spec) override;
  absl::StatusOr<Job> Get(const std::string& job) override;
  absl::StatusOr<std::vector<Job>> List(bool include_finished) override;
  absl::StatusOr<Job> Cancel(const std::string& job) override;
  absl::Status Watch(const std::string& job, absl::Time deadline,
                     const std::function<bool(const JobEvent&)>& on_event) override;
  absl::StatusOr<DeleteJobResponse> Delete(const std::string& job) override;
  absl::StatusOr<ListNodesResponse> ListNodes() override;
  absl::Status Logs(const LogsRequest& request, absl::Time deadline,
                    const std::function<bool(const LogChunk&)>& on_chunk) override;

  // --- AgentCalls ---
  absl::StatusOr<RegisterNodeResponse> RegisterNode(const RegisterNodeRequest& request) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::Status DrainNode(const DrainNodeRequest& request) override;
  absl::Status TrainerExited(const TrainerExitedRequest& request) override;

  // --- TrainerCalls ---
  absl::StatusOr<JoinResponse> Join(const JoinRequest& request, absl::Time deadline) override;
  absl::Status Ready(const ReadyRequest& request) override;
  absl::StatusOr<ProgressResponse> Progress(const ProgressRequest& request) override;
  absl::Status ReportError(const ReportErrorRequest& request) override;
  absl::Status Finished(const FinishedRequest& request) override;
  absl::Status ReportCheckpoint(const ReportCheckpointRequest& request) override;
  absl::Status StoreSet(const StoreSetRequest& request) override;
  absl::StatusOr<StoreGetResponse> StoreGet(const StoreGetRequest& request,
                                            absl::Time deadline) override;
  absl::StatusOr<StoreAddResponse> StoreAdd(const StoreAddRequest& request) override;

  // The scripts, by call. A call that returns only a status is answered by its response
  // message (its content unused). List's request carries include_finished; Get, Cancel and
  // Delete's their job.
  Script<SubmitRequest, Job> submit{"Submit"};
  Script<GetJobRequest, Job> get{"Get"};
  Script<ListJobsRequest, std::vector<Job>> list{"List"};
  Script<CancelJobRequest, Job> cancel{"Cancel"};
  Script<WatchJobRequest, Stream<JobEvent>> watch{"Watch"};
  Script<DeleteJobRequest, DeleteJobResponse> delete_job{"Delete"};
  Script<ListNodesRequest, ListNodesResponse> list_nodes{"ListNodes"};
  Script<LogsRequest, Stream<LogChunk>> logs{"Logs"};

  Script<RegisterNodeRequest, RegisterNodeResponse> register_node{"RegisterNode"};
  Script<HeartbeatRequest, HeartbeatResponse> heartbeat{"Heartbeat"};
  Script<DrainNodeRequest, DrainNodeResponse> drain_node{"DrainNode"};
  Script<TrainerExitedRequest, TrainerExitedResponse> trainer_exited{"TrainerExited"};

  Script<JoinRequest, JoinResponse> join{"Join"};
  Script<ReadyRequest, ReadyResponse> ready{"Ready"};
  Script<ProgressRequest, ProgressResponse> progress{"Progress"};
  Script<ReportErrorRequest, ReportErrorResponse> report_error{"ReportError"};
  Script<FinishedRequest, FinishedResponse> finished{"Finished"};
  Script<ReportCheckpointRequest, ReportCheckpointResponse> report_checkpoint{"ReportCheckpoint"};

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(mu_);  // by job/key
};

}  // namespace ringmaster::client::testing

#endif  // RINGMASTER_CLIENT_TESTING_FAKE_COORDINATOR_H_
