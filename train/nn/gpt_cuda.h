// The GPT of train/nn/gpt.h on one CUDA GPU: the same parameters (the CPU model's table,
// flat, in device memory), the same forward and backward, built from the CUDA kernels
// (kernels/cuda/: cuBLASLt products, LayerNorm, GELU, memory-efficient causal attention,
// softmax cross-entropy, embedding, the residual addition). Activations stay on the device;
// only the tokens go up and the per-token losses and predictions come back.
//
//   auto gpt = GptCuda::Create(options, {.matmul = MatMulType::kTensorFloat32}, stream);
//   (*gpt)->ForwardBackward(batch, device_params, device_grads, fb_options);
//
// Three precisions, chosen by GptCudaOptions::matmul:
//   - kFloat32 / kTensorFloat32: fp32 activations with fp32 (or TF32) products, the twin of
//     the CPU model in Precision::kFloat32, which the tests compare it with.
//   - kBFloat16: llm.c-style mixed precision. The flat fp32 parameters stay the master copy;
//     each ForwardBackward casts them once into a bf16 copy that the matrix products read
//     (weights and biases); LayerNorm gains and biases and the embedding tables are read in
//     fp32. Activations and their gradients are bf16 (fp32 LayerNorm statistics, attention
//     log-sum-exps and losses); parameter gradients are fp32, the weights' straight from
//     cuBLASLt's fp32 accumulators. ForwardBackward then takes Precision::kBFloat16.
//   - kFloat16: the same with fp16 (Precision::kFloat16). fp16's range ends at 65504, so the
//     caller scales the loss (ForwardBackwardOptions::loss_scale, train/optim/loss_scaler.h):
//     a gradient that overflows becomes inf or NaN in the fp32 gradients, where the loss
//     scaler's check finds it and skips the step.
// 16-bit activations need a head size the 16-bit attention takes (64 or 128).
// Activation checkpointing as GptModel's (options.checkpoint_every = k): only every k-th
// block's input is kept, and backward recomputes each segment's activations before its
// blocks' gradients (one extra forward of all but the last segment).
// Not here: attention that keeps its probabilities (memory_efficient_attention must be
// true): UNIMPLEMENTED.
//
// Not thread-safe; all work goes to the stream given at Create, and ForwardBackward waits
// for it once (to return the loss).
#ifndef RINGMASTER_TRAIN_NN_GPT_CUDA_H_
#define RINGMASTER_TRAIN_NN_GPT_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/matmul.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/device_arena.h"
#include "train/nn/gpt.h"

namespace ringmaster::train::nn {

struct GptCudaOptions {
  // fp32 or tf32 (fp32 activations), bf16 or fp16 (16-bit activations); see above.
  kernels::cuda::MatMulType matmul = kernels::cuda::MatMulType::kFloat32;
  // Time each kind of work (profile_ms()): a pair of CUDA events around every launch. For
  // benchmarks: the events cost a little time of their own.
  bool profile = false;
  // The logits' rows are padded to a multiple of this many elements (1: dense rows of vocab).
  // With GPT-2's vocabulary of 50257, dense 16-bit rows start at odd byte offsets and the
  // LM-head products (a third of the model's FLOPs) cannot use cuBLASLt's fastest kernels;
  // llm.c pads its vocabulary to 50304 for this. Here only the rows are padded: the
  // parameters keep the CPU model's layout, and the padding is never read or written.
  int64_t logits_row_alignment = 64;
};

class GptCuda {
 public:
  // INVALID_ARGUMENT as GptModel::Create; UNIMPLEMENTED for what is not here yet (above),
  // a 16-bit matmul type, or a head size the CUDA attention does not take.
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(const GptOptions& options,
                                                         const GptCudaOptions& cuda_options,
                                                         cudaStream_t stream);
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  // The CPU twin: its table is the layout of the flat parameters and gradients, and its
  // Init fills a host buffer to copy up.
  const GptModel& cpu_model() const { return *cpu_; }
  int64_t total_elements() const { return cpu_->table().total_elements(); }

  // As GptModel::ForwardBackward, with `params` and `grads` device pointers of at least
  // total_elements() floats. Without options.accumulate the gradients are overwritten, the
  // padding between tensors included (it becomes 0). options.precision must be precision():
  // INVALID_ARGUMENT otherwise.
  // on_grads_ready is called as GptModel calls it (lm_head, lnf, each block from the last,
  // the embeddings with 0), each time the group's gradient kernels have been ENQUEUED on the
  // stream, not run: a reader on another stream or thread must wait for the stream first
  // (an event recorded in the callback; GradientSync does this through its VectorOps).
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const float* params,
                                            float* grads, const ForwardBackwardOptions& options);

  // The activations' precision: kFloat32, or kBFloat16 / kFloat16 with a 16-bit matmul.
  Precision precision() const { return precision_; }

