// comm::Store over the coordinator's per-job bootstrap store (WorkerService.Store*): how
// the trainers of one epoch find each other when a coordinator runs the job. Keys are
// scoped to the job; the coordinator clears them when an epoch commits, so each epoch's
// communicator bootstraps from a clean store.
//
// Thread-safe (the client is).
#ifndef RINGMASTER_CLIENT_COORDINATOR_STORE_H_
#define RINGMASTER_CLIENT_COORDINATOR_STORE_H_

#include <string>
#include <vector>

#include "client/coordinator.h"
#include "comm/store.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::client {

class CoordinatorStore final : public comm::Store {
 public:
  // `client` is not owned and must carry the membership token of (job, slot). `epoch`: the
  // membership epoch the caller joined (its calls are ABORTED once the job has moved on;
  // the coordinator refuses one below 1 with INVALID_ARGUMENT).
  CoordinatorStore(TrainerCalls* client, std::string job, ringmaster::SlotRef slot,
                   int64_t epoch)
      : client_(client), job_(std::move(job)), slot_(std::move(slot)), epoch_(epoch) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  TrainerCalls* const client_;
  const std::string job_;
  const ringmaster::SlotRef slot_;
  const int64_t epoch_;
};

}  // namespace ringmaster::client

#endif  // RINGMASTER_CLIENT_COORDINATOR_STORE_H_
