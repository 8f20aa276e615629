#include "train/nn/resnet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/activation.h"
#include "kernels/matmul.h"
#include "kernels/parallel.h"
#include "train/nn/random.h"
#include "train/nn/sequential.h"

namespace ringmaster::train::nn {
namespace {

using kernels::OutputMode;

constexpr int64_t kSide = 32;  // the network's input images
constexpr int64_t kChannels = 3;
constexpr int64_t kEvaluationPiece = 32;  // samples per evaluation forward

// The memory-bound passes over the activations run on the rank's compute threads.
void OnThreads(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  kernels::ParallelFor(kernels::BlasThreads(), n, body);
}

// g = g where y > 0, else 0 (y: the ReLU's output), and a copy of it into `copy` (if not
// null).
void ReluBackward(const float* y, float* g, float* copy, int64_t n) {
  OnThreads(n, [&](int64_t b, int64_t e) {
    kernels::ReluBackward(y + b, g + b, g + b, e - b);
    if (copy != nullptr) std::copy(g + b, g + e, copy + b);
  });
}

void Add(const float* x, float* y, int64_t n) {
  OnThreads(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += x[i];
  });
}

}  // namespace

// A convolution and its BatchNorm; keeps the convolution's output for the backward.
struct ResNet18::ConvBn {
  StridedConv2d conv;
  BatchNorm2d bn;
  GrowBuffer<float> conv_out;

  ConvBn(state::TensorTable& table, absl::string_view conv_name, absl::string_view bn_name,
         int64_t in_channels, int64_t out_channels, int64_t side, int64_t kernel_size,
         int64_t stride)
      : conv(table, conv_name, in_channels, out_channels, side, side, kernel_size, stride,
             kernel_size / 2),
        bn(table, bn_name, out_channels, conv.output_size() / out_channels) {}

  // y = then(bn(conv(x))): the BatchNorm's epilogue adds a residual and applies a ReLU in
  // its pass.
  absl::Status Forward(const float* params, const float* x, float* y, int64_t n, bool training,
                       const ReplicaSum& sum, float* pending, int64_t pending_begin,
                       const kernels::BatchNormEpilogue& then = {}) {
    float* out = conv_out.Reserve(n * conv.output_size());
    conv.Forward(params, x, out, n);
    if (!training) {
      bn.ForwardEval(params, out, y, n, then);
      return absl::OkStatus();
    }
    return bn.ForwardTrain(params, out, y, n, sum,
                           pending + bn.running_mean_offset() - pending_begin,
                           pending + bn.running_var_offset() - pending_begin, then);
  }

  // dy is overwritten (it becomes the convolution's output gradient); dx may be null.
  absl::Status Backward(const float* params, const float* x, float* dy, float* dx, int64_t n,
                        const ReplicaSum& sum, float* grads, OutputMode mode) {
    RM_RETURN_IF_ERROR(bn.Backward(params, conv_out.data(), dy, dy, n, sum,
                                   grads + bn.weight_offset(), grads + bn.bias_offset(), mode));
    float* const dweight[] = {grads + conv.parameters()[0].offset};
    conv.Backward(params, x, dy, n, dweight, mode, dx);
    return absl::OkStatus();
  }
};

// A basic block: out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut a
// 1x1 convolution and BatchNorm where the block changes the size, else x.
struct ResNet18::Block {
  std::unique_ptr<ConvBn> a;
  std::unique_ptr<ConvBn> b;
  std::unique_ptr<ConvBn> shortcut;  // null: identity
  int first_tensor = 0;
  int64_t in_size = 0;  // floats per sample
  int64_t out_size = 0;
  GrowBuffer<float> mid;  // after a's ReLU
  GrowBuffer<float> out;  // the block's output
};

absl::StatusOr<std::unique_ptr<ResNet18>> ResNet18::Create(const ResNetOptions& options) {
  if (options.image_side < 1 || options.image_side > kSide) {
    return absl::InvalidArgumentError(absl::StrCat("resnet18.image_side is ", options.image_side,
                                                   "; want 1..32 (images are padded to 32x32)"));
  }
  if (options.width < 1 || options.width > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("resnet18.width is ", options.width, "; want 1..1024"));
  }
  if (options.classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("resnet18.classes is ", options.classes, "; want at least 2"));
  }
  return std::unique_ptr<ResNet18>(new ResNet18(options));
}

ResNet18::~ResNet18() = default;

void ResNet18::AddGroup(std::string name, int first, int end, int block, std::string block_name) {
  ParameterGroup g;
  g.name = std::move(name);
  g.first_tensor = first;
  g.end_tensor = end;
  g.block = block;
  g.block_name = std::move(block_name);
  groups_.push_back(std::move(g));
}

