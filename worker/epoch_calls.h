// The calls every rank of an elastic job (a built-in trainer, worker/elastic_trainer.h, or a
// command job's rank, worker/command_runner.h) makes between membership epochs.
//
// Thread-safety: the functions are safe to call from any thread the client allows. They
// block (NextEpoch until `timeout`).
#ifndef RINGMASTER_WORKER_EPOCH_CALLS_H_
#define RINGMASTER_WORKER_EPOCH_CALLS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator.h"
#include "common/clock.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::worker {

// Who asks: the job's id and this rank's slot, through `client` (not owned).
struct EpochCaller {
  client::TrainerCalls* client = nullptr;
  std::string job;
  ringmaster::SlotRef slot;
};

// The epoch after `epoch`, asked of the coordinator every 100 ms (by `clock`) until it has
// formed one. Errors: the coordinator's (NOT_FOUND is waited through), DEADLINE_EXCEEDED
// after `timeout`.
absl::StatusOr<int64_t> NextEpoch(const EpochCaller& caller, int64_t epoch,
                                  absl::Duration timeout, Clock* clock);

// Tells the coordinator that `epoch` failed under this rank: it re-forms the job, or fails it
// at once when the error is permanent (no restart can fix it) or excludes the node when it is
// this node's. A failure to report is logged (ABORTED: the epoch is over anyway).
// `failure`: a command job's program's failure, structured (ReportErrorRequest.failure); the
// coordinator keeps the earliest of an epoch's, also one reported after the epoch ended.
void ReportEpochError(const EpochCaller& caller, int64_t epoch, const absl::Status& error,
                      const ringmaster::RankFailure* failure = nullptr);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_EPOCH_CALLS_H_
