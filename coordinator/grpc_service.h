// The gRPC face of the coordinator: JobService and WorkerService as callback services whose
// handlers check the caller's token, translate protos and hand Coordinator a completion;
// none blocks a gRPC thread (Join, StoreGet and Watch complete when the coordinator says).
//
// Logs is proxied to the agent that ran the trainer (coordinator/log_proxy.h).
//
// Also: Server, which owns a grpc::Server with both services and the standard health
// service, and the thread that ticks the coordinator.
#ifndef RINGMASTER_COORDINATOR_GRPC_SERVICE_H_
#define RINGMASTER_COORDINATOR_GRPC_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/auth.h"  // IsLoopbackAddress
#include "coordinator/coordinator.h"
#include "coordinator/log_proxy.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

namespace ringmaster::coordinator {

struct ServerOptions {
  // host:port; port 0 picks a free one (see Server::port()).
  std::string listen = "127.0.0.1:0";
  // Empty: no token is asked for; then `listen` must be a loopback address.
  std::string user_token;
  std::string node_token;
  // PEM file contents; empty cert and key: plaintext. client_ca set: clients must present a
  // certificate it signed (mutual TLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Longest a waiting call (Join, StoreGet, one Watch step) is held without a deadline.
  absl::Duration max_wait = absl::Seconds(60);
  // Largest request accepted.
  int max_message_bytes = 4 << 20;
  // How often the coordinator's timeouts are checked.
  absl::Duration tick = absl::Milliseconds(50);
  // Logs streams (JobService.Logs) served at once, each with a thread of its own.
  int max_log_streams = 64;
};

class Server {
 public:
  // Starts serving. Errors: INVALID_ARGUMENT for a non-loopback address without tokens, or
  // half a TLS configuration; UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       Coordinator* coordinator);
  ~Server();  // Shutdown()

  int port() const { return port_; }
  // Stops accepting calls, fails waiting ones, stops ticking. Idempotent.
  void Shutdown();
  // Blocks until Shutdown().
  void Wait();

 private:
  Server() = default;
  std::unique_ptr<grpc::Service> job_service_;
  std::unique_ptr<grpc::Service> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread ticker_;
  absl::Notification stop_;
  int port_ = 0;
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_GRPC_SERVICE_H_
