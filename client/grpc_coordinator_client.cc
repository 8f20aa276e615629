#include "client/grpc_coordinator_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace ringmaster::client {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::Status ReadTlsFiles(const TlsFiles& files, CoordinatorClientOptions* options) {
  struct {
    const char* flag;
    const std::string& path;
    std::string* into;
    bool secret;
  } reads[] = {{"--tls_ca", files.ca, &options->tls_ca, false},
               {"--tls_client_cert", files.client_cert, &options->tls_client_cert, false},
               {"--tls_client_key", files.client_key, &options->tls_client_key, true}};
  for (const auto& r : reads) {
    if (r.path.empty()) continue;
    absl::StatusOr<std::string> text = r.secret ? ReadSecretFile(r.path) : ReadFile(r.path);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat(r.flag, ": ", text.status().message()));
    }
    *r.into = *std::move(text);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> GrpcCoordinatorClient::Create(
    const CoordinatorClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("the coordinator's address is empty (--coordinator)");
  }
  if (options.tls_client_cert.empty() != options.tls_client_key.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs its key, and the key its "
                                      "certificate");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca.empty() && options.tls_client_cert.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca;
    ssl.pem_cert_chain = options.tls_client_cert;
    ssl.pem_private_key = options.tls_client_key;
    credentials = grpc::SslCredentials(ssl);
  }
  // Reconnect quickly after the coordinator restarts: gRPC's default backoff grows to
  // minutes, during which every call fails at once.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return std::unique_ptr<GrpcCoordinatorClient>(new GrpcCoordinatorClient(
      options, grpc::CreateCustomChannel(options.address, credentials, args)));
}

GrpcCoordinatorClient::GrpcCoordinatorClient(const CoordinatorClientOptions& options,
                                             std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      channel_(std::move(channel)),
      jobs_(JobService::NewStub(channel_)),
      workers_(WorkerService::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> GrpcCoordinatorClient::Context(absl::Time deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  ctx->set_deadline(absl::ToChronoTime(deadline));
  return ctx;
}

namespace {

enum class TcpProbe { kRefused, kAccepted, kNoAnswer, kUnknown };

// A plain TCP connect to `address` (HOST:PORT or [V6]:PORT), within `timeout`: whether
// something listens there. gRPC's message alone does not say: a call cut by its deadline while
// the channel connects reads "tcp handshaker shutdown" whether or not anything listens.
TcpProbe ProbeTcp(const std::string& address, absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return TcpProbe::kUnknown;
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return TcpProbe::kUnknown;
  }
  TcpProbe result = TcpProbe::kUnknown;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = connect(fd, found->ai_addr, found->ai_addrlen);
    int error = rc == 0 ? 0 : errno;
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
        socklen_t len = sizeof(error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      } else {
        error = ETIMEDOUT;
      }
    }
    result = error == 0              ? TcpProbe::kAccepted
             : error == ECONNREFUSED ? TcpProbe::kRefused
             : error == ETIMEDOUT    ? TcpProbe::kNoAnswer
                                     : TcpProbe::kUnknown;
    close(fd);
  }
  freeaddrinfo(found);
  return result;
}

}  // namespace

std::string GrpcCoordinatorClient::UnreachableHint(absl::string_view message) const {
  const bool tls = !options_.tls_ca.empty() || !options_.tls_client_cert.empty();
  constexpr char kNothingListens[] =
      " (nothing listens there: is ringmaster running, and is the address right?)";
  if (absl::StrContains(message, "onnection refused")) return kNothingListens;
  if (absl::StrContains(message, "handshake")) {
    switch (ProbeTcp(options_.address, absl::Seconds(1))) {
      case TcpProbe::kRefused:
        return kNothingListens;
      case TcpProbe::kNoAnswer:
        return " (no answer from there within 1 s: is the address right, and is no firewall in "
               "the way?)";
      case TcpProbe::kAccepted:
      case TcpProbe::kUnknown:
        break;
    }
    // gRPC says only that the handshake was cut: a plaintext client on a TLS port, or a TLS
    // client on a plaintext one (or a certificate the CA did not sign).
    return tls ? " (the TLS handshake failed: does it serve TLS, with a certificate that "
                 "--tls_ca signed?)"
               : " (it may serve TLS: give its CA with --tls_ca)";
  }
  return "";
}

