#include "train/tensor_parallel_sharded.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::train {

absl::StatusOr<std::unique_ptr<TensorParallelSharded>> TensorParallelSharded::Create(
    const TensorParallelShardedOptions& o) {
  if (o.whole_table == nullptr || o.tp_comm == nullptr || o.dp_comm == nullptr ||
      o.world_comm == nullptr) {
    return absl::InvalidArgumentError(
        "TensorParallelShardedOptions: the whole table and the tp, dp and world communicators "
        "are required");
  }
  if (o.sharded.zero_stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorParallelSharded is ZeRO-3 along dp; parallelism.zero_stage is ",
        o.sharded.zero_stage, " (ZeRO-0, 1 and 2 with a mesh run as pipeline parallelism)"));
  }
  nn::GptOptions shard_options = o.gpt;
  shard_options.tp_size = o.tp_comm->size();
  shard_options.tp_rank = o.tp_comm->rank();
  RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> shard, nn::GptModel::Create(shard_options));
  if (shard_options.tp_size > 1) {
    comm::Communicator* group = o.tp_comm;
    const absl::Duration timeout = o.sharded.op_timeout;
    shard->set_tensor_parallel_sum([group, timeout](absl::Span<float> x) {
      return group->AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32,
                              comm::ReduceOp::kSum, absl::Now() + timeout);
    });
  }
  std::unique_ptr<TensorParallelSharded> p(new TensorParallelSharded(o, std::move(shard)));
  RM_RETURN_IF_ERROR(AppendTensorPlaces(*p->shard_, *o.whole_table, /*base=*/0,
                                        /*tensor_parallel=*/shard_options.tp_size > 1,
                                        &p->places_));
  ShardedOptions so = o.sharded;
  so.table = &p->shard_->table();
  so.groups = p->shard_->parameter_groups();
  RM_ASSIGN_OR_RETURN(
      p->fsdp_, CreateShardedDataParallel(o.dp_gradients != nullptr ? o.dp_gradients : o.dp_comm,
                                          o.dp_comm, so));
  // Each split tensor's dp piece is on one rank of the job, each replicated tensor's counted
  // on tp rank 0 (duplicate_ranges): the whole job adds the partial sums up.
  comm::Communicator* world = o.world_comm;
  const absl::Duration timeout = o.sharded.op_timeout;
  p->sum_ = [world, timeout](absl::Span<double> values) {
    if (world->size() == 1) return absl::OkStatus();
    return world->AllReduce(values.data(), values.data(), values.size(), DataType::kFloat64,
                            comm::ReduceOp::kSum, absl::Now() + timeout);
  };
  return p;
}

std::string TensorParallelSharded::Describe() const {
  return absl::StrCat("tensor parallel over ", options_.tp_comm->size(), " (this rank's shard ",
                      tp_rank(), ": ", shard_->table().parameter_count(),
                      " parameters), fully sharded over ", options_.dp_comm->size(), ": ",
                      fsdp_->Describe());
}

std::vector<state::PlacedRange> TensorParallelSharded::MapPieces(
    const std::vector<state::PlacedRange>& pieces, bool replicas) const {
  std::vector<state::PlacedRange> out;
  for (const state::PlacedRange& p : pieces) {
    for (const state::PlacedRange& q :
         MapTensorPlaces(places_, p.range, p.range.begin - p.at, replicas, tp_rank())) {
      out.push_back(q);
    }
  }
  return out;
}

std::vector<state::FlatRange> TensorParallelSharded::duplicate_ranges() const {
  std::vector<state::FlatRange> out;
  // Each update piece's replicated runs, moved to the piece's place (`at`, counted from the
  // window's start).
  for (const state::PlacedRange& p : fsdp_->update_pieces()) {
    for (const state::FlatRange& r : ReplicatedRanges(places_, p.range, tp_rank())) {
      out.push_back({p.at + r.begin, p.at + r.end});
    }
  }
  return out;
}

absl::Status TensorParallelSharded::WholeParameters(absl::Span<float> params,
                                                    absl::Span<float> whole) {
  state::FlatBuffer mine(shard_->table().total_elements());
  RM_RETURN_IF_ERROR(fsdp_->WholeParameters(params, mine.span()));
  ScatterToWhole(places_, mine.data(), tp_rank(), whole);
  if (options_.tp_comm->size() == 1) return absl::OkStatus();
  return options_.tp_comm->AllReduce(whole.data(), whole.data(), whole.size(), DataType::kFloat32,
                                     comm::ReduceOp::kSum,
                                     absl::Now() + options_.sharded.op_timeout);
}

}  // namespace ringmaster::train
