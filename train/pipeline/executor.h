// The pipeline executor: runs one rank's list of a Schedule (train/pipeline/schedule.h) over
// the stages this rank holds and the pipeline group's communicator.
//
// A model stage is a PipelineStage: it computes a micro-batch's forward from its input
// activation (the first stage reads its own input: the batch) and its backward from the
// gradient of its output (the last stage starts from its own loss), keeping what backward
// needs between the two. The executor owns the messages: a stage's output goes to the next
// stage (through the communicator when that stage is on another rank, in memory otherwise),
// its input gradient to the previous one. Each run of sends and receives between two computes
// of the list is one Communicator::SendRecv batch, which CheckSchedule proved cannot deadlock
// whether the transport buffers sends or not. A buffer lives from the compute that makes it
// (or the batch that receives it) until its last use: the batch that sends it, or the
// compute that reads it.
//
//   RM_RETURN_IF_ERROR(CheckSchedule(schedule));
//   PipelineExecutorOptions o{&schedule, rank, pp_group_comm, {{stage, &my_stage}, ...}};
//   RM_ASSIGN_OR_RETURN(PipelineRunStats stats, RunPipeline(o));
//
// Memory: the messages live in the memory of PipelineExecutorOptions::ops (host memory by
// default; a GPU's with a CudaVectorOps, train/optim/cuda_vector_ops.h), allocated zeroed by
// its Allocate and freed through it. The stages' spans (input, output, gradients) and the
// communicator's buffers are then of that memory: host memory for CPU stages and the TCP
// communicator; device memory for GPU stages (pipeline::GptCudaStage) and an NCCL
// communicator (comm/nccl/nccl_communicator.h). A message of zero elements is an empty span
// (its data() may be null) and moves nothing. The executor sends a buffer, or frees it, right
// after the stage call that wrote or read it returns, and the communicator does not wait for
// the stages' own streams: so a stage call must return with its output complete and its
// input no longer read (a GPU stage synchronizes its stream before returning). A received
// buffer is complete when the batch that received it returns (as Communicator::SendRecv
// promises), before the stage that reads it is called.
//
// Thread-safety: RunPipeline uses the communicator, the ops and the stages from the calling
// thread only.
#ifndef RINGMASTER_TRAIN_PIPELINE_EXECUTOR_H_
#define RINGMASTER_TRAIN_PIPELINE_EXECUTOR_H_

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "train/optim/vector_ops.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::train::pipeline {

// One model stage of the pipeline on this rank.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Every span below is of the executor's memory (PipelineExecutorOptions::ops; see above),
  // and each call returns with its output complete and its input no longer read.
  // Floats of micro-batch `micro`'s activation entering this stage (0 for the first stage)
  // and leaving it (0 for the last): the previous stage's output and this one's.
  virtual int64_t input_elements(int micro) const = 0;
  virtual int64_t output_elements(int micro) const = 0;
  // The forward of `micro` from `input` (empty for the first stage; valid during the call
  // only: the stage keeps what its backward needs) into `output`.
  virtual absl::Status Forward(int micro, absl::Span<const float> input,
                               absl::Span<float> output) = 0;
  // The backward of `micro` from the gradient of its output (empty for the last stage, which
  // starts from its loss) into the gradient of its input (empty for the first stage),
  // accumulating its parameters' gradients. Backward does both parts; a zero-bubble schedule
  // calls BackwardInput (the input gradient only) and later BackwardWeight (the parameters').
  virtual absl::Status Backward(int micro, absl::Span<const float> output_grad,
                                absl::Span<float> input_grad) = 0;
  virtual absl::Status BackwardInput(int micro, absl::Span<const float> output_grad,
                                     absl::Span<float> input_grad) = 0;
  virtual absl::Status BackwardWeight(int micro) = 0;
};

// Message buffers a run freed, kept by size for later runs (PipelineExecutorOptions::pool): on
// a GPU an allocation and a free (cudaMalloc, cudaFree) are slow and the free synchronizes the
// device. It holds buffers of the ops they were taken with (use one pool with one VectorOps),
// and frees them when it goes. Not thread-safe.
class MessagePool {
 public:
  // A buffer of `elements` floats (empty for 0): one kept (`*reused` true; its contents are
  // a former message's), else a new, zeroed one of `ops`' memory. The ops' errors.
  absl::StatusOr<OpsBuffer> Take(VectorOps& ops, int64_t elements, bool* reused);
  void Give(OpsBuffer buffer);
  // The bytes kept.
  int64_t bytes() const { return bytes_; }

 private:
  std::multimap<int64_t, OpsBuffer> free_;
  int64_t bytes_ = 0;
};

struct PipelineExecutorOptions {
  const Schedule* schedule = nullptr;  // checked (CheckSchedule); outlives the run
  int rank = 0;                        // this rank's index in the pipeline group
  // The pipeline group (size schedule->options.ranks, this rank at `rank`); not owned.
  comm::Communicator* comm = nullptr;
  // The model stages this rank holds (schedule->RankOfStage(stage) == rank), every one of them.
  std::map<int, PipelineStage*> stages;
  absl::Duration op_timeout = absl::Seconds(120);
  // Where the messages live (above): host memory by default; not owned, outlives the run.
  VectorOps* ops = HostVectorOps();
  // Where freed messages are kept for reuse (of `ops`' memory), across runs; not owned. Null:
  // each message is allocated and freed.
  MessagePool* pool = nullptr;
};

struct PipelineRunStats {
  absl::Duration compute;   // inside the stages' calls
  absl::Duration messages;  // inside the batches: waiting for and moving messages
  absl::Duration total;
  int64_t peak_buffer_bytes = 0;  // messages held at once (activations, gradients)
  int batches = 0;
};

// Runs rank `rank`'s list. INVALID_ARGUMENT for options that do not fit the schedule (a
// missing stage, a communicator of another size, no ops); a stage's error, the
// communicator's (the step is lost: every rank of the group fails its batch within the
// deadline) or the ops' (RESOURCE_EXHAUSTED when a message does not fit in its memory).
absl::StatusOr<PipelineRunStats> RunPipeline(const PipelineExecutorOptions& options);

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_EXECUTOR_H_
