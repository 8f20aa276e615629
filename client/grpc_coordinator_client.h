// The coordinator's calls (client/coordinator.h) over gRPC, for agents, trainers and
// ringctl: one channel, the caller's bearer token on every call, gRPC errors as absl::Status with
// the same code and message.
//
// Retries: a call that fails with UNAVAILABLE (the coordinator restarting, a network
// blip) is retried with backoff until `retry_for` has passed, so a kill -9 and restart of
// the coordinator looks like a slow call. Waiting calls (Join, StoreGet) are re-issued in
// steps of at most `wait_step` until their own deadline.
//
// Thread-safe.
#ifndef RINGMASTER_CLIENT_GRPC_COORDINATOR_CLIENT_H_
#define RINGMASTER_CLIENT_GRPC_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

namespace ringmaster::client {

struct CoordinatorClientOptions {
  std::string address;  // host:port
  // User, node or membership token, by who calls. Empty: none sent.
  std::string token;
  // PEM CA of the coordinator's certificate; empty: plaintext. With client_cert/key:
  // mutual TLS.
  std::string tls_ca;
  std::string tls_client_cert;
  std::string tls_client_key;
  // Deadline of one call that does not wait.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // How long UNAVAILABLE is retried.
  absl::Duration retry_for = absl::Seconds(30);
  // Longest single wait of Join/StoreGet before it is re-issued.
  absl::Duration wait_step = absl::Seconds(20);
};

class GrpcCoordinatorClient final : public Coordinator {
 public:
  // INVALID_ARGUMENT for an empty address or half a TLS client configuration.
  static absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> Create(
      const CoordinatorClientOptions& options);

  // client/coordinator.h has the contracts. Unary calls are retried on UNAVAILABLE (above);
  // Watch re-opens its stream; Logs is not retried.
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

  absl::StatusOr<RegisterNodeResponse> RegisterNode(const RegisterNodeRequest& request) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::Status DrainNode(const DrainNodeRequest& request) override;
  absl::Status TrainerExited(const TrainerExitedRequest& request) override;

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

 private:
  GrpcCoordinatorClient(const CoordinatorClientOptions& options,
                        std::shared_ptr<grpc::Channel> channel);
  std::unique_ptr<grpc::ClientContext> Context(absl::Time deadline) const;
  // What to check when the coordinator cannot be reached (TLS on one side only, nothing
  // listening), from gRPC's message and, when that is ambiguous, a plain TCP connect to the
  // address (up to 1 s); empty when there is nothing to add.
  std::string UnreachableHint(absl::string_view message) const;
  // One unary call with the UNAVAILABLE retries.
  template <typename Stub, typename Request, typename Response>
  absl::Status Call(Stub* stub,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Time deadline);

  const CoordinatorClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<JobService::Stub> jobs_;
  std::unique_ptr<WorkerService::Stub> workers_;
};

// The TLS files a client is given by its flags (--tls_ca, --tls_client_cert,
// --tls_client_key); empty paths are not read.
struct TlsFiles {
  std::string ca;
  std::string client_cert;
  std::string client_key;
};
// Reads them into `options` (the key as a secret: common/file_util.h ReadSecretFile).
// Errors name the flag and the file.
absl::Status ReadTlsFiles(const TlsFiles& files, CoordinatorClientOptions* options);

// grpc::Status → absl::Status (same code and message).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace ringmaster::client

#endif  // RINGMASTER_CLIENT_GRPC_COORDINATOR_CLIENT_H_
