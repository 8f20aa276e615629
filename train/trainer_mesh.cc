#include "train/trainer_mesh.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "train/fingerprint.h"
#include "train/memory_plan.h"
#include "train/nn/gpt.h"
#include "train/pipeline/schedule.h"
#include "train/tensor_parallel_sharded.h"

namespace ringmaster::train {
namespace {

pipeline::ScheduleKind KindOf(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::kGPipe:
      return pipeline::ScheduleKind::kGPipe;
    case PipelineScheduleKind::kOneFOneB:
      return pipeline::ScheduleKind::kOneFOneB;
    case PipelineScheduleKind::kInterleaved1F1B:
      return pipeline::ScheduleKind::kInterleaved1F1B;
    case PipelineScheduleKind::kZeroBubble:
      return pipeline::ScheduleKind::kZeroBubble;
  }
  return pipeline::ScheduleKind::kOneFOneB;
}

}  // namespace

absl::StatusOr<MeshGroups> BuildMeshGroups(const TrainConfig& config, comm::Communicator& world,
                                           absl::Duration op_timeout) {
  MeshGroups g;
  g.dp_rank = world.rank();
  g.dp_size = world.size();
  const int pp = config.mesh.pp, tp = config.mesh.tp;
  if (pp <= 1 && tp <= 1) return g;
  const int unit = pp * tp;
  if (world.size() % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.mesh: tp ", tp, " x pp ", pp, " = ", unit,
        " ranks per data-parallel replica, but the job has ", world.size(),
        " ranks; run it on a multiple of ", unit, " ranks (data parallelism takes the rest)"));
  }
  RM_ASSIGN_OR_RETURN(comm::Mesh mesh,
                      comm::Mesh::Create(world.size(), {{"pp", pp}, {"dp", -1}, {"tp", tp}}));
  const absl::Time deadline = absl::Now() + op_timeout;
  RM_ASSIGN_OR_RETURN(g.pp, mesh.Group(world, comm::MeshDim::kPp, deadline));
  RM_ASSIGN_OR_RETURN(g.dp, mesh.Group(world, comm::MeshDim::kDp, deadline));
  RM_ASSIGN_OR_RETURN(g.tp, mesh.Group(world, comm::MeshDim::kTp, deadline));
  g.dp_rank = mesh.Coordinates(world.rank())[static_cast<int>(comm::MeshDim::kDp)];
  g.dp_size = mesh.size(comm::MeshDim::kDp);
  g.mesh = std::move(mesh);
  return g;
}

