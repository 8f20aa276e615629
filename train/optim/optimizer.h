// Optimizers over flat buffers: SGD with momentum, AdamW and LAMB, for one range of the flat
// index space (a ZeRO shard, or everything), or for pieces of it placed in a local buffer.
//
// An optimizer is created for a TensorTable and a FlatRange and keeps its state (momentum,
// Adam moments) only for that range: state memory is range.size() floats per buffer, not
// the model's size. Each Step updates params[range] from grads[range]. Per-tensor
// quantities are summed across ranks through the caller's SumAcrossRanks, so the update is
// the same, up to float rounding, however the flat space is cut into ranges (SGD and AdamW
// are element-wise and give identical bits).
//
// Under ZeRO-2/3 a rank holds no single range but one piece of every wrapping unit, back to
// back in a local shard buffer (state::PlacedRange: flat indices `range` at local offsets
// [at, at + range.size())). An optimizer created for such a placement takes params and
// grads as local buffers of local_elements() floats and keeps each state buffer just as
// large, laid out like them; the gaps between pieces (unit padding) are neither read nor
// written, and the state there stays zero. A single range is the placement {{range, 0}} with
// local_elements = range.size(). The update is the same as for ranges: LAMB adds up a
// tensor's parts from all of a rank's pieces before summing across ranks.
//
// Typical step (see also clip.h and loss_scaler.h):
//   auto opt = CreateOptimizer(model.table(), my_range, AdamWOptions{...});
//   ...gradients reduced, unscaled, clipped...
//   RM_RETURN_IF_ERROR((*opt)->Step(schedule.LrAt(step), Slice(params.span(), my_range),
//                                   Slice(grads.span(), my_range), sum_across_ranks));
//   ...all-gather the parameters of every range (ZeRO)...
//
// Weight decay applies to the tensors of the decay mask: by default those with two or more
// dimensions (weight matrices, embeddings, convolution kernels), not biases or LayerNorm
// gains (DecayMatrices). Step does not look for inf/NaN gradients: check them first
// (LossScaler, ClipGradNorm).
//
// Memory: the state, params and grads are in the memory of the optimizer's VectorOps (host by
// default; a CUDA GPU with train/optim/cuda_vector_ops.h): the same code runs over either.
//
// Thread-compatible: one Step at a time. An optimizer copies what it needs from the table.
#ifndef RINGMASTER_TRAIN_OPTIM_OPTIMIZER_H_
#define RINGMASTER_TRAIN_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/optim/sum_across_ranks.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

// The default weight-decay rule: mask[i] is true for the table's tensors with >= 2
// dimensions. Callers that want another rule build their own mask (one entry per tensor).
std::vector<bool> DecayMatrices(const state::TensorTable& table);

// PyTorch torch.optim.SGD with dampening 0 (see kernels/optimizer.h for the formula).
// Momentum 0 keeps no state buffer.
struct SgdOptions {
  double momentum = 0;           // in [0, 1)
  bool nesterov = false;         // needs momentum > 0
  double weight_decay = 0;       // >= 0, added to the gradient (L2), on the decay mask's tensors
  std::vector<bool> decay_mask;  // one entry per tensor; empty: DecayMatrices(table)
};

// PyTorch torch.optim.AdamW: decoupled weight decay, bias-corrected moments.
struct AdamWOptions {
  double beta1 = 0.9;            // in [0, 1)
  double beta2 = 0.999;          // in [0, 1)
  double eps = 1e-8;             // > 0
  double weight_decay = 0.01;    // >= 0
  std::vector<bool> decay_mask;  // one entry per tensor; empty: DecayMatrices(table)
};