std::unique_ptr<ResNet18::ConvBn> ResNet18::AddConvBn(absl::string_view conv_name,
                                                      absl::string_view bn_name,
                                                      int64_t in_channels, int64_t out_channels,
                                                      int64_t side, int64_t kernel_size,
                                                      int64_t stride, int block,
                                                      const std::string& block_name) {
  const int first = table_.size();
  auto cb = std::make_unique<ConvBn>(table_, conv_name, bn_name, in_channels, out_channels, side,
                                     kernel_size, stride);
  cb->conv.ShareScratch(&conv_scratch_);
  AddGroup(cb->conv.Describe(), first, first + 1, block, block_name);
  AddGroup(absl::StrCat("batchnorm ", out_channels), first + 1, table_.size(), block, block_name);
  largest_activation_ =
      std::max({largest_activation_, cb->conv.input_size(), cb->conv.output_size()});
  return cb;
}

ResNet18::ResNet18(const ResNetOptions& options) : options_(options), loss_(options.classes) {
  const int64_t w = options.width;
  stem_ = AddConvBn("conv1", "bn1", kChannels, w, kSide, 3, 1, 0, "stem");
  groups_[0].backward_reads_parameters = false;  // no input gradient
  int64_t in = w, side = kSide;
  int block = 1;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t out = w << stage;
    for (int i = 0; i < 2; ++i, ++block) {
      const int64_t stride = stage > 0 && i == 0 ? 2 : 1;
      const std::string name = absl::StrCat("layer", stage + 1, ".", i);
      auto b = std::make_unique<Block>();
      b->first_tensor = table_.size();
      b->a = AddConvBn(name + ".conv1", name + ".bn1", in, out, side, 3, stride, block, name);
      const int64_t out_side = (side - 1) / stride + 1;
      b->b = AddConvBn(name + ".conv2", name + ".bn2", out, out, out_side, 3, 1, block, name);
      if (stride != 1 || in != out) {
        b->shortcut = AddConvBn(name + ".shortcut.0", name + ".shortcut.1", in, out, side, 1,
                                stride, block, name);
      }
      b->in_size = in * side * side;
      b->out_size = out * out_side * out_side;
      blocks_.push_back(std::move(b));
      in = out;
      side = out_side;
    }
  }
  const int head = table_.size();
  pool_ = std::make_unique<GlobalAvgPool>(in, side * side);
  fc_ = std::make_unique<Linear>(table_, "linear", in, options.classes);
  AddGroup(fc_->Describe(), head, table_.size(), block, "head");
  const int first_buffer = table_.size();
  stem_->bn.AddRunningStatistics(table_);
  for (auto& b : blocks_) {
    b->a->bn.AddRunningStatistics(table_);
    b->b->bn.AddRunningStatistics(table_);
    if (b->shortcut) b->shortcut->bn.AddRunningStatistics(table_);
  }
  AddGroup("batchnorm running statistics", first_buffer, table_.size(), block + 1, "buffers");
  groups_.back().backward_reads_parameters = false;
  buffers_ = {table_.tensor(first_buffer).offset, table_.total_elements()};
  pending_.resize(buffers_.size());

  // Initial values: uniform for the convolutions and the linear layer, BatchNorm weight and
  // running variance 1, the rest 0.
  init_bound_.assign(table_.size(), 0.0f);
  init_value_.assign(table_.size(), 0.0f);
  auto uniform = [&](const Layer& layer) {
    for (const Parameter& p : layer.parameters()) init_bound_[p.table_index] = p.init_bound;
  };
  auto ones = [&](const BatchNorm2d& bn) {
    init_value_[bn.weight_tensor()] = 1.0f;
    // running_var follows running_mean, which follows the bias... found by offset.
    for (int i = first_buffer; i < table_.size(); ++i) {
      if (table_.tensor(i).offset == bn.running_var_offset()) init_value_[i] = 1.0f;
    }
  };
  auto conv_bn = [&](const ConvBn& cb) {
    uniform(cb.conv);
    ones(cb.bn);
  };
  conv_bn(*stem_);
  for (const auto& b : blocks_) {
    conv_bn(*b->a);
    conv_bn(*b->b);
    if (b->shortcut) conv_bn(*b->shortcut);
  }
  uniform(*fc_);
  largest_activation_ = std::max(largest_activation_, options.classes);
}

std::string ResNet18::Describe() const {
  return absl::StrCat("resnet18 width ", options_.width, " on 32x32 images (", options_.image_side,
                      "x", options_.image_side, " padded), ", options_.classes, " classes");
}

void ResNet18::InitTensors(uint64_t seed, const TensorSink& sink) const {
  SplitMix64 rng(seed);
  std::vector<float> values;
  for (int i = 0; i < table_.size(); ++i) {
    values.resize(table_.tensor(i).numel);
    if (init_bound_[i] > 0) {
      FillUniform(rng, init_bound_[i], absl::MakeSpan(values));
    } else {
      std::fill(values.begin(), values.end(), init_value_[i]);
    }
    sink(i, values);
  }
}

