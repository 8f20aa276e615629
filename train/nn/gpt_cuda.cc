#include "train/nn/gpt_cuda.h"

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

// A block's tensors in table order (train/nn/gpt.h).
enum BlockTensor {
  kLn1Weight, kLn1Bias, kQkvWeight, kQkvBias, kProjWeight, kProjBias,
  kLn2Weight, kLn2Bias, kFcWeight, kFcBias, kFcProjWeight, kFcProjBias,
};

constexpr int64_t kAlign = 64;  // floats: 256-byte aligned pieces of the arena

absl::Status Unimplemented(const auto&... parts) {
  return absl::UnimplementedError(absl::StrCat("GptCuda: ", parts...));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptCuda>> GptCuda::Create(const GptOptions& options,
                                                         const GptCudaOptions& cuda_options,
                                                         cudaStream_t stream) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> cpu, GptModel::Create(options));
  if (options.checkpoint_every != 0) {
    return Unimplemented("activation checkpointing (gpt.checkpoint_every = ",
                         options.checkpoint_every, ") is not on the GPU yet; set it to 0");
  }
  if (!options.memory_efficient_attention) {
    return Unimplemented("attention that keeps its probabilities is CPU-only; set "
                         "memory_efficient_attention");
  }
  if (cuda_options.matmul != kc::MatMulType::kFloat32 &&
      cuda_options.matmul != kc::MatMulType::kTensorFloat32) {
    return Unimplemented(kc::MatMulTypeName(cuda_options.matmul),
                         " products need 16-bit activations, not here yet: use fp32 or tf32");
  }
  const int64_t head_size = options.width / options.heads;
  if (!kc::AttentionCudaSupportsHeadSizeF32(head_size)) {
    return Unimplemented("the fp32 CUDA attention does not take head size ", head_size,
                         " (gpt.width / gpt.heads)");
  }
  RM_ASSIGN_OR_RETURN(std::unique_ptr<kc::MatMulEngine> engine, kc::MatMulEngine::Create());
  return absl::WrapUnique(new GptCuda(std::move(cpu), cuda_options, stream, std::move(engine)));
}

GptCuda::GptCuda(std::unique_ptr<GptModel> cpu, const GptCudaOptions& cuda_options,
                 cudaStream_t stream, std::unique_ptr<kc::MatMulEngine> engine)
    : cpu_(std::move(cpu)),
      options_(cpu_->options()),
      cuda_options_(cuda_options),
      stream_(stream),
      engine_(std::move(engine)) {
  const TensorTable& table = cpu_->table();
  auto find = [&](const std::string& name) {
    absl::StatusOr<int> i = table.Find(name);
    CHECK(i.ok()) << "GptModel's table has no " << name;
    return *i;
  };
  wte_ = find("wte");
  wpe_ = find("wpe");
  for (int64_t l = 0; l < options_.layers; ++l) {
    blocks_.push_back(find(absl::StrCat("h", l, ".ln1.weight")));
    CHECK_EQ(find(absl::StrCat("h", l, ".mlp.proj.bias")), blocks_.back() + kFcProjBias);
  }
  lnf_ = find("lnf.weight");
  lm_head_ = find("lm_head.weight");
}

GptCuda::~GptCuda() {
  if (arena_ != nullptr) cudaFree(arena_);
}

const float* GptCuda::Param(const float* params, int tensor) const {
  return params + cpu_->table().tensor(tensor).offset;
}

float* GptCuda::Grad(float* grads, int tensor) const {
  return grads + cpu_->table().tensor(tensor).offset;
}