  // Device bytes held for activations, tokens and scratch (the largest batch so far).
  int64_t activation_bytes() const { return arena_.bytes(); }
  // Elements from one row of the logits to the next (vocab rounded up to
  // GptCudaOptions::logits_row_alignment).
  int64_t logits_stride() const { return logits_stride_; }
  // Device bytes of the 16-bit copy of the parameters (0 in fp32).
  int64_t parameter_copy_bytes() const { return half() ? total_elements() * 2 : 0; }

  // With GptCudaOptions::profile: milliseconds of GPU time per kind of work ("matmul
  // forward", "attention backward", ...), summed over the ForwardBackward calls so far
  // (profiled_calls() of them). Empty otherwise.
  const std::map<std::string, double>& profile_ms() const { return profile_ms_; }
  int64_t profiled_calls() const { return profiled_calls_; }

 private:
  // Activations of the model's type (float or __nv_bfloat16); statistics in fp32.
  struct BlockActivations {
    void *ln1, *qkv, *attention, *residual, *ln2, *fc, *gelu;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
  };
  GptCuda(std::unique_ptr<GptModel> cpu, const GptCudaOptions& cuda_options, cudaStream_t stream,
          std::unique_ptr<kernels::cuda::MatMulEngine> engine);
  absl::Status Reserve(int64_t batch);
  const float* Param(const float* params, int tensor) const;
  float* Grad(float* grads, int tensor) const;
  // What the matrix products read for `tensor`: the fp32 parameter, or its bf16 copy.
  const void* MatMulParam(const float* params, int tensor) const;
  // The residual stream at `block`'s input (block == layers: the last block's output). With
  // checkpointing only each segment's input is kept; the streams inside a segment share
  // segment_ - 1 buffers, as in GptModel.
  void* Stream(int64_t block) const;
  const BlockActivations& Slot(int64_t block) const { return slots_[block % segment_]; }
  template <typename T>
  absl::Status Forward(const float* params, int64_t batch);
  // A block up to its GELU (into its slot), and its output projection and residual (into
  // Stream(block + 1)): backward recomputes the first for every block of a segment and the
  // second for all but the segment's last.
  template <typename T>
  absl::Status BlockForward(const float* params, int64_t batch, int64_t block);
  template <typename T>
  absl::Status BlockOutputForward(const float* params, int64_t batch, int64_t block);
  template <typename T>
  absl::Status LossAndBackward(const float* params, float* grads, int64_t batch, float scale,
                               const std::function<void(int64_t)>& on_grads_ready);
  template <typename T>
  absl::Status BlockBackward(const float* params, float* grads, int64_t batch, int64_t block);
  // Runs `launch` (which enqueues work on stream_), between two events when profiling.
  template <typename Launch>
  absl::Status Timed(const char* what, Launch launch);
  // After the stream has drained: adds the timed intervals to profile_ms_.
  absl::Status CollectProfile();

  std::unique_ptr<GptModel> cpu_;
  const GptOptions options_;
  const GptCudaOptions cuda_options_;
  cudaStream_t stream_;
  std::unique_ptr<kernels::cuda::MatMulEngine> engine_;
  bool half() const { return precision_ != Precision::kFloat32; }

  const Precision precision_;  // of the activations
  const int64_t segment_;   // blocks per checkpointed segment; layers without checkpointing
  const int64_t segments_;  // ceil(layers / segment_)
  const int64_t logits_stride_;  // elements from one row of the logits to the next
  void* params16_ = nullptr;  // 16-bit copy of the parameters (bf16 and fp16 only)
  int wte_ = 0, wpe_ = 0, lnf_ = 0, lm_head_ = 0;
  std::vector<int> blocks_;  // each block's first tensor

  // One device allocation, laid out for `capacity_` samples.
  DeviceArena arena_;
  int64_t capacity_ = 0;
  std::vector<void*> streams_;  // the residual stream at each block's input, and lnf's
  std::vector<BlockActivations> slots_;
  void *lnf_out_ = nullptr, *logits_ = nullptr;
  void *dresidual_ = nullptr, *dsmall_ = nullptr, *dbig_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *loss_ = nullptr;
  float *attention_scratch_ = nullptr, *layernorm_scratch_ = nullptr, *bias_scratch_ = nullptr;
  int32_t *inputs_ = nullptr, *targets_ = nullptr, *predicted_ = nullptr, *index_ = nullptr;
  int64_t index_groups_ = 0;

  // Profiling: events recorded this call (what, start, end), and a pool of spare events.
  struct TimedLaunch {
    const char* what;
    cudaEvent_t start, end;
  };
  std::vector<TimedLaunch> timed_;
  std::vector<cudaEvent_t> spare_events_;
  std::map<std::string, double> profile_ms_;
  int64_t profiled_calls_ = 0;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_GPT_CUDA_H_
