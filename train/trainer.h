// The trainer: one rank of a data-parallel job (ARCHITECTURE.md, "trainer").
//
// A Trainer builds the model, data, optimizer and parallel strategy a TrainConfig describes
// (config/train_config.h makes one from a JobSpec) and runs the step loop over a
// communicator that the caller made (rank, world and bootstrap come from outside: a
// FileStore for `ringctl local`, the coordinator's store in a cluster). Every rank runs the
// same sequence of collectives. It is made of parts, each in its own file:
//   model_factory.h     the data and the model a config names
//   rank_memory.h       the memory a rank's state needs, checked before allocating it
//   parallel_strategy.h how the state is spread over the ranks and gradients reduced
//   host_view.h         the host's copy of a GPU's state
//   restore.h           the start: survivors' memory or a checkpoint
//   checkpoint_policy.h when saves happen and how the ranks agree on them
//   step_reporter.h     progress lines and metrics; fingerprint.h the ranks' hashes
//
// One step: the global batch B (fixed by the job) is drawn from the sampler; this rank
// runs its share in `accumulation` micro-batches (derived from B, the world size and
// batch.micro_max); gradients of the last micro-batch are reduced in buckets while its
// backward runs; then (fp16) unscale and overflow check, clipping by global norm, the
// optimizer on this rank's range (the whole model, or its ZeRO shard), and for ZeRO the
// parameters are all-gathered.
//
// Progress and metrics: rank 0 prints a progress line every log_every steps
// (and the effective settings at start) through `progress`, and appends one JSON object
// per logged step to metrics.jsonl when set. Every diagnostics.fingerprint_every steps the
// ranks compare per-tensor hashes of their parameters (one small all-gather); a mismatch
// stops the job with INTERNAL naming the first tensor that differs.
//
// Device (spec.device): on a GPU (train/device.h) the flat parameters, gradients and optimizer
// state live in its memory, the model's forward and backward and the optimizer run there,
// gradient buckets are reduced from a second stream's thread once the backward that made
// them is done, and the host keeps copies only for checkpoints, fingerprints, evaluation and
// the resident state.
//
// Checkpoints (checkpoint.dir): a save runs in the background while training goes on. The
// ranks agree on how saves went: each rank counts the saves it failed itself (a full disk,
// an I/O error), the counts are summed in every step's control all-reduce and, when the sum
// grows, the ranks all-gather what failed, so rank 0 stops waiting for a rank that could not
// even report its failure (checkpoint/writer.h ReportPeerFailure) and a failed save costs at
// most about a step. Before a save that waits for the previous one (on_busy: wait, and the
// synchronous drain and last saves) every rank waits for its own part of it, not for rank
// 0's commit, and the ranks agree first; a save that some rank's unfinished part (a slow
// or stuck disk) would hold up for more than op_timeout is skipped by every rank, and said
// so. With checkpoint.on_failure: fail, every rank then stops with the failure (marked
// permanent); with continue, rank 0 says what failed (cause and path) and the next due
// save tries again.
//
// Errors: INVALID_ARGUMENT (spec the engine cannot run, naming the field), NOT_FOUND /
// DATA_LOSS from the data, and the communicator's ABORTED / UNAVAILABLE /
// DEADLINE_EXCEEDED when a peer fails; a failed checkpoint with on_failure: fail (the
// save's code: RESOURCE_EXHAUSTED for a full disk); a diverged run (a loss, or without
// fp16's loss scaler a gradient norm, that is not finite: FAILED_PRECONDITION) and running
// out of memory (RESOURCE_EXHAUSTED, naming what was being allocated) are marked permanent.
// Blocks until the job ends.
#ifndef RINGMASTER_TRAIN_TRAINER_H_
#define RINGMASTER_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "common/env.h"
#include "train/checkpoint_policy.h"
#include "train/config.h"
#include "train/data/dataset.h"
#include "train/grad_sync.h"
#include "train/model.h"
#include "train/restore.h"
#include "train/result.pb.h"

