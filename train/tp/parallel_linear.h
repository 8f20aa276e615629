// Tensor-parallel linear layers (Megatron-LM's ColumnParallelLinear and RowParallelLinear)
// on the CPU, over the tensor-parallel group's communicator (host memory).
//
// A linear layer y = x · Wᵀ + b follows kernels/matmul.h (PyTorch's nn.Linear): x [n, in],
// W [out, in] row-major, b [out], y [n, out]. Its T = group->size() ranks each hold a shard:
//
//   ColumnParallelLinear: W's output features split. Rank r holds the rows
//     [r·out/T, (r+1)·out/T) of W, stored [out/T, in], and the same slice of b. Its input x is
//     replicated (every rank has all of it); its output y_r = x · W_rᵀ + b_r [n, out/T] is
//     this rank's slice of y's columns (no communication). Backward: dW_r and db_r are local;
//     dx = Σ_r dy_r · W_r needs ONE all-reduce (sum) of n·in floats. This is Megatron's "f"
//     operator in front of the layer: identity forward, all-reduce backward.
//   RowParallelLinear: W's input features split. Rank r holds the columns
//     [r·in/T, (r+1)·in/T) of W, stored [out, in/T]; b is replicated (whole on every rank).
//     Its input x_r [n, in/T] is the matching slice of x's columns (a column-parallel layer's
//     output, through a local element-wise activation). Forward: the partial product
//     x_r · W_rᵀ, ONE all-reduce (sum) of n·out floats, then b added once, so that y [n, out]
//     is whole and identical on every rank. Backward: dy is replicated; dW_r = dyᵀ · x_r and
//     dx_r = dy · W_r are local, db = Σ dy is the same on every rank (no communication). This
//     is Megatron's "g" operator behind the layer: all-reduce forward, identity backward.
//
// So column → element-wise → row (an MLP, attention's projections) runs exactly one
// all-reduce in forward (the row layer's) and one in backward (the column layer's). The
// all-reduce runs at T = 1 as well (the backend returns at once; the counters count it).
//
// Splits are even: `out` (column) or `in` (row) must be a multiple of T, or Create returns
// INVALID_ARGUMENT naming the dimension and T. Uneven splits are not supported.
//
// The layers own no parameters or activations: the caller passes this rank's shard (e.g. a
// range of a flat parameter buffer) and gets gradients in its own buffers, as train/nn's
// layers do, so that a model keeps its shards where its optimizer and checkpoints see them.
// Backward is split into the input part and the weight part (what a zero-bubble pipeline
// schedules separately); they may be called in either order.
//
// `n` (rows) may be 0: the kernels are skipped, the all-reduce still runs (0 elements) so that
// every rank of the group issues the same calls.
//
// Errors of the methods that communicate: the communicator's (communicator.h), each
// collective bounded by `Options::timeout` from its start; after one, the group is broken.
//
// Thread-safety: a layer is immutable after Create. The methods that run a collective
// (RowParallelLinear::Forward, ColumnParallelLinear::BackwardInput) follow the group's rule:
// one thread at a time per communicator, the same calls in the same order on every rank of
// the group. The others are thread-compatible (concurrent calls on disjoint outputs). Buffers
// are fp32 host memory; outputs must not overlap inputs.
#ifndef RINGMASTER_TRAIN_TP_PARALLEL_LINEAR_H_
#define RINGMASTER_TRAIN_TP_PARALLEL_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "kernels/matmul.h"

namespace ringmaster::train::tp {

// Which dimension of a linear layer's weight [out, in] is split across the group.
enum class SplitDimension {
  kOutput,  // rows of W (column-parallel)
  kInput,   // columns of W (row-parallel)
};

// What one rank of T holds of a linear layer's weight [out, in] and bias [out]: a pure
// description, usable without a communicator (checkpoint loading, tests).
class LinearShard {
 public:
  // INVALID_ARGUMENT when in or out is not positive, parts < 1, rank outside [0, parts), or
  // the split dimension is not a multiple of parts (names "out" or "in", its size and T).
  static absl::StatusOr<LinearShard> Create(SplitDimension split, int64_t in, int64_t out,
                                            int parts, int rank);

  SplitDimension split() const { return split_; }
  int64_t in() const { return in_; }    // the whole layer's
  int64_t out() const { return out_; }  // the whole layer's
  int parts() const { return parts_; }
  int rank() const { return rank_; }
  // The shard's weight is [local_out(), local_in()]: out/T × in, or out × in/T.
  int64_t local_in() const { return split_ == SplitDimension::kInput ? in_ / parts_ : in_; }
  int64_t local_out() const { return split_ == SplitDimension::kOutput ? out_ / parts_ : out_; }
  // The first feature of the split dimension this rank holds: rank · (that dimension / T).
  int64_t offset() const;
  int64_t weight_elements() const { return local_out() * local_in(); }
  // Column-parallel: out/T (a slice). Row-parallel: out (the whole bias, replicated).
  int64_t bias_elements() const { return local_out(); }

