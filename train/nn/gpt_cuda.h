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
// Tensor parallelism (GptOptions::tp_size > 1) as GptModel's (Megatron's split: this rank's
// heads of attn.qkv and columns of attn.proj, its hidden units of mlp.fc and columns of
// mlp.proj; the rest replicated): the flat parameters and gradients are the rank's table
// (cpu_model().table(), cpu_model().shard(i)), and the group's sums go through
// set_tensor_parallel_sum's callback on device memory (below). Pipeline stages' slices
// (GptOptions::first_block / end_block) run through the Slice* calls (below), on device
// pointers; profile_ms() counts ForwardBackward's work only.
// Not here: attention that keeps its probabilities (memory_efficient_attention must be
// true): UNIMPLEMENTED.
//
// Not thread-safe; all work goes to the stream given at Create, and ForwardBackward waits
// for it once (to return the loss).
//
// A ParameterStore (train/model.h; fully sharded data parallelism) in device memory:
// ForwardBackwardOptions::store makes the parameters and gradients the store's, group by group
// (cpu_model().parameter_groups()), asked for in GptModel's order, so that every rank makes
// the same calls: Parameters(g) right before each kernel that reads group g is enqueued;
// BeginBackward after forward; in backward, for each group from lm_head down to the
// embeddings, Gradients(g) (the model zeroes the group's tensors there, then its kernels add
// into them, as into the zeroed flat gradients without a store), then the kernels that read
// g's parameters (backward recomputes a checkpointed segment's forward first), then
// GradientsDone(g). Each call is made once the work before it has been ENQUEUED on stream(),
// not run: the GPU runs behind the host, so the store orders its own work (gathers and
// reductions on another stream) with the model's stream by CUDA events:
//   - Parameters(g): the values must be ready for work enqueued on stream() after the call
//     returns: the store makes stream() wait for its gather (cudaStreamWaitEvent on an event
//     recorded after it), or has waited for it on the host.
//   - The pointer Parameters(g) returned is read only by work enqueued before the model's
//     next call to the store (other than Parameters(g) again): a store that frees or refills
//     the buffer at a later call records an event on stream() in that call and makes the
//     buffer's next writer wait for it.
//   - Gradients(g): the buffer is written by work enqueued on stream() after the call; if an
//     earlier reduction of the store still reads it, the store makes stream() wait for it.
//   - GradientsDone(g): once the work enqueued on stream() so far has run, g's gradients are
//     final and its parameters no longer read: the store records an event on stream() in the
//     call and makes its reduction (and the release of g's parameters) wait for it.
// ForwardBackward synchronizes stream() before it returns, so every kernel of the pass has
// run by then; the store's own work may still be in flight.
// In bf16 and fp16 the store gives fp32 values (the master values, or values already
// rounded to the compute format, which the cast leaves as they are) and the model casts a
// group's weights and biases into its 16-bit copy when a product needs them, as the call
// without a store casts the whole flat buffer; LayerNorm gains and biases and the embedding
// tables are read from the store's buffer in fp32. So a store holding the master values gives
// bit for bit the losses and gradients of the call without a store; a store that gathers
// 16-bit values gives LayerNorm and the embeddings those (as GptModel reads them).
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

class GptCuda;

