#include "train/nn/sequential.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/precision.h"
#include "train/nn/random.h"

namespace ringmaster::train::nn {
namespace {

using kernels::OutputMode;

bool FinitePositive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

kernels::HalfFormat HalfFormatOf(Precision precision) {
  return precision == Precision::kBFloat16 ? kernels::HalfFormat::kBFloat16
                                           : kernels::HalfFormat::kFloat16;
}

void RoundToPrecision(Precision precision, float* values, int64_t n) {
  if (IsHalf(precision)) kernels::RoundTo(HalfFormatOf(precision), values, values, n);
}

absl::Status CheckLossOptions(const ForwardBackwardOptions& options) {
  if (!FinitePositive(options.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.loss_scale is ", options.loss_scale, "; want finite and > 0"));
  }
  if (!FinitePositive(options.loss_divisor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.loss_divisor is ", options.loss_divisor, "; want finite and > 0"));
  }
  return absl::OkStatus();
}

SequentialClassifier::SequentialClassifier(std::string description, int64_t classes)
    : description_(std::move(description)), loss_(classes) {}

void SequentialClassifier::Add(std::unique_ptr<Layer> layer) {
  if (!layers_.empty()) CHECK_EQ(layer->input_size(), layers_.back()->output_size());
  largest_output_ = std::max(largest_output_, layer->output_size());
  const std::vector<Parameter>& parameters = layer->parameters();
  layer_group_.push_back(parameters.empty() ? -1 : static_cast<int>(groups_.size()));
  if (!parameters.empty()) {
    const int block = static_cast<int>(groups_.size());
    groups_.push_back({layer->Describe(), parameters.front().table_index,
                       parameters.back().table_index + 1, block,
                       absl::StrCat("layer ", block)});
    // The network's first layer makes no input gradient, so its backward needs only x.
    groups_.back().backward_reads_parameters = !layers_.empty();
    const Parameter& last = parameters.back();
    largest_parameter_span_ =
        std::max(largest_parameter_span_, last.offset + last.numel - parameters.front().offset);
    grad_targets_.resize(std::max(grad_targets_.size(), parameters.size()));
  }
  layers_.push_back(std::move(layer));
  outputs_.push_back(nullptr);
  output_buffers_.emplace_back();
}

void SequentialClassifier::InitTensors(uint64_t seed, const TensorSink& sink) const {
  SplitMix64 rng(seed);
  std::vector<float> values;
  for (const auto& layer : layers_) {
    for (const Parameter& p : layer->parameters()) {
      values.resize(p.numel);
      FillUniform(rng, p.init_bound, absl::MakeSpan(values));
      sink(p.table_index, values);
    }
  }
}

absl::Status SequentialClassifier::CheckBatch(const Batch& batch) const {
  return CheckClassifierBatch(batch, description_, input_size(), classes());
}

absl::Status CheckClassifierBatch(const Batch& batch, const std::string& description,
                                  int64_t input_size, int64_t classes) {
  if (batch.size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.size is ", batch.size, "; want at least 1 sample"));
  }
  if (batch.feature_dim != input_size) {
    return absl::InvalidArgumentError(absl::StrCat("batch.feature_dim is ", batch.feature_dim,
                                                   "; model '", description, "' takes ", input_size,
                                                   " features"));
  }
  if (static_cast<int64_t>(batch.features.size()) != batch.size * batch.feature_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch.features holds ", batch.features.size(),
        " values; want batch.size * batch.feature_dim = ", batch.size * batch.feature_dim));
  }
  if (static_cast<int64_t>(batch.labels.size()) != batch.size) {
    return absl::InvalidArgumentError(absl::StrCat("batch.labels holds ", batch.labels.size(),
                                                   " labels; want batch.size = ", batch.size));
  }
  for (size_t i = 0; i < batch.labels.size(); ++i) {
    if (batch.labels[i] < 0 || batch.labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("batch.labels[", i, "] is ", batch.labels[i],
                                                     "; want a class in 0..", classes - 1));
    }
  }
  return absl::OkStatus();
}

const float* SequentialClassifier::ComputeParams(const state::FlatBuffer& params,
                                                 Precision precision, ParameterStore* store) {
  if (store != nullptr) return nullptr;  // the store's parameters are in compute precision
  CHECK_GE(params.size(), table_.total_elements());
  if (!IsHalf(precision)) return params.data();
  if (compute_params_.size() != params.size()) compute_params_ = state::FlatBuffer(params.size());
  kernels::RoundTo(HalfFormatOf(precision), params.data(), compute_params_.data(), params.size());
  return compute_params_.data();
}

const float* SequentialClassifier::LayerParams(size_t i, const float* params,
                                               ParameterStore* store) const {
  if (store == nullptr || layer_group_[i] < 0) return params;
  return store->Parameters(layer_group_[i]);
}

const float* SequentialClassifier::Forward(const Batch& batch, const float* params,
                                           Precision precision, ParameterStore* store) {
  const int64_t n = batch.size;
  input_ = batch.features.data();
  if (IsHalf(precision) || layers_.front()->aliasing() == Aliasing::kInPlace) {
    float* copy = input_copy_.Reserve(n * input_size());
    std::copy_n(batch.features.data(), n * input_size(), copy);
    RoundToPrecision(precision, copy, n * input_size());
    input_ = copy;
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i];
    const float* x = LayerInput(i);
    float* y = layer.aliasing() == Aliasing::kSeparate
                   ? output_buffers_[i].Reserve(n * layer.output_size())
                   : (i == 0 ? input_copy_.data() : outputs_[i - 1]);  // x, writable
    layer.Forward(LayerParams(i, params, store), x, y, n);
    RoundToPrecision(precision, y, n * layer.output_size());
    outputs_[i] = y;
  }
  return outputs_.back();
}