  // Copies this rank's part of a whole weight [out, in] into `shard` [local_out, local_in],
  // and back. INVALID_ARGUMENT when a span's size is wrong (names which).
  absl::Status TakeWeight(absl::Span<const float> full, absl::Span<float> shard) const;
  absl::Status PutWeight(absl::Span<const float> shard, absl::Span<float> full) const;
  // The same for the bias [out]: a slice (column-parallel) or all of it (row-parallel).
  absl::Status TakeBias(absl::Span<const float> full, absl::Span<float> shard) const;
  absl::Status PutBias(absl::Span<const float> shard, absl::Span<float> full) const;

  // Reassembles the whole weight [out, in] (or bias [out]) on every rank of `group` from each
  // rank's shard: one all-gather of weight_elements() (bias_elements()) floats. `group` is the
  // group this shard was made for (size parts, this rank). A row-parallel bias is replicated:
  // GatherBias copies it. Errors: the spans' (as above), the communicator's.
  absl::Status GatherWeight(comm::Communicator& group, absl::Span<const float> shard,
                            absl::Span<float> full, absl::Time deadline) const;
  absl::Status GatherBias(comm::Communicator& group, absl::Span<const float> shard,
                          absl::Span<float> full, absl::Time deadline) const;

 private:
  LinearShard(SplitDimension split, int64_t in, int64_t out, int parts, int rank)
      : split_(split), in_(in), out_(out), parts_(parts), rank_(rank) {}
  absl::Status CheckGroup(const comm::Communicator& group) const;

  SplitDimension split_;
  int64_t in_;
  int64_t out_;
  int parts_;
  int rank_;
};

struct ParallelLinearOptions {
  int64_t in = 0;   // the whole layer's input features
  int64_t out = 0;  // the whole layer's output features
  // The tensor-parallel group: T = size(), this rank = rank(). Not owned; must outlive the
  // layer.
  comm::Communicator* group = nullptr;
  // Bound of each collective, counted from its start.
  absl::Duration timeout = absl::Seconds(60);
};

// What both layers keep: this rank's shard and the group. Not used on its own.
class ParallelLinearBase {
 public:
  const LinearShard& shard() const { return shard_; }

 protected:
  ParallelLinearBase(const LinearShard& shard, const ParallelLinearOptions& options)
      : shard_(shard), group_(options.group), timeout_(options.timeout) {}
  // Sums `count` floats of `buffer` over the group, in place.
  absl::Status AllReduceSum(float* buffer, int64_t count) const;

 private:
  LinearShard shard_;
  comm::Communicator* group_;
  absl::Duration timeout_;
};

// Output features split; see the top of this file.
class ColumnParallelLinear : public ParallelLinearBase {
 public:
  // INVALID_ARGUMENT: no group, bad sizes, or out not a multiple of T ("out").
  static absl::StatusOr<ColumnParallelLinear> Create(const ParallelLinearOptions& options);

  // y [n, out/T] = x [n, in] · weightᵀ + bias. weight [out/T, in]; bias [out/T] or null.
  // No communication.
  void Forward(const float* x, const float* weight, const float* bias, float* y,
               int64_t n) const;
  // dx [n, in] = Σ over the group of dy [n, out/T] · weight: ONE all-reduce of n·in floats.
  // Overwrites dx (whole and identical on every rank).
  absl::Status BackwardInput(const float* dy, const float* weight, float* dx, int64_t n) const;
  // dweight [out/T, in] (+)= dyᵀ · x; dbias [out/T] (+)= Σ dy's rows (dbias may be null). No
  // communication.
  void BackwardWeights(const float* x, const float* dy, float* dweight, float* dbias, int64_t n,
                       kernels::OutputMode mode) const;

 private:
  using ParallelLinearBase::ParallelLinearBase;
};

// Input features split; see the top of this file.
class RowParallelLinear : public ParallelLinearBase {
 public:
  // INVALID_ARGUMENT: no group, bad sizes, or in not a multiple of T ("in").
  static absl::StatusOr<RowParallelLinear> Create(const ParallelLinearOptions& options);

  // y [n, out] = Σ over the group of x [n, in/T] · weightᵀ, then + bias [out] (replicated,
  // added once; may be null): ONE all-reduce of n·out floats. weight [out, in/T]. y is whole
  // and identical on every rank.
  absl::Status Forward(const float* x, const float* weight, const float* bias, float* y,
                       int64_t n) const;
  // dx [n, in/T] = dy [n, out] · weight (overwrites). No communication.
  void BackwardInput(const float* dy, const float* weight, float* dx, int64_t n) const;
  // dweight [out, in/T] (+)= dyᵀ · x; dbias [out] (+)= Σ dy's rows, the same on every rank
  // (dbias may be null). No communication.
  void BackwardWeights(const float* x, const float* dy, float* dweight, float* dbias, int64_t n,
                       kernels::OutputMode mode) const;

 private:
  using ParallelLinearBase::ParallelLinearBase;
};

}  // namespace ringmaster::train::tp

#endif  // RINGMASTER_TRAIN_TP_PARALLEL_LINEAR_H_
