// How a rank's training state is spread over the ranks and how a step's gradients become
// every rank's update: the part of a step that data, fully sharded, tensor and pipeline
// parallelism each do their own way (ARCHITECTURE.md "trainer").
//
// A step with a strategy, on the training thread:
//   MaterializeParameters(params)        the parameters the forward needs are in place
//   BeginGradients(grads, diagnostics)   the backward starts writing `grads`
//   per micro-batch: BeginPass(kind), then the model's ForwardBackward with store() (when
//     not null), which asks for parameters and hands over gradients unit by unit; or,
//     without a store, GradientsReady(offset): every gradient at offset >= `offset` is final
//   ReduceGradients()                    this rank holds the reduced gradient of its pieces
//   (unscale, clip with sum(), the optimizer on update_window())
//   AfterOptimizerStep(params)           every rank's parameters are current again
// Every rank calls the same sequence: the collectives inside match.
//
// The step's buffers (`params` and `grads` of the trainer, local_elements() floats each)
// are the whole padded flat space for data parallelism and ZeRO-1, and a rank's shard of
// every unit for ZeRO-2/3 (train/fsdp_layout.h): pieces of the flat space at local offsets.
//
// Thread-safety: from the training thread only.
#ifndef RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_
#define RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/grad_sync.h"
#include "train/model.h"
#include "train/optim/sum_across_ranks.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

class PipelineParallel;  // train/pipeline_parallel.h

class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;

  // For the start-up line, e.g. "ZeRO-1; buckets 3 (25 MiB), overlap on".
  virtual std::string Describe() const = 0;
  // Elements of the step's parameter and gradient buffers this rank allocates.
  virtual int64_t local_elements() const = 0;
  // The part of the step's buffers that the optimizer updates (its spans), and the pieces of
  // the flat index space in it (`at` counted from the window's start): the optimizer keeps
  // state for them only.
  virtual state::FlatRange update_window() const = 0;
  virtual std::vector<state::PlacedRange> update_pieces() const = 0;
  // The pieces this rank writes to a checkpoint, `at` in the step's parameter buffer (the
  // ranks save disjoint parts that tile the flat space, so the save work is split N ways;
  // any stage and world size can load them).
  virtual std::vector<state::PlacedRange> saved_pieces() const = 0;
  // Whether every rank holds the whole training state (the survivors of an elastic job can
  // then restore from any one rank's memory).
  virtual bool whole_state_on_every_rank() const = 0;
  // Adds per-rank partial sums up over the ranks that share an update (clipping's norm,
  // LAMB's trust ratios, the loss scaler's overflow vote).
  virtual const SumAcrossRanks& sum() const = 0;

  // The parameters the forward reads are in place; `params` is the step's parameter buffer
  // (ZeRO-3 gathers from it until ReduceGradients or EndEvaluation). Also before an
  // evaluation.
  virtual absl::Status MaterializeParameters(absl::Span<float> params) = 0;
  // Where the model reads its parameters and writes its gradients (ForwardBackwardOptions::
  // store), or null: `params` and `grads` whole.
  virtual ParameterStore* store() { return nullptr; }
  // Before each model pass with store(): a micro-batch whose gradients count, one run only to
  // take part in the ranks' collectives (a rank with no sample in this micro-batch: its
  // gradients count as zero), or an evaluation (forward only; end it with EndEvaluation).
  enum class Pass { kTrain, kDiscard, kEvaluate };
  virtual void BeginPass(Pass pass) {}
  virtual absl::Status EndEvaluation() { return absl::OkStatus(); }
  virtual void BeginGradients(float* grads, bool measure_local_norm) = 0;
  virtual void GradientsReady(int64_t offset) = 0;
  // Blocks until this rank holds the reduced gradient of owned(); the communicator's error
  // otherwise (the step must not be applied).
  virtual absl::Status ReduceGradients() = 0;
  virtual const GradientSyncStats& last_step() const = 0;
  // Each gradient bucket's reductions since the strategy was made (data parallelism's
  // buckets, ZeRO-2's stripes, ZeRO-3's units), in launch order; empty where none are
  // counted. Any thread.
  virtual std::vector<BucketCounters> bucket_counters() const { return {}; }
  // After the optimizer updated update_window() of `params` (the step's buffer), or after
  // a restore wrote it: every rank's parameters are current again.
  virtual absl::Status AfterOptimizerStep(absl::Span<float> params) = 0;
  // The whole parameters in table order into `whole` (table.total_elements() floats of host
  // memory) from the step's parameter buffer `params` (host memory for data parallelism,
  // whose default copies it; the strategy's memory under ZeRO-2/3, which gathers every unit:
  // every rank calls it then). For on_finish and the like, not for steps.
  virtual absl::Status WholeParameters(absl::Span<float> params, absl::Span<float> whole) {
    std::copy_n(params.data(), whole.size(), whole.data());
    return absl::OkStatus();
  }
  // With a store: the whole parameters every rank computes with when it keeps them (ZeRO-2's
  // compute copy, table order), else null (ZeRO-3).
  virtual const float* replicated_parameters() const { return nullptr; }
  // Bytes of unit buffers (gathered parameters, unreduced gradients, staging) this strategy
  // holds now and at most so far; 0 for data parallelism.
  virtual int64_t unit_buffer_bytes_peak() const { return 0; }
  // Ranges of the update window (offsets from its start) whose gradients this rank holds
  // but another rank counts in the gradients' norm (tensor parallelism's replicated tensors).
  virtual std::vector<state::FlatRange> duplicate_ranges() const { return {}; }
  // Pipeline parallelism's step, which runs the model's stages itself (RunStep instead of
  // the model's ForwardBackward per micro-batch); null for the other strategies.
  virtual PipelineParallel* pipeline() { return nullptr; }
  // The model the steps and evaluations run when it is not the job's whole model (a
  // tensor-parallel shard, whose table lays out the store's units), else null.
  virtual Model* step_model() { return nullptr; }
  // The pieces of the flat space this rank's step buffer holds (`at` there), every one of
  // which a restore fills: saved_pieces() where the ranks' pieces are disjoint; more where
  // tensor-parallel ranks each hold a replicated tensor that only one of them saves.
  virtual std::vector<state::PlacedRange> held_pieces() const { return saved_pieces(); }
};

struct DataParallelOptions {
  // Elements of the model's table (unpadded).
  int64_t elements = 0;
  // 0: every rank keeps the whole state; 1: each keeps the optimizer state of its shard;
  // 2: and only its shard of the reduced gradient (reduce-scatter).
  int zero_stage = 0;
  double bucket_mb = 25;
  bool overlap = true;
  absl::Duration op_timeout = absl::Seconds(120);
  // The step's memory (the device's, or the host's) and the reducing thread's.
  VectorOps* ops = HostVectorOps();
  VectorOps* comm_ops = HostVectorOps();
};

// Data parallelism (with ZeRO-1/2): every rank runs the whole model on its share of the
// batch, the gradients are summed in buckets overlapped with backward over `comm` (device
// memory when the step runs on a GPU), partial sums over `host_comm` (host memory). Neither
// is owned; both outlive the strategy and have the same ranks.
absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateDataParallel(
    comm::Communicator* comm, comm::Communicator* host_comm, const DataParallelOptions& options);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_
