#include "client/testing/fake_coordinator.h"

#include "absl/strings/numbers.h"

namespace ringmaster::client::testing {
namespace {

// A scripted stream: its items to `on_item` until it returns false, then its status.
template <typename Item>
absl::Status Play(const absl::StatusOr<Stream<Item>>& stream,
                  const std::function<bool(const Item&)>& on_item) {
  if (!stream.ok()) return stream.status();
  for (const Item& item : stream->items) {
    if (!on_item(item)) return absl::OkStatus();
  }
  return stream->status;
}

std::string StoreKey(const std::string& job, const std::string& key) {
  return absl::StrCat(job, "/", key);
}

}  // namespace

absl::StatusOr<Job> FakeCoordinator::Submit(const JobSpec& spec) {
  SubmitRequest request;
  *request.mutable_spec() = spec;
  return submit.Answer(request);
}

absl::StatusOr<Job> FakeCoordinator::Get(const std::string& job) {
  GetJobRequest request;
  request.set_job(job);
  return get.Answer(request);
}

absl::StatusOr<std::vector<Job>> FakeCoordinator::List(bool include_finished) {
  ListJobsRequest request;
  request.set_include_finished(include_finished);
  return list.Answer(request);
}

absl::StatusOr<Job> FakeCoordinator::Cancel(const std::string& job) {
  CancelJobRequest request;
  request.set_job(job);
  return cancel.Answer(request);
}

absl::Status FakeCoordinator::Watch(const std::string& job, absl::Time,
                                    const std::function<bool(const JobEvent&)>& on_event) {
  WatchJobRequest request;
  request.set_job(job);
  return Play(watch.Answer(request), on_event);
}

absl::StatusOr<DeleteJobResponse> FakeCoordinator::Delete(const std::string& job) {
  DeleteJobRequest request;
  request.set_job(job);
  return delete_job.Answer(request);
}

absl::StatusOr<ListNodesResponse> FakeCoordinator::ListNodes() {
  return list_nodes.Answer(ListNodesRequest());
}

absl::Status FakeCoordinator::Logs(const LogsRequest& request, absl::Time,
                                   const std::function<bool(const LogChunk&)>& on_chunk) {
  return Play(logs.Answer(request), on_chunk);
}

absl::StatusOr<RegisterNodeResponse> FakeCoordinator::RegisterNode(
    const RegisterNodeRequest& request) {
  return register_node.Answer(request);
}

absl::StatusOr<HeartbeatResponse> FakeCoordinator::Heartbeat(const HeartbeatRequest& request) {
  return heartbeat.Answer(request);
}

absl::Status FakeCoordinator::DrainNode(const DrainNodeRequest& request) {
  return drain_node.Answer(request).status();
}

absl::Status FakeCoordinator::TrainerExited(const TrainerExitedRequest& request) {
  return trainer_exited.Answer(request).status();
}

absl::StatusOr<JoinResponse> FakeCoordinator::Join(const JoinRequest& request, absl::Time) {
  return join.Answer(request);
}

absl::Status FakeCoordinator::Ready(const ReadyRequest& request) {
  return ready.Answer(request).status();
}

absl::StatusOr<ProgressResponse> FakeCoordinator::Progress(const ProgressRequest& request) {
  return progress.Answer(request);
}

absl::Status FakeCoordinator::ReportError(const ReportErrorRequest& request) {
  return report_error.Answer(request).status();
}

absl::Status FakeCoordinator::Finished(const FinishedRequest& request) {
  return finished.Answer(request).status();
}

absl::Status FakeCoordinator::ReportCheckpoint(const ReportCheckpointRequest& request) {
  return report_checkpoint.Answer(request).status();
}

absl::Status FakeCoordinator::StoreSet(const StoreSetRequest& request) {
  absl::MutexLock lock(&mu_);
  store_[StoreKey(request.job(), request.key())] = request.value();
  return absl::OkStatus();
}

absl::StatusOr<StoreGetResponse> FakeCoordinator::StoreGet(const StoreGetRequest& request,
                                                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto all_set = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : request.keys()) {
      if (!store_.count(StoreKey(request.job(), key))) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&all_set), deadline)) {
    return absl::DeadlineExceededError("a key of the store was not set in time");
  }
  StoreGetResponse response;
  for (const std::string& key : request.keys()) {
    response.add_values(store_[StoreKey(request.job(), key)]);
  }
  return response;
}

absl::StatusOr<StoreAddResponse> FakeCoordinator::StoreAdd(const StoreAddRequest& request) {
  absl::MutexLock lock(&mu_);
  std::string& value = store_[StoreKey(request.job(), request.key())];
  int64_t n = 0;
  if (!value.empty() && !absl::SimpleAtoi(value, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key ", request.key(), " does not hold a number"));
  }
  n += request.delta();
  value = absl::StrCat(n);
  StoreAddResponse response;
  response.set_value(n);
  return response;
}

}  // namespace ringmaster::client::testing
