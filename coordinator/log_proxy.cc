#include "coordinator/log_proxy.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster::coordinator {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

bool Ended(ringmaster::JobPhase phase) {
  return phase == JOB_PHASE_SUCCEEDED || phase == JOB_PHASE_FAILED ||
         phase == JOB_PHASE_CANCELLED;
}

}  // namespace

struct LogProxy::Shared {
  absl::Mutex mu;
  int active ABSL_GUARDED_BY(mu) = 0;
};

// One Logs call. Without a source it only finishes with its error. With one, its thread
// (Run) reads and writes, and calls Finish as its last act on the reactor; gRPC then calls
// OnDone, which deletes it.
class LogProxy::Stream final : public grpc::ServerWriteReactor<LogChunk> {
 public:
  explicit Stream(const absl::Status& error) { Finish(ToGrpc(error)); }

  Stream(Coordinator* coordinator, const LogProxyOptions& options,
         std::shared_ptr<Shared> shared, LogsRequest request, Coordinator::LogSource source,
         absl::Time deadline)
      : coordinator_(coordinator),
        options_(options),
        shared_(std::move(shared)),
        request_(std::move(request)),
        source_(std::move(source)),
        deadline_(deadline) {
    std::thread([this] { Run(); }).detach();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;  // the client went away
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void OnDone() override { delete this; }

 private:
  void Run() {
    const absl::Status status = Pump();
    // After Finish, `this` may be gone at any moment: take what is needed first.
    const std::shared_ptr<Shared> shared = shared_;
    Finish(ToGrpc(status));
    absl::MutexLock lock(&shared->mu);
    --shared->active;
  }

  absl::Status Pump() {
    const std::string where =
        absl::StrCat("the agent of node ", source_.slot.node(), " at ", source_.log_address);
    auto agent = AgentService::NewStub(
        grpc::CreateChannel(source_.log_address, grpc::InsecureChannelCredentials()));
    int64_t offset = request_.tail_bytes() > 0 ? -request_.tail_bytes() : 0;
    while (true) {
      if (Cancelled()) return absl::CancelledError("the client went away");
      if (absl::Now() >= deadline_) return absl::OkStatus();
      ReadLogRequest read;
      read.set_job(request_.job());
      read.set_slot(source_.slot.slot());
      read.set_offset(offset);
      read.set_max_bytes(options_.chunk_bytes);
      grpc::ClientContext ctx;
      if (!options_.node_token.empty()) {
        ctx.AddMetadata("authorization", "Bearer " + options_.node_token);
      }
      ctx.set_deadline(absl::ToChronoTime(std::min(deadline_, absl::Now() + options_.agent_timeout)));
      ReadLogResponse got;
      if (grpc::Status s = agent->ReadLog(&ctx, read, &got); !s.ok()) return Explain(s, where);
      offset = got.offset() + static_cast<int64_t>(got.data().size());
      if (!got.data().empty()) {
        chunk_.Clear();
        chunk_.set_data(std::move(*got.mutable_data()));
        chunk_.set_offset(got.offset());
        *chunk_.mutable_slot() = source_.slot;
        if (!Write()) return absl::CancelledError("the client went away");
        continue;
      }
      if (!request_.follow()) return absl::OkStatus();
      // At the end of the file: done once the job is over and its trainer there is gone
      // (then nothing more will be written).
      absl::StatusOr<Job> job = coordinator_->Get(request_.job());
      if ((!job.ok() || Ended(job->phase())) && !got.running()) return absl::OkStatus();
      if (!Sleep(options_.poll)) return absl::CancelledError("the client went away");
    }
  }

  // The agent's error, for the user: which node, and what to do.
  absl::Status Explain(const grpc::Status& s, const std::string& where) const {
    const std::string file =
        absl::StrCat(request_.job(), "/slot-", source_.slot.slot(), ".log in its work directory");
    switch (s.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        return absl::NotFoundError(absl::StrCat(where, ": ", s.error_message()));
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
        return absl::FailedPreconditionError(absl::StrCat(
            where, " refuses the coordinator (", s.error_message(),
            "): give the coordinator and the agents the same --node_token_file"));
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return absl::UnavailableError(absl::StrCat("cannot reach ", where, " (", s.error_message(),
                                                   "); the log is on that node at ", file));
      default:
        return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                            absl::StrCat(where, ": ", s.error_message()));
    }
  }

  bool Cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // Writes chunk_ and waits until it is written; false when the client left.
  bool Write() {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return false;
      writing_ = true;
    }
    StartWrite(&chunk_);
    absl::MutexLock lock(&mu_);
    // A cancelled call completes its write too (not ok), so this always returns.
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
    return !cancelled_;
  }

  // Sleeps for `d` unless the call is cancelled first (false).
  bool Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), d);
    return !cancelled_;
  }

  Coordinator* const coordinator_ = nullptr;
  const LogProxyOptions options_;
  const std::shared_ptr<Shared> shared_;
  const LogsRequest request_;
  const Coordinator::LogSource source_;
  const absl::Time deadline_ = absl::InfiniteFuture();
  LogChunk chunk_;  // the write in flight

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

LogProxy::LogProxy(Coordinator* coordinator, const LogProxyOptions& options)
    : coordinator_(coordinator), options_(options), shared_(std::make_shared<Shared>()) {}

LogProxy::~LogProxy() {
  absl::MutexLock lock(&shared_->mu);
  shared_->mu.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &shared_->active));
}

int LogProxy::active_streams() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->active;
}

grpc::ServerWriteReactor<LogChunk>* LogProxy::Start(grpc::CallbackServerContext* ctx,
                                                    const LogsRequest& request,
                                                    const absl::Status& auth) {
  if (!auth.ok()) return new Stream(auth);
  if (request.tail_bytes() < 0) {
    return new Stream(absl::InvalidArgumentError(
        absl::StrCat("tail_bytes must be >= 0, got ", request.tail_bytes())));
  }
  absl::StatusOr<Coordinator::LogSource> source = coordinator_->FindLog(request);
  if (!source.ok()) return new Stream(source.status());
  {
    absl::MutexLock lock(&shared_->mu);
    if (shared_->active >= options_.max_streams) {
      return new Stream(absl::ResourceExhaustedError(
          absl::StrCat(shared_->active, " log streams are open already (the most the "
                       "coordinator serves at once); try again when one has ended")));
    }
    ++shared_->active;
  }
  const auto deadline = ctx->deadline();
  return new Stream(coordinator_, options_, shared_, request, *std::move(source),
                    deadline == std::chrono::system_clock::time_point::max()
                        ? absl::InfiniteFuture()
                        : absl::FromChrono(deadline));
}

}  // namespace ringmaster::coordinator