absl::Status GptCuda::Reserve(int64_t batch) {
  if (batch <= capacity_) return absl::OkStatus();
  const int64_t t = options_.context, c = options_.width, v = options_.vocab;
  const int64_t rows = batch * t;
  char* base = nullptr;
  int64_t used = 0;  // in 4-byte elements
  auto take = [&](int64_t n) {
    float* p = base == nullptr ? nullptr : reinterpret_cast<float*>(base) + used;
    used += (n + kAlign - 1) / kAlign * kAlign;
    return p;
  };
  auto take_ints = [&](int64_t n) { return reinterpret_cast<int32_t*>(take(n)); };
  auto place = [&] {
    streams_.assign(options_.layers + 1, nullptr);
    for (float*& s : streams_) s = take(rows * c);
    slots_.assign(options_.layers, {});
    for (BlockActivations& a : slots_) {
      a.ln1 = take(rows * c);
      a.ln1_mean = take(rows);
      a.ln1_rstd = take(rows);
      a.qkv = take(rows * 3 * c);
      a.attention = take(rows * c);
      a.lse = take(batch * options_.heads * t);
      a.residual = take(rows * c);
      a.ln2 = take(rows * c);
      a.ln2_mean = take(rows);
      a.ln2_rstd = take(rows);
      a.fc = take(rows * 4 * c);
      a.gelu = take(rows * 4 * c);
    }
    lnf_out_ = take(rows * c);
    lnf_mean_ = take(rows);
    lnf_rstd_ = take(rows);
    logits_ = take(rows * v);
    loss_ = take(rows);
    dresidual_ = take(rows * c);
    dsmall_ = take(rows * c);
    dbig_ = take(rows * std::max(4 * c, v));
    attention_scratch_ = take(kc::AttentionCudaScratchFloats(batch, t, options_.heads));
    layernorm_scratch_ = take(kc::LayerNormBackwardScratchFloats(c));
    bias_scratch_ = take(kc::BiasGradientScratchFloats(4 * c));
    inputs_ = take_ints(rows);
    targets_ = take_ints(rows);
    predicted_ = take_ints(rows);
    index_ = take_ints(kernels::EmbeddingIndexInts(batch, t));
  };
  place();  // measures
  if (arena_ != nullptr) {
    RM_RETURN_IF_ERROR(CudaToStatus(cudaStreamSynchronize(stream_), "GptCuda: stream"));
    cudaFree(arena_);
    arena_ = nullptr;
    arena_bytes_ = 0;
    capacity_ = 0;
  }
  const int64_t bytes = used * 4;
  RM_RETURN_IF_ERROR(CudaToStatus(
      cudaMalloc(&arena_, bytes),
      absl::StrCat("GptCuda: cudaMalloc of ", bytes, " bytes of activations for ", batch,
                   " samples")
          .c_str()));
  arena_bytes_ = bytes;
  capacity_ = batch;
  base = static_cast<char*>(arena_);
  used = 0;
  place();  // assigns
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GptCuda::ForwardBackward(const Batch& batch, const float* params,
                                                   float* grads,
                                                   const ForwardBackwardOptions& options) {
  if (options.precision != Precision::kFloat32) {
    return Unimplemented("only fp32 activations on the GPU so far (precision ",
                         static_cast<int>(options.precision), ")");
  }
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  if (params == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError("GptCuda::ForwardBackward: params and grads are device "
                                      "pointers and must not be null");
  }
  RM_RETURN_IF_ERROR(cpu_->CheckBatch(batch));
  const int64_t t = options_.context;
  RM_RETURN_IF_ERROR(Reserve(batch.size));

  const int64_t rows = batch.size * t;
  std::vector<int32_t> inputs(rows), targets(rows);
  for (int64_t b = 0; b < batch.size; ++b) {
    const int32_t* sample = batch.tokens.data() + b * (t + 1);
    std::copy_n(sample, t, inputs.data() + b * t);
    std::copy_n(sample + 1, t, targets.data() + b * t);
  }
  RM_ASSIGN_OR_RETURN(kernels::EmbeddingIndex index,
                      kernels::IndexTokens(inputs.data(), batch.size, t, options_.vocab));
  index_groups_ = index.groups;
  // Pageable host memory: each copy has left the host buffer when the call returns.
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(inputs_, inputs.data(), rows * 4,
                                          cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(targets_, targets.data(), rows * 4,
                                          cudaMemcpyHostToDevice, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(index_, index.ints.data(), index.ints.size() * 4,
                                          cudaMemcpyHostToDevice, stream_));

  RM_RETURN_IF_ERROR(Forward(params, batch.size));
  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  RM_RETURN_IF_ERROR(kc::SoftmaxCrossEntropyForwardBackward(
      logits_, targets_, rows, options_.vocab, scale, loss_, predicted_, dbig_, stream_));
  if (!options.accumulate) {
    RM_RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(grads, 0, total_elements() * sizeof(float), stream_));
  }
  RM_RETURN_IF_ERROR(Backward(params, grads, batch.size, options.on_grads_ready));

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
    stats.correct += predicted[i] == targets[i];
  }
  return stats;
}

