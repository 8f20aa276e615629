#include "train/nn/gpt_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rows.h"
#include "kernels/embedding_index.h"
#include "train/nn/sequential.h"

namespace ringmaster::train::nn {
namespace {

namespace kc = kernels::cuda;
using kernels::OutputMode;
using bf16 = __nv_bfloat16;
using f16 = __half;

// A block's tensors in table order (train/nn/gpt.h).
enum BlockTensor {
  kLn1Weight, kLn1Bias, kQkvWeight, kQkvBias, kProjWeight, kProjBias,
  kLn2Weight, kLn2Bias, kFcWeight, kFcBias, kFcProjWeight, kFcProjBias,
};

absl::Status Unimplemented(const auto&... parts) {
  return absl::UnimplementedError(absl::StrCat("GptCuda: ", parts...));
}

// The kernels of each activation type under one name, so Forward and LossAndBackward are
// written once for fp32, bf16 and fp16 (the matrix products and attention take each already).
absl::Status Embed(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                   int64_t b, int64_t t, int64_t c, int64_t v, cudaStream_t s) {
  return kc::EmbeddingForward(out, tokens, wte, wpe, b, t, c, v, s);
}
absl::Status Embed(bf16* out, const int32_t* tokens, const float* wte, const float* wpe,
                   int64_t b, int64_t t, int64_t c, int64_t v, cudaStream_t s) {
  return kc::EmbeddingForwardBf16(out, tokens, wte, wpe, b, t, c, v, s);
}
absl::Status Embed(f16* out, const int32_t* tokens, const float* wte, const float* wpe,
                   int64_t b, int64_t t, int64_t c, int64_t v, cudaStream_t s) {
  return kc::EmbeddingForwardF16(out, tokens, wte, wpe, b, t, c, v, s);
}
absl::Status EmbedBackward(float* dwte, float* dwpe, const float* dout, const int32_t* index,
                           int64_t groups, int64_t b, int64_t t, int64_t c, int64_t v,
                           cudaStream_t s) {
  return kc::EmbeddingBackward(dwte, dwpe, dout, index, groups, b, t, c, v, s);
}
absl::Status EmbedBackward(float* dwte, float* dwpe, const bf16* dout, const int32_t* index,
                           int64_t groups, int64_t b, int64_t t, int64_t c, int64_t v,
                           cudaStream_t s) {
  return kc::EmbeddingBackwardBf16(dwte, dwpe, dout, index, groups, b, t, c, v, s);
}
absl::Status EmbedBackward(float* dwte, float* dwpe, const f16* dout, const int32_t* index,
                           int64_t groups, int64_t b, int64_t t, int64_t c, int64_t v,
                           cudaStream_t s) {
  return kc::EmbeddingBackwardF16(dwte, dwpe, dout, index, groups, b, t, c, v, s);
}
absl::Status LayerNorm(float* y, float* mean, float* rstd, const float* x, const float* gain,
                       const float* bias, int64_t rows, int64_t c, cudaStream_t s) {
  return kc::LayerNormForward(y, mean, rstd, x, gain, bias, rows, c, s);
}
absl::Status LayerNorm(bf16* y, float* mean, float* rstd, const bf16* x, const float* gain,
                       const float* bias, int64_t rows, int64_t c, cudaStream_t s) {
  return kc::LayerNormForwardBf16(y, mean, rstd, x, gain, bias, rows, c, s);
}
absl::Status LayerNorm(f16* y, float* mean, float* rstd, const f16* x, const float* gain,
                       const float* bias, int64_t rows, int64_t c, cudaStream_t s) {
  return kc::LayerNormForwardF16(y, mean, rstd, x, gain, bias, rows, c, s);
}
absl::Status LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                               const float* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t c, float* scratch,
                               cudaStream_t s) {
  return kc::LayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, c, scratch, s);
}
absl::Status LayerNormBackward(bf16* dx, float* dgain, float* dbias, const bf16* dy,
                               const bf16* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t c, float* scratch,
                               cudaStream_t s) {
  return kc::LayerNormBackwardBf16(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, c, scratch,
                                   s);
}
absl::Status LayerNormBackward(f16* dx, float* dgain, float* dbias, const f16* dy,
                               const f16* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t c, float* scratch,
                               cudaStream_t s) {
  return kc::LayerNormBackwardF16(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, c, scratch,
                                   s);
}
absl::Status Gelu(float* out, const float* x, int64_t n, cudaStream_t s) {
  return kc::GeluForward(out, x, n, s);
}
absl::Status Gelu(bf16* out, const bf16* x, int64_t n, cudaStream_t s) {
  return kc::GeluForwardBf16(out, x, n, s);
}
absl::Status Gelu(f16* out, const f16* x, int64_t n, cudaStream_t s) {
  return kc::GeluForwardF16(out, x, n, s);
}
absl::Status GeluBackward(float* dx, const float* x, const float* dout, int64_t n,
                          cudaStream_t s) {
  return kc::GeluBackward(dx, x, dout, n, s);
}
absl::Status GeluBackward(bf16* dx, const bf16* x, const bf16* dout, int64_t n, cudaStream_t s) {
  return kc::GeluBackwardBf16(dx, x, dout, n, s);
}
absl::Status GeluBackward(f16* dx, const f16* x, const f16* dout, int64_t n, cudaStream_t s) {
  return kc::GeluBackwardF16(dx, x, dout, n, s);
}
absl::Status Residual(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  return kc::ResidualForward(out, a, b, n, s);
}
absl::Status Residual(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t s) {
  return kc::ResidualForwardBf16(out, a, b, n, s);
}
absl::Status Residual(f16* out, const f16* a, const f16* b, int64_t n, cudaStream_t s) {
  return kc::ResidualForwardF16(out, a, b, n, s);
}
absl::Status CrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t classes,
                          float scale, float* loss, int32_t* predicted, float* dlogits,
                          int64_t stride, cudaStream_t s) {
  return kc::SoftmaxCrossEntropyForwardBackward(logits, labels, n, classes, scale, loss, predicted,
                                                dlogits, s, stride);
}
absl::Status CrossEntropy(const bf16* logits, const int32_t* labels, int64_t n, int64_t classes,
                          float scale, float* loss, int32_t* predicted, bf16* dlogits,
                          int64_t stride, cudaStream_t s) {
  return kc::SoftmaxCrossEntropyForwardBackwardBf16(logits, labels, n, classes, scale, loss,
                                                    predicted, dlogits, s, stride);
}
absl::Status CrossEntropy(const f16* logits, const int32_t* labels, int64_t n, int64_t classes,
                          float scale, float* loss, int32_t* predicted, f16* dlogits,
                          int64_t stride, cudaStream_t s) {
  return kc::SoftmaxCrossEntropyForwardBackwardF16(logits, labels, n, classes, scale, loss,
                                                   predicted, dlogits, s, stride);
}

}  // namespace

