#include "train/tp/parallel_linear.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "kernels/elementwise.h"

namespace ringmaster::train::tp {
namespace {

absl::Status CheckSize(absl::string_view what, size_t size, int64_t expected) {
  if (static_cast<int64_t>(size) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", size, " floats, expected ", expected));
  }
  return absl::OkStatus();
}

// Copies the block of `rows` rows × `cols` columns between a matrix with rows of `from_stride`
// floats (starting at `from`) and one with rows of `to_stride`.
void CopyBlock(const float* from, int64_t from_stride, float* to, int64_t to_stride, int64_t rows,
               int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    std::copy_n(from + i * from_stride, cols, to + i * to_stride);
  }
}

absl::StatusOr<LinearShard> ShardFor(SplitDimension split, const ParallelLinearOptions& o) {
  if (o.group == nullptr) {
    return absl::InvalidArgumentError("ParallelLinearOptions.group: no communicator");
  }
  return LinearShard::Create(split, o.in, o.out, o.group->size(), o.group->rank());
}

}  // namespace

absl::StatusOr<LinearShard> LinearShard::Create(SplitDimension split, int64_t in, int64_t out,
                                                int parts, int rank) {
  if (in < 1 || out < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear layer: in (", in, ") and out (", out, ") must be positive"));
  }
  if (parts < 1 || rank < 0 || rank >= parts) {
    return absl::InvalidArgumentError(absl::StrCat("linear layer shard: rank ", rank,
                                                   " is not in [0, T) for T = ", parts));
  }
  const bool by_output = split == SplitDimension::kOutput;
  const int64_t size = by_output ? out : in;
  if (size % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        by_output ? "column-parallel linear: out (" : "row-parallel linear: in (", size,
        ") is not a multiple of the tensor-parallel size T = ", parts,
        "; uneven splits are not supported: choose ", by_output ? "out" : "in",
        " divisible by T"));
  }
  return LinearShard(split, in, out, parts, rank);
}

int64_t LinearShard::offset() const {
  return rank_ * (split_ == SplitDimension::kOutput ? local_out() : local_in());
}

absl::Status LinearShard::TakeWeight(absl::Span<const float> full, absl::Span<float> shard) const {
  RM_RETURN_IF_ERROR(CheckSize("TakeWeight: full weight", full.size(), out_ * in_));
  RM_RETURN_IF_ERROR(CheckSize("TakeWeight: shard", shard.size(), weight_elements()));
  if (split_ == SplitDimension::kOutput) {
    std::copy_n(full.data() + offset() * in_, weight_elements(), shard.data());
  } else {
    CopyBlock(full.data() + offset(), in_, shard.data(), local_in(), out_, local_in());
  }
  return absl::OkStatus();
}

absl::Status LinearShard::PutWeight(absl::Span<const float> shard, absl::Span<float> full) const {
  RM_RETURN_IF_ERROR(CheckSize("PutWeight: shard", shard.size(), weight_elements()));
  RM_RETURN_IF_ERROR(CheckSize("PutWeight: full weight", full.size(), out_ * in_));
  if (split_ == SplitDimension::kOutput) {
    std::copy_n(shard.data(), weight_elements(), full.data() + offset() * in_);
  } else {
    CopyBlock(shard.data(), local_in(), full.data() + offset(), in_, out_, local_in());
  }
  return absl::OkStatus();
}

absl::Status LinearShard::TakeBias(absl::Span<const float> full, absl::Span<float> shard) const {
  RM_RETURN_IF_ERROR(CheckSize("TakeBias: full bias", full.size(), out_));
  RM_RETURN_IF_ERROR(CheckSize("TakeBias: shard", shard.size(), bias_elements()));
  const int64_t begin = split_ == SplitDimension::kOutput ? offset() : 0;
  std::copy_n(full.data() + begin, bias_elements(), shard.data());
  return absl::OkStatus();
}

absl::Status LinearShard::PutBias(absl::Span<const float> shard, absl::Span<float> full) const {
  RM_RETURN_IF_ERROR(CheckSize("PutBias: shard", shard.size(), bias_elements()));
  RM_RETURN_IF_ERROR(CheckSize("PutBias: full bias", full.size(), out_));
  const int64_t begin = split_ == SplitDimension::kOutput ? offset() : 0;
  std::copy_n(shard.data(), bias_elements(), full.data() + begin);
  return absl::OkStatus();
}

absl::Status LinearShard::CheckGroup(const comm::Communicator& group) const {
  if (group.size() != parts_ || group.rank() != rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear layer shard: made for rank ", rank_, " of ", parts_,
                     ", given a group where this is rank ", group.rank(), " of ", group.size()));
  }
  return absl::OkStatus();
}