// LAMB (You et al. 2019, algorithm 2): Adam moments with bias correction, per element
// r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w, and per tensor
//   w -= lr * phi(||w||) / ||r|| * r,   the ratio taken as 1 when ||w|| or ||r|| is 0,
// with phi(z) = min(max(z, min_weight_norm), max_weight_norm). Every tensor is adapted;
// weight decay follows the mask.
struct LambOptions {
  double beta1 = 0.9;            // in [0, 1)
  double beta2 = 0.999;          // in [0, 1)
  double eps = 1e-6;             // > 0
  double weight_decay = 0.01;    // >= 0
  std::vector<bool> decay_mask;  // one entry per tensor; empty: DecayMatrices(table)
  double min_weight_norm = 0;    // >= 0
  double max_weight_norm = std::numeric_limits<double>::infinity();  // >= min_weight_norm
};

using OptimizerOptions = std::variant<SgdOptions, AdamWOptions, LambOptions>;

// One state buffer of an optimizer (or one piece of it), for checkpoints: element k of
// `data` is the state of flat index range.begin + k. Resharding N -> M ranks is interval
// intersection of ranges.
struct StateBuffer {
  std::string name;        // "momentum" (SGD), "exp_avg", "exp_avg_sq" (AdamW, LAMB)
  state::FlatRange range;  // the optimizer's range, or one piece's range
  absl::Span<float> data;  // range.size() floats owned by the optimizer, in ops() memory
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // E.g. "AdamW(beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.01 on 4 of 6 tensors)".
  virtual std::string Describe() const = 0;

  // Applies update number step() + 1 with learning rate `lr` to `params`, the range's
  // parameters (element 0 is flat index range().begin), from `grads`, the range's
  // gradients; both hold exactly range().size() elements (CHECK). Padding between tensors
  // is neither read nor written. For a placement: `params` and `grads` are the local
  // buffers, local_elements() long (CHECK), flat index piece.range.begin + k at local
  // offset piece.at + k; the gaps between pieces are neither read nor written.
  //
  // Every rank of the group calls Step at the same point with the same `lr`; `sum` is
  // called the same number of times on every rank with spans of the same length (LAMB:
  // once, 2 values per tensor of the table; SGD, AdamW: never). Blocks while `sum` does.
  //
  // INVALID_ARGUMENT when lr is negative or not finite; otherwise the error of `sum`. On
  // any such error nothing has changed: parameters, state and step count are as before.
  // (A device failure, INTERNAL from the ops, may leave a tensor half updated.)
  absl::Status Step(double lr, absl::Span<float> params, absl::Span<const float> grads,
                    const SumAcrossRanks& sum);

  // The optimizer's range. For a placement: the flat indices from the first piece's begin
  // to the last piece's end (the one piece's range when there is one; {0, 0} for none).
  // With several pieces it holds indices of no piece (other ranks' parts of the units) and
  // is not the layout of the local buffers: slicing params by range() is right only for a
  // range (Step CHECKs the size); address the buffers through placement().
  state::FlatRange range() const { return range_; }
  // Where the flat indices are in params, grads and each state buffer: {range(), at 0} for
  // an optimizer created for a range.
  const std::vector<state::PlacedRange>& placement() const { return placement_; }
  // Elements of params, grads and each state buffer: range().size() for a range.
  int64_t local_elements() const { return local_elements_; }
  // The memory its state, params and grads are in.
  VectorOps* ops() const { return ops_; }
  // Updates applied so far (Adam's bias correction uses step() + 1 for the next one).
  int64_t step() const { return step_; }

  // The state buffers, to save, or to fill when restoring from a checkpoint (then call
  // RestoreStep). Views stay valid while the optimizer lives. For a range: one per buffer,
  // with range(). For a placement: one per buffer per non-empty piece, buffer-major (all
  // pieces of "exp_avg", then of "exp_avg_sq"), each with the piece's range and its part
  // of the buffer; when no piece is non-empty, the first piece stands for all (as an empty
  // range does), and no pieces give no buffers.
  std::vector<StateBuffer> state_buffers();
  // Bytes of state held: buffers × local_elements() × 4.
  int64_t state_bytes() const;
  // Sets the step count of restored state. INVALID_ARGUMENT when negative.
  absl::Status RestoreStep(int64_t step);

