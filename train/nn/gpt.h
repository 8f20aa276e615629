// A GPT-2-style decoder-only language model on CPU (train/model.h's Model), after karpathy's
// llm.c train_gpt2.c:
//
//   x0 = wte[token] + wpe[position]
//   per block l:  x' = x + attn.proj(attention(attn.qkv(ln1(x))))
//                 x  = x' + mlp.proj(gelu(mlp.fc(ln2(x'))))
//   logits = lm_head(lnf(x)),  loss = softmax cross-entropy against the next token
//
// with causal multi-head self-attention, GELU in its tanh form, pre-LayerNorm blocks and an
// LM head without bias: its own tensor, or (GptOptions::tied_head, GPT-2 as OpenAI released
// it) the token embedding wte itself, logits = lnf(x) · wteᵀ. A batch holds `context + 1` tokens
// per sample (train/batch.h); every one of the `context` positions is a loss term
// (LossTermsPerSample() == context).
//
// Parameters, in forward order (so that backward finishes them from the highest offset down),
// weights [out, in] as PyTorch's nn.Linear:
//   wte [vocab, width], wpe [context, width],
//   per block l: h<l>.ln1.weight, h<l>.ln1.bias [width], h<l>.attn.qkv.weight [3 width, width],
//     h<l>.attn.qkv.bias [3 width], h<l>.attn.proj.weight [width, width], h<l>.attn.proj.bias,
//     h<l>.ln2.weight, h<l>.ln2.bias, h<l>.mlp.fc.weight [4 width, width], h<l>.mlp.fc.bias,
//     h<l>.mlp.proj.weight [width, 4 width], h<l>.mlp.proj.bias [width],
//   lnf.weight, lnf.bias [width], lm_head.weight [vocab, width] (not with a tied head).
// Initialisation as GPT-2: every weight and embedding normal(0, 0.02), the two residual
// projections of each block (attn.proj, mlp.proj) normal(0, 0.02 / sqrt(2 layers)), biases 0,
// LayerNorm gains 1.
//
// Activation memory (MemoryStats.activation_bytes_peak: the buffers below, all held at once;
// they grow to the largest batch seen, so steady-state steps allocate nothing). Per token:
//   - the residual stream at the input of each block and of lnf: width floats each;
//   - per block: ln1 and ln2 outputs and statistics, qkv, the attention output and its
//     statistics (log-sum-exp: heads floats; or probabilities: heads * context floats),
//     the residual after attention, mlp.fc's output and its GELU: 15 width + 4 + heads
//     floats with memory-efficient attention;
//   - lnf output and statistics, the logits, the per-token loss, prediction, input and target;
//   - backward's gradients: the residual stream's, one of width and one of
//     max(4 width, vocab) floats, reused by every block; attention's scratch.
//   - with a tied head, the head's part of wte's gradient: vocab × width floats (not per token).
//   - a LayerNorm's gain and bias gradients before they are handed to a store: 2 width floats
//     (not per token).
// With activation checkpointing every k blocks, forward keeps the residual stream only at
// the inputs of blocks 0, k, 2k, ... and per-block activations only for one segment of k
// blocks; backward recomputes each segment from its input (the last one is still in memory
// after forward and is not recomputed). Gradients are bit-identical to the run without it:
// the recomputation runs the same kernels on the same values. Not counted in the peak, as in
// SequentialClassifier: the rounded copy of the parameters (bf16/fp16) and the staging
// buffer for one block's parameter gradients (half precision with accumulate).
//
// Mixed precision (train/model.h) as SequentialClassifier: with bf16 or fp16 the master
// parameters are rounded once per call into a compute copy; the embedding output, every
// LayerNorm, linear, attention, GELU and residual output, the logits, every activation
// gradient (also after each addition into the residual stream's gradient) and every
// parameter gradient are rounded to the format as they are produced. Products accumulate
// in fp32; the softmax cross-entropy and the statistics that a GPU keeps in fp32 (LayerNorm
// mean and 1/std, attention log-sum-exp or probabilities) are not rounded.
//
// Not thread-safe (one call at a time); on_grads_ready runs on the calling thread.
#ifndef RINGMASTER_TRAIN_NN_GPT_H_
#define RINGMASTER_TRAIN_NN_GPT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/grow_buffer.h"
#include "train/nn/layers.h"