struct GptCudaOptions {
  // fp32 or tf32 (fp32 activations), bf16 or fp16 (16-bit activations); see above.
  kernels::cuda::MatMulType matmul = kernels::cuda::MatMulType::kFloat32;
  // Time each kind of work (profile_ms()): a pair of CUDA events around every launch. For
  // benchmarks: the events cost a little time of their own.
  bool profile = false;
  // The vocabulary is padded to a multiple of this many elements (logits_stride(); 1: no
  // padding). With GPT-2's vocabulary of 50257, the LM-head products (a third of the model's
  // FLOPs) with an odd dimension of 16-bit operands cannot use cuBLASLt's fastest kernels;
  // llm.c pads its vocabulary to 50304 (Vp) for this. The logits' rows are always
  // logits_stride() elements apart. In bf16 and fp16 the LM head's forward product
  // (logits = lnf · lm_headᵀ) and input-gradient product (d lnf = dlogits · lm_head) also run
  // over the padded vocabulary: the lm_head's 16-bit copy has logits_stride() rows, those past
  // vocab zero (zeroed once at Create; the cast writes only the vocab rows), and the
  // cross-entropy writes zeros into dlogits' padding columns, so the padding adds nothing;
  // the logits' padding columns (lnf · 0 = 0) are never read. The weight-gradient product
  // stays over vocab, into the CPU model's vocab x width gradient: the flat parameters and
  // gradients keep the CPU model's layout. In fp32 and tf32 the products read the fp32
  // parameters (vocab rows) and run over vocab.
  int64_t logits_row_alignment = 64;
  // Whether ForwardBackward is called without a ParameterStore (the parameters one flat
  // buffer). In bf16 and fp16 the model then holds a 16-bit copy of every parameter; false
  // (every call with a store: fully sharded data parallelism) holds only one parameter
  // group's copy, and a call without a store is INVALID_ARGUMENT.
  bool flat_parameters = true;
  // bf16/fp16 with flat_parameters: another model of the same options whose 16-bit copy of
  // the parameters this one reads instead of keeping its own (the micro-batches in flight of
  // one pipeline stage share one); not owned, it outlives this model.
  const GptCuda* parameter_copy_of = nullptr;
  // Whether SliceForward casts its `params` into the 16-bit copy. False: the caller casts
  // once a step (CastParameterCopy) for every model that shares the copy.
  bool cast_in_slices = true;
};

