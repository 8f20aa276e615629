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

#include "absl/status/statusor.h"
#include "state/tensor.h"
#include "train/batch.h"

namespace ringmaster::train {

enum class Precision { kFloat32, kBFloat16, kFloat16 };

// "fp32", "bf16" or "fp16", as job specs write them.
inline const char* PrecisionName(Precision p) {
  return p == Precision::kBFloat16 ? "bf16" : p == Precision::kFloat16 ? "fp16" : "fp32";
}

struct ForwardBackwardOptions {
  float loss_scale = 1.0f;
  double loss_divisor = 1.0;  // > 0: the global batch's count of loss terms
  bool accumulate = false;    // add into `grads` instead of overwriting them
  Precision precision = Precision::kFloat32;
  // Called during backward, in decreasing order of `offset`, each time every gradient at
  // flat offset >= `offset` is final; called last with 0. May be empty.
  std::function<void(int64_t offset)> on_grads_ready;
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
  // Deterministic initialisation from `seed` (same on every rank).
  virtual void Init(uint64_t seed, state::FlatBuffer& params) const = 0;
  // Loss terms one sample contributes (1 for a classifier, context for a language model).
  virtual int64_t LossTermsPerSample() const = 0;

  // INVALID_ARGUMENT when the batch does not fit the model (names the field).
  virtual absl::StatusOr<StepStats> ForwardBackward(const Batch& batch,
                                                    const state::FlatBuffer& params,
                                                    state::FlatBuffer& grads,
                                                    const ForwardBackwardOptions& options) = 0;
  // Forward only, fp32 (or `precision`), no gradients.
  virtual absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                             Precision precision) = 0;

  virtual MemoryStats memory() const = 0;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MODEL_H_