absl::Status GptCuda::CheckSupported(const GptOptions& options,
                                     const GptCudaOptions& cuda_options) {
  if (cuda_options.logits_row_alignment < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCuda: logits_row_alignment must be >= 1 (1: dense rows), got ",
                     cuda_options.logits_row_alignment));
  }
  if (!options.memory_efficient_attention) {
    return Unimplemented("attention that keeps its probabilities is CPU-only; set "
                         "memory_efficient_attention");
  }
  const kc::MatMulType type = cuda_options.matmul;
  const int64_t head_size = options.width / options.heads;
  const bool bf16 = type == kc::MatMulType::kBFloat16, fp16 = type == kc::MatMulType::kFloat16;
  const bool supported = bf16   ? kc::AttentionCudaSupportsHeadSizeBf16(head_size)
                         : fp16 ? kc::AttentionCudaSupportsHeadSizeF16(head_size)
                                : kc::AttentionCudaSupportsHeadSizeF32(head_size);
  if (!supported) {
    return Unimplemented("the ", bf16 ? "bf16" : fp16 ? "fp16" : "fp32",
                         " CUDA attention does not take head size ", head_size,
                         " (model.gpt.width / model.gpt.heads)",
                         bf16 || fp16 ? "; 16-bit attention takes 64 or 128" : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GptCuda>> GptCuda::Create(const GptOptions& options,
                                                         const GptCudaOptions& cuda_options,
                                                         cudaStream_t stream) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> cpu, GptModel::Create(options));
  RM_RETURN_IF_ERROR(CheckSupported(options, cuda_options));
  const bool bf16 = cuda_options.matmul == kc::MatMulType::kBFloat16;
  const bool fp16 = cuda_options.matmul == kc::MatMulType::kFloat16;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<kc::MatMulEngine> engine, kc::MatMulEngine::Create());
  auto gpt = absl::WrapUnique(new GptCuda(std::move(cpu), cuda_options, stream, std::move(engine)));
  if (const GptCuda* owner = cuda_options.parameter_copy_of; owner != nullptr) {
    if (!(bf16 || fp16) || !cuda_options.flat_parameters || owner->precision_ != gpt->precision_ ||
        owner->copy_elements_ != gpt->copy_elements_ || !owner->cuda_options_.flat_parameters) {
      return absl::InvalidArgumentError(
          "GptCudaOptions::parameter_copy_of: a model shares the 16-bit copy of another of the "
          "same options only, in bf16 or fp16 with flat parameters");
    }
    gpt->params16_ = owner->params16_;
  } else if (bf16 || fp16) {
    const int64_t bytes = gpt->parameter_copy_bytes();
    RM_RETURN_IF_ERROR(CudaToStatus(
        cudaMalloc(&gpt->params16_, bytes),
        absl::StrCat("GptCuda: cudaMalloc of ", bytes, " bytes for the 16-bit parameters")
            .c_str()));
    // The lm_head's padding rows, zeroed once: no cast writes them.
    const int64_t padding = gpt->HeadPadding();
    if (padding > 0) {
      RM_RETURN_IF_ERROR(CudaToStatus(
          cudaMemsetAsync(static_cast<uint16_t*>(gpt->params16_) + (bytes / 2 - padding), 0,
                          2 * padding, stream),
          "cudaMemsetAsync of the lm_head's 16-bit padding rows"));
    }
  }
  return gpt;
}

GptCuda::GptCuda(std::unique_ptr<GptModel> cpu, const GptCudaOptions& cuda_options,
                 cudaStream_t stream, std::unique_ptr<kc::MatMulEngine> engine)
    : cpu_(std::move(cpu)),
      options_(cpu_->options()),
      cuda_options_(cuda_options),
      stream_(stream),
      engine_(std::move(engine)),
      precision_(cuda_options.matmul == kc::MatMulType::kBFloat16  ? Precision::kBFloat16
                 : cuda_options.matmul == kc::MatMulType::kFloat16 ? Precision::kFloat16
                                                                   : Precision::kFloat32),
      blocks_in_slice_(options_.end_block - options_.first_block),
      segment_(options_.checkpoint_every == 0
                   ? blocks_in_slice_
                   : std::min(options_.checkpoint_every, blocks_in_slice_)),
      segments_((blocks_in_slice_ + segment_ - 1) / segment_),
      logits_stride_((options_.vocab + cuda_options.logits_row_alignment - 1) /
                     cuda_options.logits_row_alignment * cuda_options.logits_row_alignment),
      attn_width_(options_.width / options_.tp_size),
      heads_local_(options_.heads / options_.tp_size),
      hidden_(4 * options_.width / options_.tp_size),
      arena_(stream) {
  const state::TensorTable& table = cpu_->table();
  auto find = [&](const std::string& name) {
    absl::StatusOr<int> i = table.Find(name);
    CHECK(i.ok()) << "GptModel's table has no " << name;
    return *i;
  };
  // A slice's table has only its own tensors (the others stay -1).
  if (cpu_->has_embeddings()) {
    wte_ = find("wte");
    wpe_ = find("wpe");
  }
  for (int64_t l = options_.first_block; l < options_.end_block; ++l) {
    blocks_.push_back(find(absl::StrCat("h", l, ".ln1.weight")));
    CHECK_EQ(find(absl::StrCat("h", l, ".mlp.proj.bias")), blocks_.back() + kFcProjBias);
  }
  if (cpu_->has_head()) {
    lnf_ = find("lnf.weight");
    if (options_.tied_head) {
      lm_head_ = find("wte");  // the embeddings', or a last stage's copy
    } else {
      lm_head_ = find("lm_head.weight");
      // Its padding rows follow it in the 16-bit copy.
      CHECK_EQ(lm_head_ + 1, table.size()) << "lm_head.weight must be the table's last tensor";
    }
  }
  groups_ = cpu_->parameter_groups();
  const int groups = static_cast<int>(groups_.size());
  group_of_tensor_.resize(table.size());
  for (int g = 0; g < groups; ++g) {
    for (int i = groups_[g].first_tensor; i < groups_[g].end_tensor; ++i) group_of_tensor_[i] = g;
  }
  // The 16-bit copy's layout (parameter_copy_bytes): each group at its flat offset, or at its
  // phase; without flat_parameters lm_head's group then moves up by whole kCopyPhase steps
  // until it ends past every other group's copy, so that its padding rows do too.
  const int head = cpu_->has_head() && !options_.tied_head ? group_of_tensor_[lm_head_] : -1;
  copy_offset_.resize(groups);
  int64_t others_end = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t first = table.tensor(groups_[g].first_tensor).offset;
    copy_offset_[g] = cuda_options_.flat_parameters ? first : first % kCopyPhase;
    if (g != head) others_end = std::max(others_end, copy_offset_[g] + GroupSpan(g));
  }
  if (!cpu_->has_head()) {  // a pipeline stage without the head: no padding rows
    copy_elements_ = others_end;
    groups_copy_end_ = others_end;
    return;
  }
  if (options_.tied_head) {
    // The head's own copy of wte (with the padding rows) after every group's: the
    // embeddings group's copy has no room for padding rows after wte.
    groups_copy_end_ = others_end;
    head_copy_offset_ = (others_end + kCopyPhase - 1) / kCopyPhase * kCopyPhase;
    copy_elements_ = head_copy_offset_ + options_.vocab * options_.width + HeadPadding();
    return;
  }
  const int64_t short_by = others_end - (copy_offset_[head] + GroupSpan(head));
  if (short_by > 0) copy_offset_[head] += (short_by + kCopyPhase - 1) / kCopyPhase * kCopyPhase;
  head_copy_offset_ = copy_offset_[head];
  copy_elements_ = copy_offset_[head] + GroupSpan(head) + HeadPadding();
  groups_copy_end_ = copy_elements_ - HeadPadding();
}

