// The GPT as pipeline stages: GptStage runs a slice of nn::GptModel (GptOptions::first_block
// and end_block: some blocks, with the embeddings on the first stage and lnf, the LM head and
// the loss on the last) as a PipelineStage for RunPipeline (train/pipeline/executor.h).
//
// Each micro-batch in flight has its own GptModel of the slice, holding that micro-batch's
// activations from its forward until its backward (or, under the zero-bubble schedule, its
// weight pass); they share the stage's parameters and gradients. So a stage holds as many
// micro-batches' activations as its schedule keeps in flight: all m under GPipe, at most P
// (fewer on later stages) under 1F1B, as the schedules' simulation says.
//
//   GptStage stage = *GptStage::Create(slice_options);
//   stage.BeginStep(micro_batches, params, grads, fb_options);  // zeroes grads
//   ... RunPipeline(...) with {stage_index, &stage} ...
//   stage.stats();  // the loss of the step's micro-batches (last stage)
//
// Gradients: every micro-batch adds to `grads`, in micro-batch order under every schedule
// (the schedules' backward and weight passes go in that order), so they equal bit for bit
// one GptModel's ForwardBackward over the same micro-batches with accumulation.
//
// Not thread-safe: RunPipeline's thread calls it.
#ifndef RINGMASTER_TRAIN_PIPELINE_GPT_STAGE_H_
#define RINGMASTER_TRAIN_PIPELINE_GPT_STAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/gpt_pipeline_stage.h"
#include "train/pipeline/micro_batch_models.h"

namespace ringmaster::train::pipeline {

// The blocks [first, end) of each of `stages` stages of a `layers`-block GPT, in order: as
// even as can be, the first stages taking one more when they do not divide (the last stage
// also holds the LM head). INVALID_ARGUMENT naming both when stages > layers or stages < 1.
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitBlocks(int64_t layers, int stages);

// The options of stage `stage`'s slice: the whole model's with its blocks (SplitBlocks' entry).
nn::GptOptions StageOptions(const nn::GptOptions& whole,
                            const std::vector<std::pair<int64_t, int64_t>>& blocks, int stage);

class GptStage final : public GptPipelineStage {
 public:
  // `slice`: the whole model's options with this stage's first_block / end_block.
  // INVALID_ARGUMENT as nn::GptModel::Create.
  static absl::StatusOr<std::unique_ptr<GptStage>> Create(const nn::GptOptions& slice);

  // The slice's model: its table (the stage's tensors, under the whole model's names), its
  // parameter groups, InitTensors.
  const nn::GptModel& model() const { return models_.front(); }
  const nn::GptModel& layout() const override { return model(); }
  // With tensor parallelism (GptOptions::tp_size > 1): the group's sum, for every model of
  // the stage (nn::GptModel::set_tensor_parallel_sum).
  void set_tensor_parallel_sum(nn::GptModel::TensorParallelSum sum);

  // Before each step: its micro-batches (the first and last stages read their tokens, the
  // others only their sizes), the stage's parameters (unchanged until the step ends) and its
  // gradients (zeroed here; the step adds to them), and the loss scale, divisor and precision
  // (`options.store`, `accumulate` and `on_grads_ready` do not apply). All must outlive the
  // step. `discarded` (empty: none) marks stand-in micro-batches that do not count (a
  // replica with fewer samples than micro-batches in a short global batch): they run, so that
  // every stage exchanges the schedule's messages, but add nothing to the gradients or the
  // loss. INVALID_ARGUMENT for buffers smaller than the slice's table, a store, or
  // `discarded` of another length. What a failed step left in flight is dropped.
  absl::Status BeginStep(absl::Span<const Batch> micro_batches, absl::Span<const float> params,
                         absl::Span<float> grads, const ForwardBackwardOptions& options,
                         std::vector<bool> discarded = {}) override;
  // Nothing to wait for: the gradients are complete when the step's last action returns.
  absl::Status EndStep() override { return absl::OkStatus(); }
  // The step so far: on the last stage the loss of its micro-batches (zeros elsewhere).
  const StepStats& stats() const override { return models_.stats(); }
  // The most micro-batches in flight at once since Create, and the activation bytes their
  // models hold (each model keeps its buffers for the next micro-batch).
  int peak_in_flight() const override { return static_cast<int>(models_.pool().size()); }
  int64_t activation_bytes() const override;

  // A forward-only pass of `batch` outside a step (evaluation): `input` from the previous
  // stage (empty on the first), `output` to the next (empty on the last, which returns the
  // loss; the others return zeros). `params` as BeginStep's.
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, absl::Span<const float> params,
                                     Precision precision, absl::Span<const float> input,
                                     absl::Span<float> output) override;

  int64_t input_elements(int micro) const override;
  int64_t output_elements(int micro) const override;
  absl::Status Forward(int micro, absl::Span<const float> input, absl::Span<float> output) override;
  absl::Status BackwardWeight(int micro) override;

 private:
  explicit GptStage(std::unique_ptr<nn::GptModel> first);
  absl::Status BackwardOf(int micro, absl::Span<const float> output_grad,
                          absl::Span<float> input_grad, bool defer_weights) override;

  const nn::GptOptions slice_;
  nn::GptModel::TensorParallelSum tp_sum_;
  MicroBatchModels<nn::GptModel> models_;
  // In bf16/fp16: the step's parameters rounded once (BeginStep) for every model in flight,
  // instead of a rounded copy in each.
  state::FlatBuffer rounded_;
};

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_GPT_STAGE_H_