namespace ringmaster::train::nn {

struct GptOptions {
  int64_t layers = 4;
  int64_t heads = 4;  // must divide width
  int64_t width = 128;
  int64_t context = 128;  // tokens a sample predicts (it holds context + 1)
  int64_t vocab = 256;    // bytes
  // The LM head is wte (GPT-2): no lm_head.weight; wte's gradient is the embedding's plus
  // the head's. Its parameter group ("embeddings") is read again by the head, in forward and
  // at the start of backward (ParameterGroup::read_again_by_head). A pipeline stage's slice
  // (first_block/end_block below) that has the head but not the embeddings holds its own copy
  // of wte (first in its table, a group of its own, with the whole model's initial values)
  // and uses it as an untied model uses lm_head: the pipeline sums the two copies' gradients
  // (train/pipeline_parallel.h) so that they stay equal.
  bool tied_head = false;
  // Activation checkpointing: keep only every k-th block's input and recompute the other
  // activations in backward, one segment of k blocks at a time. 0 = off (keep everything).
  int64_t checkpoint_every = 0;
  // Attention keeps only a log-sum-exp per query row and recomputes its probabilities in
  // backward; false keeps the [heads, context, context] probabilities of every sample.
  bool memory_efficient_attention = true;
  // A pipeline stage's slice of the model (train/pipeline/gpt_stage.h): blocks
  // [first_block, end_block) of the `layers` (end_block -1: to the last), with the
  // embeddings when first_block is 0 and lnf, the LM head and the loss when end_block is
  // `layers`. Its table holds only those tensors, under the whole model's names (h<l> with l
  // counted in the whole model), and InitTensors gives them the whole model's values. A
  // slice that is not the whole model trains through the Slice* calls only.
  int64_t first_block = 0;
  int64_t end_block = -1;
  // Tensor parallelism (Megatron): rank tp_rank of tp_size computes heads / tp_size of each
  // block's attention heads (its rows of the fused Q/K/V projection: the same heads' q, k and
  // v rows; its columns of the output projection) and 4 width / tp_size of the MLP's hidden
  // units (its rows of mlp.fc, its columns of mlp.proj). LayerNorms, the two projections'
  // biases, the embeddings and the LM head are replicated (every rank computes them whole,
  // on the same values). Each block sums the partial outputs of its two row-parallel
  // projections over the group in forward, and the partial input gradients of its two
  // column-parallel ones in backward: 2 + 2 sums a block (set_tensor_parallel_sum). The
  // table holds the rank's shards under the whole model's names (shard() says which part of
  // the whole tensor each is); InitTensors gives them the whole model's values.
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
};

// Which part of a whole-model tensor, viewed as a matrix [rows, cols] (a vector as [n, 1]),
// a tensor-parallel rank's tensor holds: the rows of `row_ranges` in order, each cut to the
// columns [col_begin, col_end). A replicated tensor holds all of it.
struct TensorShard {
  std::vector<std::pair<int64_t, int64_t>> row_ranges;
  int64_t col_begin = 0, col_end = 0;
  int64_t whole_rows = 0, whole_cols = 0;
  bool whole() const {
    return row_ranges.size() == 1 && row_ranges[0].first == 0 &&
           row_ranges[0].second == whole_rows && col_begin == 0 && col_end == whole_cols;
  }
};

class GptModel final : public Model {
 public:
  // INVALID_ARGUMENT naming the field: gpt.layers, gpt.heads, gpt.width, gpt.context and
  // gpt.vocab must be positive (vocab at most 2^31 - 1, token ids being int32), gpt.heads
  // must divide gpt.width, gpt.checkpoint_every must be >= 0.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptOptions& options);