class GptCuda {
 public:
  // INVALID_ARGUMENT as GptModel::Create; UNIMPLEMENTED for what is not here yet (above),
  // a 16-bit matmul type, or a head size the CUDA attention does not take.
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(const GptOptions& options,
                                                         const GptCudaOptions& cuda_options,
                                                         cudaStream_t stream);
  // Create's UNIMPLEMENTED and INVALID_ARGUMENT for `cuda_options`, without making anything
  // (`options` already valid for GptModel): whether this model has a CUDA path.
  static absl::Status CheckSupported(const GptOptions& options, const GptCudaOptions& cuda_options);
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
  // With options.store (above) `params` and `grads` are not used (they may be null), and
  // options.accumulate is INVALID_ARGUMENT (the store sums micro-batches), as in GptModel.
  // FAILED_PRECONDITION on a pipeline stage's slice (use the Slice* calls below).
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const float* params,
                                            float* grads, const ForwardBackwardOptions& options);

  // The activations' precision: kFloat32, or kBFloat16 / kFloat16 with a 16-bit matmul.
  Precision precision() const { return precision_; }

  // Tensor parallelism (GptOptions::tp_size > 1; the split and the shards as GptModel's,
  // cpu_model().shard(i)): the group's in-place sum of `count` fp32 values at `device_data`,
  // called 2 times per block in forward (the partial outputs of attn.proj and mlp.proj,
  // before their replicated bias is added) and 2 in backward (the partial input gradients of
  // mlp.fc and attn.qkv), plus once per recomputed row-parallel projection with activation
  // checkpointing (as many as GptModel makes): the same calls, in the same order, with the
  // same counts, on every rank of the group. The call comes once the partial values'
  // kernels have been ENQUEUED on `stream` (= stream()), not run; the callback must make work
  // enqueued on `stream` after it returns see the sums in place: ncclAllReduce(data, data,
  // count, ncclFloat32, ncclSum, comm, stream), or cudaStreamSynchronize(stream), a sum on
  // the host and a copy back. `device_data` stays valid and untouched by the model until
  // that work has run. A non-OK status ends the model's call with it (the parameters'
  // gradients are then garbage). Required before the first ForwardBackward when tp_size > 1
  // (FAILED_PRECONDITION otherwise).
  //
  // Precision of the sums: always fp32. In fp32/tf32 the partial products are fp32 and
  // summed in place. In bf16/fp16 each rank's partial product comes out of the matrix
  // product rounded once to 16 bits (as every product's output is), is widened exactly into
  // an fp32 buffer, summed there in fp32, has the replicated bias added in fp32 (for the
  // projections) and is rounded once to 16 bits. GptModel in bf16 keeps the partial
  // products in fp32 before the sum: this adds one 16-bit rounding per partial (relative
  // 2^-9 for bf16), which the tests bound (gpt_cuda_tp_test.cc). Megatron sums the 16-bit
  // partials in 16 bits; fp32 sums keep the group's result independent of the group's size
  // up to fp32 rounding.
  using DeviceSum =
      std::function<absl::Status(float* device_data, int64_t count, cudaStream_t stream)>;
  void set_tensor_parallel_sum(DeviceSum sum) { tp_sum_ = std::move(sum); }

  // Pipeline stages (GptOptions::first_block / end_block: GptModel's slices, the flat
  // parameters and gradients laid out by cpu_model().table(), which holds only the slice's
  // tensors): one micro-batch through this slice in three calls, as GptModel's Slice* calls
  // but on device pointers and the stream. The object keeps one micro-batch's activations (a
  // stage with several in flight holds one GptCuda each). ForwardBackward on a slice that is
  // not the whole model is FAILED_PRECONDITION.
  //
  // The boundary (the activation leaving a stage and entering the next, and its gradient) is
  // fp32 on the device, [batch.size * context, width] row-major. In fp32/tf32 it is the
  // residual stream itself; in bf16/fp16 it is the 16-bit residual stream widened exactly,
  // and the next stage rounds it back exactly: chaining slices gives the whole model's
  // arithmetic (the tests find the same gradients, within fp32 rounding of the products'
  // orders). Twice the bytes of 16-bit values on the wire, which the pipeline executor may
  // cast if it wants.
  //
  // SliceForward: `params` (device, total_elements() floats; GptCudaOptions::flat_parameters)
  // must stay alive and unchanged until the micro-batch's backward is done. `input` is the
  // previous stage's output (null on the first stage), `output` receives this slice's (null
  // on the last stage); INVALID_ARGUMENT for a pointer given or missing against that, or a bad
  // batch (as ForwardBackward). The batch's tokens are read by the first stage (inputs) and
  // the last (targets). The work is ENQUEUED on stream(): `output` is ready for work enqueued
  // on stream() after the call (another stream must wait for an event recorded on it).
  absl::Status SliceForward(const Batch& batch, const float* params, const float* input,
                            float* output);
  // SliceBackward, after SliceForward: from the gradient of the slice's output (null on the
  // last stage, which starts from its loss scaled by options.loss_scale / loss_divisor) to
  // the gradient of its input (null on the first stage), ADDING the parameters' gradients to
  // `grads` (device; zero them before a step's first micro-batch; options.accumulate and
  // on_grads_ready are ignored, options.store must be null, options.precision must be
  // precision()). With defer_weights the linear layers' weight and bias gradients are left for
  // SliceBackwardWeights (their inputs' gradients, and with checkpointing their inputs, copied
  // into device memory held until then: activation_bytes() counts it); LayerNorms and the
  // embeddings are done here: the zero-bubble schedule's split. With discard (the last stage:
  // a stand-in micro-batch that does not count) the loss's gradient is zero, so every
  // gradient it adds is zero, and the StepStats are zeros. StepStats: the loss on the last
  // stage (the call then waits for the stream), zeros elsewhere. FAILED_PRECONDITION without a
  // SliceForward. With tensor parallelism the sums are those of ForwardBackward's backward.
  absl::StatusOr<StepStats> SliceBackward(float* grads, const ForwardBackwardOptions& options,
                                          const float* output_grad, float* input_grad,
                                          bool defer_weights, bool discard = false);
  // The deferred weight gradients of the last SliceBackward, added to `grads`
  // (FAILED_PRECONDITION if none are pending): bit for bit what SliceBackward without
  // defer_weights adds.
  absl::Status SliceBackwardWeights(float* grads, const ForwardBackwardOptions& options);
  // After SliceForward on the last stage: its micro-batch's loss, for a forward-only pass
  // (waits for the stream); FAILED_PRECONDITION elsewhere or without a SliceForward.
  absl::StatusOr<StepStats> SliceLoss();

  // Device bytes held for activations, tokens and scratch (the largest batch so far).
  int64_t activation_bytes() const { return arena_.bytes() + deferred_arena_.bytes(); }
  // Elements from one row of the logits to the next (vocab rounded up to
  // GptCudaOptions::logits_row_alignment).
  int64_t logits_stride() const { return logits_stride_; }
  // The stream every kernel of the model goes to (a ParameterStore's events are recorded on it).
  cudaStream_t stream() const { return stream_; }

  // Device bytes of the 16-bit copy of the parameters (0 in fp32), with the lm_head's
  // padding rows (logits_stride() - vocab rows of width; GptCudaOptions::logits_row_alignment)
  // after its vocab rows. With GptCudaOptions::flat_parameters a copy of every parameter at
  // its flat offset (lm_head, the table's last tensor, ends with its padding rows). Without,
  // room for one parameter group's copy at a time: a group's copy starts at its first tensor's
  // offset modulo kCopyPhase (so that its tensors keep the whole copy's alignment to 256 bytes
  // and cuBLASLt picks the same algorithms for them), except lm_head's group, placed higher
  // (at an offset of the same phase) so that its padding rows lie past every other group's
  // copy and stay zero: at most the largest group, 2 (kCopyPhase - 1) elements and the
  // padding rows.
  // With a tied head (GptOptions::tied_head) the head reads its own 16-bit copy of wte, with
  // the padding rows, placed after every group's copy (cast with them): vocab x width more
  // elements (the 16-bit copy an untied lm_head has; a pipeline's last stage, whose copy of
  // wte is its head, holds that copy in 16 bits twice: vocab x width elements more than it
  // needs).
  static constexpr int64_t kCopyPhase = 128;
  // 0 for a model that reads another's copy (GptCudaOptions::parameter_copy_of).
  int64_t parameter_copy_bytes() const {
    return half() && cuda_options_.parameter_copy_of == nullptr ? 2 * copy_elements_ : 0;
  }
  // Casts the flat `params` (device, total_elements() floats) into the 16-bit copy this
  // model reads (its own or the one it shares), on the stream; nothing in fp32 and tf32.
  absl::Status CastParameterCopy(const float* params) { return CastParameters(params); }

  // With GptCudaOptions::profile: milliseconds of GPU time per kind of work ("matmul
  // forward", "attention backward", ...), summed over the ForwardBackward calls so far
  // (profiled_calls() of them). Empty otherwise. With a store, a group's 16-bit cast is timed
  // with the product that needs it.
  const std::map<std::string, double>& profile_ms() const { return profile_ms_; }
  int64_t profiled_calls() const { return profiled_calls_; }

 private:
  // Activations of the model's type (float or __nv_bfloat16); statistics in fp32.
  struct BlockActivations {
    void *ln1, *qkv, *attention, *residual, *ln2, *fc, *gelu;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
  };
  friend class GptCudaTestPeer;  // gpt_cuda_test: reads the padding, poisons dlogits
  GptCuda(std::unique_ptr<GptModel> cpu, const GptCudaOptions& cuda_options, cudaStream_t stream,
          std::unique_ptr<kernels::cuda::MatMulEngine> engine);
  absl::Status Reserve(int64_t batch);
  // `tensor` of `params`, or of the store's group (asked for in this call).
  const float* Param(const float* params, int tensor);
  // `tensor` of `grads`, or of the store's buffer of the group begun last (BeginGradients).
  float* Grad(float* grads, int tensor) const;
  // What the matrix products read for `tensor`: the fp32 parameter, or its 16-bit copy (with
  // a store, cast from the store's group when it is not the group cast last; an error of the
  // cast is kept in cast_status_, which Timed returns).
  const void* MatMulParam(const float* params, int tensor);
  // The LM head's weight for its 16-bit products: lm_head's, or with a tied head the head's
  // own copy of wte (padded as lm_head's would be); in fp32 the fp32 parameters.
  const void* HeadMatMulParam(const float* params);
  absl::Status CastTo16(void* out, const float* values, int64_t n);
  // With a store: the backward of the group holding `tensor` begins (its gradient buffer
  // asked for, its tensors zeroed) and ends (GradientsDone). Nothing without a store.
  absl::Status BeginGradients(int tensor);
  void EndGradients(int tensor);
  // Elements from a group's first tensor to the end of its last.
  int64_t GroupSpan(int group) const;
  // The LM head's output rows as its forward and input-gradient products see them:
  // logits_stride_ with a 16-bit copy (its padding rows zero), vocab in fp32.
  int64_t HeadRows() const { return half() ? logits_stride_ : options_.vocab; }
  // Elements of the lm_head copy's padding rows: the last ones of params16_.
  int64_t HeadPadding() const {
    return cpu_->has_head() ? (logits_stride_ - options_.vocab) * options_.width : 0;
  }
  // The residual stream at `block`'s input (block == blocks_in_slice_: the last block's
  // output). With checkpointing only each segment's input is kept; the streams inside a
  // segment share segment_ - 1 buffers, as in GptModel.
  void* Stream(int64_t block) const;
  const BlockActivations& Slot(int64_t block) const { return slots_[block % segment_]; }
  // The batch's checks (cpu_model().CheckBatch), activations for it, its tokens uploaded
  // (their targets kept in targets_host_), this call's profile intervals begun.
  absl::Status PrepareCall(const Batch& batch);
  // FAILED_PRECONDITION naming `call` for a pipeline stage's slice.
  absl::Status CheckWhole(const char* call) const;
  // The 16-bit copy of the flat parameters (nothing in fp32).
  absl::Status CastParameters(const float* params);
  // Waits for the stream; the loss and accuracy of the last Loss over `rows`.
  absl::StatusOr<StepStats> ReadStats(int64_t rows);
  // run(T{}) with T the activations' type (float, __nv_bfloat16 or __half).
  template <typename F>
  absl::Status ByPrecision(F run);
  // Forward: the embeddings (into Stream(0)), the blocks, lnf and the LM head (the logits).
  template <typename T>
  absl::Status Forward(const float* params, int64_t batch);
  template <typename T>
  absl::Status EmbeddingsForward(const float* params, int64_t batch);
  template <typename T>
  absl::Status BlocksForward(const float* params, int64_t batch);
  template <typename T>
  absl::Status HeadForward(const float* params, int64_t batch);
  // The cross-entropy of the logits (loss_, predicted_) and its gradient × scale (dbig_).
  template <typename T>
  absl::Status Loss(int64_t rows, float scale);
  // Backward from dbig_ (the logits' gradient): the LM head and lnf (leaving the gradient of
  // the last block's output in dresidual_), the blocks, the embeddings; `ready` gets each
  // parameter group's first tensor once its gradient kernels are enqueued.
  template <typename T>
  absl::Status HeadBackward(const float* params, float* grads, int64_t batch,
                            const std::function<void(int)>& ready);
  template <typename T>
  absl::Status BlocksBackward(const float* params, float* grads, int64_t batch,
                              const std::function<void(int)>& ready);
  template <typename T>
  absl::Status EmbeddingsBackward(float* grads, int64_t batch,
                                  const std::function<void(int)>& ready);
  // A linear layer's weight (and bias) gradient, added to `grads`, from its input x
  // [rows, in] and output gradient dy [rows, out] (rows dy_stride apart; 0: out): now, or
  // while deferring_ kept (copies) in deferred_ for SliceBackwardWeights.
  absl::Status LinearWeights(float* grads, const void* x, const void* dy, int weight, bool has_bias,
                             int64_t rows, int64_t in, int64_t out, int64_t dy_stride = 0);
  // A copy of `bytes` at `from` in the deferred arena (laid out by ReserveDeferred).
  absl::StatusOr<const void*> KeepForWeights(const void* from, int64_t bytes);
  absl::Status ReserveDeferred(int64_t rows);
  // A pipeline boundary's fp32 values into activations (rounded in 16-bit) and back (exact).
  absl::Status FromFloat(void* out, const float* in, int64_t n);
  absl::Status ToFloat(float* out, const void* in, int64_t n);
  // INVALID_ARGUMENT naming `what` unless `pointer` is non-null exactly when `wanted`.
  absl::Status CheckBoundary(const char* call, const char* what, const void* pointer,
                             bool wanted) const;
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
  // attn.proj or mlp.proj (`weight`, its bias next): out [rows, width] = in · weightᵀ + bias;
  // with tensor parallelism the partial product summed over the group, then the bias.
  absl::Status RowParallelForward(const float* params, const void* in, int weight, void* out,
                                  int64_t rows, int64_t in_features);
  // With tensor parallelism: the partial input gradient of a column-parallel layer at `data`
  // (n activations) summed over the group in place. Nothing with tp_size 1.
  absl::Status SumInputGradient(void* data, int64_t n);
  // The group's sum of the n activations at `data`, in fp32: in place (fp32), or widened into
  // tp_partials_ (16-bit); NarrowSum then rounds such a sum back into `data` (nothing in fp32).
  absl::StatusOr<float*> SumPartials(void* data, int64_t n);
  absl::Status NarrowSum(void* data, const float* sum, int64_t n);
  // out = in (n 16-bit activations) widened to fp32, and back (rounded).
  absl::Status Widen(float* out, const void* in, int64_t n);
  absl::Status Narrow(void* out, const float* in, int64_t n);
  // FAILED_PRECONDITION if tensor parallelism has no sum.
  absl::Status CheckTensorParallelSum() const;
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
  const int64_t blocks_in_slice_;  // layers, or a pipeline stage's blocks
  const int64_t segment_;          // blocks per checkpointed segment; all without checkpointing
  const int64_t segments_;         // ceil(blocks_in_slice_ / segment_)
  const int64_t logits_stride_;  // elements from one row of the logits to the next
  // Per tensor-parallel rank (the whole model's with tp_size 1): attention width (heads_local_
  // heads), heads, MLP hidden units.
  const int64_t attn_width_, heads_local_, hidden_;
  DeviceSum tp_sum_;
  // 16-bit copy of the parameters (bf16 and fp16 only), copy_elements_ long: every flat
  // offset, or (without flat_parameters) the span of the group cast last, each group's at
  // copy_offset_[group] (see parameter_copy_bytes). The lm_head's padding rows follow its
  // copy and are zero.
  void* params16_ = nullptr;
  std::vector<int64_t> copy_offset_;  // where each group's first tensor is in params16_
  int64_t copy_elements_ = 0;
  // Where the LM head's 16-bit weight starts in params16_ (a tied head's copy of wte after
  // every group's copy), and where the groups' copies end (CastParameters casts up to there).
  int64_t head_copy_offset_ = 0;
  int64_t groups_copy_end_ = 0;
  bool head_cast_ = false;  // with a store: the tied head's copy was cast this pass
  int wte_ = -1, wpe_ = -1, lnf_ = -1, lm_head_ = -1;  // -1: not in this slice
  std::vector<int> blocks_;             // each block's first tensor (the slice's blocks, from 0)
  std::vector<ParameterGroup> groups_;  // cpu_'s parameter groups
  std::vector<int> group_of_tensor_;

  // The current call's store (null: the flat buffers), set at the start of each call.
  ParameterStore* store_ = nullptr;
  int cast_group_ = -1;          // with a store, the group params16_ holds (-1: none yet)
  absl::Status cast_status_;     // the error of a cast made by MatMulParam, until Timed
  float* group_grads_ = nullptr;  // with a store, the gradient base of the group begun last

  // One device allocation, laid out for `capacity_` samples.
  DeviceArena arena_;
  int64_t capacity_ = 0;
  std::vector<void*> streams_;  // the residual stream at each block's input, and lnf's
  std::vector<BlockActivations> slots_;
  void *lnf_out_ = nullptr, *logits_ = nullptr;
  float* tied_grad_ = nullptr;  // a tied head's part of wte's gradient [vocab, width]
  void *dresidual_ = nullptr, *dsmall_ = nullptr, *dbig_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *loss_ = nullptr;
  float *attention_scratch_ = nullptr, *layernorm_scratch_ = nullptr, *bias_scratch_ = nullptr;
  int32_t *inputs_ = nullptr, *targets_ = nullptr, *predicted_ = nullptr, *index_ = nullptr;
  int64_t index_groups_ = 0;
  // Tensor parallelism only: [rows] ones and a [width] bias (fp32) for the bias after a
  // row-parallel sum; in 16-bit the fp32 sums, [rows, width].
  float *ones_ = nullptr, *tp_bias_ = nullptr, *tp_partials_ = nullptr;
  std::vector<int32_t> targets_host_;  // the current call's targets

  // Pipeline slices: the micro-batch of the last SliceForward (samples; 0: none pending),
  // its parameters, and the weight gradients SliceBackward deferred.
  int64_t slice_batch_ = 0;
  const float* slice_params_ = nullptr;
  struct DeferredWeights {
    int weight;  // the tensor; its bias (if any) follows
    bool has_bias;
    const void* in;    // [rows, in_features] activations
    const void* dout;  // [rows, out_features] activations, rows dout_stride apart (0: dense)
    int64_t in_features, out_features, dout_stride;
  };
  bool deferring_ = false;
  std::vector<DeferredWeights> deferred_;
  static constexpr int64_t kDeferredAlign = 256;  // bytes; cuBLASLt wants 16
  DeviceArena deferred_arena_{stream_};
  char* deferred_base_ = nullptr;
  int64_t deferred_used_ = 0;  // bytes

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