namespace ringmaster::train {

// One of the trainer's communicators and its counters (RankStats.comm_ops).
struct CommGroupCounters {
  // "world" (the job's: the host collectives'); the gradients' communicator, when it is
  // another, by its backend ("nccl": the GPUs'); a mesh group "dp", "tp", "pp"; or a mesh
  // group's NCCL split "dp/nccl", "tp/nccl", "pp/nccl".
  std::string group;
  int size = 0;
  comm::Counters counters;
};

// What a rank knows after each step (TrainerOptions::on_step).
struct StepReport {
  int64_t step = 0;         // steps done (1 after the first)
  int64_t total_steps = 0;
  double loss = 0;          // the step's mean loss, the same on every rank
  double grad_norm = 0;     // global, after unscaling; 0 for a skipped step
  absl::Duration step_time;   // wall time of this step on this rank
  absl::Duration comm_time;   // inside the step's gradient collectives
  // The job's rate now, as the progress line says it (common/progress_rate.h: over the
  // last 30 s of steps; StepReporter::rates): steps per second, and samples and tokens per
  // second of all ranks together (steps/s times the global batch; tokens: language models,
  // else 0). 0 before the first step.
  double steps_per_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  // Over the last logging window (StepReporter::Window): the share of the window this
  // rank's training thread waited for collectives. 0 before the first window ends.
  double exposed_comm_fraction = 0;
  double lr = 0;          // the step's learning rate
  double loss_scale = 0;  // fp16's loss scale after the step; 0 without a loss scaler
  // Rank 0: the last checkpoint save that failed so far (its error names the cause and the
  // path); -1 and empty while none has.
  int64_t checkpoint_error_step = -1;
  std::string checkpoint_error;
  // This trainer's communication since it started, per communicator (counters only grow),
  // and per gradient bucket (ParallelStrategy::bucket_counters); the steps it ran (not the
  // job's: those since this trainer restored its state).
  std::vector<CommGroupCounters> comm;
  std::vector<BucketCounters> buckets;
  int64_t steps_run = 0;
};

struct TrainerOptions {
  // What to train (config/train_config.h TrainConfigFromSpec makes it from a job spec).
  TrainConfig config;
  // Not owned; its rank and size are this rank's. It reduces the gradients: host memory on
  // the CPU, the GPU's memory with a device (NCCL, or TCP staging through the host).
  comm::Communicator* comm = nullptr;
  // Collectives over host memory (the per-step control sums, ZeRO's sums across ranks,
  // restores, fingerprints), for a `comm` that takes device memory only (NCCL). Null: comm.
  // Same ranks as comm. Not owned.
  comm::Communicator* host_comm = nullptr;
  // Where the trainer bootstraps an NCCL communicator for the gradients when it trains on
  // a GPU and config.backend allows it (auto: every rank has its own GPU; nccl: required;
  // train/gradient_backend.h): the Store NCCL's unique id travels through (the
  // coordinator's in a cluster) and a key prefix fresh for this communicator, e.g. the
  // epoch's prefix + "nccl". `comm` then carries the host collectives. Every rank of the job
  // sets it, or none does. Null: the gradients go over `comm` (and backend: nccl fails,
  // naming the field). Not owned.
  comm::Store* nccl_store = nullptr;
  std::string nccl_prefix;
  // This rank's index among its node's ranks (its slot): with a device it trains on GPU
  // gpu % (GPUs the process sees), so a node with fewer GPUs than ranks shares them (their
  // gradients then go through the TCP backend's host staging). -1: 0.
  int gpu = -1;
  // Ranks on this host (for the default thread count: cores / local ranks).
  int local_ranks = 1;
  // Deadline of each collective.
  absl::Duration op_timeout = absl::Seconds(120);
  // Where rank 0's progress lines go (e.g. stdout). Empty: nowhere.
  std::function<void(const std::string& line)> progress;
  // Data to train (and evaluate) on instead of loading spec.data, e.g. synthetic data in
  // tests. Not owned; must outlive the call. test_data may stay null (no evaluation).
  const data::Dataset* train_data = nullptr;
  const data::Dataset* test_data = nullptr;
  // Called once after the last step with the final parameters (e.g. to compare runs).
  std::function<void(const state::TensorTable& table, const state::FlatBuffer& params)> on_finish;
  // Set (e.g. from a SIGTERM handler) to drain: the ranks agree to stop after the current
  // step and, when the job checkpoints, save synchronously within
  // checkpoint.drain_grace_seconds first. Not owned; may be null.
  const std::atomic<bool>* drain_requested = nullptr;
  // checkpoint.every: auto: the job's preemptions per hour as the cluster signals them (the
  // elastic trainer stores the coordinator's ProgressResponse.preemption_rate_per_hour).
  // Not owned; may be null (the configured rate only).
  const std::atomic<double>* preemption_rate_per_hour = nullptr;
  // Set (e.g. from a SIGUSR1 handler) to save a checkpoint after the current step (on
  // demand); cleared when taken. Not owned; may be null.
  std::atomic<bool>* save_requested = nullptr;
  // Stop (like a drain) once the job has taken this many steps; 0: run to the end.
  int64_t stop_at_step = 0;
  // The filesystem checkpoints are written through; null: the real one. A test seam
  // (e.g. common/fault_injection_env.h's full disk). Not owned.
  Env* checkpoint_env = nullptr;
  // Called once on every rank when the model, data and optimizer state are ready (after a
  // resume), just before the first step, with that step's index. An error stops the run.
  std::function<absl::Status(int64_t first_step)> on_restored;
  // Called once on every rank right after the state is restored, before on_restored: where
  // it came from and, when a survivor's memory could not be used, why (the elastic trainer
  // tells the coordinator, and says how many steps a recovery lost).
  std::function<void(const Restored&)> on_resumed;
  // Called on every rank after each step (after its drain/save decision), on the training
  // thread: keep it short (e.g. hand the report to another thread).
  std::function<void(const StepReport&)> on_step;
  // Called on rank 0, on the training thread (keep it short), for the latest committed
  // checkpoint of the job when the run starts (if any), then for each checkpoint this run
  // commits, within a step of its commit.
  std::function<void(const CommittedCheckpoint&)> on_checkpoint;
  // In and out; every rank of the job passes one, or none does. In: with resume "auto" and
  // ZeRO-0 the ranks all-gather the steps they hold in memory and the latest checkpoint's
  // step (rank 0's view); when some rank holds a step at least as recent as the checkpoint,
  // the first such rank broadcasts its state (parameters, moments, sampler, loss scale,
  // optimizer step) and no checkpoint is read. Cleared once restored (memory is not held
  // twice). Out: the state after the last completed step (see ResidentState). Not owned.
  ResidentState* resident = nullptr;
};


// Builds a rank's trainer: loads the data (unless given), creates the model, chooses the
// device and the gradients' communicator, allocates the state and restores it (see
// TrainerOptions::resident and checkpoint.resume). Every rank calls it (it runs
// collectives). Errors as RunTraining's.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  // Keeps the state in TrainerOptions::resident (see ResidentState) and, when the run did not
  // finish, aborts the gradients' own communicator (NCCL) instead of waiting for peers that
  // may be gone.
  ~Trainer();

