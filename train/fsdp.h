// Sharded data parallelism: ZeRO-2 and ZeRO-3 (fully sharded, FSDP) as a ParallelStrategy
// that is also the model's ParameterStore (train/model.h).
//
// The flat index space is cut into units (train/fsdp_layout.h); a rank's step buffers hold
// its piece of every unit: the fp32 master parameters, the reduced gradients and (in the
// optimizer) the moments, 1/N of each.
//
// ZeRO-3, one micro-batch (a pass):
//   forward   the model asks for a group's parameters: its unit is all-gathered (from the
//             pieces, rounded to the compute precision, over the wire in 16 bits under
//             bf16/fp16) into a unit buffer, unless already there; with forward prefetch the
//             next prefetch_limit units' all-gathers are queued at once, so they run while
//             this unit computes. Moving on to the next unit frees the previous one
//             (reshard_after_forward; else every unit stays until its backward is done).
//   backward  the unit is gathered again if it was freed (backward prefetch queues the
//             units before it first); its gradients go to a zeroed unit gradient buffer,
//             or, when every group of the unit allows it (ParameterGroup::
//             gradients_over_parameters: the GPT on the CPU) and the strategy is in host
//             memory, over its gathered parameters, each group's as the model asks for it
//             (the gaps between tensors zeroed); once the unit's last group is done, its
//             gradients are reduce-scattered (in fp32, or bf16 with precision.reduce) and
//             added to this rank's shard, and its buffers are freed.
// So a micro-batch all-gathers every unit twice (once with reshard_after_forward: false)
// and reduce-scatters it once; with gradient accumulation this happens per micro-batch and
// the shard sums them (nothing unsharded is kept across micro-batches).
// The diagnostics' local gradient norm (this rank's gradient before the reduction) is
// measured on the unit buffers before each reduce-scatter: with accumulation it is
// sqrt(Σ over the micro-batches of their squared norms), since no sum of them is kept.
//
// ZeRO-2: parameters stay whole on every rank (a compute copy, rounded to the compute
// precision, in the strategy), the fp32 master pieces are the step buffer; gradients go
// through unit buffers and reduce-scatters as above, its units being buckets of bucket_mb;
// after the optimizer step every unit is all-gathered into the compute copy.
//
// The collectives run on one communication thread, in the order the training thread asks
// for them, which is the same on every rank (the same model, the same policy). The unit
// buffers come from a pool that reuses freed buffers (train/unit_buffer_pool.h); it holds at
// most as many as were in use at once, each at most the largest unit. A gather's buffer is
// taken by the communication thread when it gets to the gather, so the reductions queued
// before it have given theirs back. For ZeRO-3:
//   gradients over the parameters: the units in use and prefetched, (1 + prefetch_limit),
//     the unit being reduced handing its buffer to the gather queued after it; a unit that
//     backward does not gather (the embeddings) takes one for its gradients while at most
//     one reduction is queued: max(1 + prefetch_limit, 2) × the largest unit (2 without
//     prefetch);
//   gradients apart: besides the parameters, 2 gradient buffers (the one being written and
//     the one being reduced: before it takes another the training thread waits until at
//     most one reduction is still queued), at most (prefetch_limit + 3) × the largest unit;
// more with activation checkpointing (a segment's units stay gathered from its
// recomputation to its backward) and with reshard_after_forward: false (every unit, from
// forward to backward).
// ZeRO-2 holds the same 2 gradient buffers of a bucket and, after the optimizer step, one
// for the gathers. On top: with gradient accumulation the staging of one shard (fp32), and
// with 16-bit gathers or reductions one unit and one shard in 16 bits.
// unit_buffer_bytes_peak() is the pool's peak plus the staging. Errors of a collective surface at ReduceGradients (or
// EndEvaluation / AfterOptimizerStep): the step must not be applied.
//
// On a GPU (ShardedOptions::ops and comm_ops a TrainingDevice's, `comm` NCCL or the TCP
// backend staging through host memory) the same units, order and numbers, in device memory:
// the step buffers, the unit buffers and the staging. The model enqueues its kernels on its
// stream and calls the store as soon as they are ENQUEUED (train/nn/gpt_cuda.h's contract);
// the strategy orders its work with that stream by its marks (VectorOps::Mark/Wait):
//   Parameters(g)    returns once the gather is complete on the device (the communication
//                    thread's collective returned, its 16-bit unpacking synchronized), so
//                    work the model enqueues after the call reads the gathered values;
//   freeing a unit   (reshard, GradientsDone, end of a pass) gives its buffer back to the pool
//                    with a mark on the model's stream; a gather into that buffer waits for
//                    the mark first (the model may still be reading it); a gradient buffer
//                    is zeroed on the model's stream itself, needing no wait;
//   GradientsDone(g) marks the model's stream; the reduce-scatter waits for that mark;
//   MaterializeParameters / AfterOptimizerStep / BeginGradients mark the step buffers'
//                    last writer (the optimizer) and readers, which the gathers and the
//                    first write of a reduced shard wait for.
// Those waits are host waits on the communication thread (the communicators' collectives
// are blocking calls). An evaluation pass (Pass::kEvaluate) of a strategy in device memory
// hands the model host copies of the gathered units (the trainer evaluates with the CPU
// model, as it does under data parallelism on a GPU), one unit at a time.
//
// Thread-safety: the ParallelStrategy and ParameterStore calls from the training thread only.
#ifndef RINGMASTER_TRAIN_FSDP_H_
#define RINGMASTER_TRAIN_FSDP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "state/tensor.h"
#include "train/config.h"
#include "train/fsdp_layout.h"
#include "train/model.h"
#include "train/optim/vector_ops.h"
#include "train/parallel_strategy.h"