template <typename Stub, typename Request, typename Response>
absl::Status GrpcCoordinatorClient::Call(
    Stub* stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, Response* response, absl::Time deadline) {
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    auto ctx = Context(deadline);
    absl::Status s = FromGrpc((stub->*method)(ctx.get(), request, response));
    if (!absl::IsUnavailable(s)) return s;
    const absl::Time now = absl::Now();
    if (now + backoff >= std::min(give_up, deadline)) {
      return absl::UnavailableError(absl::StrCat("the coordinator at ", options_.address,
                                                 " cannot be reached: ", s.message(),
                                                 UnreachableHint(s.message())));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

#define RM_CLIENT_UNARY(stub, Method, Request, Response)                                  \
  absl::StatusOr<Response> GrpcCoordinatorClient::Method(const Request& request) {            \
    Response response;                                                                    \
    RM_RETURN_IF_ERROR(Call(stub.get(), &std::remove_reference_t<decltype(*stub)>::Method, \
                            request, &response, absl::Now() + options_.rpc_timeout));     \
    return response;                                                                      \
  }

RM_CLIENT_UNARY(workers_, RegisterNode, RegisterNodeRequest, RegisterNodeResponse)
RM_CLIENT_UNARY(workers_, Heartbeat, HeartbeatRequest, HeartbeatResponse)
RM_CLIENT_UNARY(workers_, Progress, ProgressRequest, ProgressResponse)
RM_CLIENT_UNARY(workers_, StoreAdd, StoreAddRequest, StoreAddResponse)
#undef RM_CLIENT_UNARY

#define RM_CLIENT_STATUS(Method, Request, Response)                                          \
  absl::Status GrpcCoordinatorClient::Method(const Request& request) {                           \
    Response response;                                                                       \
    return Call(workers_.get(), &WorkerService::Stub::Method, request, &response,            \
                absl::Now() + options_.rpc_timeout);                                         \
  }

RM_CLIENT_STATUS(DrainNode, DrainNodeRequest, DrainNodeResponse)
RM_CLIENT_STATUS(TrainerExited, TrainerExitedRequest, TrainerExitedResponse)
RM_CLIENT_STATUS(Ready, ReadyRequest, ReadyResponse)
RM_CLIENT_STATUS(ReportError, ReportErrorRequest, ReportErrorResponse)
RM_CLIENT_STATUS(Finished, FinishedRequest, FinishedResponse)
RM_CLIENT_STATUS(ReportCheckpoint, ReportCheckpointRequest, ReportCheckpointResponse)
RM_CLIENT_STATUS(StoreSet, StoreSetRequest, StoreSetResponse)
#undef RM_CLIENT_STATUS

absl::StatusOr<Job> GrpcCoordinatorClient::Submit(const JobSpec& spec) {
  SubmitRequest request;
  *request.mutable_spec() = spec;
  Job job;
  RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::Submit, request, &job,
                          absl::Now() + options_.rpc_timeout));
  return job;
}

absl::StatusOr<Job> GrpcCoordinatorClient::Get(const std::string& id) {
  GetJobRequest request;
  request.set_job(id);
  Job job;
  RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::Get, request, &job,
                          absl::Now() + options_.rpc_timeout));
  return job;
}

absl::StatusOr<std::vector<Job>> GrpcCoordinatorClient::List(bool include_finished) {
  ListJobsRequest request;
  request.set_include_finished(include_finished);
  std::vector<Job> jobs;
  do {  // page by page
    ListJobsResponse response;
    RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::List, request, &response,
                            absl::Now() + options_.rpc_timeout));
    for (Job& job : *response.mutable_jobs()) jobs.push_back(std::move(job));
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return jobs;
}

