#include "train/pipeline/gpt_cuda_stage.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace ringmaster::train::pipeline {

absl::StatusOr<std::unique_ptr<GptCudaStage>> GptCudaStage::Create(const nn::GptOptions& slice,
                                                                   const nn::GptCudaOptions& cuda,
                                                                   cudaStream_t stream) {
  // The first model keeps the stage's 16-bit copy of the parameters (bf16/fp16), cast once a
  // step (BeginStep); the models made for more micro-batches in flight read it.
  nn::GptCudaOptions first = cuda;
  first.parameter_copy_of = nullptr;
  first.cast_in_slices = false;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptCuda> model,
                      nn::GptCuda::Create(slice, first, stream));
  nn::GptCudaOptions others = first;
  if (model->parameter_copy_bytes() > 0) others.parameter_copy_of = model.get();
  return absl::WrapUnique(new GptCudaStage(std::move(model), slice, others, stream));
}

GptCudaStage::GptCudaStage(std::unique_ptr<nn::GptCuda> first, const nn::GptOptions& slice,
                           const nn::GptCudaOptions& cuda, cudaStream_t stream)
    : slice_(slice),
      cuda_(cuda),
      stream_(stream),
      models_("GptCudaStage", slice.context * slice.width, std::move(first)) {}

absl::Status GptCudaStage::BeginStep(absl::Span<const Batch> micro_batches,
                                     absl::Span<const float> params, absl::Span<float> grads,
                                     const ForwardBackwardOptions& options,
                                     std::vector<bool> discarded) {
  const int64_t need = model().total_elements();
  if (static_cast<int64_t>(params.size()) < need || static_cast<int64_t>(grads.size()) < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaStage::BeginStep: the parameters and gradients of '",
        model().cpu_model().Describe(), "' need ", need, " floats each (device memory)"));
  }
  if (options.precision != model().precision()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaStage::BeginStep: options.precision ", PrecisionName(options.precision),
        " is not the model's ", PrecisionName(model().precision()), " (GptCudaOptions::matmul)"));
  }
  // A failed step can leave micro-batches in flight: that step is lost, its models free.
  RM_RETURN_IF_ERROR(models_.Begin(micro_batches, params, grads, options, std::move(discarded)));
  // The step's parameters in 16 bits, once, for every micro-batch (bf16/fp16).
  RM_RETURN_IF_ERROR(models_.pool().front()->CastParameterCopy(params.data()));
  if (!grads.empty()) {
    RM_RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(grads.data(), 0, grads.size() * sizeof(float), stream_));
  }
  return absl::OkStatus();
}

void GptCudaStage::set_tensor_parallel_sum(nn::GptCuda::DeviceSum sum) {
  tp_sum_ = std::move(sum);
  for (const auto& m : models_.pool()) m->set_tensor_parallel_sum(tp_sum_);
}