absl::Status BuildDeviceMeshGroups(MeshGroups& groups, comm::Communicator& nccl,
                                   absl::Duration op_timeout) {
  if (!groups.mesh) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + op_timeout;
  RM_ASSIGN_OR_RETURN(groups.pp_device, groups.mesh->Group(nccl, comm::MeshDim::kPp, deadline));
  RM_ASSIGN_OR_RETURN(groups.dp_device, groups.mesh->Group(nccl, comm::MeshDim::kDp, deadline));
  RM_ASSIGN_OR_RETURN(groups.tp_device, groups.mesh->Group(nccl, comm::MeshDim::kTp, deadline));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreatePipelineStrategy(
    const TrainConfig& config, const Model& model, const MeshGroups& groups,
    comm::Communicator& world, absl::Duration op_timeout, TrainingDevice* device) {
  const auto* gpt = dynamic_cast<const nn::GptModel*>(&model);
  if (gpt == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.mesh is tp ", config.mesh.tp, " x pp ", config.mesh.pp, ", but model '",
        model.Describe(), "' is not a GPT: model parallelism splits a GPT's blocks"));
  }
  if (config.zero_stage == 3 && config.mesh.pp <= 1) {  // FSDP over tensor-parallel shards
    TensorParallelShardedOptions o;
    o.gpt = gpt->options();
    o.whole_table = &model.table();
    o.tp_comm = groups.tp.get();
    o.dp_comm = groups.dp.get();
    o.world_comm = &world;
    o.sharded = ShardedOptionsFor(config, model);
    o.sharded.op_timeout = op_timeout;
    if (device != nullptr) {
      nn::GptOptions shard = gpt->options();
      shard.tp_size = groups.tp->size();
      shard.tp_rank = groups.tp->rank();
      RM_RETURN_IF_ERROR(device->RunTensorParallelShard(shard, groups.tp_for_device(), op_timeout));
      o.sharded.ops = device->ops();
      o.sharded.comm_ops = device->comm_ops();
      o.dp_gradients = groups.dp_device.get();
    }
    RM_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelSharded> s, TensorParallelSharded::Create(o));
    return std::unique_ptr<ParallelStrategy>(std::move(s));
  }
  PipelineParallelOptions o;
  o.gpt = gpt->options();
  o.whole_table = &model.table();
  RM_ASSIGN_OR_RETURN(o.schedule, MeshSchedule(config, groups.dp_size));
  o.pp_comm = groups.pp.get();
  o.dp_comm = groups.dp.get();
  o.tp_comm = groups.tp.get();
  o.world_comm = &world;
  o.dp.zero_stage = config.zero_stage;
  o.dp.bucket_mb = config.bucket_mb;
  o.dp.overlap = config.overlap;
  o.dp.op_timeout = op_timeout;
  if (device != nullptr) {
    comm::Communicator* tp = groups.tp_for_device();
    o.make_stage = [device, tp, op_timeout](const nn::GptOptions& slice) {
      return device->CreateStage(slice, tp, op_timeout);
    };
    o.ops = device->ops();
    o.dp.ops = device->ops();
    o.dp.comm_ops = device->comm_ops();
    o.pp_messages = groups.pp_device.get();
    o.dp_gradients = groups.dp_device.get();
  }
  RM_ASSIGN_OR_RETURN(std::unique_ptr<PipelineParallel> p, PipelineParallel::Create(o));
  return std::unique_ptr<ParallelStrategy>(std::move(p));
}

absl::StatusOr<pipeline::ScheduleOptions> MeshSchedule(const TrainConfig& config, int dp_size) {
  if (config.mesh.pp > 1) {
    return pipeline::ScheduleOptions{KindOf(config.pipeline.schedule), config.mesh.pp,
                                     config.pipeline.micro_batches, config.pipeline.virtual_stages};
  }
  // One stage: the micro-batches of data parallelism's plan, one after the other, each one's
  // backward right after its forward (1F1B on one rank), so that one micro-batch's
  // activations are held at a time as under data parallelism's accumulation (GPipe would
  // hold them all).
  RM_ASSIGN_OR_RETURN(data::BatchPlan plan, PlanPipelineBatches(config, dp_size));
  return pipeline::ScheduleOptions{pipeline::ScheduleKind::kOneFOneB, 1, plan.accumulation_steps,
                                   1};
}