  // "gpt 4 layers x 4 heads x 128 wide, context 128, vocab 256", then
  // ", checkpointing every k blocks" and ", attention keeping probabilities" when set.
  std::string Describe() const override;
  const state::TensorTable& table() const override { return table_; }
  // The tensors in table order from one SplitMix64 stream seeded with `seed`: normal values
  // by Box–Muller (in double, rounded to float; both values of each pair used), constants as
  // above.
  void InitTensors(uint64_t seed, const TensorSink& sink) const override;
  int64_t LossTermsPerSample() const override { return options_.context; }

  // INVALID_ARGUMENT naming the field for a batch that does not fit (batch.size <= 0,
  // batch.context != gpt.context, batch.tokens not batch.size * (context + 1) ids,
  // batch.tokens[i] outside [0, vocab)) or options.loss_scale / options.loss_divisor not
  // finite and positive. Any batch.size works; buffers grow only for a larger one. `params`
  // and `grads` must have at least table().total_elements() floats (CHECK); gradient padding
  // between tensors is left untouched (with options.store, the store's buffers instead).
  // Announces on_grads_ready(offset) as soon as a parameter group's gradients are final (the
  // offset of its first tensor: lm_head (untied), lnf, then h<l>'s mlp.proj, mlp.fc, ln2,
  // attn.proj, attn.qkv, ln1 for l = layers-1 down to 0, then 0 for wte and wpe). StepStats:
  // loss_sum over the batch.size * context tokens, loss_terms = that count, correct = the tokens
  // whose highest logit is the target (next- token accuracy; ties go to the lower id).
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const state::FlatBuffer& params,
                                            state::FlatBuffer& grads,
                                            const ForwardBackwardOptions& options) override;
  // The same forward, and so the same StepStats bit for bit as ForwardBackward.
  using Model::Evaluate;
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                     Precision precision, ParameterStore* store) override;
  // embeddings (wte, wpe; block "embeddings"), per block h<l>: ln1, attn.qkv, attn.proj,
  // ln2, mlp.fc, mlp.proj (block "h<l>"), then lnf and lm_head (block "head"; lnf only with a
  // tied head).
  std::vector<ParameterGroup> parameter_groups() const override { return groups_; }
  MemoryStats memory() const override;
  // How a pass runs, for ActivationBytesFor: ForwardBackward (the whole model), or
  // SliceForward and SliceBackward (a pipeline or tensor-parallel stage, pipeline::GptStage),
  // without or with deferred weights (the zero_bubble schedule's split backward).
  enum class ActivationRun { kForwardBackward, kSlice, kSliceDeferringWeights };
  // MemoryStats.activation_bytes_peak after one such pass of `batch` samples on a model that
  // ran nothing larger, computed from the buffers' sizes without allocating them
  // (train/memory_plan.h and mesh_memory.h plan models too large to run with it). Equal to
  // the measured figure: memory_plan_test and mesh_memory_test hold it to that.
  int64_t ActivationBytesFor(int64_t batch,
                             ActivationRun run = ActivationRun::kForwardBackward) const;

  // Pipeline stages: one micro-batch through this slice, in three calls. The slice keeps one
  // micro-batch's activations (a stage with several in flight holds one GptModel each).
  //
  // SliceForward: the batch's tokens are read by the first stage (its inputs) and the last
  // (its targets; the others need only batch.size); `input` is the previous stage's output
  // ([batch.size * context, width] floats, empty on the first stage), `output` receives this
  // slice's (same shape; empty on the last). INVALID_ARGUMENT as ForwardBackward, or for a
  // span of the wrong size. In bf16/fp16 the model rounds `params` into a copy of its own for
  // the pass, unless `params_rounded` says they are rounded already (RoundParameters: a stage
  // with several micro-batches in flight rounds once, for all its models).
  absl::Status SliceForward(const Batch& batch, absl::Span<const float> params, Precision precision,
                            absl::Span<const float> input, absl::Span<float> output,
                            bool params_rounded = false);
  // `params` rounded to `precision`'s format into `rounded` (as large), as SliceForward rounds
  // them: pass the result with params_rounded. A copy without rounding in fp32.
  static void RoundParameters(Precision precision, absl::Span<const float> params,
                              absl::Span<float> rounded);
  // SliceBackward, after SliceForward (whose `params` must stay as they were, alive, until
  // the micro-batch's backward is done): from the gradient of the slice's output (empty on the
  // last stage, which starts from its loss scaled by options.loss_scale / loss_divisor) to the
  // gradient of its input (empty on the first stage), ADDING the parameters' gradients to
  // `grads` (zero them before a step's first micro-batch; options.accumulate is ignored,
  // options.store must be null, on_grads_ready is not called). With defer_weights the linear
  // layers' weight and bias gradients are left for SliceBackwardWeights (their inputs' and
  // outputs' gradients kept until then; LayerNorms and embeddings are done here): the
  // zero-bubble schedule's split. With discard (the last stage: a stand-in micro-batch that
  // does not count) the loss's gradient is zero, so every gradient it adds is zero, and the
  // StepStats are zeros. StepStats: the loss on the last stage, zeros elsewhere.
  absl::StatusOr<StepStats> SliceBackward(absl::Span<float> grads,
                                          const ForwardBackwardOptions& options,
                                          absl::Span<const float> output_grad,
                                          absl::Span<float> input_grad, bool defer_weights,
                                          bool discard = false);
  // The deferred weight gradients of the last SliceBackward (FAILED_PRECONDITION if none are
  // pending); the sums are the ones SliceBackward without defer_weights adds, bit for bit.
  absl::Status SliceBackwardWeights(absl::Span<float> grads, const ForwardBackwardOptions& options);
  // After SliceForward on the last stage: its micro-batch's loss (as Evaluate's), for a
  // forward-only pass; FAILED_PRECONDITION elsewhere or without a SliceForward.
  absl::StatusOr<StepStats> SliceLoss();
  // Whether this slice holds the embeddings (first stage) / the head and loss (last stage).
  bool has_embeddings() const { return first_block_ == 0; }
  bool has_head() const { return end_block_ == options_.layers; }
  bool is_whole() const { return has_embeddings() && has_head(); }
  // A tied head reading this slice's own wte (the whole model): its weight gradient is added
  // to the embedding's (a pipeline's last stage uses its copy of wte as an untied head).
  bool head_is_wte() const { return options_.tied_head && is_whole(); }

  const GptOptions& options() const { return options_; }

  // Tensor parallelism (GptOptions::tp_size > 1): the group's in-place sum, called 2 times
  // per block in a forward and 2 in a backward (the same calls in the same order on every
  // rank of the group). Its first error ends the call that met it (ForwardBackward,
  // Evaluate, the Slice* calls return it; the results are garbage). Required before the
  // first call when tp_size > 1 (FAILED_PRECONDITION otherwise).
  using TensorParallelSum = std::function<absl::Status(absl::Span<float>)>;
  void set_tensor_parallel_sum(TensorParallelSum sum) { tp_sum_ = std::move(sum); }
  // The part of its whole-model tensor that table().tensor(i) holds.
  const TensorShard& shard(int tensor) const { return shards_[tensor]; }
  // The batch checks of ForwardBackward (INVALID_ARGUMENT naming the field, as above), for
  // twins of this model that take the same batches (train/nn/gpt_cuda.h).
  absl::Status CheckBatch(const Batch& batch) const;

 private:
  // One block's activations that backward reads, for the rows of the current call.
  struct BlockActivations {
    float* ln1;  // [rows, width], and its mean and 1/std [rows]
    float* ln1_mean;
    float* ln1_rstd;
    float* qkv;              // [rows, 3 width]
    float* attention;        // [rows, width]
    float* attention_stats;  // log-sum-exp or probabilities
    float* residual;         // x + attention branch: the input of ln2 [rows, width]
    float* ln2;
    float* ln2_mean;
    float* ln2_rstd;
    float* fc;    // [rows, 4 width], before GELU
    float* gelu;  // [rows, 4 width]
  };
  // What one call works with.
  struct Pass {
    const float* params;  // the master parameters or their rounded copy (null with a store)
    ParameterStore* store;
    Precision precision;
    int64_t batch;  // samples
    int64_t rows;   // batch * context
  };
  class GradWriter;

  // A linear layer's weight gradient left for SliceBackwardWeights.
  struct DeferredWeights {
    int weight = 0;  // the tensor; its bias (if any) follows
    bool has_bias = false;
    const float* in = nullptr;    // [rows, in_features]
    const float* dout = nullptr;  // [rows, out_features]
    int64_t in_features = 0;
    int64_t out_features = 0;
  };

  explicit GptModel(const GptOptions& options);
  // Adds a whole-model tensor of `shape` with its initial distribution: normal(0, std) for
  // std > 0, else the constant `value`; this rank's table gets `shard` of it (whole: all).
  int AddTensor(const std::string& name, std::vector<int64_t> shape, float std, float value,
                std::optional<TensorShard> shard = std::nullopt);
  const float* Tensor(const Pass& pass, int index) const {
    const float* base =
        pass.store != nullptr ? pass.store->Parameters(group_of_tensor_[index]) : pass.params;
    return base + table_.tensor(index).offset;
  }

  // Validates the batch, lays out the activations for it and splits its tokens into inputs
  // and targets.
  // `rounded`: the parameters are in the compute format already (no private copy).
  absl::StatusOr<Pass> Prepare(const Batch& batch, absl::Span<const float> params,
                               Precision precision, ParameterStore* store, bool rounded = false);
  void PlaceActivations(int64_t batch);
  // The floats of PlaceActivations' arena for `batch` samples (it checks the two agree).
  int64_t ArenaFloats(int64_t batch) const;
  // The floats SliceBackward keeps for deferred weights over `rows` tokens.
  int64_t DeferredFloats(int64_t rows) const;
  // The residual-stream buffer at the input of block `block` (block == layers: of lnf).
  float* Stream(int64_t block) const;
  BlockActivations& Slot(int64_t block) { return slots_[block % segment_]; }

  // Everything up to the logits, in parts: the embeddings into Stream(0), the blocks, lnf
  // and the LM head.
  void Forward(const Pass& pass);
  void EmbeddingsForward(const Pass& pass);
  void BlocksForward(const Pass& pass);
  void HeadForward(const Pass& pass);
  // A block up to its GELU output, and its residual output (the next block's input).
  void BlockForward(const Pass& pass, int64_t block);
  void BlockOutputForward(const Pass& pass, int64_t block);
  // From the logits' gradient (in dbig_) down to the embeddings, in parts: the LM head and
  // lnf (leaving the gradient of the last block's output in dresidual_), the blocks, the
  // embeddings.
  void Backward(const Pass& pass, GradWriter& writer);
  void HeadBackward(const Pass& pass, GradWriter& writer);
  void BlocksBackward(const Pass& pass, GradWriter& writer);
  void EmbeddingsBackward(const Pass& pass, GradWriter& writer);
  // A linear layer's weight (and bias) gradient from its input and output gradient: now, as
  // a group of its own in `writer` (which the caller finishes after reading the weight for
  // the input gradient), or, while deferring, kept for SliceBackwardWeights.
  void LinearWeights(GradWriter& writer, int weight, bool has_bias, const float* in,
                     const float* dout, int64_t rows, int64_t in_features, int64_t out_features);
  // Finishes the group LinearWeights began (nothing while deferring).
  void FinishLinear(GradWriter& writer);
  // A LayerNorm's backward (gain tensor `gain`, its bias after it): adds its input gradient
  // to dx and writes the gain's and bias's gradients, which with a store are summed in a
  // scratch and written once the kernel is done reading the gain.
  void LayerNormGradients(const Pass& pass, GradWriter& writer, int gain, float* dx,
                          const float* dy, const float* x, const float* mean, const float* rstd,
                          int64_t rows);
  // A row-parallel projection (attn.proj, mlp.proj): out = in · weightᵀ + bias, the partial
  // products summed over the tensor-parallel group before the (replicated) bias is added.
  void RowParallelForward(const float* in, const float* weight, const float* bias, float* out,
                          int64_t rows, int64_t in_features, int64_t out_features);
  // Given the gradient of the block's output in dresidual_, leaves its input's there.
  void BlockBackward(const Pass& pass, int64_t block, GradWriter& writer);

  GptOptions options_;
  int64_t first_block_;  // the slice: blocks [first_block_, end_block_) of the whole model
  int64_t end_block_;
  std::string description_;
  int64_t segment_;   // blocks per checkpointed segment; layers when checkpointing is off
  int64_t segments_;  // ceil(layers / segment_)
  state::TensorTable table_;
  struct InitRule {
    float std;
    float value;
  };
  // The whole model's tensors in InitTensors' order (a slice's own among them, at their
  // index in table_, the others -1), so that a slice draws the whole model's stream.
  struct InitEntry {
    int64_t numel;  // the whole tensor's
    InitRule rule;
    int tensor;
  };
  std::vector<InitEntry> init_;
  bool keep_ = true;  // during construction: whether AddTensor's tensor is this slice's
  std::vector<TensorShard> shards_;  // per tensor of table_
  // Per tensor-parallel rank: attention width (heads_local × head size), heads, MLP hidden.
  int64_t attn_width_ = 0, heads_local_ = 0, hidden_ = 0;
  TensorParallelSum tp_sum_;
  absl::Status tp_error_;  // the first failed sum of the current call
  // Sums `n` floats at `data` over the tensor-parallel group (nothing with tp_size 1).
  void TensorParallelReduce(float* data, int64_t n);
  absl::Status TakeTensorParallelError();
  int wte_ = 0;
  int wpe_ = 0;
  std::vector<int> blocks_;  // each block's first tensor
  int lnf_ = 0;              // weight; bias at lnf_ + 1
  int lm_head_ = 0;
  int64_t largest_group_ = 0;  // elements spanned by the biggest group of gradients
  std::vector<ParameterGroup> groups_;
  std::vector<int> group_of_tensor_;

  // Activations of the current call: pointers into arena_.
  GrowBuffer<float> arena_;
  std::vector<float*> streams_;
  std::vector<BlockActivations> slots_;  // segment_ of them
  float* lnf_out_ = nullptr;
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  float* logits_ = nullptr;
  GrowBuffer<int32_t> tokens_;  // inputs, then targets: [rows] each
  GrowBuffer<float> attention_scratch_;
  SoftmaxCrossEntropy loss_;

  // Backward's activation gradients.
  GrowBuffer<float> dresidual_;  // [rows, width]
  GrowBuffer<float> dsmall_;     // [rows, width]
  GrowBuffer<float> dbig_;       // [rows, max(4 width, vocab)]: dlogits, dfc, dqkv

  state::FlatBuffer compute_params_;  // rounded parameters, for half precision

  // Pipeline slices: the pass of the last SliceForward, and the deferred weight gradients.
  std::optional<Pass> slice_pass_;
  bool deferring_ = false;
  std::vector<DeferredWeights> deferred_;
  GrowBuffer<float> deferred_buffers_;  // the deferred layers' output gradients (and inputs)
  int64_t deferred_used_ = 0;
  // Keeps `n` floats from `from` for SliceBackwardWeights.
  const float* KeepForWeights(const float* from, int64_t n);
  GrowBuffer<float> staged_grads_;  // one group's half-precision gradients, for accumulate
  GrowBuffer<float> layer_norm_sums_;  // a LayerNorm's gain and bias gradients [2, width]
  GrowBuffer<float> tied_grad_;     // tied head: the head's part of wte's gradient [vocab, width]
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_GPT_H_