absl::Status LinearShard::GatherWeight(comm::Communicator& group, absl::Span<const float> shard,
                                       absl::Span<float> full, absl::Time deadline) const {
  RM_RETURN_IF_ERROR(CheckGroup(group));
  RM_RETURN_IF_ERROR(CheckSize("GatherWeight: shard", shard.size(), weight_elements()));
  RM_RETURN_IF_ERROR(CheckSize("GatherWeight: full weight", full.size(), out_ * in_));
  if (split_ == SplitDimension::kOutput) {  // the shards are consecutive rows: in place
    return group.AllGather(shard.data(), full.data(), weight_elements(), DataType::kFloat32,
                           deadline);
  }
  std::vector<float> shards(out_ * in_);
  RM_RETURN_IF_ERROR(group.AllGather(shard.data(), shards.data(), weight_elements(),
                                     DataType::kFloat32, deadline));
  for (int r = 0; r < parts_; ++r) {
    RM_ASSIGN_OR_RETURN(LinearShard other, Create(split_, in_, out_, parts_, r));
    RM_RETURN_IF_ERROR(other.PutWeight(
        absl::MakeConstSpan(shards.data() + r * weight_elements(), weight_elements()), full));
  }
  return absl::OkStatus();
}

absl::Status LinearShard::GatherBias(comm::Communicator& group, absl::Span<const float> shard,
                                     absl::Span<float> full, absl::Time deadline) const {
  RM_RETURN_IF_ERROR(CheckGroup(group));
  RM_RETURN_IF_ERROR(CheckSize("GatherBias: shard", shard.size(), bias_elements()));
  RM_RETURN_IF_ERROR(CheckSize("GatherBias: full bias", full.size(), out_));
  if (split_ == SplitDimension::kInput) return PutBias(shard, full);
  return group.AllGather(shard.data(), full.data(), bias_elements(), DataType::kFloat32, deadline);
}

// ---------------------------------------------------------------------------------------

absl::Status ParallelLinearBase::AllReduceSum(float* buffer, int64_t count) const {
  return group_->AllReduce(buffer, buffer, count, DataType::kFloat32, comm::ReduceOp::kSum,
                           absl::Now() + timeout_);
}

absl::StatusOr<ColumnParallelLinear> ColumnParallelLinear::Create(
    const ParallelLinearOptions& options) {
  RM_ASSIGN_OR_RETURN(LinearShard shard, ShardFor(SplitDimension::kOutput, options));
  return ColumnParallelLinear(shard, options);
}

void ColumnParallelLinear::Forward(const float* x, const float* weight, const float* bias,
                                   float* y, int64_t n) const {
  if (n == 0) return;
  kernels::LinearForward(x, weight, bias, y, n, shard().in(), shard().local_out());
}

absl::Status ColumnParallelLinear::BackwardInput(const float* dy, const float* weight, float* dx,
                                                 int64_t n) const {
  if (n > 0) kernels::LinearBackwardInput(dy, weight, dx, n, shard().in(), shard().local_out());
  return AllReduceSum(dx, n * shard().in());
}

void ColumnParallelLinear::BackwardWeights(const float* x, const float* dy, float* dweight,
                                           float* dbias, int64_t n,
                                           kernels::OutputMode mode) const {
  if (n == 0) return;
  kernels::LinearBackwardWeights(x, dy, dweight, dbias, n, shard().in(), shard().local_out(), mode);
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<RowParallelLinear> RowParallelLinear::Create(const ParallelLinearOptions& options) {
  RM_ASSIGN_OR_RETURN(LinearShard shard, ShardFor(SplitDimension::kInput, options));
  return RowParallelLinear(shard, options);
}

absl::Status RowParallelLinear::Forward(const float* x, const float* weight, const float* bias,
                                        float* y, int64_t n) const {
  const int64_t out = shard().out();
  if (n > 0) kernels::LinearForward(x, weight, /*bias=*/nullptr, y, n, shard().local_in(), out);
  RM_RETURN_IF_ERROR(AllReduceSum(y, n * out));
  if (bias != nullptr) {
    for (int64_t i = 0; i < n; ++i) kernels::Accumulate(y + i * out, bias, out);
  }
  return absl::OkStatus();
}

void RowParallelLinear::BackwardInput(const float* dy, const float* weight, float* dx,
                                      int64_t n) const {
  if (n == 0) return;
  kernels::LinearBackwardInput(dy, weight, dx, n, shard().local_in(), shard().out());
}

void RowParallelLinear::BackwardWeights(const float* x, const float* dy, float* dweight,
                                        float* dbias, int64_t n, kernels::OutputMode mode) const {
  if (n == 0) return;
  kernels::LinearBackwardWeights(x, dy, dweight, dbias, n, shard().local_in(), shard().out(), mode);
}

}  // namespace ringmaster::train::tp
