// The bookkeeping a GPT pipeline stage shares between its CPU and GPU forms (GptStage,
// GptCudaStage): a step's micro-batches and their discard marks, its parameters and
// gradients (spans of the models' memory, host or device), options and loss statistics, and a
// pool of models of the stage's slice, one per micro-batch in flight (holding its activations from
// its forward until its backward, or its weight pass), made on demand and kept for the next steps.
//
//   MicroBatchModels<nn::GptModel> models("GptStage", elements_per_sample, std::move(first));
//   RM_RETURN_IF_ERROR(models.Begin(micro_batches, params, grads, options, discarded));
//   RM_ASSIGN_OR_RETURN(Model* m, models.ForForward(micro, make));  // then its forward, then
//   models.Started(micro);                                            // it is in flight
//   RM_ASSIGN_OR_RETURN(Model* m, models.InFlight(micro));  // its backward, then
//   models.Release(micro);
//
// Errors name `owner` (the stage's class). Not thread-safe.
#ifndef RINGMASTER_TRAIN_PIPELINE_MICRO_BATCH_MODELS_H_
#define RINGMASTER_TRAIN_PIPELINE_MICRO_BATCH_MODELS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/pipeline/executor.h"

namespace ringmaster::train::pipeline {

template <typename Model>
class MicroBatchModels {
 public:
  // `boundary_per_sample`: floats of one sample's activation between two stages (context *
  // width). `first`: the pool's first model (never null).
  MicroBatchModels(std::string owner, int64_t boundary_per_sample, std::unique_ptr<Model> first)
      : owner_(std::move(owner)), boundary_per_sample_(boundary_per_sample) {
    free_.push_back(first.get());
    pool_.push_back(std::move(first));
  }

  // The first model made (the slice's table, its options).
  Model& front() const { return *pool_.front(); }
  const std::vector<std::unique_ptr<Model>>& pool() const { return pool_; }

  // A step begins: its micro-batches, parameters and gradients (all outliving it; the caller
  // checks the buffers' sizes and zeroes the gradients), options (accumulating, without
  // on_grads_ready) and discard marks (empty: none); its statistics restart. INVALID_ARGUMENT
  // for a ParameterStore or marks of another length (nothing changes then). What a failed
  // step left in flight is dropped.
  absl::Status Begin(absl::Span<const Batch> micro_batches, absl::Span<const float> params,
                     absl::Span<float> grads, const ForwardBackwardOptions& options,
                     std::vector<bool> discarded) {
    if (options.store != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(owner_, "::BeginStep: a ParameterStore (not for pipeline stages)"));
    }
    if (!discarded.empty() && discarded.size() != micro_batches.size()) {
      return absl::InvalidArgumentError(absl::StrCat(owner_, "::BeginStep: ", discarded.size(),
                                                     " discard marks for ", micro_batches.size(),
                                                     " micro-batches"));
    }
    discarded.resize(micro_batches.size(), false);
    discarded_ = std::move(discarded);
    while (!in_flight_.empty()) Release(in_flight_.begin()->first);
    micro_batches_ = micro_batches;
    params_ = params;
    grads_ = grads;
    options_ = options;
    options_.accumulate = true;
    options_.on_grads_ready = nullptr;
    stats_ = {};
    started_ = true;
    return absl::OkStatus();
  }
  absl::Span<const float> params() const { return params_; }
  absl::Span<float> grads() const { return grads_; }
  const ForwardBackwardOptions& options() const { return options_; }
  const StepStats& stats() const { return stats_; }
  // Adds a micro-batch's loss statistics to the step's.
  void AddStats(const StepStats& micro) {
    stats_.loss_sum += micro.loss_sum;
    stats_.loss_terms += micro.loss_terms;
    stats_.correct += micro.correct;
  }

  // Micro-batch `micro` of the step (INVALID_ARGUMENT naming the count when there is none).
  absl::StatusOr<const Batch*> MicroBatch(int micro) const {
    if (micro < 0 || micro >= static_cast<int>(micro_batches_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(owner_, ": micro-batch ", micro, " of ",
                                                     micro_batches_.size(), " given to BeginStep"));
    }
    return &micro_batches_[micro];
  }
  bool discarded(int micro) const { return discarded_[micro]; }
  // Floats of `micro`'s activation between two stages (0 for a micro-batch not in the step).
  int64_t BoundaryElements(int micro) const {
    absl::StatusOr<const Batch*> b = MicroBatch(micro);
    return b.ok() ? (*b)->size * boundary_per_sample_ : 0;
  }

  // The model for `micro`'s forward: a free one, or one `make` makes (then kept in the pool).
  // FAILED_PRECONDITION before a step or when `micro` is already in flight; INVALID_ARGUMENT
  // for a micro-batch not in the step. The model is in flight once Started(micro) is called.
  absl::StatusOr<Model*> ForForward(
      int micro, const std::function<absl::StatusOr<std::unique_ptr<Model>>()>& make) {
    if (!started_) return absl::FailedPreconditionError(absl::StrCat(owner_, ": no BeginStep yet"));
    RM_RETURN_IF_ERROR(MicroBatch(micro).status());
    if (in_flight_.count(micro)) {
      return absl::FailedPreconditionError(
          absl::StrCat(owner_, ": micro-batch ", micro, " is already in flight"));
    }
    if (free_.empty()) {
      RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, make());
      free_.push_back(model.get());
      pool_.push_back(std::move(model));
    }
    return free_.back();
  }
  // After a successful forward with ForForward(micro)'s model.
  void Started(int micro) {
    in_flight_[micro] = free_.back();
    free_.pop_back();
  }
  // A free model (null while every one is in flight).
  Model* AnyFree() const { return free_.empty() ? nullptr : free_.back(); }

  // The model holding `micro`'s activations (FAILED_PRECONDITION when none does).
  absl::StatusOr<Model*> InFlight(int micro) const {
    auto it = in_flight_.find(micro);
    if (it == in_flight_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(owner_, ": micro-batch ", micro, " has no forward in flight"));
    }
    return it->second;
  }
  // `micro`'s model is free again (its backward is done).
  void Release(int micro) {
    auto it = in_flight_.find(micro);
    free_.push_back(it->second);
    in_flight_.erase(it);
  }

 private:
  const std::string owner_;
  const int64_t boundary_per_sample_;
  std::vector<std::unique_ptr<Model>> pool_;  // every model made; pool_[0] always
  std::vector<Model*> free_;
  std::map<int, Model*> in_flight_;  // by micro-batch
  absl::Span<const Batch> micro_batches_;
  absl::Span<const float> params_;
  absl::Span<float> grads_;
  ForwardBackwardOptions options_;
  StepStats stats_;
  std::vector<bool> discarded_;
  bool started_ = false;
};

// A PipelineStage whose Backward and BackwardInput are one pass, with or without its weight
// gradients deferred to BackwardWeight (the GPT stages' split).
class SplitBackwardStage : public PipelineStage {
 public:
  absl::Status Backward(int micro, absl::Span<const float> output_grad,
                        absl::Span<float> input_grad) final {
    return BackwardOf(micro, output_grad, input_grad, /*defer_weights=*/false);
  }
  absl::Status BackwardInput(int micro, absl::Span<const float> output_grad,
                             absl::Span<float> input_grad) final {
    return BackwardOf(micro, output_grad, input_grad, /*defer_weights=*/true);
  }

 protected:
  virtual absl::Status BackwardOf(int micro, absl::Span<const float> output_grad,
                                  absl::Span<float> input_grad, bool defer_weights) = 0;
};

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_MICRO_BATCH_MODELS_H_
