#include "train/pipeline/gpt_stage.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster::train::pipeline {

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitBlocks(int64_t layers, int stages) {
  if (stages < 1 || stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", layers, " GPT blocks into ", stages,
                     " pipeline stages: want 1 <= stages <= gpt.layers (each stage holds at "
                     "least one block)"));
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const int64_t count = layers / stages + (s < layers % stages ? 1 : 0);
    out.emplace_back(first, first + count);
    first += count;
  }
  return out;
}

nn::GptOptions StageOptions(const nn::GptOptions& whole,
                            const std::vector<std::pair<int64_t, int64_t>>& blocks, int stage) {
  nn::GptOptions slice = whole;
  slice.first_block = blocks[stage].first;
  slice.end_block = blocks[stage].second;
  return slice;
}

absl::StatusOr<std::unique_ptr<GptStage>> GptStage::Create(const nn::GptOptions& slice) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model, nn::GptModel::Create(slice));
  return absl::WrapUnique(new GptStage(std::move(model)));
}

GptStage::GptStage(std::unique_ptr<nn::GptModel> first)
    : slice_(first->options()),
      models_("GptStage", slice_.context * slice_.width, std::move(first)) {}

absl::Status GptStage::BeginStep(absl::Span<const Batch> micro_batches,
                                 absl::Span<const float> params, absl::Span<float> grads,
                                 const ForwardBackwardOptions& options,
                                 std::vector<bool> discarded) {
  const int64_t need = model().table().total_elements();
  if (static_cast<int64_t>(params.size()) < need || static_cast<int64_t>(grads.size()) < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptStage::BeginStep: the parameters and gradients of '", model().Describe(),
                     "' need ", need, " floats each"));
  }
  // In bf16/fp16 the models read the parameters rounded: once here for all of them.
  absl::Span<const float> step_params = params;
  if (options.precision != Precision::kFloat32) {
    if (rounded_.size() != static_cast<int64_t>(params.size())) {
      rounded_ = state::FlatBuffer(static_cast<int64_t>(params.size()));
    }
    nn::GptModel::RoundParameters(options.precision, params, rounded_.span());
    step_params = rounded_.span();
  }
  // A failed step can leave micro-batches in flight: that step is lost, its models free.
  RM_RETURN_IF_ERROR(
      models_.Begin(micro_batches, step_params, grads, options, std::move(discarded)));
  std::fill(grads.begin(), grads.end(), 0.0f);
  return absl::OkStatus();
}

void GptStage::set_tensor_parallel_sum(nn::GptModel::TensorParallelSum sum) {
  tp_sum_ = std::move(sum);
  for (const auto& m : models_.pool()) m->set_tensor_parallel_sum(tp_sum_);
}

int64_t GptStage::activation_bytes() const {
  int64_t bytes = 0;
  for (const auto& m : models_.pool()) bytes += m->memory().activation_bytes_peak;
  return bytes;
}

int64_t GptStage::input_elements(int micro) const {
  return model().has_embeddings() ? 0 : models_.BoundaryElements(micro);
}

int64_t GptStage::output_elements(int micro) const {
  return model().has_head() ? 0 : models_.BoundaryElements(micro);
}

absl::Status GptStage::Forward(int micro, absl::Span<const float> input, absl::Span<float> output) {
  RM_ASSIGN_OR_RETURN(
      nn::GptModel * model,
      models_.ForForward(micro, [&]() -> absl::StatusOr<std::unique_ptr<nn::GptModel>> {
        RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> m, nn::GptModel::Create(slice_));
        m->set_tensor_parallel_sum(tp_sum_);
        return m;
      }));
  RM_RETURN_IF_ERROR(model->SliceForward(**models_.MicroBatch(micro), models_.params(),
                                         models_.options().precision, input, output,
                                         /*params_rounded=*/true));
  models_.Started(micro);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GptStage::Evaluate(const Batch& batch, absl::Span<const float> params,
                                             Precision precision, absl::Span<const float> input,
                                             absl::Span<float> output) {
  nn::GptModel* model = models_.AnyFree();
  if (model == nullptr) {
    return absl::FailedPreconditionError(
        "GptStage::Evaluate: a step's micro-batches are in flight");
  }
  RM_RETURN_IF_ERROR(model->SliceForward(batch, params, precision, input, output));
  if (!model->has_head()) return StepStats{};
  return model->SliceLoss();
}

absl::Status GptStage::BackwardOf(int micro, absl::Span<const float> output_grad,
                                  absl::Span<float> input_grad, bool defer_weights) {
  RM_ASSIGN_OR_RETURN(nn::GptModel * model, models_.InFlight(micro));
  RM_ASSIGN_OR_RETURN(const StepStats stats,
                      model->SliceBackward(models_.grads(), models_.options(), output_grad,
                                           input_grad, defer_weights, models_.discarded(micro)));
  models_.AddStats(stats);
  if (!defer_weights) models_.Release(micro);
  return absl::OkStatus();
}

absl::Status GptStage::BackwardWeight(int micro) {
  RM_ASSIGN_OR_RETURN(nn::GptModel * model, models_.InFlight(micro));
  RM_RETURN_IF_ERROR(model->SliceBackwardWeights(models_.grads(), models_.options()));
  models_.Release(micro);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::pipeline
