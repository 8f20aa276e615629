// Model: explicit forward and backward over flat buffers (ARCHITECTURE.md, llm.c style).
//
// A model owns its TensorTable (parameters added in forward order) and its activation
// memory; parameters, gradients and optimizer state live in FlatBuffers laid out by that
// table and owned by the trainer. One model object serves one rank; it is not thread-safe
// (one call at a time), but it calls `on_grads_ready` from the calling thread so the
// trainer can hand finished gradient buckets to its communication thread.
//
// Loss convention, chosen so that ranks with unequal shares of a global batch still sum to
// the exact global mean: ForwardBackward computes
//     L = loss_scale * (sum over the samples (and tokens) of the batch of their loss) /
//     loss_divisor
// and writes dL/dparams into `grads` (or adds it, with accumulate). The trainer passes the
// global batch's sample (or token) count as loss_divisor and all-reduces with SUM.
//
// Buffers: `params` and `grads` hold at least table().total_elements() floats (trainers pad
// them to a multiple of world size for sharding; the padding is never read or written).
//
// Mixed precision is emulated on CPU: with compute precision bf16 or fp16 the model rounds
// the fp32 master parameters, every activation and every gradient it produces to that
// format (so an fp16 overflow shows up as inf/nan in `grads`, as on a GPU). Master weights,
// the loss and optimizer state stay fp32.
#ifndef RINGMASTER_TRAIN_MODEL_H_
#define RINGMASTER_TRAIN_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/batch.h"

namespace ringmaster::train {

enum class Precision { kFloat32, kBFloat16, kFloat16 };

// Whether `p` is a 16-bit compute precision (bf16 or fp16).
inline bool IsHalf(Precision p) { return p != Precision::kFloat32; }

// "fp32", "bf16" or "fp16", as job specs write them.
inline const char* PrecisionName(Precision p) {
  return p == Precision::kBFloat16 ? "bf16" : p == Precision::kFloat16 ? "fp16" : "fp32";
}

// A model's parameters in groups of consecutive tensors, in forward order: each layer with
// parameters (a Linear, a LayerNorm, a convolution, the embeddings) is a group, and `block`
// says which transformer block or stage it belongs to (groups of one block are adjacent).
// Fully sharded data parallelism wraps groups into units (train/fsdp_layout.h).
struct ParameterGroup {
  std::string name;      // "h3.attn.qkv", "embeddings", "linear 784->512"
  int first_tensor = 0;  // the table's tensors [first_tensor, end_tensor)
  int end_tensor = 0;
  int block = 0;         // 0, 1, ... in forward order
  std::string block_name;  // "h3", "embeddings", "head", "layer 1"
  // Whether backward reads the group's parameters (an embedding's and a network's first
  // layer's do not: they make no input gradient).
  bool backward_reads_parameters = true;
  // Whether the model reads the group's parameters again after later groups' in forward and
  // before them in backward (a token embedding that is also the LM head): sharded data
  // parallelism keeps its unit gathered from its first use until its gradients are final.
  bool read_again_by_head = false;
  // Whether the model's backward reads none of the group's parameters once it has asked for
  // the group's gradient buffer (ParameterStore::Gradients) and writes every element of its
  // tensors' gradients there: a store may then hand it the group's gathered parameters as
  // that buffer (ZeRO-3 writes a unit's gradients over its gathered parameters, holding one
  // buffer for both). Set by models whose CPU backward promises it (GptModel, but for a tied
  // embedding); the GPU models' backward does not (ZeRO-3 in device memory never does it).
  bool gradients_over_parameters = false;
};

// Where a model finds its parameters and puts its gradients when they are not whole flat
// buffers (ZeRO-2/3: train/fsdp.h). A model given one (ForwardBackwardOptions::store) asks
// for a group's parameters right before each use and does not keep the pointer past the
// next call for another group; it calls BeginBackward once its forward is done, asks for a
// group's gradient buffer before writing it and says when it is final. Under half
// precision the store's parameters are already rounded to the compute format.
//
// The pointers are "bases": tensor i of the group is at base + table.tensor(i).offset (the
// store holds the group's unit as one contiguous piece of the flat index space).
//
// Called on the model's thread, one call at a time.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  // The group's parameters, gathered first if need be (blocks until they are here).
  virtual const float* Parameters(int group) = 0;
  // Forward is done; what follows is backward (recomputation included).
  virtual void BeginBackward() = 0;
  // Where the group's gradients go: the model overwrites them (never adds: the store sums
  // micro-batches itself). Tensors' padding is zero and is left alone. For a group with
  // gradients_over_parameters it may be the memory of the group's parameters (the model
  // reads them no more).
  virtual float* Gradients(int group) = 0;
  // The group's gradients are final and its parameters no longer needed for this backward.
  virtual void GradientsDone(int group) = 0;
};