MemoryStats ResNet18::memory() const {
  int64_t bytes = input_.bytes() + stem_out_.bytes() + pooled_.bytes() + logits_.bytes() +
                  stem_->conv_out.bytes() + stem_->conv.scratch_bytes() + loss_.scratch_bytes() +
                  conv_scratch_.bytes();
  for (const GrowBuffer<float>& w : work_) bytes += w.bytes();
  for (const auto& b : blocks_) {
    bytes += b->mid.bytes() + b->out.bytes();
    for (const ConvBn* cb : {b->a.get(), b->b.get(), b->shortcut.get()}) {
      if (cb != nullptr) bytes += cb->conv_out.bytes() + cb->conv.scratch_bytes();
    }
  }
  return {bytes};
}

void ResNet18::UpdateBuffers(absl::Span<float> params) {
  if (!pending_valid_) return;
  std::copy(pending_.begin(), pending_.end(), params.begin() + buffers_.begin);
  pending_valid_ = false;
}

absl::Status ResNet18::CheckBatch(const Batch& batch, bool allow_empty) const {
  if (allow_empty && batch.size == 0 && batch.features.empty() && batch.labels.empty()) {
    return absl::OkStatus();
  }
  return CheckClassifierBatch(batch, Describe(), options_.image_side * options_.image_side,
                              options_.classes);
}

void ResNet18::PrepareInput(const float* features, int64_t n) {
  const int64_t side = options_.image_side, offset = (kSide - side) / 2;
  const int64_t plane = kSide * kSide;
  float* x = input_.Reserve(std::max<int64_t>(1, n) * kChannels * plane);
  std::memset(x, 0, n * kChannels * plane * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float* image = features + i * side * side;
    float* first = x + i * kChannels * plane;
    for (int64_t y = 0; y < side; ++y) {
      std::memcpy(first + (y + offset) * kSide + offset, image + y * side, side * sizeof(float));
    }
    for (int64_t c = 1; c < kChannels; ++c)
      std::memcpy(first + c * plane, first, plane * sizeof(float));
  }
}

absl::Status ResNet18::Forward(const float* params, int64_t n, bool training,
                               const ReplicaSum& sum) {
  const int64_t m = std::max<int64_t>(1, n);
  float* pending = pending_.data();
  const int64_t pb = buffers_.begin;
  const kernels::BatchNormEpilogue relu{nullptr, true};
  float* x = stem_out_.Reserve(m * stem_->conv.output_size());
  RM_RETURN_IF_ERROR(
      stem_->Forward(params, input_.data(), x, n, training, sum, pending, pb, relu));
  float* shortcut_out = work_[0].Reserve(m * largest_activation_);
  for (auto& b : blocks_) {
    float* mid = b->mid.Reserve(m * b->a->conv.output_size());
    RM_RETURN_IF_ERROR(b->a->Forward(params, x, mid, n, training, sum, pending, pb, relu));
    const float* residual = x;
    if (b->shortcut) {
      RM_RETURN_IF_ERROR(
          b->shortcut->Forward(params, x, shortcut_out, n, training, sum, pending, pb));
      residual = shortcut_out;
    }
    float* out = b->out.Reserve(m * b->out_size);
    RM_RETURN_IF_ERROR(
        b->b->Forward(params, mid, out, n, training, sum, pending, pb, {residual, true}));
    x = out;
  }
  float* pooled = pooled_.Reserve(m * pool_->output_size());
  pool_->Forward(params, x, pooled, n);
  fc_->Forward(params, pooled, logits_.Reserve(m * options_.classes), n);
  return absl::OkStatus();
}