GptCuda::~GptCuda() {
  if (params16_ != nullptr && cuda_options_.parameter_copy_of == nullptr) cudaFree(params16_);
  for (const TimedLaunch& t : timed_) spare_events_.insert(spare_events_.end(), {t.start, t.end});
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
}

template <typename Launch>
absl::Status GptCuda::Timed(const char* what, Launch launch) {
  if (!cuda_options_.profile) {
    absl::Status status = launch();
    if (status.ok()) status = std::exchange(cast_status_, absl::OkStatus());
    return status;
  }
  cudaEvent_t events[2];
  for (cudaEvent_t& e : events) {
    if (spare_events_.empty()) {
      RM_RETURN_IF_CUDA_ERROR(cudaEventCreate(&e));
    } else {
      e = spare_events_.back();
      spare_events_.pop_back();
    }
  }
  timed_.push_back({what, events[0], events[1]});
  RM_RETURN_IF_CUDA_ERROR(cudaEventRecord(events[0], stream_));
  RM_RETURN_IF_ERROR(launch());
  RM_RETURN_IF_ERROR(std::exchange(cast_status_, absl::OkStatus()));
  RM_RETURN_IF_CUDA_ERROR(cudaEventRecord(events[1], stream_));
  return absl::OkStatus();
}

absl::Status GptCuda::CollectProfile() {
  if (!cuda_options_.profile) return absl::OkStatus();
  absl::Status status;
  for (const TimedLaunch& t : timed_) {
    float ms = 0;
    if (status.ok()) {
      status = CudaToStatus(cudaEventElapsedTime(&ms, t.start, t.end), "cudaEventElapsedTime");
    }
    profile_ms_[t.what] += ms;
    spare_events_.insert(spare_events_.end(), {t.start, t.end});
  }
  timed_.clear();
  ++profiled_calls_;
  return status;
}

const float* GptCuda::Param(const float* params, int tensor) {
  const float* base = store_ != nullptr ? store_->Parameters(group_of_tensor_[tensor]) : params;
  return base + cpu_->table().tensor(tensor).offset;
}

float* GptCuda::Grad(float* grads, int tensor) const {
  return (store_ != nullptr ? group_grads_ : grads) + cpu_->table().tensor(tensor).offset;
}

int64_t GptCuda::GroupSpan(int group) const {
  const state::TensorTable& table = cpu_->table();
  const state::TensorSpec& last = table.tensor(groups_[group].end_tensor - 1);
  return last.offset + last.numel - table.tensor(groups_[group].first_tensor).offset;
}

absl::Status GptCuda::BeginGradients(int tensor) {
  if (store_ == nullptr) return absl::OkStatus();
  const ParameterGroup& group = groups_[group_of_tensor_[tensor]];
  group_grads_ = store_->Gradients(group_of_tensor_[tensor]);
  return Timed("zero the gradients", [&] {
    for (int i = group.first_tensor; i < group.end_tensor; ++i) {
      const state::TensorSpec& t = cpu_->table().tensor(i);
      RM_RETURN_IF_ERROR(
          CudaToStatus(cudaMemsetAsync(group_grads_ + t.offset, 0, t.numel * sizeof(float), stream_),
                       "cudaMemsetAsync of a parameter group's gradients"));
    }
    return absl::OkStatus();
  });
}

void GptCuda::EndGradients(int tensor) {
  if (store_ != nullptr) store_->GradientsDone(group_of_tensor_[tensor]);
}

void* GptCuda::Stream(int64_t block) const {
  if (block == blocks_in_slice_) return streams_.back();
  if (block % segment_ == 0) return streams_[block / segment_];
  return streams_[segments_ + block % segment_ - 1];
}

absl::Status GptCuda::CastTo16(void* out, const float* values, int64_t n) {
  return precision_ == Precision::kBFloat16
             ? kc::CastFloatToBf16(static_cast<bf16*>(out), values, n, stream_)
             : kc::CastFloatToF16(static_cast<f16*>(out), values, n, stream_);
}

const void* GptCuda::MatMulParam(const float* params, int tensor) {
  if (!half()) return Param(params, tensor);
  const int64_t offset = cpu_->table().tensor(tensor).offset;
  if (store_ == nullptr) return static_cast<const uint16_t*>(params16_) + offset;
  // The group's span, cast into params16_ from copy_offset_[group].
  const int group = group_of_tensor_[tensor];
  const int64_t first = cpu_->table().tensor(groups_[group].first_tensor).offset;
  uint16_t* out = static_cast<uint16_t*>(params16_) + copy_offset_[group];
  const float* values = store_->Parameters(group) + first;
  if (group != cast_group_ && cast_status_.ok()) {
    cast_status_ = CastTo16(out, values, GroupSpan(group));
    if (cast_status_.ok()) cast_group_ = group;
  }
  return out + (offset - first);
}

const void* GptCuda::HeadMatMulParam(const float* params) {
  if (!half() || !options_.tied_head) return MatMulParam(params, lm_head_);
  uint16_t* out = static_cast<uint16_t*>(params16_) + head_copy_offset_;
  // With flat parameters CastParameters made it; with a store, cast once a pass (forward),
  // the store asked each time as for any other group's use.
  if (store_ == nullptr) return out;
  const float* values = Param(params, lm_head_);
  if (!head_cast_ && cast_status_.ok()) {
    cast_status_ = CastTo16(out, values, options_.vocab * options_.width);
    head_cast_ = cast_status_.ok();
  }
  return out;
}