absl::StatusOr<StepStats> SequentialClassifier::Evaluate(const Batch& batch,
                                                         const state::FlatBuffer& params,
                                                         Precision precision,
                                                         ParameterStore* store) {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  const float* logits =
      Forward(batch, ComputeParams(params, precision, store), precision, store);
  return loss_.Forward(logits, batch.labels.data(), batch.size);
}

absl::StatusOr<StepStats> SequentialClassifier::ForwardBackward(
    const Batch& batch, const state::FlatBuffer& params, state::FlatBuffer& grads,
    const ForwardBackwardOptions& options) {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  if (absl::Status s = CheckLossOptions(options); !s.ok()) return s;
  if (options.store != nullptr && options.accumulate) {
    return absl::InvalidArgumentError(
        "ForwardBackwardOptions: accumulate with a ParameterStore (the store sums micro-batches)");
  }
  if (options.store == nullptr) CHECK_GE(grads.size(), table_.total_elements());
  const int64_t n = batch.size;
  const float* compute_params = ComputeParams(params, options.precision, options.store);
  const float* logits = Forward(batch, compute_params, options.precision, options.store);
  if (options.store != nullptr) options.store->BeginBackward();

  float* dlogits = grad_[0].Reserve(n * largest_output_);
  grad_[1].Reserve(n * largest_output_);
  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  const StepStats stats = loss_.ForwardBackward(logits, batch.labels.data(), n, scale, dlogits);
  RoundToPrecision(options.precision, dlogits, n * classes());
  Backward(compute_params, n, grads, options);
  return stats;
}

void SequentialClassifier::Backward(const float* params, int64_t n, state::FlatBuffer& grads,
                                    const ForwardBackwardOptions& options) {
  int current = 0;  // grad_[current] holds the gradient of layer i's output
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i];
    const float* dy = grad_[current].data();
    BackwardParams(layer, layer_group_[i], LayerInput(i), dy, n, grads, options);
    if (i > 0) {  // no gradient for the data
      if (layer.aliasing() == Aliasing::kSeparate) current = 1 - current;
      float* dx = grad_[current].data();
      layer.BackwardInput(LayerParams(i, params, options.store), LayerInput(i), outputs_[i], dy,
                          dx, n);
      RoundToPrecision(options.precision, dx, n * layer.input_size());
    }
    // The layer's gradients are final and its parameters read for the last time.
    if (layer_group_[i] >= 0) {
      if (options.store != nullptr) options.store->GradientsDone(layer_group_[i]);
      if (options.on_grads_ready) options.on_grads_ready(layer.parameters().front().offset);
    }
    if (i == 0) break;
  }
  // The first layer with parameters announced offset 0 already, unless there is none.
  if (options.on_grads_ready && table_.size() == 0) options.on_grads_ready(0);
}

void SequentialClassifier::BackwardParams(Layer& layer, int group, const float* x,
                                          const float* dy, int64_t n, state::FlatBuffer& grads,
                                          const ForwardBackwardOptions& options) {
  const std::vector<Parameter>& parameters = layer.parameters();
  if (parameters.empty()) return;
  float* base = options.store != nullptr ? options.store->Gradients(group) : grads.data();
  const bool half = IsHalf(options.precision);
  // Half precision with accumulate: the gradient is produced (and rounded) apart, then added.
  const bool staged = half && options.accumulate;
  float* stage = staged ? staged_grads_.Reserve(largest_parameter_span_) : nullptr;
  const int64_t first = parameters.front().offset;
  for (size_t k = 0; k < parameters.size(); ++k) {
    grad_targets_[k] =
        staged ? stage + (parameters[k].offset - first) : base + parameters[k].offset;
  }
  const OutputMode mode =
      options.accumulate && !half ? OutputMode::kAccumulate : OutputMode::kOverwrite;
  layer.BackwardParams(x, dy, n, absl::MakeConstSpan(grad_targets_.data(), parameters.size()),
                       mode);
  if (half) {
    for (size_t k = 0; k < parameters.size(); ++k) {
      float* sum = base + parameters[k].offset;
      if (staged) {
        kernels::AddRounded(HalfFormatOf(options.precision), grad_targets_[k], sum,
                            parameters[k].numel);
      } else {
        kernels::RoundTo(HalfFormatOf(options.precision), sum, sum, parameters[k].numel);
      }
    }
  }
}

MemoryStats SequentialClassifier::memory() const {
  int64_t bytes = input_copy_.bytes() + grad_[0].bytes() + grad_[1].bytes() + loss_.scratch_bytes();
  for (const GrowBuffer<float>& b : output_buffers_) bytes += b.bytes();
  for (const auto& layer : layers_) bytes += layer->scratch_bytes();
  return {.activation_bytes_peak = bytes};
}

}  // namespace ringmaster::train::nn