absl::StatusOr<Job> GrpcCoordinatorClient::Cancel(const std::string& id) {
  CancelJobRequest request;
  request.set_job(id);
  Job job;
  RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::Cancel, request, &job,
                          absl::Now() + options_.rpc_timeout));
  return job;
}

absl::Status GrpcCoordinatorClient::Watch(const std::string& job, absl::Time deadline,
                                      const std::function<bool(const JobEvent&)>& on_event) {
  int64_t version = 0;
  while (absl::Now() < deadline) {
    WatchJobRequest request;
    request.set_job(job);
    request.set_after_version(version);
    auto ctx = Context(std::min(deadline, absl::Now() + options_.wait_step));
    auto stream = jobs_->Watch(ctx.get(), request);
    JobEvent event;
    while (stream->Read(&event)) {
      version = event.version();
      if (!on_event(event)) {
        ctx->TryCancel();
        stream->Finish().ok();
        return absl::OkStatus();
      }
      const ringmaster::JobPhase phase = event.job().phase();
      if (phase == JOB_PHASE_SUCCEEDED || phase == JOB_PHASE_FAILED ||
          phase == JOB_PHASE_CANCELLED) {
        stream->Finish().ok();
        return absl::OkStatus();
      }
    }
    absl::Status s = FromGrpc(stream->Finish());
    if (!s.ok() && !absl::IsDeadlineExceeded(s) && !absl::IsUnavailable(s)) return s;
    if (absl::IsUnavailable(s)) absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job, " still running"));
}

absl::StatusOr<DeleteJobResponse> GrpcCoordinatorClient::Delete(const std::string& id) {
  DeleteJobRequest request;
  request.set_job(id);
  DeleteJobResponse response;
  RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::Delete, request, &response,
                          absl::Now() + options_.rpc_timeout));
  return response;
}

absl::StatusOr<ListNodesResponse> GrpcCoordinatorClient::ListNodes() {
  ListNodesResponse response;
  RM_RETURN_IF_ERROR(Call(jobs_.get(), &JobService::Stub::ListNodes, ListNodesRequest(),
                          &response, absl::Now() + options_.rpc_timeout));
  return response;
}

absl::Status GrpcCoordinatorClient::Logs(const LogsRequest& request, absl::Time deadline,
                                     const std::function<bool(const LogChunk&)>& on_chunk) {
  auto ctx = Context(deadline);
  auto stream = jobs_->Logs(ctx.get(), request);
  LogChunk chunk;
  while (stream->Read(&chunk)) {
    if (!on_chunk(chunk)) {
      ctx->TryCancel();
      stream->Finish().ok();
      return absl::OkStatus();
    }
  }
  absl::Status s = FromGrpc(stream->Finish());
  if (absl::IsDeadlineExceeded(s) && request.follow()) return absl::OkStatus();
  return s;
}

absl::StatusOr<JoinResponse> GrpcCoordinatorClient::Join(const JoinRequest& request,
                                                     absl::Time deadline) {
  while (true) {
    JoinResponse response;
    absl::Status s = Call(workers_.get(), &WorkerService::Stub::Join, request, &response,
                          std::min(deadline, absl::Now() + options_.wait_step));
    if (s.ok()) return response;
    if (!absl::IsDeadlineExceeded(s) || absl::Now() >= deadline) return s;
  }
}

absl::StatusOr<StoreGetResponse> GrpcCoordinatorClient::StoreGet(const StoreGetRequest& request,
                                                             absl::Time deadline) {
  while (true) {
    StoreGetResponse response;
    absl::Status s = Call(workers_.get(), &WorkerService::Stub::StoreGet, request, &response,
                          std::min(deadline, absl::Now() + options_.wait_step));
    if (s.ok()) return response;
    if (!absl::IsDeadlineExceeded(s) || absl::Now() >= deadline) return s;
  }
}

}  // namespace ringmaster::client