absl::Status GptCuda::Reserve(int64_t batch) {
  if (batch <= capacity_) return absl::OkStatus();
  const int64_t t = options_.context, c = options_.width;
  const int64_t rows = batch * t;
  const int64_t act = half() ? 2 : 4;  // bytes of an activation
  const int64_t ca = attn_width_;      // this tensor-parallel rank's heads' width
  auto place = [&](DeviceArena::Layout& layout) {
    auto take = [&](int64_t n) { return layout.Floats(n); };
    auto take_act = [&](int64_t n) { return layout.Take(n * act); };
    auto take_ints = [&](int64_t n) { return layout.Ints(n); };
    // Kept: each segment's input and the last block's output; reused: the streams inside a
    // segment and the blocks' activations, recomputed segment by segment in backward.
    streams_.assign(segments_ + segment_, nullptr);
    for (void*& s : streams_) s = take_act(rows * c);
    slots_.assign(segment_, {});
    for (BlockActivations& a : slots_) {
      a.ln1 = take_act(rows * c);
      a.ln1_mean = take(rows);
      a.ln1_rstd = take(rows);
      a.qkv = take_act(rows * 3 * ca);
      a.attention = take_act(rows * ca);
      a.lse = take(batch * heads_local_ * t);
      a.residual = take_act(rows * c);
      a.ln2 = take_act(rows * c);
      a.ln2_mean = take(rows);
      a.ln2_rstd = take(rows);
      a.fc = take_act(rows * hidden_);
      a.gelu = take_act(rows * hidden_);
    }
    const bool head = cpu_->has_head();  // a pipeline stage without it needs no logits
    if (head) {
      lnf_out_ = take_act(rows * c);
      lnf_mean_ = take(rows);
      lnf_rstd_ = take(rows);
      logits_ = take_act(rows * logits_stride_);
      if (cpu_->head_is_wte()) tied_grad_ = take(options_.vocab * c);
    }
    loss_ = take(rows);
    dresidual_ = take_act(rows * c);
    dsmall_ = take_act(rows * c);
    // The MLP's, Q/K/V's or the logits' gradient.
    dbig_ = take_act(rows * std::max({hidden_, 3 * ca, head ? logits_stride_ : 0}));
    attention_scratch_ = take(kc::AttentionCudaScratchFloats(batch, t, heads_local_));
    layernorm_scratch_ = take(kc::LayerNormBackwardScratchFloats(c));
    bias_scratch_ = take(kc::BiasGradientScratchFloats(4 * c));
    inputs_ = take_ints(rows);
    targets_ = take_ints(rows);
    predicted_ = take_ints(rows);
    index_ = take_ints(kernels::EmbeddingIndexInts(batch, t));
    // Tensor parallelism (RowParallelForward, SumPartials): a column of ones and a bias for
    // the rank-1 product that adds the replicated bias, and in 16-bit the fp32 partial sums.
    if (options_.tp_size > 1) {
      ones_ = take(rows);
      tp_bias_ = take(c);
      if (half()) tp_partials_ = take(rows * c);
    }
  };
  capacity_ = 0;  // until Fit succeeds: its pointers are stale
  RM_RETURN_IF_ERROR(
      arena_.Fit(place, absl::StrCat("GptCuda: activations for ", batch, " samples")));
  if (options_.tp_size > 1) {
    const std::vector<float> ones(rows, 1.0f);  // pageable: copied out when the call returns
    RM_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(ones_, ones.data(), rows * 4, cudaMemcpyHostToDevice, stream_));
  }
  capacity_ = batch;
  return absl::OkStatus();
}

// The same check as GptModel's, for the whole-model call.
absl::Status GptCuda::CheckWhole(const char* call) const {
  if (cpu_->is_whole()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("GptCuda::", call, " of '", cpu_->Describe(),
                   "': a pipeline stage's slice runs with SliceForward/SliceBackward"));
}

