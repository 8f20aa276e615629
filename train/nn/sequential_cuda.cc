#include "train/nn/sequential_cuda.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rows.h"
#include "kernels/precision.h"

namespace ringmaster::train::nn {
namespace {

namespace kc = kernels::cuda;
using kernels::OutputMode;

}  // namespace

absl::StatusOr<std::unique_ptr<SequentialCuda>> SequentialCuda::Create(
    const SequentialClassifier& model, const SequentialCudaOptions& options, cudaStream_t stream) {
  auto gpu = absl::WrapUnique(new SequentialCuda);
  gpu->precision_ = options.matmul == kc::MatMulType::kBFloat16  ? Precision::kBFloat16
                    : options.matmul == kc::MatMulType::kFloat16 ? Precision::kFloat16
                                                                 : Precision::kFloat32;
  // 16-bit values in fp32 storage: TF32 products are exact for them.
  gpu->products_ = IsHalf(gpu->precision_) ? kc::MatMulType::kTensorFloat32 : options.matmul;
  const std::vector<ParameterGroup> groups = model.parameter_groups();
  for (const auto& layer : model.layers()) {
    Step step;
    step.in = layer->input_size();
    step.out = layer->output_size();
    if (dynamic_cast<const Linear*>(layer.get()) != nullptr) {
      step.kind = Kind::kLinear;
    } else if (dynamic_cast<const Relu*>(layer.get()) != nullptr) {
      step.kind = Kind::kRelu;
    } else if (const auto* conv = dynamic_cast<const Conv2d*>(layer.get())) {
      step.kind = Kind::kConv;
      step.conv = conv->Shape(0);
    } else if (const auto* pool = dynamic_cast<const MaxPool2d*>(layer.get())) {
      step.kind = Kind::kPool;
      step.channels = pool->channels();
      step.height = pool->height();
      step.width = pool->width();
    } else {
      return absl::UnimplementedError(absl::StrCat("layer '", layer->Describe(), "' of model ",
                                                   model.Describe(), " has no CUDA twin"));
    }
    // Linear and Conv2d always have a weight and a bias (train/nn/layers.h).
    if (step.has_params()) {
      const std::vector<Parameter>& p = layer->parameters();
      step.weight = p[0].offset;
      step.bias = p[1].offset;
      step.weight_numel = p[0].numel;
      step.bias_numel = p[1].numel;
      for (size_t g = 0; g < groups.size(); ++g) {
        if (groups[g].first_tensor == p[0].table_index) step.group = static_cast<int>(g);
      }
      CHECK_GE(step.group, 0) << "no parameter group starts at layer '" << layer->Describe() << "'";
      gpu->largest_parameter_span_ =
          std::max(gpu->largest_parameter_span_, step.weight_numel + step.bias_numel);
    }
    gpu->steps_.push_back(step);
  }
  gpu->description_ = model.Describe();
  gpu->input_size_ = model.input_size();
  gpu->classes_ = model.classes();
  gpu->total_elements_ = model.table().total_elements();
  gpu->options_ = options;
  gpu->stream_ = stream;
  gpu->arena_ = std::make_unique<DeviceArena>(stream);
  RM_ASSIGN_OR_RETURN(gpu->engine_, kc::MatMulEngine::Create());
  return gpu;
}

absl::Status SequentialCuda::Reserve(int64_t batch) {
  if (batch <= capacity_) return absl::OkStatus();
  auto place = [&](DeviceArena::Layout& layout) {
    auto take = [&](int64_t n) { return layout.Floats(n); };
    auto take_ints = [&](int64_t n) { return layout.Ints(n); };
    input_ = take(batch * input_size_);
    outputs_.assign(steps_.size(), nullptr);
    argmax_.assign(steps_.size(), nullptr);
    int64_t largest = 0, scratch = 0;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      largest = std::max(largest, s.out);
      // ReLU runs in place: its output is its input (the layer before needs neither its own
      // output in backward, as on the CPU).
      outputs_[i] = s.kind == Kind::kRelu ? const_cast<float*>(Input(i)) : take(batch * s.out);
      if (s.kind == Kind::kPool) argmax_[i] = take_ints(batch * s.out);
      if (s.kind == Kind::kConv) {
        kernels::Conv2dShape shape = s.conv;
        shape.batch = batch;
        scratch = std::max(scratch, kc::Conv2dCudaScratchFloats(shape));
      }
      if (s.kind == Kind::kLinear)
        scratch = std::max(scratch, kc::BiasGradientScratchFloats(s.out));
    }
    grad_[0] = take(batch * largest);
    grad_[1] = take(batch * largest);
    labels_ = take_ints(batch);
    loss_ = take(batch);
    predicted_ = take_ints(batch);
    scratch_ = take(scratch);
    compute_params_ = IsHalf(precision_) ? take(total_elements_) : nullptr;
    staged_grads_ = IsHalf(precision_) ? take(largest_parameter_span_) : nullptr;
  };
  capacity_ = 0;  // until Fit succeeds: its pointers are stale
  RM_RETURN_IF_ERROR(
      arena_->Fit(place, absl::StrCat("SequentialCuda: activations for ", batch, " samples")));
  capacity_ = batch;
  return absl::OkStatus();
}

