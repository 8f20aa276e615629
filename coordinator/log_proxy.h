// JobService.Logs: a trainer's log, read from the agent of its node (AgentService.ReadLog,
// with the node token) and streamed to the user, as `kubectl logs` goes through the API
// server to the kubelet.
//
// Each stream is a gRPC write reactor driven by a thread of its own (the reads from the
// agent and the waits of a follow block; a gRPC callback thread never does). At most
// `max_streams` run at once; one more is answered RESOURCE_EXHAUSTED.
//
// A stream reads the log from its start (or `tail_bytes` before its end) in chunks of
// `chunk_bytes`, one write in flight at a time. Without `follow` it ends at the end of the
// file; with it, it polls every `poll` until the job has ended (or was deleted) and the
// trainer is gone and everything is read, the call's deadline passes, or the client leaves.
// The agent unreachable or refusing ends the stream with its error, naming the node.
//
// Thread-safe. The destructor waits for the running streams' threads to return; the
// server owning the reactors must have been shut down first (that cancels the streams).
#ifndef RINGMASTER_COORDINATOR_LOG_PROXY_H_
#define RINGMASTER_COORDINATOR_LOG_PROXY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

namespace ringmaster::coordinator {

struct LogProxyOptions {
  // Presented to the agents ("Bearer <node token>"); empty: none.
  std::string node_token;
  int max_streams = 64;
  int chunk_bytes = 64 << 10;
  // How often a followed log is read again once its end was reached.
  absl::Duration poll = absl::Milliseconds(300);
  // Deadline of one read from an agent.
  absl::Duration agent_timeout = absl::Seconds(5);
};

class LogProxy {
 public:
  // `coordinator` is not owned and must outlive the proxy.
  LogProxy(Coordinator* coordinator, const LogProxyOptions& options);
  ~LogProxy();

  // The reactor for one Logs call. `auth` is the result of checking the caller's token:
  // an error ends the call with it at once.
  grpc::ServerWriteReactor<LogChunk>* Start(grpc::CallbackServerContext* ctx,
                                            const LogsRequest& request, const absl::Status& auth);

  // Streams running now (for tests).
  int active_streams() const;

 private:
  struct Shared;
  class Stream;

  Coordinator* const coordinator_;
  const LogProxyOptions options_;
  const std::shared_ptr<Shared> shared_;
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_LOG_PROXY_H_