namespace ringmaster::train {

struct ShardedOptions {
  const state::TensorTable* table = nullptr;  // the model's; not owned, outlives the strategy
  std::vector<ParameterGroup> groups;         // the model's parameter_groups()
  int zero_stage = 3;                         // 2 or 3
  FsdpConfig fsdp;                            // stage 3's units, prefetch, resharding
  double bucket_mb = 25;                      // stage 2's units
  Precision compute = Precision::kFloat32;    // the gathered parameters' precision
  Precision reduce = Precision::kFloat32;     // the reduce-scatter's: fp32 or bf16
  absl::Duration op_timeout = absl::Seconds(120);
  // The memory of the step's buffers and the unit buffers, and the streams that order the
  // work on them (not owned; they outlive the strategy): `ops` the model's (its marks tell
  // the communication thread when the model's reads and writes are done), `comm_ops` the
  // communication thread's. Host memory by default; a GPU's (TrainingDevice::ops() and
  // comm_ops()) with a communicator of device memory.
  VectorOps* ops = HostVectorOps();
  VectorOps* comm_ops = HostVectorOps();
};

// Whether a job of `config` trains with this strategy (ZeRO-2 and 3, on the CPU or a GPU).
inline bool UsesShardedStrategy(const TrainConfig& config) {
  return config.zero_stage >= 2 && !HasMesh(config);
}

// The options `config` asks for, over `model`'s table (not owned: it must outlive them) and
// parameter groups.
ShardedOptions ShardedOptionsFor(const TrainConfig& config, const Model& model);

// The strategy over `comm` (host memory; CPU training) with partial sums over `host_comm`.
// Neither is owned; both outlive the strategy and have the same ranks. INVALID_ARGUMENT for
// a stage other than 2 or 3, a reduce precision other than fp32 or bf16, or a bad layout.
absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateShardedDataParallel(
    comm::Communicator* comm, comm::Communicator* host_comm, const ShardedOptions& options);

// The layout a strategy with these options uses on `world` ranks (for memory estimates).
absl::StatusOr<FsdpLayout> ShardedLayout(const ShardedOptions& options, int world);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_FSDP_H_