absl::Status SequentialCuda::Round(float* x, int64_t count) {
  return IsHalf(precision_) ? kc::RoundToHalf(HalfFormatOf(precision_), x, x, count, stream_)
                            : absl::OkStatus();
}

absl::StatusOr<const float*> SequentialCuda::StepParams(const Step& s, const float* params,
                                                        ParameterStore* store) {
  if (store == nullptr) return params;
  const float* values = store->Parameters(s.group);
  if (!IsHalf(precision_)) return values;
  // The weight and the bias, rounded at their offsets (as the whole copy without a store).
  for (const int64_t offset : {s.weight, s.bias}) {
    RM_RETURN_IF_ERROR(kc::RoundToHalf(HalfFormatOf(precision_), values + offset,
                                       compute_params_ + offset,
                                       offset == s.weight ? s.weight_numel : s.bias_numel, stream_));
  }
  return compute_params_;
}

absl::Status SequentialCuda::Forward(const float* all_params, ParameterStore* store, int64_t n) {
  const kc::MatMulType type = products_;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const float* x = Input(i);
    float* y = outputs_[i];
    const float* params = all_params;
    if (s.has_params()) {
      RM_ASSIGN_OR_RETURN(params, StepParams(s, all_params, store));
    }
    switch (s.kind) {
      case Kind::kLinear:
        RM_RETURN_IF_ERROR(engine_->LinearForward(type, x, params + s.weight, params + s.bias, y, n,
                                                  s.in, s.out, stream_));
        break;
      case Kind::kRelu:
        RM_RETURN_IF_ERROR(kc::ReluForward(x, y, n * s.out, stream_));
        break;
      case Kind::kConv: {
        kernels::Conv2dShape shape = s.conv;
        shape.batch = n;
        RM_RETURN_IF_ERROR(kc::Conv2dForward(engine_.get(), type, shape, x, params + s.weight,
                                             params + s.bias, y, scratch_, stream_));
        break;
      }
      case Kind::kPool:
        RM_RETURN_IF_ERROR(
            kc::MaxPool2x2Forward(x, y, argmax_[i], n * s.channels, s.height, s.width, stream_));
        break;
    }
    RM_RETURN_IF_ERROR(Round(y, n * s.out));
  }

  return absl::OkStatus();
}

absl::Status SequentialCuda::Backward(const float* all_params, float* all_grads, int64_t n,
                                      const ForwardBackwardOptions& options) {
  const kc::MatMulType type = products_;
  const bool half = IsHalf(precision_);
  const kernels::HalfFormat format = HalfFormatOf(precision_);
  ParameterStore* store = options.store;
  // grad_[current] holds the gradient of step i's output; the parameters' gradients add
  // onto zeroed (or accumulating) grads.
  int current = 0;
  for (size_t i = steps_.size(); i-- > 0;) {
    const Step& s = steps_[i];
    const float* x = Input(i);
    const float* dy = grad_[current];
    if (s.has_params()) {
      // With a store: the group's buffer, its weight and bias zeroed as the flat gradients are.
      float* grads = all_grads;
      if (store != nullptr) {
        grads = store->Gradients(s.group);
        RM_RETURN_IF_CUDA_ERROR(
            cudaMemsetAsync(grads + s.weight, 0, s.weight_numel * sizeof(float), stream_));
        RM_RETURN_IF_CUDA_ERROR(
            cudaMemsetAsync(grads + s.bias, 0, s.bias_numel * sizeof(float), stream_));
      }
      // fp32, and 16-bit without accumulate: onto the zeroed (or accumulating) gradients.
      // 16-bit with accumulate: produced apart, then rounded and added, as on the CPU.
      const bool staged = half && options.accumulate;
      float* dw = staged ? staged_grads_ : grads + s.weight;
      float* db = staged ? staged_grads_ + s.weight_numel : grads + s.bias;
      const OutputMode mode = staged ? OutputMode::kOverwrite : OutputMode::kAccumulate;
      if (s.kind == Kind::kLinear) {
        RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, x, dy, dw, db, n, s.in, s.out, mode,
                                                          scratch_, stream_));
      } else {
        kernels::Conv2dShape shape = s.conv;
        shape.batch = n;
        RM_RETURN_IF_ERROR(kc::Conv2dBackwardWeights(engine_.get(), type, shape, x, dy, dw, db,
                                                     mode, scratch_, stream_));
      }
      if (staged) {
        RM_RETURN_IF_ERROR(
            kc::AddRoundedHalf(format, dw, grads + s.weight, s.weight_numel, stream_));
        RM_RETURN_IF_ERROR(kc::AddRoundedHalf(format, db, grads + s.bias, s.bias_numel, stream_));
      } else {
        RM_RETURN_IF_ERROR(Round(grads + s.weight, s.weight_numel));
        RM_RETURN_IF_ERROR(Round(grads + s.bias, s.bias_numel));
      }
    }
    if (s.has_params() && options.on_grads_ready) options.on_grads_ready(s.weight);
    if (i > 0) {  // no gradient for the data
      const float* params = all_params;
      if (s.has_params()) {
        RM_ASSIGN_OR_RETURN(params, StepParams(s, all_params, store));
      }
      if (s.kind != Kind::kRelu) current = 1 - current;  // ReLU's backward is in place
      float* dx = grad_[current];
      switch (s.kind) {
        case Kind::kLinear:
          RM_RETURN_IF_ERROR(engine_->LinearBackwardInput(type, dy, params + s.weight, dx, n, s.in,
                                                          s.out, stream_));
          break;
        case Kind::kRelu:
          RM_RETURN_IF_ERROR(kc::ReluBackward(outputs_[i], dy, dx, n * s.out, stream_));
          break;
        case Kind::kConv: {
          kernels::Conv2dShape shape = s.conv;
          shape.batch = n;
          RM_RETURN_IF_ERROR(kc::Conv2dBackwardInput(engine_.get(), type, shape, params + s.weight,
                                                     dy, dx, scratch_, stream_));
          break;
        }
        case Kind::kPool:
          RM_RETURN_IF_ERROR(kc::MaxPool2x2Backward(dy, argmax_[i], dx, n * s.channels, s.height,
                                                    s.width, stream_));
          break;
      }
      RM_RETURN_IF_ERROR(Round(dx, n * s.in));
    }
    // The layer's gradients are enqueued, and the last read of its parameters.
    if (s.has_params() && store != nullptr) store->GradientsDone(s.group);
  }
  // As the CPU model: a model without parameters still announces offset 0.
  if (options.on_grads_ready && total_elements_ == 0) options.on_grads_ready(0);

  return absl::OkStatus();
}

