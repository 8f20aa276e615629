// The GPT's pipeline stages on a CUDA GPU (CUDA builds only: --config=cuda or cudaemu):
// GptCudaStage runs a slice of nn::GptCuda (GptOptions::first_block / end_block, as
// GptStage's, train/pipeline/gpt_stage.h) as a PipelineStage for RunPipeline, with the
// executor's messages in device memory: PipelineExecutorOptions::ops a CudaVectorOps
// (train/optim/cuda_vector_ops.h) and the pipeline group an NcclCommunicator
// (comm/nccl/nccl_communicator.h; a TCP communicator stages device buffers through the host).
//
// As GptStage: each micro-batch in flight has its own GptCuda of the slice (its activations
// from its forward until its backward or weight pass), all of them sharing the stage's device
// parameters and gradients, in bf16/fp16 one 16-bit copy of the parameters (cast once a step,
// by BeginStep; nn::GptCudaOptions::parameter_copy_of), and the stage's stream; the same calls, the
// same semantics (BeginStep zeroes the gradients, micro-batches add to them in micro-batch order,
// discarded micro-batches add nothing, the last stage sums the loss).
//
//   auto stage = *GptCudaStage::Create(slice_options, cuda_options, stream);
//   stage->set_tensor_parallel_sum(sum);                     // with tp_size > 1
//   stage->BeginStep(micro_batches, device_params, device_grads, fb_options);  // zeroes grads
//   ... RunPipeline(...) with {stage_index, stage.get()} and ops on the device ...
//   stage->Synchronize();  // the gradients are complete; stage->stats(): the loss (last stage)
//
// Ordering with the communicator: the executor sends a stage's output (and frees its input)
// right after the call returns, and NCCL runs on its own stream, which does not wait for the
// model's. So Forward, Backward and BackwardInput enqueue their work on the stream and then
// SYNCHRONIZE it (cudaStreamSynchronize) before returning: their output is complete and their
// input no longer read. (An event the communicator's stream waits on would let the host run
// ahead; NcclCommunicator has no such call yet.) BackwardWeight reads and writes nothing of
// the executor's and only enqueues (it fills the bubble while the host waits for messages);
// the gradients are complete once the stream has been synchronized: Synchronize(), or any
// later call of the stage other than BackwardWeight, or work ordered after it on the stream
// (an optimizer on the same stream).
//
// Not thread-safe: RunPipeline's thread calls it; all work goes to the stream given at Create
// (CUDA's current device must be the stream's).
#ifndef RINGMASTER_TRAIN_PIPELINE_GPT_CUDA_STAGE_H_
#define RINGMASTER_TRAIN_PIPELINE_GPT_CUDA_STAGE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_cuda.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/gpt_pipeline_stage.h"
#include "train/pipeline/micro_batch_models.h"

namespace ringmaster::train::pipeline {

class GptCudaStage final : public GptPipelineStage {
 public:
  // `slice`: the whole model's options with this stage's blocks (StageOptions, gpt_stage.h),
  // and its tensor-parallel shard. Errors as nn::GptCuda::Create.
  static absl::StatusOr<std::unique_ptr<GptCudaStage>> Create(const nn::GptOptions& slice,
                                                              const nn::GptCudaOptions& cuda,
                                                              cudaStream_t stream);

  // The slice's first model: cpu_model().table() is the layout of the stage's parameters and
  // gradients (the stage's tensors under the whole model's names), precision().
  const nn::GptCuda& model() const { return models_.front(); }
  const nn::GptModel& layout() const override { return model().cpu_model(); }
  cudaStream_t stream() const { return stream_; }
  // With tensor parallelism (tp_size > 1): the group's sum, for every model of the stage
  // (nn::GptCuda::set_tensor_parallel_sum; called from the stage's calls, on RunPipeline's
  // thread). Required before the first Forward then.
  void set_tensor_parallel_sum(nn::GptCuda::DeviceSum sum);

  // Before each step, as GptStage::BeginStep: the micro-batches (host tokens; the first and
  // last stages read them), the stage's DEVICE parameters (unchanged until the step's work has
  // run) and gradients (zeroed here, on the stream; the step adds to them), at least
  // model().total_elements() floats each, and the loss scale, divisor and precision
  // (options.precision must be model().precision(); `store`, `accumulate` and
  // `on_grads_ready` do not apply). All must outlive the step. `discarded` as GptStage's.
  // INVALID_ARGUMENT for short buffers, a store, another precision, or `discarded` of another
  // length; INTERNAL for a CUDA error. What a failed step left in flight is dropped.
  absl::Status BeginStep(absl::Span<const Batch> micro_batches, absl::Span<const float> params,
                         absl::Span<float> grads, const ForwardBackwardOptions& options,
                         std::vector<bool> discarded = {}) override;
  // The step so far: on the last stage the loss of its micro-batches (zeros elsewhere).
  const StepStats& stats() const override { return models_.stats(); }
  // Waits for the stage's work (the gradients complete). INTERNAL for a CUDA error.
  absl::Status Synchronize();
  absl::Status EndStep() override { return Synchronize(); }
  // The most micro-batches in flight at once since Create, and the device bytes their models
  // hold for activations (nn::GptCuda::activation_bytes; each keeps its memory for the next
  // micro-batch).
  int peak_in_flight() const override { return static_cast<int>(models_.pool().size()); }
  int64_t activation_bytes() const override;
  // The bytes of the 16-bit parameter copies the models in flight keep (0 in fp32).
  int64_t parameter_copy_bytes() const override;

  // A forward-only pass of `batch` outside a step (evaluation), as GptStage::Evaluate: `input`
  // from the previous stage (empty on the first), `output` to the next (empty on the last,
  // which returns the loss; the others return zeros), device spans; `params` as BeginStep's.
  // Returns once the work has run. FAILED_PRECONDITION while a step's micro-batches are in
  // flight; INVALID_ARGUMENT for spans of the wrong size.
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, absl::Span<const float> params,
                                     absl::Span<const float> input, absl::Span<float> output);
  // The same, INVALID_ARGUMENT unless `precision` is model().precision().
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, absl::Span<const float> params,
                                     Precision precision, absl::Span<const float> input,
                                     absl::Span<float> output) override;

  // The PipelineStage calls on device spans [rows, width] fp32 (nn::GptCuda's boundary);
  // INVALID_ARGUMENT for a span of another size than input_elements / output_elements.
  int64_t input_elements(int micro) const override;
  int64_t output_elements(int micro) const override;
  absl::Status Forward(int micro, absl::Span<const float> input, absl::Span<float> output) override;
  absl::Status BackwardWeight(int micro) override;

 private:
  GptCudaStage(std::unique_ptr<nn::GptCuda> first, const nn::GptOptions& slice,
               const nn::GptCudaOptions& cuda, cudaStream_t stream);
  absl::Status BackwardOf(int micro, absl::Span<const float> output_grad,
                          absl::Span<float> input_grad, bool defer_weights) override;
  // INVALID_ARGUMENT naming `what` unless `span` holds `want` floats.
  static absl::Status CheckSize(const char* what, size_t size, int64_t want);

  const nn::GptOptions slice_;
  const nn::GptCudaOptions cuda_;
  const cudaStream_t stream_;
  nn::GptCuda::DeviceSum tp_sum_;
  MicroBatchModels<nn::GptCuda> models_;
};

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_GPT_CUDA_STAGE_H_