struct ForwardBackwardOptions {
  float loss_scale = 1.0f;
  double loss_divisor = 1.0;  // > 0: the global batch's count of loss terms
  bool accumulate = false;    // add into `grads` instead of overwriting them
  Precision precision = Precision::kFloat32;
  // Called during backward, in decreasing order of `offset`, each time every gradient at
  // flat offset >= `offset` is final; called last with 0. May be empty.
  std::function<void(int64_t offset)> on_grads_ready;
  // Not owned; null: the parameters and gradients are `params` and `grads` (whole flat
  // buffers, which may then be empty). With a store, `accumulate` must be false.
  ParameterStore* store = nullptr;
  // For a model whose forward and backward need sums over the data-parallel replicas
  // (synchronized BatchNorm: every replica's batch statistics): sums the values
  // element-wise over the replicas in place, every replica calling it alike (a collective).
  // Empty: this rank's batch alone.
  std::function<absl::Status(absl::Span<double> values)> sum_across_replicas;
};

struct StepStats {
  double loss_sum = 0;     // unscaled sum of per-term losses over the batch
  int64_t loss_terms = 0;  // samples (classifier) or tokens (language model) in it
  int64_t correct = 0;     // terms whose argmax is the label (LM: the next token)
};

struct MemoryStats {
  int64_t activation_bytes_peak = 0;  // largest activation memory held during a step
};

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string Describe() const = 0;  // e.g. "mlp 784-512-512-10"
  virtual const state::TensorTable& table() const = 0;
  // Deterministic initialisation from `seed` (the same on every rank): hands each tensor's
  // initial values to `sink`, in table order.
  using TensorSink = std::function<void(int tensor, absl::Span<const float> values)>;
  virtual void InitTensors(uint64_t seed, const TensorSink& sink) const = 0;
  // Zeroes `params` (at least table().total_elements() floats) and fills every tensor.
  void Init(uint64_t seed, state::FlatBuffer& params) const;
  // Fills only the pieces of the flat space in `local` (a rank's shard under ZeRO-2/3), with
  // the values Init gives them; the rest of `local` is left alone.
  void InitPieces(uint64_t seed, absl::Span<const state::PlacedRange> pieces,
                  absl::Span<float> local) const;
  // Loss terms one sample contributes (1 for a classifier, context for a language model).
  virtual int64_t LossTermsPerSample() const = 0;

  // INVALID_ARGUMENT when the batch does not fit the model (names the field).
  virtual absl::StatusOr<StepStats> ForwardBackward(const Batch& batch,
                                                    const state::FlatBuffer& params,
                                                    state::FlatBuffer& grads,
                                                    const ForwardBackwardOptions& options) = 0;
  // Forward only, fp32 (or `precision`), no gradients. With a store (not owned) the
  // parameters come from it, `params` unused.
  virtual absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                             Precision precision, ParameterStore* store) = 0;
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                     Precision precision) {
    return Evaluate(batch, params, precision, nullptr);
  }
  // The parameter groups in forward order; together they hold every tensor once.
  virtual std::vector<ParameterGroup> parameter_groups() const = 0;

  virtual MemoryStats memory() const = 0;

  // Buffers: tensors of the table that are model state but not trained (BatchNorm's
  // running statistics), all in this range of the flat space, after every trained tensor.
  // Their gradients are always zero and they are one-dimensional, so no optimizer changes
  // them (no weight decay by the default mask). ForwardBackward never writes `params`: it
  // keeps the buffers' new values until UpdateBuffers. Empty for a model without buffers.
  virtual state::FlatRange buffer_range() const { return {}; }
  // Writes the buffers' values after the training forwards since the last call into their
  // range of `params` (the whole flat space); leaves them when no forward ran since.
  virtual void UpdateBuffers(absl::Span<float> params) {}
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MODEL_H_
