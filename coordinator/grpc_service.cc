#include "coordinator/grpc_service.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "coordinator/auth.h"
#include "glog/logging.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/server_interceptor.h"

namespace ringmaster::coordinator {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string Header(const grpc::CallbackServerContext* ctx, const char* name) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(name);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// The call's deadline, capped at now + max_wait (a call without one would hold its waiter
// for ever; the caller simply calls again).
absl::Time Deadline(const grpc::CallbackServerContext* ctx, absl::Duration max_wait) {
  const absl::Time cap = absl::Now() + max_wait;
  const auto deadline = ctx->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  return std::min(absl::FromChrono(deadline), cap);
}

template <typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(fn()));
  return reactor;
}

// Writes the result of an asynchronous coordinator call into `response` and finishes.
template <typename T>
Coordinator::Done<T> FinishWith(grpc::ServerUnaryReactor* reactor, T* response) {
  return [reactor, response](absl::StatusOr<T> result) {
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpc(result.status()));
  };
}

class JobServiceImpl final : public JobService::CallbackService {
 public:
  JobServiceImpl(Coordinator* coordinator, const ServerOptions& options)
      : coordinator_(coordinator),
        options_(options),
        logs_(coordinator, LogProxyOptions{.node_token = options.node_token,
                                           .max_streams = options.max_log_streams}) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const SubmitRequest* request,
                                   Job* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      auto job = coordinator_->Submit(request->spec());
      if (job.ok()) *response = std::move(*job);
      return job.status();
    });
  }
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const GetJobRequest* request,
                                Job* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      auto job = coordinator_->Get(request->job());
      if (job.ok()) *response = std::move(*job);
      return job.status();
    });
  }
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const ListJobsRequest* request,
                                 ListJobsResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      auto page = coordinator_->List(*request);
      if (page.ok()) *response = std::move(*page);
      return page.status();
    });
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx,
                                   const CancelJobRequest* request, Job* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      auto job = coordinator_->Cancel(request->job());
      if (job.ok()) *response = std::move(*job);
      return job.status();
    });
  }

  grpc::ServerWriteReactor<JobEvent>* Watch(grpc::CallbackServerContext* ctx,
                                            const WatchJobRequest* request) override {
    return new Watcher(coordinator_, ctx, *request, Auth(ctx), options_.max_wait);
  }
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const DeleteJobRequest* request,
                                   DeleteJobResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      auto r = coordinator_->Delete(request->job());
      if (r.ok()) *response = std::move(*r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const ListNodesRequest*,
                                      ListNodesResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(Auth(ctx));
      *response = coordinator_->ListNodes();
      return absl::OkStatus();
    });
  }
  grpc::ServerWriteReactor<LogChunk>* Logs(grpc::CallbackServerContext* ctx,
                                           const LogsRequest* request) override {
    return logs_.Start(ctx, *request, Auth(ctx));
  }

 private:
  // Streams the job's states: asks the coordinator for the next version, writes it, asks
  // again; ends when the job has ended, at the call's deadline, or when the client leaves.
  //
  // Every reaction (OnWriteDone, OnCancel, the coordinator's callback) runs under the
  // shared state's mutex; gRPC never runs OnDone inline from Finish, so OnDone takes the
  // same mutex, detaches the state and deletes the reactor. A coordinator callback that
  // arrives after that finds no reactor and does nothing. WatchNext is always called
  // without the mutex (it may complete at once, on this thread), with arguments copied
  // under it.
  class Watcher final : public grpc::ServerWriteReactor<JobEvent> {
   public:
    Watcher(Coordinator* coordinator, grpc::CallbackServerContext* ctx, WatchJobRequest request,
            const absl::Status& auth, absl::Duration max_wait)
        : coordinator_(coordinator),
          job_(request.job()),
          version_(request.after_version()),
          call_deadline_(ctx->deadline() == std::chrono::system_clock::time_point::max()
                             ? absl::InfiniteFuture()
                             : absl::FromChrono(ctx->deadline())),
          max_wait_(max_wait),
          state_(std::make_shared<State>()) {
      std::optional<NextCall> next;
      {
        absl::MutexLock lock(&state_->mu);
        state_->self = this;
        if (!auth.ok()) {
          End(ToGrpc(auth));
        } else {
          next = MakeNext();
        }
      }
      if (next) Call(*next);
    }

    void OnWriteDone(bool ok) override {
      std::optional<NextCall> next;
      {
        absl::MutexLock lock(&state_->mu);
        if (!ok) {
          End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
        } else if (ended_) {
          End(grpc::Status::OK);
        } else {
          next = MakeNext();
        }
      }
      if (next) Call(*next);
    }
    void OnCancel() override {
      absl::MutexLock lock(&state_->mu);
      End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
    void OnDone() override {
      {
        absl::MutexLock lock(&state_->mu);
        state_->self = nullptr;
      }
      delete this;
    }

   private:
    struct State {
      absl::Mutex mu;
      Watcher* self ABSL_GUARDED_BY(mu) = nullptr;
    };
    struct NextCall {
      Coordinator* coordinator;
      std::string job;
      int64_t version;
      absl::Time deadline;
      std::shared_ptr<State> state;
    };

    NextCall MakeNext() {
      return NextCall{coordinator_, job_, version_,
                      std::min(call_deadline_, absl::Now() + max_wait_), state_};
    }

    static void Call(const NextCall& next) {
      next.coordinator->WatchNext(
          next.job, next.version, next.deadline, [state = next.state](absl::StatusOr<JobEvent> e) {
            std::optional<NextCall> again;
            {
              absl::MutexLock lock(&state->mu);
              if (state->self != nullptr) again = state->self->OnEvent(std::move(e));
            }
            if (again) Call(*again);
          });
    }

    // Under the mutex. Returns the next call to make when the watch goes on unwritten.
    std::optional<NextCall> OnEvent(absl::StatusOr<JobEvent> event) {
      if (finished_) return std::nullopt;
      if (!event.ok()) {
        if (event.status().code() == absl::StatusCode::kDeadlineExceeded &&
            absl::Now() < call_deadline_) {
          return MakeNext();  // our own cap, not the caller's deadline: wait on
        }
        End(event.status().code() == absl::StatusCode::kDeadlineExceeded
                ? grpc::Status::OK
                : ToGrpc(event.status()));
        return std::nullopt;
      }
      event_ = std::move(*event);
      version_ = event_.version();
      const ringmaster::JobPhase phase = event_.job().phase();
      ended_ = phase == JOB_PHASE_SUCCEEDED || phase == JOB_PHASE_FAILED ||
               phase == JOB_PHASE_CANCELLED;
      StartWrite(&event_);
      return std::nullopt;
    }

    void End(const grpc::Status& status) {
      if (finished_) return;
      finished_ = true;
      Finish(status);
    }

    Coordinator* const coordinator_;
    const std::string job_;
    int64_t version_;
    const absl::Time call_deadline_;
    const absl::Duration max_wait_;
    const std::shared_ptr<State> state_;
    JobEvent event_;
    bool ended_ = false;
    bool finished_ = false;
  };

  absl::Status Auth(const grpc::CallbackServerContext* ctx) const {
    return CheckBearer(Header(ctx, "authorization"), options_.user_token, "user token");
  }

  Coordinator* const coordinator_;
  const ServerOptions options_;
  LogProxy logs_;
};