  // Ranges of the local buffers (offsets, increasing and disjoint) whose tensors another rank
  // also holds and counts in the per-tensor sums: tensor parallelism's replicated tensors on
  // the group's ranks other than 0 (ParallelStrategy::duplicate_ranges). LAMB leaves them
  // out of its norms, so that the ranks' sums count each tensor once; they are updated as
  // every other part. SGD and AdamW have no per-tensor sums.
  void set_duplicate_ranges(std::vector<state::FlatRange> ranges) {
    duplicates_ = std::move(ranges);
  }

 protected:
  // A tensor piece of the placement with the weight decay that applies to it.
  struct Piece {
    int tensor = 0;
    int64_t offset = 0;  // of the piece's first element in the local spans
    int64_t size = 0;
    float weight_decay = 0;
  };

  // For `pieces` (checked: state::CheckPlacement) in a local buffer of `local_elements`.
  // `weight_decay` goes to the pieces of tensors whose mask entry is true; `state_names`
  // are the buffers AllocateState makes, local_elements floats each, zero.
  Optimizer(const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
            int64_t local_elements, double weight_decay, const std::vector<bool>& decay_mask,
            std::vector<std::string> state_names);
  friend absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
      const state::TensorTable&, absl::Span<const state::PlacedRange>, int64_t,
      const OptimizerOptions&, VectorOps*);

  int num_tensors() const { return num_tensors_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // "weight_decay=0.01 on 4 of 6 tensors", for Describe.
  std::string DecayString() const;
  // The part of a local span (params, grads) under a piece.
  template <typename T>
  static absl::Span<T> Part(absl::Span<T> local_span, const Piece& piece) {
    return local_span.subspan(piece.offset, piece.size);
  }
  // The part of state buffer `index` (in state_names order) under a piece.
  absl::Span<float> state(int index, const Piece& piece);
  // The parts of `piece` outside the duplicate ranges (set_duplicate_ranges), in order.
  std::vector<Piece> Counted(const Piece& piece) const;

 private:
  // Applies update number `step` (>= 1). Modifies nothing when it returns an error.
  virtual absl::Status Update(int64_t step, float lr, absl::Span<float> params,
                              absl::Span<const float> grads, const SumAcrossRanks& sum) = 0;

  // Allocates the state buffers in `ops` memory (CreateOptimizer, once).
  absl::Status AllocateState(VectorOps* ops);

  std::vector<state::PlacedRange> placement_;
  int64_t local_elements_ = 0;
  state::FlatRange range_;
  VectorOps* ops_ = nullptr;
  std::vector<std::string> state_names_;
  int num_tensors_ = 0;
  double weight_decay_ = 0;
  int decayed_tensors_ = 0;
  std::vector<Piece> pieces_;
  std::vector<state::FlatRange> duplicates_;
  std::vector<std::pair<std::string, OpsBuffer>> state_;
  int64_t step_ = 0;
};

// Checks the options against the table (INVALID_ARGUMENT naming the setting: "beta2 must
// be in [0, 1), got 1", "decay_mask has 3 entries for 6 tensors", a range outside the
// table) and creates the optimizer with zero state, in `ops` memory, and step 0.
// RESOURCE_EXHAUSTED when that memory cannot hold the state.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const state::TensorTable& table,
                                                           state::FlatRange range,
                                                           const OptimizerOptions& options,
                                                           VectorOps* ops = HostVectorOps());

// The same for `pieces` of the flat space placed in a local buffer of `local_elements`
// (ZeRO-2/3: a rank's piece of every unit). INVALID_ARGUMENT as above, and for pieces that
// state::CheckPlacement refuses, naming the piece ("optimizer placement: piece 1 ([64, 96)
// at 40): ...", or the two local spans that overlap), or a negative local_elements.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
    int64_t local_elements, const OptimizerOptions& options, VectorOps* ops = HostVectorOps());

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_OPTIM_OPTIMIZER_H_
