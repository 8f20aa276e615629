// Sharded data parallelism (ZeRO-2 and ZeRO-3 / FSDP) on a CUDA GPU: the device twin of
// train/fsdp.h. WORK IN PROGRESS (issue 19, "the CUDA path"): this header holds the design and
// the first piece, the unit buffer pool over VectorOps (train/unit_buffer_pool.h, which the
// CPU strategy uses too, over host memory); the strategy itself
// (CreateShardedDataParallelOnDevice) is not written yet. /work/notes/device_wip.md
// says what is next.
//
// ============================================================================================
// Design
// ============================================================================================
//
// Same layout, same order, same numbers as the CPU strategy. The units, the pieces and the
// order of the collectives are train/fsdp_layout.h's and train/fsdp.h's, unchanged: the device
// strategy differs only in where the buffers live and in how its work is ordered with the
// model's. So ZeRO-3 on a GPU must give the CPU strategy's losses (within the CUDA model's own
// tolerance against the CPU model), its traffic formula (Zero3PassTraffic) and its checkpoints
// (saved_pieces() = layout.Placement(rank), loadable under any stage and world size).
//
// What lives where (one rank, one GPU):
//   device  the step buffers: TrainingDevice::params() and grads() sized local_elements()
//           (this rank's pieces of every unit: fp32 master parameters and reduced gradients;
//           the optimizer's moments live beside them on ops(), as today);
//           the unit buffers, from a UnitBufferPool on comm_ops(): gathered parameters (fp32,
//           or the compute precision's 16 bits, see "bf16 gathers" below) and unreduced
//           gradients (fp32), at most (prefetch_limit + 3) × the largest unit, the CPU
//           strategy's bound (fsdp.h), the pool enforcing it the same way;
//           staging: one reduced shard (fp32, to add into grads() under accumulation), and
//           with 16-bit wires one packed unit and one packed shard;
//           ZeRO-2 only: the replicated compute copy (table order), which the model reads.
//   host    nothing per step. The trainer's host copy of the shard (HostView) for checkpoints
//           and fingerprints, as for DDP on a device.
//
// Who does what:
//   training thread   the model (TrainingDevice::ForwardBackward with options.store = the
//                     strategy) enqueues kernels on the compute stream (ops()); the store's
//                     calls (Parameters, Gradients, GradientsDone, BeginBackward) only queue
//                     ops for the communication thread and record events (ops()->Mark()).
//   comm thread       takes the ops in order (the same order on every rank, as on the CPU);
//                     before an op reads or writes a buffer the compute stream used, it waits
//                     on the host for the event recorded then (ops()->Wait(token)); then it
//                     runs the collective through the NCCL communicator, which blocks until
//                     the result is complete (comm/nccl: its own stream does not wait for
//                     ours, hence the host wait before); its own kernels (pack/unpack to
//                     16 bits, the shard accumulation, the local norm) go to comm_ops() and
//                     are synchronized before the op counts as done.
//   The host waits on the comm thread are what NcclCommunicator's blocking API allows today.
//   A later step can make them stream waits (cudaStreamWaitEvent of the NCCL stream on our
//   event, and of the compute stream on an event after the collective) once the communicator
//   exposes an enqueue-only form; the ordering rules below stay the same.
//
// The store contract of train/nn/gpt_cuda.h and sequential_cuda.h, met op by op:
//   Parameters(g)     queue the unit's gather (and the prefetched ones) as the CPU strategy
//                     does; wait on the host until the gather op is done (the collective
//                     blocked until complete, the unpack was synchronized on comm_ops()), so
//                     the values are ready for any work enqueued after the call. (A later
//                     step: have the comm thread record an event after the gather and make
//                     the compute stream cudaStreamWaitEvent on it, so that the training
//                     thread does not block and can enqueue ahead; the exposed-time counter
//                     then measures the stream wait with events instead of the host wait.)
//   releasing a unit  (reshard after forward, GradientsDone in ZeRO-3, end of a pass): the
//                     model may still have kernels in flight that read it. The release
//                     records a mark on ops() and hands the buffer back to the pool WITH that
//                     token (UnitBufferPool::Give(buffer, token)); whoever takes it next gets
//                     the token and must wait on it before writing: the comm thread (a gather
//                     writes it) waits on the host; the compute stream (a gradient buffer
//                     zeroed there) needs no wait, being the stream that read it.
//   Gradients(g)      a pool buffer (bounded: before taking it, wait until at most one
//                     reduction is queued, as on the CPU), zeroed by ops()->Zero on the
//                     compute stream; the model writes it after the call, in stream order.
//                     A buffer the comm thread gave back after a reduce-scatter was fully read
//                     by then (NCCL returned and comm_ops() was synchronized): no wait.
//   GradientsDone(g)  record a mark on ops() and queue the reduce-scatter with it; the comm
//                     thread waits for the mark before NCCL reads the buffer. In ZeRO-3 also
//                     release the unit's parameters (as above, with the same mark).
//   BeginBackward     as on the CPU.
// cudaFree waits for the whole device (NCCL kernels of the comm stream included), so the
// pool must not free in a step: the strategy sizes it up front (the first unit requests are
// for the largest unit, or a Reserve(count, largest) to add), so that a Take never frees a
// too-small buffer mid-step. (fsdp_cuda_test met this: a buffer freed in the test made the
// host wait for the model's stream and hid a missing event wait.)
// Marks are reused after VectorOps::kMaxMarks further marks (an event re-recorded): a token
// that sat in the pool that long then waits for later work of the same stream, which only
// waits longer, never less; so pool tokens never need refreshing.
//
// The step around the model (ParallelStrategy, train/parallel_strategy.h):
//   MaterializeParameters(params)  params = the device shard buffer (the comm thread reads it
//                                  for gathers). The optimizer ran on ops() before: the first
//                                  gather waits on a mark recorded here.
//   ReduceGradients                waits for every queued op; the comm thread's adds into
//                                  grads() were synchronized on comm_ops(), so the shard is
//                                  ready for the optimizer on ops(); returns the first error.
//   AfterOptimizerStep             ZeRO-3: nothing. ZeRO-2: every unit gathered into the
//                                  replicated compute copy (after a mark on ops()).
//   WholeParameters                gathers every unit, fp32, and copies the whole to the host
//                                  `whole` (the trainer's on_finish, checkpoints of stage 0
//                                  layouts): that is the only place the whole model is on the
//                                  host; a unit buffer at a time.
//   sum()                          over host_comm, as on the CPU: clipping's and LAMB's
//                                  partial sums are already host doubles from ops().
//   unit_buffer_bytes_peak()       the pool's peak + staging, device bytes; the trainer's
//                                  memory line reports it as "unit buffers (GPU)".
//
// Errors. A collective's error (DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED from the NCCL
// communicator) or a CUDA error of the comm thread's kernels (INTERNAL) is kept by the comm
// thread, which then runs no further collective and only counts the remaining ops and gives
// their buffers back (with their tokens: the compute stream always progresses, so waiting on
// its marks cannot hang; a gather cut short by a broken NCCL communicator may leave its
// buffer half written, which is why nothing of that step is applied); Parameters(g) after an
// error returns the unit's buffer as it is (the model computes garbage that is thrown away)
// rather than blocking, and
// the error surfaces at ReduceGradients / EndEvaluation / AfterOptimizerStep, where the step
// must not be applied, exactly as the CPU strategy. The elastic path aborts the communicator
// (Communicator::Abort), which makes a blocked collective return ABORTED, so the comm thread
// never outlives an epoch. The destructor waits for the comm thread, then synchronizes both
// streams before the pool frees its buffers.
//
// ZeRO-2 on the device: the CPU strategy's stage 2 (buckets as units, the compute copy
// replicated and read by the model with Parameters(g) = copy) with the same buffers as above.
// It replaces today's device stage 2 (DataParallel with zero_stage 2, which keeps the whole
// gradient buffer on the GPU: the first bullet, still open on the GPU).
//
// bf16 / fp16 gathers (precision.compute 16 bits): two options, open decision.
//   (a) like the CPU strategy: pack the shard to 16 bits on comm_ops(), all-gather 16 bits,
//       unpack into an fp32 unit buffer. Half the traffic, fp32 unit buffers (same memory as
//       fp32 gathers); the model's contract holds as is (it casts the rounded fp32 values
//       again, exactly). LayerNorm gains/biases and the embedding tables are then READ
//       ROUNDED to bf16 (gpt_cuda.h says so), as the CPU GptModel with a store reads them:
//       CPU and GPU ZeRO-3 agree, but differ from DDP on the GPU (which reads them in fp32).
//       The tests must state that tolerance (DDP vs ZeRO-3 in bf16) rather than bit equality.
//   (b) keep 16-bit unit buffers and teach the models a 16-bit store (Parameters16(g)) to
//       skip their own cast; saves half the unit buffer memory. Needs a model API change.
//   The first version does (a). PyTorch FSDP's MixedPrecision(param_dtype=bf16) also reads
//   norms' weights in bf16, so (a) matches the reference behaviour.
//
// What the TrainingDevice must expose (train/device.h, small additions):
//   - CudaDeviceOptions::flat_parameters (false for ZeRO-3/2-sharded): GptCuda then keeps only
//     one group's 16-bit copy (GptCudaOptions::flat_parameters), and CreateCudaDevice sizes
//     params()/grads() as local_elements() (already: padded_elements is the caller's).
//   - ForwardBackward(batch, options) already passes options.store to the models; with a store
//     and flat_parameters false it must not touch params()/grads() (they are the shard).
//   - Evaluate(batch, precision, store): a forward-only pass on the device with a store (the
//     trainer evaluates with the CPU Model today, which a device store cannot serve). GptCuda
//     and SequentialCuda have a Forward already; this wraps it with the loss.
//   - gpu() (the ordinal) and, for the strategy, ops()/comm_ops() (already there).
//
// What train/trainer.cc must change:
//   - ChooseDevice: stop refusing zero_stage 3 with a device; pass flat_parameters = false
//     when the strategy is sharded.
//   - `sharded` (today: stage 3, or stage 2 on the CPU) becomes stage 2 or 3 on any device;
//     with a device: CreateShardedDataParallelOnDevice(comm (NCCL), hcomm, device, options)
//     instead of CreateShardedDataParallel.
//   - Evaluate: with a device and a store, device->Evaluate(batch, precision, store).
//   - The memory line: unit buffers on the GPU; PlanRankState (memory_plan) for a device.
//   - TCP with host staging on a GPU (several ranks per GPU): the comm thread stages each unit
//     through host memory (the TCP backend's staging copies) — same ops, slower; or refuse
//     stage 3 there at first (clear error naming parallelism.gradient_backend).
//
// Tests (under --config=cudaemu; each rank an emulated GPU with emulated NCCL, forked ranks
// as comm/nccl:gpu_per_rank does):
//   - unit_buffer_pool_test: the pool's reuse, bound and release tokens, on host and on
//     CudaVectorOps (done);
//   - fsdp_cuda_test: a 2-rank gather and reduce-scatter of a unit through the pool, each of
//     their waits shown necessary by slow work on the model's stream (done); then ZeRO-3
//     training of the MLP and GPT on the device equal to the CPU ZeRO-3 run (losses,
//     parameters after k steps), each wrapping, with/without prefetch, accumulation; the
//     store contract (store_testing.h's CheckedStore rules) under jitter
//     (RM_CUDA_EMU_JITTER_US): a missing event shows as stale data;
//   - trainer_nccl_test: a stage-3 job over nccl equals the same job over tcp on the CPU.
#ifndef RINGMASTER_TRAIN_FSDP_CUDA_H_
#define RINGMASTER_TRAIN_FSDP_CUDA_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "train/fsdp_layout.h"
#include "train/optim/vector_ops.h"
#include "train/unit_buffer_pool.h"