absl::Status CheckMeshFingerprints(const MeshGroups& groups, comm::Communicator& world,
                                   const PipelineParallel& pipeline, absl::Span<const float> params,
                                   double loss, int64_t step, absl::Time deadline) {
  if (!groups.mesh) return absl::OkStatus();
  const int rank = world.rank();
  absl::Status found;  // the first difference this rank's groups found
  auto compare = [&](comm::Communicator& group, const state::TensorTable& table,
                     absl::Span<const uint64_t> hashes, const FingerprintGroup& g) -> absl::Status {
    RM_ASSIGN_OR_RETURN(const std::vector<uint64_t> all,
                        GatherGroupFingerprints(group, hashes, loss, g, deadline));
    if (found.ok()) found = CompareGroupFingerprints(table, all, group.size(), step, g);
    return absl::OkStatus();
  };
  for (const PipelineParallel::StageView& stage : pipeline.stage_views()) {
    const state::TensorTable& table = stage.model->table();
    // Hashed once: the data-parallel and the tensor-parallel comparisons both read them.
    const std::vector<uint64_t> hashes = TensorHashes(table, params.data() + stage.base);
    if (groups.dp != nullptr && groups.dp->size() > 1) {
      FingerprintGroup g;
      g.job_ranks = groups.mesh->GroupRanks(comm::MeshDim::kDp, rank);
      g.what = absl::StrCat("the data-parallel replicas of pipeline stage ", stage.index);
      RM_RETURN_IF_ERROR(compare(*groups.dp, table, hashes, g));
    }
    if (groups.tp != nullptr && groups.tp->size() > 1) {
      FingerprintGroup g;
      for (int t = 0; t < table.size(); ++t) {
        if (stage.model->shard(t).whole()) g.tensors.push_back(t);
      }
      g.job_ranks = groups.mesh->GroupRanks(comm::MeshDim::kTp, rank);
      g.what = absl::StrCat("the tensors the tensor-parallel group of pipeline stage ", stage.index,
                            " replicates");
      if (!g.tensors.empty()) RM_RETURN_IF_ERROR(compare(*groups.tp, table, hashes, g));
    }
  }
  // Every rank stops alike: the lowest rank whose groups found a difference.
  double first = found.ok() ? world.size() : rank;
  RM_RETURN_IF_ERROR(
      world.AllReduce(&first, &first, 1, DataType::kFloat64, comm::ReduceOp::kMin, deadline));
  if (!found.ok()) return found;
  if (first < world.size()) {
    return absl::InternalError(absl::StrCat(
        "ranks diverged at step ", step, ": rank ", static_cast<int>(first),
        " found copies of a tensor that differ (its error names them); this rank's copies "
        "agree with its groups'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<data::BatchPlan> PlanPipelineBatches(const TrainConfig& config, int dp_size) {
  if (config.mesh.pp <= 1) return PlanRankBatches(config, dp_size);
  // The job cannot run this way on this world: it fails at once with the reason, rather than
  // spend its restarts.
  const int m = config.pipeline.micro_batches;
  if (config.accumulation > 0) {
    return MarkPermanent(absl::InvalidArgumentError(
        absl::StrCat("batch.accumulation is set, but with parallelism.mesh.pp > 1 "
                     "parallelism.pipeline.micro_batches (",
                     m, ") cuts each replica's share of the batch; remove batch.accumulation")));
  }
  const int64_t share = config.global_batch / dp_size;  // the smallest replica's share
  if (share < m) {
    return MarkPermanent(absl::InvalidArgumentError(absl::StrCat(
        "parallelism.pipeline.micro_batches is ", m, ", but batch.global ", config.global_batch,
        " over ", dp_size, " data-parallel replicas leaves ", share,
        " samples to some replica; lower micro_batches or raise batch.global")));
  }
  data::BatchPlanOptions po;
  po.global_batch = config.global_batch;
  po.world_size = dp_size;
  po.accumulation_steps = m;
  RM_ASSIGN_OR_RETURN(data::BatchPlan plan, data::PlanBatches(po));
  // batch.micro_max bounds the micro-batch (memory): the pipeline's must fit under it.
  if (config.micro_max > 0 && plan.max_micro_batch > config.micro_max) {
    return MarkPermanent(absl::InvalidArgumentError(absl::StrCat(
        "batch.micro_max is ", config.micro_max, ", but batch.global ", config.global_batch,
        " over ", dp_size, " data-parallel replicas in ", m,
        " micro-batches (parallelism.pipeline.micro_batches) makes micro-batches of up to ",
        plan.max_micro_batch, " samples; raise micro_batches to ",
        (plan.max_rank_share + config.micro_max - 1) / config.micro_max,
        " or more, or raise micro_max")));
  }
  return plan;
}

absl::Status GatherPipelineMicroBatches(const data::BatchPlan& plan, const data::GlobalBatch& gb,
                                        int dp_rank, const data::Dataset& dataset,
                                        std::vector<Batch>* micro_batches,
                                        std::vector<bool>* discarded) {
  const int64_t count = static_cast<int64_t>(gb.indices.size());
  micro_batches->resize(plan.accumulation_steps);
  discarded->assign(plan.accumulation_steps, false);
  for (int micro = 0; micro < plan.accumulation_steps; ++micro) {
    const data::Range r = plan.MicroBatch(count, dp_rank, micro);
    (*discarded)[micro] = r.empty();
    const absl::Span<const int64_t> indices =
        r.empty() ? absl::MakeConstSpan(gb.indices).subspan(0, 1)
                  : absl::MakeConstSpan(gb.indices).subspan(r.begin, r.size());
    RM_RETURN_IF_ERROR(dataset.Gather(indices, &(*micro_batches)[micro]));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::train