absl::Status GptCudaStage::Synchronize() {
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

int64_t GptCudaStage::activation_bytes() const {
  int64_t bytes = 0;
  for (const auto& m : models_.pool()) bytes += m->activation_bytes();
  return bytes;
}

int64_t GptCudaStage::input_elements(int micro) const {
  return model().cpu_model().has_embeddings() ? 0 : models_.BoundaryElements(micro);
}

int64_t GptCudaStage::output_elements(int micro) const {
  return model().cpu_model().has_head() ? 0 : models_.BoundaryElements(micro);
}

absl::Status GptCudaStage::CheckSize(const char* what, size_t size, int64_t want) {
  if (static_cast<int64_t>(size) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("GptCudaStage: ", what, " holds ", size, " floats; want ", want));
}

absl::Status GptCudaStage::Forward(int micro, absl::Span<const float> input,
                                   absl::Span<float> output) {
  RM_ASSIGN_OR_RETURN(
      nn::GptCuda * model,
      models_.ForForward(micro, [&]() -> absl::StatusOr<std::unique_ptr<nn::GptCuda>> {
        RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptCuda> m,
                            nn::GptCuda::Create(slice_, cuda_, stream_));
        m->set_tensor_parallel_sum(tp_sum_);
        return m;
      }));
  RM_RETURN_IF_ERROR(CheckSize("Forward's input", input.size(), input_elements(micro)));
  RM_RETURN_IF_ERROR(CheckSize("Forward's output", output.size(), output_elements(micro)));
  const bool first = model->cpu_model().has_embeddings(), last = model->cpu_model().has_head();
  RM_RETURN_IF_ERROR(model->SliceForward(**models_.MicroBatch(micro), models_.params().data(),
                                         first ? nullptr : input.data(),
                                         last ? nullptr : output.data()));
  // The executor sends `output` on the communicator's stream right after this returns.
  RM_RETURN_IF_ERROR(Synchronize());
  models_.Started(micro);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GptCudaStage::Evaluate(const Batch& batch, absl::Span<const float> params,
                                                 absl::Span<const float> input,
                                                 absl::Span<float> output) {
  nn::GptCuda* model = models_.AnyFree();
  if (model == nullptr) {
    return absl::FailedPreconditionError(
        "GptCudaStage::Evaluate: a step's micro-batches are in flight");
  }
  const bool first = model->cpu_model().has_embeddings(), last = model->cpu_model().has_head();
  const int64_t boundary = batch.size * slice_.context * slice_.width;
  RM_RETURN_IF_ERROR(CheckSize("Evaluate's input", input.size(), first ? 0 : boundary));
  RM_RETURN_IF_ERROR(CheckSize("Evaluate's output", output.size(), last ? 0 : boundary));
  RM_RETURN_IF_ERROR(model->CastParameterCopy(params.data()));  // the stage's copy is a step's
  RM_RETURN_IF_ERROR(model->SliceForward(batch, params.data(), first ? nullptr : input.data(),
                                         last ? nullptr : output.data()));
  if (last) return model->SliceLoss();  // waits for the stream
  RM_RETURN_IF_ERROR(Synchronize());
  return StepStats{};
}

absl::StatusOr<StepStats> GptCudaStage::Evaluate(const Batch& batch, absl::Span<const float> params,
                                                 Precision precision, absl::Span<const float> input,
                                                 absl::Span<float> output) {
  if (precision != model().precision()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCudaStage::Evaluate in ", PrecisionName(precision),
                     " on a stage made for ", PrecisionName(model().precision())));
  }
  return Evaluate(batch, params, input, output);
}

int64_t GptCudaStage::parameter_copy_bytes() const {
  int64_t bytes = 0;
  for (const auto& m : models_.pool()) bytes += m->parameter_copy_bytes();
  return bytes;
}

absl::Status GptCudaStage::BackwardOf(int micro, absl::Span<const float> output_grad,
                                      absl::Span<float> input_grad, bool defer_weights) {
  RM_ASSIGN_OR_RETURN(nn::GptCuda * model, models_.InFlight(micro));
  RM_RETURN_IF_ERROR(
      CheckSize("the output's gradient", output_grad.size(), output_elements(micro)));
  RM_RETURN_IF_ERROR(CheckSize("the input's gradient", input_grad.size(), input_elements(micro)));
  const bool first = model->cpu_model().has_embeddings(), last = model->cpu_model().has_head();
  RM_ASSIGN_OR_RETURN(
      const StepStats stats,
      model->SliceBackward(models_.grads().data(), models_.options(),
                           last ? nullptr : output_grad.data(), first ? nullptr : input_grad.data(),
                           defer_weights, models_.discarded(micro)));
  // The executor sends `input_grad` and frees `output_grad` right after this returns.
  RM_RETURN_IF_ERROR(Synchronize());
  models_.AddStats(stats);
  if (!defer_weights) models_.Release(micro);
  return absl::OkStatus();
}

absl::Status GptCudaStage::BackwardWeight(int micro) {
  RM_ASSIGN_OR_RETURN(nn::GptCuda * model, models_.InFlight(micro));
  // Only enqueued: the model's next micro-batch runs after it on the same stream.
  RM_RETURN_IF_ERROR(model->SliceBackwardWeights(models_.grads().data(), models_.options()));
  models_.Release(micro);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::pipeline