absl::Status GptCuda::PrepareCall(const Batch& batch) {
  RM_RETURN_IF_ERROR(cpu_->CheckBatch(batch));
  RM_RETURN_IF_ERROR(CheckTensorParallelSum());
  const int64_t t = options_.context;
  RM_RETURN_IF_ERROR(Reserve(batch.size));
  // Intervals left by a call that failed are not this call's.
  for (const TimedLaunch& l : timed_) spare_events_.insert(spare_events_.end(), {l.start, l.end});
  timed_.clear();

  const int64_t rows = batch.size * t;
  std::vector<int32_t> inputs(rows);
  targets_host_.resize(rows);
  for (int64_t b = 0; b < batch.size; ++b) {
    const int32_t* sample = batch.tokens.data() + b * (t + 1);
    std::copy_n(sample, t, inputs.data() + b * t);
    std::copy_n(sample + 1, t, targets_host_.data() + b * t);
  }
  RM_ASSIGN_OR_RETURN(kernels::EmbeddingIndex index,
                      kernels::IndexTokens(inputs.data(), batch.size, t, options_.vocab));
  index_groups_ = index.groups;
  // Pageable host memory: each copy has left the host buffer when the call returns.
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(inputs_, inputs.data(), rows * 4,
                                          cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(targets_, targets_host_.data(), rows * 4, cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(index_, index.ints.data(), index.ints.size() * 4,
                                          cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status GptCuda::CastParameters(const float* params) {
  if (!half()) return absl::OkStatus();
  return Timed("16-bit parameter cast", [&] {
    // Every tensor up to the last group's end (lm_head's), not the padding rows after it.
    RM_RETURN_IF_ERROR(CastTo16(params16_, params, groups_copy_end_));
    if (!options_.tied_head || !cpu_->has_head()) return absl::OkStatus();
    return CastTo16(static_cast<uint16_t*>(params16_) + head_copy_offset_,
                    params + cpu_->table().tensor(lm_head_).offset,
                    options_.vocab * options_.width);
  });
}

absl::StatusOr<StepStats> GptCuda::ReadStats(int64_t rows) {
  std::vector<float> loss(rows);
  std::vector<int32_t> predicted(rows);
  RM_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(loss.data(), loss_, rows * 4, cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(predicted.data(), predicted_, rows * 4,
                                          cudaMemcpyDeviceToHost, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  StepStats stats;
  stats.loss_terms = rows;
  for (int64_t i = 0; i < rows; ++i) {
    stats.loss_sum += loss[i];
    stats.correct += predicted[i] == targets_host_[i];
  }
  return stats;
}

template <typename F>
absl::Status GptCuda::ByPrecision(F run) {
  if (precision_ == Precision::kBFloat16) return run(bf16{});
  if (precision_ == Precision::kFloat16) return run(f16{});
  return run(float{});
}

absl::StatusOr<StepStats> GptCuda::ForwardBackward(const Batch& batch, const float* params,
                                                   float* grads,
                                                   const ForwardBackwardOptions& options) {
  RM_RETURN_IF_ERROR(CheckWhole("ForwardBackward"));
  if (options.precision != precision()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCuda::ForwardBackward: precision ", PrecisionName(options.precision),
                     " asked of a model built for ", PrecisionName(precision_),
                     " activations (GptCudaOptions::matmul)"));
  }
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  const bool stored = options.store != nullptr;
  if (stored && options.accumulate) {
    return absl::InvalidArgumentError(
        "ForwardBackwardOptions: accumulate with a ParameterStore (the store sums micro-batches)");
  }
  if (!stored && !cuda_options_.flat_parameters) {
    return absl::InvalidArgumentError(
        "GptCuda::ForwardBackward: a model created without GptCudaOptions::flat_parameters "
        "takes its parameters from a ParameterStore (ForwardBackwardOptions::store)");
  }
  if (!stored && (params == nullptr || grads == nullptr)) {
    return absl::InvalidArgumentError(
        "GptCuda::ForwardBackward: params and grads are device "
        "pointers and must not be null");
  }
  RM_RETURN_IF_ERROR(PrepareCall(batch));
  slice_batch_ = 0;  // a slice's pending micro-batch, if any, is gone
  // With a store the parameters are cast (MatMulParam) and the gradients zeroed
  // (BeginGradients) group by group instead.
  store_ = options.store;
  cast_group_ = -1;
  head_cast_ = false;
  cast_status_ = absl::OkStatus();
  if (!stored) RM_RETURN_IF_ERROR(CastParameters(params));
  if (!stored && !options.accumulate) {
    RM_RETURN_IF_ERROR(Timed("zero the gradients", [&] {
      return CudaToStatus(cudaMemsetAsync(grads, 0, total_elements() * sizeof(float), stream_),
                          "cudaMemsetAsync of the gradients");
    }));
  }
  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  RM_RETURN_IF_ERROR(ByPrecision([&](auto zero) -> absl::Status {
    using T = decltype(zero);
    RM_RETURN_IF_ERROR(Forward<T>(params, batch.size));
    if (stored) options.store->BeginBackward();
    return LossAndBackward<T>(params, grads, batch.size, scale, options.on_grads_ready);
  }));
  store_ = nullptr;
  RM_ASSIGN_OR_RETURN(const StepStats stats, ReadStats(batch.size * options_.context));
  RM_RETURN_IF_ERROR(CollectProfile());
  return stats;
}

template <typename T>
absl::Status GptCuda::Forward(const float* params, int64_t batch) {
  RM_RETURN_IF_ERROR(EmbeddingsForward<T>(params, batch));
  RM_RETURN_IF_ERROR(BlocksForward<T>(params, batch));
  return HeadForward<T>(params, batch);
}

template <typename T>
absl::Status GptCuda::EmbeddingsForward(const float* params, int64_t batch) {
  return Timed("embedding forward", [&] {
    return Embed(static_cast<T*>(Stream(0)), inputs_, Param(params, wte_), Param(params, wpe_),
                 batch, options_.context, options_.width, options_.vocab, stream_);
  });
}

template <typename T>
absl::Status GptCuda::BlocksForward(const float* params, int64_t batch) {
  for (int64_t l = 0; l < blocks_in_slice_; ++l) {
    RM_RETURN_IF_ERROR(BlockForward<T>(params, batch, l));
    RM_RETURN_IF_ERROR(BlockOutputForward<T>(params, batch, l));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GptCuda::HeadForward(const float* params, int64_t batch) {
  const int64_t c = options_.width, rows = batch * options_.context;
  auto act = [](void* a) { return static_cast<T*>(a); };
  RM_RETURN_IF_ERROR(Timed("layernorm forward", [&] {
    return LayerNorm(act(lnf_out_), lnf_mean_, lnf_rstd_, act(Stream(blocks_in_slice_)),
                     Param(params, lnf_), Param(params, lnf_ + 1), rows, c, stream_);
  }));
  return Timed("matmul forward", [&] {
    return engine_->LinearForward(cuda_options_.matmul, lnf_out_, HeadMatMulParam(params), nullptr,
                                  logits_, rows, c, HeadRows(), stream_, logits_stride_);
  });
}

template <typename T>
absl::Status GptCuda::BlockForward(const float* params, int64_t batch, int64_t block) {
  const int64_t t = options_.context, c = options_.width, rows = batch * t;
  const kc::MatMulType type = cuda_options_.matmul;
  const int first = blocks_[block];
  auto w = [&](BlockTensor k) { return Param(params, first + k); };  // fp32 (LayerNorm)
  auto mw = [&](BlockTensor k) { return MatMulParam(params, first + k); };
  auto act = [](void* a) { return static_cast<T*>(a); };
  const BlockActivations& a = Slot(block);
  const T* x = act(Stream(block));
  RM_RETURN_IF_ERROR(Timed("layernorm forward", [&] {
    return LayerNorm(act(a.ln1), a.ln1_mean, a.ln1_rstd, x, w(kLn1Weight), w(kLn1Bias), rows, c,
                     stream_);
  }));
  const int64_t ca = attn_width_;  // this tensor-parallel rank's heads' width
  RM_RETURN_IF_ERROR(Timed("matmul forward", [&] {
    return engine_->LinearForward(type, a.ln1, mw(kQkvWeight), mw(kQkvBias), a.qkv, rows, c, 3 * ca,
                                  stream_);
  }));
  RM_RETURN_IF_ERROR(Timed("attention forward", [&] {
    return kc::AttentionForwardLse(act(a.attention), a.lse, act(a.qkv), batch, t, ca, heads_local_,
                                   stream_);
  }));
  RM_RETURN_IF_ERROR(
      RowParallelForward(params, a.attention, first + kProjWeight, a.residual, rows, ca));
  RM_RETURN_IF_ERROR(Timed("residual add", [&] {
    return Residual(act(a.residual), act(a.residual), x, rows * c, stream_);
  }));
  RM_RETURN_IF_ERROR(Timed("layernorm forward", [&] {
    return LayerNorm(act(a.ln2), a.ln2_mean, a.ln2_rstd, act(a.residual), w(kLn2Weight),
                     w(kLn2Bias), rows, c, stream_);
  }));
  RM_RETURN_IF_ERROR(Timed("matmul forward", [&] {
    return engine_->LinearForward(type, a.ln2, mw(kFcWeight), mw(kFcBias), a.fc, rows, c, hidden_,
                                  stream_);
  }));
  return Timed("gelu forward",
               [&] { return Gelu(act(a.gelu), act(a.fc), rows * hidden_, stream_); });
}

template <typename T>
absl::Status GptCuda::BlockOutputForward(const float* params, int64_t batch, int64_t block) {
  const int64_t rows = batch * options_.context, c = options_.width;
  const int first = blocks_[block];
  auto act = [](void* a) { return static_cast<T*>(a); };
  const BlockActivations& a = Slot(block);
  void* out = Stream(block + 1);
  RM_RETURN_IF_ERROR(RowParallelForward(params, a.gelu, first + kFcProjWeight, out, rows, hidden_));
  return Timed("residual add",
               [&] { return Residual(act(out), act(out), act(a.residual), rows * c, stream_); });
}

absl::Status GptCuda::RowParallelForward(const float* params, const void* in, int weight, void* out,
                                         int64_t rows, int64_t in_features) {
  const int64_t c = options_.width;
  const kc::MatMulType type = cuda_options_.matmul;
  if (options_.tp_size == 1) {
    return Timed("matmul forward", [&] {
      return engine_->LinearForward(type, in, MatMulParam(params, weight),
                                    MatMulParam(params, weight + 1), out, rows, in_features, c,
                                    stream_);
    });
  }
  // The rank's partial product, summed over the group, then the replicated bias once: the
  // value the products read (the fp32 parameter, or its 16-bit copy widened), added in fp32
  // by a rank-1 product (a column of ones times the bias row, exact in fp32).
  RM_RETURN_IF_ERROR(Timed("matmul forward", [&] {
    return engine_->LinearForward(type, in, MatMulParam(params, weight), nullptr, out, rows,
                                  in_features, c, stream_);
  }));
  RM_ASSIGN_OR_RETURN(float* sum, SumPartials(out, rows * c));
  const float* bias = tp_bias_;
  if (half()) {
    const void* bias16 = MatMulParam(params, weight + 1);
    RM_RETURN_IF_ERROR(Timed("tensor-parallel bias", [&] { return Widen(tp_bias_, bias16, c); }));
  } else {
    bias = Param(params, weight + 1);
  }
  RM_RETURN_IF_ERROR(Timed("tensor-parallel bias", [&] {
    return engine_->MatMul(kc::MatMulType::kFloat32, kernels::Transpose::kNo,
                           kernels::Transpose::kNo, rows, c, 1, ones_, bias, sum,
                           OutputMode::kAccumulate, stream_);
  }));
  return NarrowSum(out, sum, rows * c);
}

absl::Status GptCuda::CheckTensorParallelSum() const {
  if (options_.tp_size == 1 || tp_sum_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "GptCuda '", cpu_->Describe(), "' has no tensor-parallel sum (set_tensor_parallel_sum)"));
}

absl::StatusOr<float*> GptCuda::SumPartials(void* data, int64_t n) {
  RM_RETURN_IF_ERROR(CheckTensorParallelSum());
  float* sum = half() ? tp_partials_ : static_cast<float*>(data);
  if (half()) RM_RETURN_IF_ERROR(Timed("tensor-parallel sum", [&] { return Widen(sum, data, n); }));
  RM_RETURN_IF_ERROR(Timed("tensor-parallel sum", [&] { return tp_sum_(sum, n, stream_); }));
  return sum;
}

absl::Status GptCuda::SumInputGradient(void* data, int64_t n) {
  if (options_.tp_size == 1) return absl::OkStatus();
  RM_ASSIGN_OR_RETURN(float* sum, SumPartials(data, n));
  return NarrowSum(data, sum, n);
}

absl::Status GptCuda::NarrowSum(void* data, const float* sum, int64_t n) {
  if (!half()) return absl::OkStatus();
  return Timed("tensor-parallel sum", [&] { return Narrow(data, sum, n); });
}

absl::Status GptCuda::Narrow(void* out, const float* in, int64_t n) {
  return precision_ == Precision::kBFloat16
             ? kc::CastFloatToBf16(static_cast<bf16*>(out), in, n, stream_)
             : kc::CastFloatToF16(static_cast<f16*>(out), in, n, stream_);
}

absl::Status GptCuda::Widen(float* out, const void* in, int64_t n) {
  return precision_ == Precision::kBFloat16
             ? kc::CastBf16ToFloat(out, static_cast<const bf16*>(in), n, stream_)
             : kc::CastF16ToFloat(out, static_cast<const f16*>(in), n, stream_);
}

template <typename T>
absl::Status GptCuda::Loss(int64_t rows, float scale) {
  return Timed("softmax cross-entropy", [&] {
    return CrossEntropy(static_cast<T*>(logits_), targets_, rows, options_.vocab, scale, loss_,
                        predicted_, static_cast<T*>(dbig_), logits_stride_, stream_);
  });
}

template <typename T>
absl::Status GptCuda::LossAndBackward(const float* params, float* grads, int64_t batch, float scale,
                                      const std::function<void(int64_t)>& on_grads_ready) {
  // Each group of tensors (lm_head, lnf, a block, the embeddings) is announced once its
  // gradient kernels are enqueued: the caller orders its reads after them (a CUDA event).
  auto ready = [&](int first_tensor) {
    if (on_grads_ready) on_grads_ready(cpu_->table().tensor(first_tensor).offset);
  };
  RM_RETURN_IF_ERROR(Loss<T>(batch * options_.context, scale));
  RM_RETURN_IF_ERROR(HeadBackward<T>(params, grads, batch, ready));
  RM_RETURN_IF_ERROR(BlocksBackward<T>(params, grads, batch, ready));
  return EmbeddingsBackward<T>(grads, batch, ready);
}

template <typename T>
absl::Status GptCuda::HeadBackward(const float* params, float* grads, int64_t batch,
                                   const std::function<void(int)>& ready) {
  const int64_t c = options_.width, rows = batch * options_.context;
  const kc::MatMulType type = cuda_options_.matmul;
  auto p = [&](int tensor) { return Param(params, tensor); };
  auto g = [&](int tensor) { return Grad(grads, tensor); };
  auto act = [](void* a) { return static_cast<T*>(a); };
  T* dlogits = act(dbig_);
  T* dx = act(dresidual_);  // the residual stream's gradient, added to in place
  T* dsmall = act(dsmall_);
  // With a store each group's parameters are asked for before its gradients (each layer's
  // input gradient is enqueued before its weights'), and its gradients end after the last
  // kernel that reads its parameters, in GptModel's order.
  RM_RETURN_IF_ERROR(Timed("matmul backward (inputs)", [&] {
    return engine_->LinearBackwardInput(type, dlogits, HeadMatMulParam(params), dsmall, rows, c,
                                        HeadRows(), stream_, logits_stride_);
  }));
  if (cpu_->head_is_wte()) {
    // The head's part of wte's gradient, added to the embedding's by EmbeddingsBackward.
    RM_RETURN_IF_ERROR(Timed("matmul backward (weights, biases)", [&] {
      return engine_->LinearBackwardWeightsFloatOutput(
          type, lnf_out_, dlogits, tied_grad_, nullptr, rows, c, options_.vocab,
          OutputMode::kOverwrite, nullptr, stream_, logits_stride_);
    }));
  } else {
    RM_RETURN_IF_ERROR(BeginGradients(lm_head_));
    RM_RETURN_IF_ERROR(LinearWeights(grads, lnf_out_, dlogits, lm_head_, /*has_bias=*/false, rows,
                                     c, options_.vocab, logits_stride_));
    ready(lm_head_);
  }
  if (!options_.tied_head) EndGradients(lm_head_);
  RM_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(dx, 0, rows * c * sizeof(T), stream_));
  const float* lnf_gain = p(lnf_);
  RM_RETURN_IF_ERROR(BeginGradients(lnf_));
  RM_RETURN_IF_ERROR(Timed("layernorm backward", [&] {
    return LayerNormBackward(dx, g(lnf_), g(lnf_ + 1), dsmall, act(Stream(blocks_in_slice_)),
                             lnf_gain, lnf_mean_, lnf_rstd_, rows, c, layernorm_scratch_, stream_);
  }));
  EndGradients(lnf_);
  ready(lnf_);
  return absl::OkStatus();
}

template <typename T>
absl::Status GptCuda::BlocksBackward(const float* params, float* grads, int64_t batch,
                                     const std::function<void(int)>& ready) {
  for (int64_t s = segments_ - 1; s >= 0; --s) {
    const int64_t begin = s * segment_, end = std::min(begin + segment_, blocks_in_slice_);
    if (s != segments_ - 1) {  // the last segment's activations are still there from forward
      for (int64_t l = begin; l < end; ++l) {
        RM_RETURN_IF_ERROR(BlockForward<T>(params, batch, l));
        if (l + 1 < end) RM_RETURN_IF_ERROR(BlockOutputForward<T>(params, batch, l));
      }
    }
    for (int64_t l = end - 1; l >= begin; --l) {
      RM_RETURN_IF_ERROR(BlockBackward<T>(params, grads, batch, l));
      ready(blocks_[l]);
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GptCuda::EmbeddingsBackward(float* grads, int64_t batch,
                                         const std::function<void(int)>& ready) {
  RM_RETURN_IF_ERROR(BeginGradients(wte_));
  if (cpu_->head_is_wte()) {  // the head's part first, as GptModel adds them
    float* dwte = Grad(grads, wte_);
    RM_RETURN_IF_ERROR(Timed("embedding backward", [&] {
      return Residual(dwte, dwte, tied_grad_, options_.vocab * options_.width, stream_);
    }));
  }
  RM_RETURN_IF_ERROR(Timed("embedding backward", [&] {
    return EmbedBackward(Grad(grads, wte_), Grad(grads, wpe_), static_cast<T*>(dresidual_), index_,
                         index_groups_, batch, options_.context, options_.width, options_.vocab,
                         stream_);
  }));
  EndGradients(wte_);
  ready(wte_);
  return absl::OkStatus();
}

absl::Status GptCuda::LinearWeights(float* grads, const void* x, const void* dy, int weight,
                                    bool has_bias, int64_t rows, int64_t in, int64_t out,
                                    int64_t dy_stride) {
  if (deferring_) {
    // The output gradient's buffer is reused by the next layer, and with checkpointing the
    // input's by the next segment's recomputation: copies of both, for SliceBackwardWeights.
    const int64_t act = half() ? 2 : 4;
    RM_ASSIGN_OR_RETURN(const void* kept_dy,
                        KeepForWeights(dy, rows * (dy_stride > 0 ? dy_stride : out) * act));
    const void* kept_x = x;
    if (segments_ > 1) {
      RM_ASSIGN_OR_RETURN(kept_x, KeepForWeights(x, rows * in * act));
    }
    deferred_.push_back({weight, has_bias, kept_x, kept_dy, in, out, dy_stride});
    return absl::OkStatus();
  }
  return Timed("matmul backward (weights, biases)", [&] {
    return engine_->LinearBackwardWeightsFloatOutput(
        cuda_options_.matmul, x, dy, Grad(grads, weight),
        has_bias ? Grad(grads, weight + 1) : nullptr, rows, in, out, OutputMode::kAccumulate,
        has_bias ? bias_scratch_ : nullptr, stream_, dy_stride);
  });
}

absl::StatusOr<const void*> GptCuda::KeepForWeights(const void* from, int64_t bytes) {
  char* to = deferred_base_ + deferred_used_;
  deferred_used_ += (bytes + kDeferredAlign - 1) / kDeferredAlign * kDeferredAlign;
  CHECK_LE(deferred_used_, deferred_arena_.bytes());
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_));
  return to;
}

absl::Status GptCuda::ReserveDeferred(int64_t rows) {
  const int64_t c = options_.width, act = half() ? 2 : 4;
  const bool inputs = segments_ > 1;
  // Per block: the output gradients of mlp.proj, mlp.fc, attn.proj and attn.qkv, and with
  // checkpointing their inputs; the head: the logits' gradient (and lnf's output).
  int64_t elements = blocks_in_slice_ * (c + hidden_ + c + 3 * attn_width_ +
                                         (inputs ? hidden_ + c + attn_width_ + c : 0));
  int64_t pieces = blocks_in_slice_ * (inputs ? 8 : 4);
  if (cpu_->has_head()) {
    elements += logits_stride_ + (inputs ? c : 0);
    pieces += inputs ? 2 : 1;
  }
  const int64_t bytes = rows * elements * act + pieces * kDeferredAlign;
  deferred_used_ = 0;
  if (bytes <= deferred_arena_.bytes()) return absl::OkStatus();
  return deferred_arena_.Fit(
      [&](DeviceArena::Layout& layout) { deferred_base_ = static_cast<char*>(layout.Take(bytes)); },
      absl::StrCat("GptCuda: deferred weight-gradient inputs for ", rows, " rows"));
}

absl::Status GptCuda::FromFloat(void* out, const float* in, int64_t n) {
  if (half()) return Narrow(out, in, n);
  return CudaToStatus(cudaMemcpyAsync(out, in, n * 4, cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync of a pipeline boundary");
}

absl::Status GptCuda::ToFloat(float* out, const void* in, int64_t n) {
  if (half()) return Widen(out, in, n);
  return CudaToStatus(cudaMemcpyAsync(out, in, n * 4, cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync of a pipeline boundary");
}

absl::Status GptCuda::CheckBoundary(const char* call, const char* what, const void* pointer,
                                    bool wanted) const {
  if ((pointer != nullptr) == wanted) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("GptCuda::", call, " of '", cpu_->Describe(), "': ", what,
                   wanted ? " must be a device pointer of batch.size * context * width floats"
                          : " must be null (this stage is an end of the pipeline)"));
}

absl::Status GptCuda::SliceForward(const Batch& batch, const float* params, const float* input,
                                   float* output) {
  if (!cuda_options_.flat_parameters || params == nullptr) {
    return absl::InvalidArgumentError(
        "GptCuda::SliceForward: params must be a device pointer of flat parameters "
        "(GptCudaOptions::flat_parameters)");
  }
  RM_RETURN_IF_ERROR(CheckBoundary("SliceForward", "input", input, !cpu_->has_embeddings()));
  RM_RETURN_IF_ERROR(CheckBoundary("SliceForward", "output", output, !cpu_->has_head()));
  slice_batch_ = 0;
  deferred_.clear();
  RM_RETURN_IF_ERROR(PrepareCall(batch));
  store_ = nullptr;
  cast_group_ = -1;
  head_cast_ = false;
  cast_status_ = absl::OkStatus();
  if (cuda_options_.cast_in_slices) RM_RETURN_IF_ERROR(CastParameters(params));
  const int64_t n = batch.size * options_.context * options_.width;
  RM_RETURN_IF_ERROR(ByPrecision([&](auto zero) -> absl::Status {
    using T = decltype(zero);
    if (cpu_->has_embeddings()) {
      RM_RETURN_IF_ERROR(EmbeddingsForward<T>(params, batch.size));
    } else {
      RM_RETURN_IF_ERROR(
          Timed("pipeline boundary", [&] { return FromFloat(Stream(0), input, n); }));
    }
    RM_RETURN_IF_ERROR(BlocksForward<T>(params, batch.size));
    if (cpu_->has_head()) return HeadForward<T>(params, batch.size);
    return Timed("pipeline boundary", [&] { return ToFloat(output, Stream(blocks_in_slice_), n); });
  }));
  slice_params_ = params;
  slice_batch_ = batch.size;
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GptCuda::SliceLoss() {
  if (!cpu_->has_head() || slice_batch_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GptCuda::SliceLoss of '", cpu_->Describe(), "': only the last stage, after SliceForward"));
  }
  const int64_t rows = slice_batch_ * options_.context;
  slice_batch_ = 0;
  // The cross-entropy's gradient goes to dbig_, unread.
  RM_RETURN_IF_ERROR(ByPrecision([&](auto zero) { return Loss<decltype(zero)>(rows, 1.0f); }));
  return ReadStats(rows);
}

absl::StatusOr<StepStats> GptCuda::SliceBackward(float* grads,
                                                 const ForwardBackwardOptions& options,
                                                 const float* output_grad, float* input_grad,
                                                 bool defer_weights, bool discard) {
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  if (options.store != nullptr) {
    return absl::InvalidArgumentError(
        "GptCuda::SliceBackward: a ParameterStore (not for "
        "pipeline stages)");
  }
  if (slice_batch_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptCuda::SliceBackward of '", cpu_->Describe(), "' before its SliceForward"));
  }
  if (options.precision != precision_ || grads == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCuda::SliceBackward: want options.precision ", PrecisionName(precision_),
                     " (the model's) and a device pointer for the gradients"));
  }
  RM_RETURN_IF_ERROR(CheckBoundary("SliceBackward", "output_grad", output_grad, !cpu_->has_head()));
  RM_RETURN_IF_ERROR(
      CheckBoundary("SliceBackward", "input_grad", input_grad, !cpu_->has_embeddings()));
  const int64_t batch = slice_batch_, rows = batch * options_.context;
  const int64_t n = rows * options_.width;
  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  deferred_.clear();
  if (defer_weights) RM_RETURN_IF_ERROR(ReserveDeferred(rows));
  const std::function<void(int)> no_announcements = [](int) {};
  deferring_ = defer_weights;
  absl::Status status = ByPrecision([&](auto zero) -> absl::Status {
    using T = decltype(zero);
    if (cpu_->has_head()) {
      if (discard) {  // a stand-in micro-batch: the loss's gradient is zero
        RM_RETURN_IF_CUDA_ERROR(
            cudaMemsetAsync(dbig_, 0, rows * logits_stride_ * sizeof(T), stream_));
      } else {
        RM_RETURN_IF_ERROR(Loss<T>(rows, scale));
      }
      RM_RETURN_IF_ERROR(HeadBackward<T>(slice_params_, grads, batch, no_announcements));
    } else {
      RM_RETURN_IF_ERROR(
          Timed("pipeline boundary", [&] { return FromFloat(dresidual_, output_grad, n); }));
    }
    RM_RETURN_IF_ERROR(BlocksBackward<T>(slice_params_, grads, batch, no_announcements));
    if (cpu_->has_embeddings()) return EmbeddingsBackward<T>(grads, batch, no_announcements);
    return Timed("pipeline boundary", [&] { return ToFloat(input_grad, dresidual_, n); });
  });
  deferring_ = false;
  RM_RETURN_IF_ERROR(status);
  StepStats stats;
  if (cpu_->has_head() && !discard) {
    RM_ASSIGN_OR_RETURN(stats, ReadStats(rows));
  }
  if (!defer_weights) slice_batch_ = 0;
  return stats;
}

absl::Status GptCuda::SliceBackwardWeights(float* grads, const ForwardBackwardOptions& options) {
  if (slice_batch_ == 0 || deferred_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("GptCuda::SliceBackwardWeights of '",
                                                      cpu_->Describe(),
                                                      "': no SliceBackward deferred its weights"));
  }
  if (options.precision != precision_ || grads == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCuda::SliceBackwardWeights: want options.precision ", PrecisionName(precision_),
        " (the model's) and a device pointer for the gradients"));
  }
  const int64_t rows = slice_batch_ * options_.context;
  for (const DeferredWeights& d : deferred_) {
    RM_RETURN_IF_ERROR(LinearWeights(grads, d.in, d.dout, d.weight, d.has_bias, rows, d.in_features,
                                     d.out_features, d.dout_stride));
  }
  deferred_.clear();
  slice_batch_ = 0;
  return absl::OkStatus();
}

template <typename T>
absl::Status GptCuda::BlockBackward(const float* params, float* grads, int64_t batch,
                                    int64_t l) {
  const int64_t t = options_.context, c = options_.width, rows = batch * t;
  const kc::MatMulType type = cuda_options_.matmul;
  auto act = [](void* a) { return static_cast<T*>(a); };
  T* dx = act(dresidual_);  // the residual stream's gradient, added to in place
  T* dsmall = act(dsmall_);
  T* dbig = act(dbig_);
  const int first = blocks_[l];
  auto w = [&](BlockTensor k) { return Param(params, first + k); };
  auto mw = [&](BlockTensor k) { return MatMulParam(params, first + k); };
  auto gw = [&](BlockTensor k) { return Grad(grads, first + k); };
  const BlockActivations& a = Slot(l);
  const int64_t ca = attn_width_;  // this tensor-parallel rank's heads' width
  // MLP: out = residual + proj(gelu(fc(ln2(residual)))).
  // With tensor parallelism this rank holds hidden_ of the 4 width hidden units and ca of the
  // width attention channels; the input gradients of mlp.fc and attn.qkv are partial sums.
  // Each layer's input gradient first, then its weights' (its parameters asked for before its
  // gradients, in GptModel's order).
  RM_RETURN_IF_ERROR(Timed("matmul backward (inputs)", [&] {
    return engine_->LinearBackwardInput(type, dx, mw(kFcProjWeight), dbig, rows, hidden_, c,
                                        stream_);
  }));
  RM_RETURN_IF_ERROR(BeginGradients(first + kFcProjWeight));
  RM_RETURN_IF_ERROR(
      LinearWeights(grads, a.gelu, dx, first + kFcProjWeight, true, rows, hidden_, c));
  EndGradients(first + kFcProjWeight);
  RM_RETURN_IF_ERROR(Timed("gelu backward", [&] {
    return GeluBackward(dbig, act(a.fc), dbig, rows * hidden_, stream_);
  }));
  RM_RETURN_IF_ERROR(Timed("matmul backward (inputs)", [&] {
    return engine_->LinearBackwardInput(type, dbig, mw(kFcWeight), dsmall, rows, c, hidden_,
                                        stream_);
  }));
  RM_RETURN_IF_ERROR(BeginGradients(first + kFcWeight));
  RM_RETURN_IF_ERROR(LinearWeights(grads, a.ln2, dbig, first + kFcWeight, true, rows, c, hidden_));
  EndGradients(first + kFcWeight);
  RM_RETURN_IF_ERROR(SumInputGradient(dsmall, rows * c));  // column-parallel: partial
  const float* ln2_gain = w(kLn2Weight);
  RM_RETURN_IF_ERROR(BeginGradients(first + kLn2Weight));
  RM_RETURN_IF_ERROR(Timed("layernorm backward", [&] {
    return LayerNormBackward(dx, gw(kLn2Weight), gw(kLn2Bias), dsmall, act(a.residual), ln2_gain,
                             a.ln2_mean, a.ln2_rstd, rows, c, layernorm_scratch_, stream_);
  }));
  EndGradients(first + kLn2Weight);
  // Attention: residual = x + proj(attention(qkv(ln1(x)))).
  RM_RETURN_IF_ERROR(Timed("matmul backward (inputs)", [&] {
    return engine_->LinearBackwardInput(type, dx, mw(kProjWeight), dsmall, rows, ca, c, stream_);
  }));
  RM_RETURN_IF_ERROR(BeginGradients(first + kProjWeight));
  RM_RETURN_IF_ERROR(LinearWeights(grads, a.attention, dx, first + kProjWeight, true, rows, ca, c));
  EndGradients(first + kProjWeight);
  T* dqkv = dbig;
  RM_RETURN_IF_ERROR(Timed("attention backward", [&] {
    return kc::AttentionBackwardLse(dqkv, dsmall, act(a.qkv), act(a.attention), a.lse,
                                    attention_scratch_, batch, t, ca, heads_local_, stream_);
  }));
  RM_RETURN_IF_ERROR(Timed("matmul backward (inputs)", [&] {
    return engine_->LinearBackwardInput(type, dqkv, mw(kQkvWeight), dsmall, rows, c, 3 * ca,
                                        stream_);
  }));
  RM_RETURN_IF_ERROR(BeginGradients(first + kQkvWeight));
  RM_RETURN_IF_ERROR(LinearWeights(grads, a.ln1, dqkv, first + kQkvWeight, true, rows, c, 3 * ca));
  EndGradients(first + kQkvWeight);
  RM_RETURN_IF_ERROR(SumInputGradient(dsmall, rows * c));  // column-parallel: partial
  const float* ln1_gain = w(kLn1Weight);
  RM_RETURN_IF_ERROR(BeginGradients(first + kLn1Weight));
  RM_RETURN_IF_ERROR(Timed("layernorm backward", [&] {
    return LayerNormBackward(dx, gw(kLn1Weight), gw(kLn1Bias), dsmall, act(Stream(l)), ln1_gain,
                             a.ln1_mean, a.ln1_rstd, rows, c, layernorm_scratch_, stream_);
  }));
  EndGradients(first + kLn1Weight);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::nn