class WorkerServiceImpl final : public WorkerService::CallbackService {
 public:
  WorkerServiceImpl(Coordinator* coordinator, const ServerOptions& options)
      : coordinator_(coordinator), options_(options) {}

  // --- agents ---
  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const RegisterNodeRequest* request,
                                         RegisterNodeResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(NodeAuth(ctx));
      auto r = coordinator_->RegisterNode(*request);
      if (r.ok()) *response = std::move(*r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(NodeAuth(ctx));
      auto r = coordinator_->Heartbeat(*request);
      if (r.ok()) *response = std::move(*r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx,
                                      const DrainNodeRequest* request,
                                      DrainNodeResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(NodeAuth(ctx));
      return coordinator_->DrainNode(*request);
    });
  }
  grpc::ServerUnaryReactor* TrainerExited(grpc::CallbackServerContext* ctx,
                                          const TrainerExitedRequest* request,
                                          TrainerExitedResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(NodeAuth(ctx));
      return coordinator_->TrainerExited(*request);
    });
  }

  // --- trainers ---
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const JoinRequest* request,
                                 JoinResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (absl::Status s = MemberAuth(ctx, request->job(), request->slot()); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return reactor;
    }
    coordinator_->Join(*request, Deadline(ctx, options_.max_wait), FinishWith(reactor, response));
    return reactor;
  }
  grpc::ServerUnaryReactor* Ready(grpc::CallbackServerContext* ctx, const ReadyRequest* request,
                                  ReadyResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      return coordinator_->Ready(*request);
    });
  }
  grpc::ServerUnaryReactor* Progress(grpc::CallbackServerContext* ctx,
                                     const ProgressRequest* request,
                                     ProgressResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      auto r = coordinator_->Progress(*request);
      if (r.ok()) *response = std::move(*r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* ReportError(grpc::CallbackServerContext* ctx,
                                        const ReportErrorRequest* request,
                                        ReportErrorResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      return coordinator_->ReportError(*request);
    });
  }
  grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* ctx,
                                     const FinishedRequest* request,
                                     FinishedResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      return coordinator_->Finished(*request);
    });
  }
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* ctx,
                                             const ReportCheckpointRequest* request,
                                             ReportCheckpointResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      return coordinator_->ReportCheckpoint(*request);
    });
  }
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* ctx,
                                     const StoreSetRequest* request,
                                     StoreSetResponse*) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      return coordinator_->StoreSet(*request);
    });
  }
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* ctx,
                                     const StoreGetRequest* request,
                                     StoreGetResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (absl::Status s = MemberAuth(ctx, request->job(), request->slot()); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return reactor;
    }
    coordinator_->StoreGet(*request, Deadline(ctx, options_.max_wait),
                           FinishWith(reactor, response));
    return reactor;
  }
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* ctx,
                                     const StoreAddRequest* request,
                                     StoreAddResponse* response) override {
    return Unary(ctx, [&]() -> absl::Status {
      RM_RETURN_IF_ERROR(MemberAuth(ctx, request->job(), request->slot()));
      auto r = coordinator_->StoreAdd(*request);
      if (r.ok()) *response = std::move(*r);
      return r.status();
    });
  }

 private:
  absl::Status NodeAuth(const grpc::CallbackServerContext* ctx) const {
    return CheckBearer(Header(ctx, "authorization"), options_.node_token, "node token");
  }
  absl::Status MemberAuth(const grpc::CallbackServerContext* ctx, const std::string& job,
                          const ringmaster::SlotRef& slot) const {
    if (job.empty()) return absl::InvalidArgumentError("job is empty");
    if (slot.node().empty()) return absl::InvalidArgumentError("slot.node is empty");
    return CheckBearer(Header(ctx, "authorization"), coordinator_->MembershipTokenFor(job, slot),
                       absl::StrCat("membership token of job ", job, " slot ", slot.node(), "/",
                                    slot.slot()));
  }

  Coordinator* const coordinator_;
  const ServerOptions options_;
};

