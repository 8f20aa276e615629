// What the trainer's pipeline parallelism (train/pipeline_parallel.h) asks of one of a
// rank's GPT stages, wherever it runs: GptStage on the CPU (train/pipeline/gpt_stage.h) and
// GptCudaStage on a GPU (train/pipeline/gpt_cuda_stage.h, made by TrainingDevice::CreateStage
// in train/device.h). The spans are of the stage's memory: host memory for the first, the
// GPU's for the second (the executor's messages too: PipelineExecutorOptions::ops).
//
// Not thread-safe: the training thread (and RunPipeline on it) calls it.
#ifndef RINGMASTER_TRAIN_PIPELINE_GPT_PIPELINE_STAGE_H_
#define RINGMASTER_TRAIN_PIPELINE_GPT_PIPELINE_STAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/pipeline/micro_batch_models.h"

namespace ringmaster::train::pipeline {

class GptPipelineStage : public SplitBackwardStage {
 public:
  // The slice's CPU model: its table lays the stage's parameters and gradients out (the
  // stage's tensors under the whole model's names), shard(i) says which part of each whole
  // tensor a tensor-parallel rank holds.
  virtual const nn::GptModel& layout() const = 0;
  // Before each step: the micro-batches (host tokens), the stage's parameters and gradients
  // (zeroed here; the step adds to them), the loss scale, divisor and precision; `discarded`
  // marks stand-in micro-batches that add nothing (GptStage::BeginStep says more).
  virtual absl::Status BeginStep(absl::Span<const Batch> micro_batches,
                                 absl::Span<const float> params, absl::Span<float> grads,
                                 const ForwardBackwardOptions& options,
                                 std::vector<bool> discarded) = 0;
  // After the step's last action: the gradients are complete when it returns (a GPU stage
  // waits for its stream). INTERNAL for a device's error.
  virtual absl::Status EndStep() = 0;
  // The step so far: on the last stage the loss of its micro-batches (zeros elsewhere).
  virtual const StepStats& stats() const = 0;
  // A forward-only pass of `batch` outside a step: `input` from the previous stage (empty on
  // the first), `output` to the next (empty on the last, which returns the loss).
  // `precision` is the job's (a GPU stage was made for it).
  virtual absl::StatusOr<StepStats> Evaluate(const Batch& batch, absl::Span<const float> params,
                                             Precision precision, absl::Span<const float> input,
                                             absl::Span<float> output) = 0;
  // The most micro-batches in flight at once so far, the bytes their activations hold, and
  // (a GPU stage in bf16/fp16) the bytes of their 16-bit copies of the parameters.
  virtual int peak_in_flight() const = 0;
  virtual int64_t activation_bytes() const = 0;
  virtual int64_t parameter_copy_bytes() const { return 0; }
};

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_GPT_PIPELINE_STAGE_H_