  // Steps done so far (the first step's index before the first Step()), and in all.
  int64_t steps_done() const;
  int64_t total_steps() const;
  // True once the last step ran or the ranks agreed to stop (drain, stop_at_step).
  bool finished() const;

  // One training step on every rank; then the saves, fingerprints, evaluation and reports it
  // triggers. An error ends the run (the communicator may be broken): later calls return it
  // again. FAILED_PRECONDITION once finished().
  absl::Status Step();

  // Steps until finished(), then waits for the last save, evaluates and reports.
  absl::StatusOr<TrainResult> Run();

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  absl::Status StepOnce();
  std::unique_ptr<State> s_;
};

// Create + Run. Blocks until the job ends.
absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& options);

// The result (train/result.proto) as one line of JSON, with a newline (ringtrainer's
// --summary, which ringctl local reads): protobuf's JSON mapping, compact; a value not
// measured or not finite (eval_accuracy without test data) is left out.
std::string TrainResultJson(const TrainResult& result);

// For a trainer program's main(), first thing (before flags and threads): the BLAS kernels
// this CPU runs, re-executing the program when OpenBLAS did not recognise the CPU
// (kernels::UseBestBlasKernels, kernels/matmul.h). Returns what it found or did, or "" when
// there was nothing to say; the trainer's start lines repeat it.
std::string UseBestCpuKernels(char** argv);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TRAINER_H_