// Why `host:port` cannot be listened on, found by trying it with a plain socket (gRPC only
// says that it failed): in use, not an address of this machine, or not host:port at all.
std::string ListenProblem(const std::string& listen) {
  std::string host = listen, port;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos || close + 1 >= host.size() || host[close + 1] != ':') {
      return "not host:port";
    }
    port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    if (colon == std::string::npos) return "not host:port";
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                                 &found);
      rc != 0) {
    return absl::StrCat("the host or port does not resolve: ", gai_strerror(rc));
  }
  std::string problem = "gRPC could not start a listener there";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const int rc = bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    close(fd);
    if (rc == 0) continue;
    if (err == EADDRINUSE) {
      problem = "the port is in use by another process (another ringmaster?); stop it or "
                "choose another port";
    } else if (err == EADDRNOTAVAIL) {
      problem = "it is not an address of this machine";
    } else if (err == EACCES) {
      problem = "permission denied (ports below 1024 need privileges)";
    } else {
      problem = strerror(err);
    }
    break;
  }
  freeaddrinfo(found);
  return problem;
}

// gRPC's callback server answers a request it cannot parse (a malformed protobuf) with
// UNIMPLEMENTED and no message, before any handler runs; our handlers never answer so. This
// interceptor turns that answer into what it is: INVALID_ARGUMENT saying the request is not a
// valid message of the method.
class MalformedRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(std::string method) : method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request to ", method_, " is not a valid protobuf message of its "
                         "request type (see proto/coordinator.proto); was it built from the "
                         "project's .proto files?")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class MalformedRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MalformedRequestInterceptor(info->method() != nullptr ? info->method() : "");
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      Coordinator* coordinator) {
  if ((options.user_token.empty() || options.node_token.empty()) &&
      !IsLoopbackAddress(options.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", options.listen,
        " is not a loopback address: give --user_token_file and --node_token_file, or "
        "listen on 127.0.0.1"));
  }
  RM_RETURN_IF_ERROR(CheckTlsMaterial(options.tls_cert, options.tls_key, options.tls_client_ca));
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (options.tls_cert.empty()) {
    credentials = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options.tls_client_ca;
    ssl.pem_key_cert_pairs.push_back({options.tls_key, options.tls_cert});
    credentials = grpc::SslServerCredentials(ssl);
  }

  std::unique_ptr<Server> server(new Server());
  server->job_service_ = std::make_unique<JobServiceImpl>(coordinator, options);
  server->worker_service_ = std::make_unique<WorkerServiceImpl>(coordinator, options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same address would then
  // serve too, and clients and agents would be split between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->worker_service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, ": ", ListenProblem(options.listen)));
  }
  Server* raw = server.get();
  server->ticker_ = std::thread([raw, coordinator, tick = options.tick] {
    while (!raw->stop_.WaitForNotificationWithTimeout(tick)) coordinator->Tick();
    coordinator->FailWaiters();
  });
  return server;
}

void Server::Shutdown() {
  if (stop_.HasBeenNotified()) return;
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();  // fails the waiting calls on its way out
  // Null when Start failed to listen (and destroys the half-made server).
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
}

void Server::Wait() { stop_.WaitForNotification(); }

Server::~Server() {
  Shutdown();
  if (server_ != nullptr) server_->Wait();
}

}  // namespace ringmaster::coordinator