namespace ringmaster::train {

// The comm thread's two collectives (the design above), in fp32, over `comm` (the NCCL
// communicator: device memory, blocking until the result is complete). `compute_ops` is the
// model's stream's (whose marks are waited for on the host), `comm_ops` the comm thread's.
// Every rank calls them for the same units in the same order. Errors: the communicator's,
// or INTERNAL for a device failure; the buffers' contents are then undefined.

// Unit `unit`'s parameters, all-gathered from every rank's piece (this rank's at
// shards + unit.local, unit.shard floats) into `into` (unit.padded floats from the pool).
// Waits first for into.token (the mark its last reader gave back with it) and for
// `shards_written` (a mark on compute_ops after the last write of `shards`: the optimizer
// step; UnitBufferPool::kNoToken when there is none).
absl::Status GatherUnitOnDevice(comm::Communicator& comm, VectorOps& compute_ops,
                                const FsdpUnit& unit, const float* shards, int shards_written,
                                const UnitBufferPool::Taken& into, absl::Time deadline);

// Unit `unit`'s gradients (unit.padded floats at `unit_grads`, written by compute_ops' work
// before the mark `written`) reduce-scattered, summed over the ranks, into this rank's piece
// at shards + unit.local: overwriting it, or with `accumulate` added to it through
// `scratch` (unit.shard floats of comm_ops' memory) on comm_ops. Returns once the piece is
// complete and `unit_grads` is no longer read (the buffer may go back to the pool with
// UnitBufferPool::kNoToken).
absl::Status ReduceScatterUnitOnDevice(comm::Communicator& comm, VectorOps& compute_ops,
                                       VectorOps& comm_ops, const FsdpUnit& unit,
                                       const float* unit_grads, int written, bool accumulate,
                                       float* scratch, float* shards, absl::Time deadline);

// Declarations to come (see the design above):
//   absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateShardedDataParallelOnDevice(
//       comm::Communicator* comm, comm::Communicator* host_comm, TrainingDevice* device,
//       const ShardedOptions& options);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_FSDP_CUDA_H_
