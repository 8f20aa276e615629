// One trainer under a coordinator: the epoch loop of ARCHITECTURE.md, step 2 onwards.
//
//   join epoch e → rank, world (blocks until every member joined)
//   bootstrap a TCP communicator through the coordinator's store (prefix epoch-e/)
//   (the first epoch: load the data), restore from the latest checkpoint (resume: auto),
//   report Ready, train, reporting from a side thread each step's progress (rank 0: with
//   the last failed checkpoint save, which the job's status shows) and, rank 0, each
//   checkpoint committed (ReportCheckpoint; also the latest one when an epoch starts: a
//   drain save commits after its epoch ended, and that report is refused as stale)
//   - finished: report Finished; done.
//   - the coordinator announced epoch e' > e (its Progress answer):
//       drain or growth (the ring is whole): every rank votes to stop after the current
//       step, the job saves synchronously, leavers exit, the rest join e' and resume from
//       that checkpoint: no step is lost;
//       failure: the collective fails soon (a peer died), see below.
//   - a collective failed (a peer died or hung): report the error, abort the communicator,
//     learn the next epoch and join it.
//
// Restore in a new epoch (train::TrainerOptions::resident): each trainer keeps the state
// after the last step it completed in memory. With plain data parallelism (ZeRO-0) every
// survivor holds the whole state, so the ranks agree on the most recent step any of them
// holds and the first rank holding it broadcasts it to all, newcomers included: no step is
// trained again and nothing is read from disk. With ZeRO-1/2 a dead rank took its shard of
// the optimizer state with it, and when the latest checkpoint is more recent than every
// survivor's memory, the job resumes from that checkpoint, resharded to the new world.
#ifndef RINGMASTER_WORKER_ELASTIC_TRAINER_H_
#define RINGMASTER_WORKER_ELASTIC_TRAINER_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator.h"
#include "common/clock.h"
#include "proto/coordinator.pb.h"
#include "proto/job_spec.pb.h"
#include "train/model_factory.h"
#include "train/trainer.h"

namespace ringmaster::worker {

struct ElasticResult {
  train::TrainResult last;  // of the last epoch this trainer trained in
  int64_t epochs = 0;       // epochs trained in
  bool left = false;        // it left (drain) before the job finished
  int last_rank = -1;
};

struct ElasticTrainerOptions {
  // Not owned; carries this trainer's membership token.
  client::TrainerCalls* client = nullptr;
  std::string job;
  ringmaster::SlotRef slot;
  int64_t first_epoch = 1;
  // Effective and validated (the coordinator sent it so).
  JobSpec spec;
  // The address peers reach this trainer at, and the number of trainers on this host.
  std::string advertise_host = "127.0.0.1";
  int local_ranks = 1;
  absl::Duration op_timeout = absl::Seconds(60);
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long to wait for an epoch to commit (survivors of a job below min_ranks wait here
  // until the coordinator gives up on the job).
  absl::Duration join_timeout = absl::Minutes(30);
  // Rank 0's progress lines.
  std::function<void(const std::string&)> progress;
  // Set (SIGTERM) to leave: the job drains (synchronous save), this trainer exits.
  const std::atomic<bool>* leave_requested = nullptr;
  // Called once the job's training is complete on this rank, before the coordinator hears
  // so (the Finished call that can end the job): what must exist when the job shows
  // succeeded, e.g. rank 0's result file, is written here. An error is returned as is and
  // the coordinator is not told.
  std::function<absl::Status(const ElasticResult&)> before_finished;

  // Seams for tests; empty or null: the real ones.
  // Loads the job's data, once (train::LoadJobData).
  std::function<absl::StatusOr<train::JobData>(const train::TrainConfig&)> load_data;
  // Trains one epoch over the communicator the loop made (train::RunTraining): returns when
  // the job's training is done, when drain_requested is set (result.drained), or with the
  // error that ended the epoch.
  std::function<absl::StatusOr<train::TrainResult>(const train::TrainerOptions&)> train;
  // Times the wait for the next epoch (the coordinator is asked every 100 ms, until
  // join_timeout). Not owned.
  Clock* clock = Clock::Real();
};

// A later epoch of the run (JoinResponse.continues_run) resumes it: from a survivor's memory
// (a whole state: the new ranks get it broadcast, so a job without checkpoint.dir grows and
// shrinks), else the latest checkpoint.
// Errors: FAILED_PRECONDITION when the job ended (cancelled, failed) or cannot recover (a
// drained trainer of a job whose state is sharded and that has no checkpoint.dir); an error marked permanent (out of memory, a diverged run, a failed
// save with checkpoint.on_failure: fail) is reported so, and the coordinator fails the job
// without restarting it; the trainer exits non-zero.
absl::StatusOr<ElasticResult> RunElasticTrainer(const ElasticTrainerOptions& options);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_ELASTIC_TRAINER_H_
