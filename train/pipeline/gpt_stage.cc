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

GptStage::GptStage(std::unique_ptr<nn::GptModel> first) : slice_(first->options()) {
  free_.push_back(first.get());
  pool_.push_back(std::move(first));
}

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
  if (options.store != nullptr) {
    return absl::InvalidArgumentError(
        "GptStage::BeginStep: a ParameterStore (not for pipeline stages)");
  }
  if (!discarded.empty() && discarded.size() != micro_batches.size()) {
    return absl::InvalidArgumentError(absl::StrCat("GptStage::BeginStep: ", discarded.size(),
                                                   " discard marks for ", micro_batches.size(),
                                                   " micro-batches"));
  }
  discarded.resize(micro_batches.size(), false);
  discarded_ = std::move(discarded);
  // A failed step can leave micro-batches in flight: that step is lost, its models free.
  while (!in_flight_.empty()) Release(in_flight_.begin()->first);
  micro_batches_ = micro_batches;
  params_ = params;
  grads_ = grads;
  options_ = options;
  options_.accumulate = true;
  options_.on_grads_ready = nullptr;
  std::fill(grads.begin(), grads.end(), 0.0f);
  started_ = true;
  stats_ = {};
  return absl::OkStatus();
}

void GptStage::set_tensor_parallel_sum(nn::GptModel::TensorParallelSum sum) {
  tp_sum_ = std::move(sum);
  for (const auto& m : pool_) m->set_tensor_parallel_sum(tp_sum_);
}

int64_t GptStage::activation_bytes() const {
  int64_t bytes = 0;
  for (const auto& m : pool_) bytes += m->memory().activation_bytes_peak;
  return bytes;
}

absl::StatusOr<const Batch*> GptStage::MicroBatch(int micro) const {
  if (micro < 0 || micro >= static_cast<int>(micro_batches_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GptStage: micro-batch ", micro, " of ",
                                                   micro_batches_.size(), " given to BeginStep"));
  }
  return &micro_batches_[micro];
}

int64_t GptStage::BoundaryElements(int micro) const {
  absl::StatusOr<const Batch*> b = MicroBatch(micro);
  return b.ok() ? (*b)->size * slice_.context * slice_.width : 0;
}

int64_t GptStage::input_elements(int micro) const {
  return model().has_embeddings() ? 0 : BoundaryElements(micro);
}

int64_t GptStage::output_elements(int micro) const {
  return model().has_head() ? 0 : BoundaryElements(micro);
}

absl::Status GptStage::Forward(int micro, absl::Span<const float> input, absl::Span<float> output) {
  if (!started_) return absl::FailedPreconditionError("GptStage: no BeginStep yet");
  RM_ASSIGN_OR_RETURN(const Batch* batch, MicroBatch(micro));
  if (in_flight_.count(micro)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptStage: micro-batch ", micro, " is already in flight"));
  }
  if (free_.empty()) {
    RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model, nn::GptModel::Create(slice_));
    model->set_tensor_parallel_sum(tp_sum_);
    free_.push_back(model.get());
    pool_.push_back(std::move(model));
  }
  nn::GptModel* model = free_.back();
  RM_RETURN_IF_ERROR(model->SliceForward(*batch, params_, options_.precision, input, output));
  free_.pop_back();
  in_flight_[micro] = model;
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GptStage::Evaluate(const Batch& batch, absl::Span<const float> params,
                                             Precision precision, absl::Span<const float> input,
                                             absl::Span<float> output) {
  if (free_.empty()) {
    return absl::FailedPreconditionError(
        "GptStage::Evaluate: a step's micro-batches are in flight");
  }
  nn::GptModel* model = free_.back();
  RM_RETURN_IF_ERROR(model->SliceForward(batch, params, precision, input, output));
  if (!model->has_head()) return StepStats{};
  return model->SliceLoss();
}

absl::StatusOr<nn::GptModel*> GptStage::InFlight(int micro) const {
  auto it = in_flight_.find(micro);
  if (it == in_flight_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptStage: micro-batch ", micro, " has no forward in flight"));
  }
  return it->second;
}

absl::Status GptStage::BackwardOf(int micro, absl::Span<const float> output_grad,
                                  absl::Span<float> input_grad, bool defer_weights) {
  RM_ASSIGN_OR_RETURN(nn::GptModel * model, InFlight(micro));
  RM_ASSIGN_OR_RETURN(const StepStats stats,
                      model->SliceBackward(grads_, options_, output_grad, input_grad, defer_weights,
                                           discarded_[micro]));
  stats_.loss_sum += stats.loss_sum;
  stats_.loss_terms += stats.loss_terms;
  stats_.correct += stats.correct;
  if (!defer_weights) Release(micro);
  return absl::OkStatus();
}

absl::Status GptStage::Backward(int micro, absl::Span<const float> output_grad,
                                absl::Span<float> input_grad) {
  return BackwardOf(micro, output_grad, input_grad, /*defer_weights=*/false);
}

absl::Status GptStage::BackwardInput(int micro, absl::Span<const float> output_grad,
                                     absl::Span<float> input_grad) {
  return BackwardOf(micro, output_grad, input_grad, /*defer_weights=*/true);
}

absl::Status GptStage::BackwardWeight(int micro) {
  RM_ASSIGN_OR_RETURN(nn::GptModel * model, InFlight(micro));
  RM_RETURN_IF_ERROR(model->SliceBackwardWeights(grads_, options_));
  Release(micro);
  return absl::OkStatus();
}

void GptStage::Release(int micro) {
  auto it = in_flight_.find(micro);
  free_.push_back(it->second);
  in_flight_.erase(it);
}

}  // namespace ringmaster::train::pipeline