absl::StatusOr<StepStats> SequentialCuda::ForwardBackward(const Batch& batch, const float* params,
                                                          float* grads,
                                                          const ForwardBackwardOptions& options) {
  if (options.precision != precision_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SequentialCuda::ForwardBackward: options.precision is ", PrecisionName(options.precision),
        " but this GPU model was created for ", PrecisionName(precision_)));
  }
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  RM_RETURN_IF_ERROR(CheckClassifierBatch(batch, description_, input_size_, classes_));
  const bool stored = options.store != nullptr;
  if (stored && options.accumulate) {
    return absl::InvalidArgumentError(
        "ForwardBackwardOptions: accumulate with a ParameterStore (the store sums micro-batches)");
  }
  if (!stored && (params == nullptr || grads == nullptr)) {
    return absl::InvalidArgumentError(
        "SequentialCuda::ForwardBackward: params and grads are "
        "device pointers and must not be null");
  }
  const int64_t n = batch.size;
  RM_RETURN_IF_ERROR(Reserve(n));
  // 16-bit values: rounded where the CPU model rounds them (train/nn/sequential.cc); with a
  // store, each layer's parameters where the layer reads them (StepParams).
  if (!stored && IsHalf(precision_)) {
    RM_RETURN_IF_ERROR(kc::RoundToHalf(HalfFormatOf(precision_), params, compute_params_,
                                       total_elements_, stream_));
    params = compute_params_;
  }
  // Pageable host memory: each copy has left the host buffer when the call returns.
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(input_, batch.features.data(), n * input_size_ * 4,
                                          cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(labels_, batch.labels.data(), n * 4, cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_ERROR(Round(input_, n * input_size_));
  if (!stored && !options.accumulate) {
    RM_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(grads, 0, total_elements_ * sizeof(float), stream_));
  }

  RM_RETURN_IF_ERROR(Forward(params, options.store, n));
  if (stored) options.store->BeginBackward();

  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  RM_RETURN_IF_ERROR(kc::SoftmaxCrossEntropyForwardBackward(
      outputs_.back(), labels_, n, classes_, scale, loss_, predicted_, grad_[0], stream_));
  RM_RETURN_IF_ERROR(Round(grad_[0], n * classes_));

  RM_RETURN_IF_ERROR(Backward(params, grads, n, options));

  std::vector<float> loss(n);
  std::vector<int32_t> predicted(n);
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(loss.data(), loss_, n * 4, cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(predicted.data(), predicted_, n * 4, cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  StepStats stats;
  stats.loss_terms = n;
  for (int64_t i = 0; i < n; ++i) {
    stats.loss_sum += loss[i];
    stats.correct += predicted[i] == batch.labels[i];
  }
  return stats;
}

}  // namespace ringmaster::train::nn