absl::Status ResNet18::Backward(const float* params, int64_t n, float* grads,
                                const ForwardBackwardOptions& options) {
  const int64_t m = std::max<int64_t>(1, n);
  const OutputMode mode = options.accumulate ? OutputMode::kAccumulate : OutputMode::kOverwrite;
  const ReplicaSum& sum = options.sum_across_replicas;
  auto ready = [&](int64_t offset) {
    if (options.on_grads_ready) options.on_grads_ready(offset);
  };
  // The buffers' gradients are zero (padding between them untouched).
  if (mode == OutputMode::kOverwrite) {
    for (int i = groups_.back().first_tensor; i < table_.size(); ++i) {
      const state::TensorSpec& t = table_.tensor(i);
      std::fill_n(grads + t.offset, t.numel, 0.0f);
    }
  }
  float* g = work_[0].Reserve(m * largest_activation_);  // the gradient flowing down
  float* d = work_[1].Reserve(m * largest_activation_);  // the next one
  float* t = work_[2].Reserve(m * largest_activation_);
  float* u = work_[3].Reserve(m * largest_activation_);
  // Head: dlogits is in t.
  std::vector<float*> fc_grads;
  for (const Parameter& p : fc_->parameters()) fc_grads.push_back(grads + p.offset);
  fc_->BackwardParams(pooled_.data(), t, n, fc_grads, mode);
  ready(fc_->parameters().front().offset);
  fc_->BackwardInput(params, pooled_.data(), nullptr, t, u, n);
  pool_->BackwardInput(params, nullptr, nullptr, u, g, n);
  for (size_t i = blocks_.size(); i-- > 0;) {
    Block& b = *blocks_[i];
    const float* x = i == 0 ? stem_out_.data() : blocks_[i - 1]->out.data();
    ReluBackward(b.out.data(), g, b.shortcut ? t : d, n * b.out_size);
    if (b.shortcut) {
      RM_RETURN_IF_ERROR(b.shortcut->Backward(params, x, t, d, n, sum, grads, mode));
    }
    RM_RETURN_IF_ERROR(b.b->Backward(params, b.mid.data(), g, u, n, sum, grads, mode));
    ReluBackward(b.mid.data(), u, nullptr, n * b.a->conv.output_size());
    RM_RETURN_IF_ERROR(b.a->Backward(params, x, u, t, n, sum, grads, mode));
    Add(t, d, n * b.in_size);
    ready(table_.tensor(b.first_tensor).offset);
    std::swap(g, d);
  }
  ReluBackward(stem_out_.data(), g, nullptr, n * stem_->conv.output_size());
  RM_RETURN_IF_ERROR(stem_->Backward(params, input_.data(), g, nullptr, n, sum, grads, mode));
  ready(0);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ResNet18::ForwardBackward(const Batch& batch,
                                                    const state::FlatBuffer& params,
                                                    state::FlatBuffer& grads,
                                                    const ForwardBackwardOptions& options) {
  RM_RETURN_IF_ERROR(CheckBatch(batch, /*allow_empty=*/true));
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  if (options.precision != Precision::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("options.precision is ",
                                                   PrecisionName(options.precision),
                                                   "; model.resnet18 computes in fp32 only"));
  }
  if (options.store != nullptr) {
    return absl::InvalidArgumentError(
        "options.store is set; model.resnet18 needs whole flat buffers (its BatchNorm running "
        "statistics are updated in every forward)");
  }
  CHECK_GE(params.size(), table_.total_elements());
  CHECK_GE(grads.size(), table_.total_elements());
  if (!pending_valid_) {
    std::copy_n(params.data() + buffers_.begin, buffers_.size(), pending_.data());
    pending_valid_ = true;
  }
  const int64_t n = batch.size;
  if (n == 0 && !options.sum_across_replicas) {
    // Nothing to do but give zero gradients.
    if (!options.accumulate) {
      for (const state::TensorSpec& t : table_.tensors()) {
        std::fill_n(grads.data() + t.offset, t.numel, 0.0f);
      }
    }
    if (options.on_grads_ready) options.on_grads_ready(0);
    return StepStats{};
  }
  PrepareInput(batch.features.data(), n);
  RM_RETURN_IF_ERROR(Forward(params.data(), n, /*training=*/true, options.sum_across_replicas));
  StepStats stats;
  float* dlogits = work_[2].Reserve(std::max<int64_t>(1, n) * largest_activation_);
  if (n > 0) {
    stats = loss_.ForwardBackward(logits_.data(), batch.labels.data(), n,
                                  static_cast<float>(options.loss_scale / options.loss_divisor),
                                  dlogits);
  }
  RM_RETURN_IF_ERROR(Backward(params.data(), n, grads.data(), options));
  return stats;
}

absl::StatusOr<StepStats> ResNet18::Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                             Precision precision, ParameterStore* store) {
  RM_RETURN_IF_ERROR(CheckBatch(batch, /*allow_empty=*/false));
  if (precision != Precision::kFloat32 || store != nullptr) {
    return absl::InvalidArgumentError(
        "model.resnet18 evaluates in fp32 with whole flat buffers only (precision, store)");
  }
  // In pieces, so that a large evaluation batch does not grow every activation buffer.
  StepStats stats;
  for (int64_t first = 0; first < batch.size; first += kEvaluationPiece) {
    const int64_t n = std::min(kEvaluationPiece, batch.size - first);
    PrepareInput(batch.features.data() + first * batch.feature_dim, n);
    RM_RETURN_IF_ERROR(Forward(params.data(), n, /*training=*/false, nullptr));
    const StepStats piece = loss_.Forward(logits_.data(), batch.labels.data() + first, n);
    stats.loss_sum += piece.loss_sum;
    stats.loss_terms += piece.loss_terms;
    stats.correct += piece.correct;
  }
  return stats;
}

}  // namespace ringmaster::train::nn