absl::Status GptCuda::Forward(const float* params, int64_t batch) {
  const int64_t t = options_.context, c = options_.width, rows = batch * t;
  const kc::MatMulType type = cuda_options_.matmul;
  auto p = [&](int tensor) { return Param(params, tensor); };
  RM_RETURN_IF_ERROR(kc::EmbeddingForward(streams_[0], inputs_, p(wte_), p(wpe_), batch, t, c,
                                          options_.vocab, stream_));
  for (int64_t l = 0; l < options_.layers; ++l) {
    const int first = blocks_[l];
    auto w = [&](BlockTensor k) { return p(first + k); };
    const BlockActivations& a = slots_[l];
    const float* x = streams_[l];
    RM_RETURN_IF_ERROR(kc::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w(kLn1Weight),
                                            w(kLn1Bias), rows, c, stream_));
    RM_RETURN_IF_ERROR(engine_->LinearForward(type, a.ln1, w(kQkvWeight), w(kQkvBias), a.qkv,
                                              rows, c, 3 * c, stream_));
    RM_RETURN_IF_ERROR(kc::AttentionForwardLse(a.attention, a.lse, a.qkv, batch, t, c,
                                               options_.heads, stream_));
    RM_RETURN_IF_ERROR(engine_->LinearForward(type, a.attention, w(kProjWeight), w(kProjBias),
                                              a.residual, rows, c, c, stream_));
    RM_RETURN_IF_ERROR(kc::ResidualForward(a.residual, a.residual, x, rows * c, stream_));
    RM_RETURN_IF_ERROR(kc::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual,
                                            w(kLn2Weight), w(kLn2Bias), rows, c, stream_));
    RM_RETURN_IF_ERROR(engine_->LinearForward(type, a.ln2, w(kFcWeight), w(kFcBias), a.fc, rows,
                                              c, 4 * c, stream_));
    RM_RETURN_IF_ERROR(kc::GeluForward(a.gelu, a.fc, rows * 4 * c, stream_));
    float* out = streams_[l + 1];
    RM_RETURN_IF_ERROR(engine_->LinearForward(type, a.gelu, w(kFcProjWeight), w(kFcProjBias), out,
                                              rows, 4 * c, c, stream_));
    RM_RETURN_IF_ERROR(kc::ResidualForward(out, out, a.residual, rows * c, stream_));
  }
  RM_RETURN_IF_ERROR(kc::LayerNormForward(lnf_out_, lnf_mean_, lnf_rstd_,
                                          streams_[options_.layers], p(lnf_), p(lnf_ + 1), rows,
                                          c, stream_));
  return engine_->LinearForward(type, lnf_out_, p(lm_head_), nullptr, logits_, rows, c,
                                options_.vocab, stream_);
}

