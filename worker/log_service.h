// The agent's AgentService (proto/coordinator.proto): the coordinator reads the logs of the
// trainers this agent ran, to stream them to users (JobService.Logs).
//
// What is served: <work_dir>/<job>/slot-<S>.log, for a (job, slot) this agent ran (Add),
// or found in the work directory when the service started (an earlier run of this agent
// wrote it), until the job is forgotten (Forget). Nothing else: the job must be a job id
// ([A-Za-z0-9._-], not "." or ".."), and neither the job's directory nor the log may be a
// symbolic link (they are opened with O_NOFOLLOW, relative to the work directory), so no
// request reaches a file outside it.
//
// Callers present the node token ("authorization: Bearer <node token>"): UNAUTHENTICATED
// without it, PERMISSION_DENIED when it is wrong. Without a node token configured, the
// service listens on loopback addresses only.
//
// Thread-safe: the agent's loop calls Add/SetRunning/Forget while gRPC threads serve reads;
// a read is one bounded pread (at most 1 MiB) on a gRPC thread.
#ifndef RINGMASTER_WORKER_LOG_SERVICE_H_
#define RINGMASTER_WORKER_LOG_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace ringmaster::worker {

struct LogServiceOptions {
  // host:port to listen on; port 0 picks a free one (see LogService::port()).
  std::string listen;
  // Asked of every caller; empty: none (then `listen` must be a loopback address).
  std::string node_token;
  // The agent's work directory (must exist).
  std::string work_dir;
};

class LogService {
 public:
  // Starts serving. INVALID_ARGUMENT for a non-loopback address without a node token or an
  // empty work_dir; UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<LogService>> Start(const LogServiceOptions& options);
  ~LogService();  // stops serving

  int port() const { return port_; }

  // The agent started a trainer of `job` on `slot` (its log may be served from now on).
  void Add(const std::string& job, int slot);
  // Whether that trainer still runs (ReadLogResponse.running).
  void SetRunning(const std::string& job, int slot, bool running);
  // The job was deleted: its logs are not served any more.
  void Forget(const std::string& job);

  // True for a job name that may be a path component here (a job id).
  static bool IsJobId(const std::string& job);

 private:
  class Service;
  LogService() = default;

  absl::Mutex mu_;
  // (job, slot) → its trainer runs.
  std::map<std::pair<std::string, int>, bool> served_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_LOG_SERVICE_H_