absl::Status GptCuda::Backward(const float* params, float* grads, int64_t batch,
                              const std::function<void(int64_t)>& on_grads_ready) {
  const int64_t t = options_.context, c = options_.width, rows = batch * t;
  const int64_t vocab = options_.vocab;
  const kc::MatMulType type = cuda_options_.matmul;
  constexpr OutputMode kAdd = OutputMode::kAccumulate;  // grads are zeroed or accumulated
  auto p = [&](int tensor) { return Param(params, tensor); };
  auto g = [&](int tensor) { return Grad(grads, tensor); };
  // Each group of tensors (lm_head, lnf, a block, the embeddings) is announced once its
  // gradient kernels are enqueued: the caller orders its reads after them (a CUDA event).
  auto ready = [&](int first_tensor) {
    if (on_grads_ready) on_grads_ready(cpu_->table().tensor(first_tensor).offset);
  };
  float* dlogits = dbig_;
  float* dx = dresidual_;  // the residual stream's gradient, added to in place

  RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, lnf_out_, dlogits, g(lm_head_), nullptr,
                                                    rows, c, vocab, kAdd, nullptr, stream_));
  ready(lm_head_);
  RM_RETURN_IF_ERROR(
      engine_->LinearBackwardInput(type, dlogits, p(lm_head_), dsmall_, rows, c, vocab, stream_));
  RM_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(dx, 0, rows * c * sizeof(float), stream_));
  RM_RETURN_IF_ERROR(kc::LayerNormBackward(dx, g(lnf_), g(lnf_ + 1), dsmall_,
                                           streams_[options_.layers], p(lnf_), lnf_mean_,
                                           lnf_rstd_, rows, c, layernorm_scratch_, stream_));
  ready(lnf_);

  for (int64_t l = options_.layers - 1; l >= 0; --l) {
    const int first = blocks_[l];
    auto w = [&](BlockTensor k) { return p(first + k); };
    auto gw = [&](BlockTensor k) { return g(first + k); };
    const BlockActivations& a = slots_[l];
    float* dsmall = dsmall_;
    float* dbig = dbig_;
    // MLP: out = residual + proj(gelu(fc(ln2(residual)))).
    RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, a.gelu, dx, gw(kFcProjWeight),
                                                      gw(kFcProjBias), rows, 4 * c, c, kAdd,
                                                      bias_scratch_, stream_));
    RM_RETURN_IF_ERROR(
        engine_->LinearBackwardInput(type, dx, w(kFcProjWeight), dbig, rows, 4 * c, c, stream_));
    RM_RETURN_IF_ERROR(kc::GeluBackward(dbig, a.fc, dbig, rows * 4 * c, stream_));
    RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, a.ln2, dbig, gw(kFcWeight),
                                                      gw(kFcBias), rows, c, 4 * c, kAdd,
                                                      bias_scratch_, stream_));
    RM_RETURN_IF_ERROR(
        engine_->LinearBackwardInput(type, dbig, w(kFcWeight), dsmall, rows, c, 4 * c, stream_));
    RM_RETURN_IF_ERROR(kc::LayerNormBackward(dx, gw(kLn2Weight), gw(kLn2Bias), dsmall,
                                             a.residual, w(kLn2Weight), a.ln2_mean, a.ln2_rstd,
                                             rows, c, layernorm_scratch_, stream_));
    // Attention: residual = x + proj(attention(qkv(ln1(x)))).
    RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, a.attention, dx, gw(kProjWeight),
                                                      gw(kProjBias), rows, c, c, kAdd,
                                                      bias_scratch_, stream_));
    RM_RETURN_IF_ERROR(
        engine_->LinearBackwardInput(type, dx, w(kProjWeight), dsmall, rows, c, c, stream_));
    float* dqkv = dbig;
    RM_RETURN_IF_ERROR(kc::AttentionBackwardLse(dqkv, dsmall, a.qkv, a.attention, a.lse,
                                                attention_scratch_, batch, t, c, options_.heads,
                                                stream_));
    RM_RETURN_IF_ERROR(engine_->LinearBackwardWeights(type, a.ln1, dqkv, gw(kQkvWeight),
                                                      gw(kQkvBias), rows, c, 3 * c, kAdd,
                                                      bias_scratch_, stream_));
    RM_RETURN_IF_ERROR(
        engine_->LinearBackwardInput(type, dqkv, w(kQkvWeight), dsmall, rows, c, 3 * c, stream_));
    RM_RETURN_IF_ERROR(kc::LayerNormBackward(dx, gw(kLn1Weight), gw(kLn1Bias), dsmall, streams_[l],
                                             w(kLn1Weight), a.ln1_mean, a.ln1_rstd, rows, c,
                                             layernorm_scratch_, stream_));
    ready(first);
  }
  RM_RETURN_IF_ERROR(kc::EmbeddingBackward(g(wte_), g(wpe_), dx, index_, index_groups_, batch, t,
                                           c, vocab, stream_));
  ready(wte_);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::nn
