#include "train/mesh_memory.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "state/tensor.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"
#include "train/nn/gpt.h"
#include "train/pipeline/gpt_stage.h"
#include "train/pipeline/schedule.h"
#include "train/rank_report.h"
#include "train/trainer_mesh.h"

namespace ringmaster::train {

absl::StatusOr<std::vector<MeshRankPlan>> PlanMeshMemory(const TrainConfig& config, int world) {
  const int tp = config.mesh.tp, pp = config.mesh.pp;
  if (world < 1 || world % (tp * pp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.mesh: tp ", tp, " x pp ", pp, " = ", tp * pp,
                     " ranks per data-parallel replica, but the job has ", world,
                     " ranks; plan for a multiple of ", tp * pp, " ranks"));
  }
  const int dp = world / (tp * pp);
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> whole,
                      CreateModel(config.model, DescribeJobData(config)));
  const auto* gpt = dynamic_cast<const nn::GptModel*>(whole.get());
  if (gpt == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.mesh is tp ", tp, " x pp ", pp, ", but model '",
                     whole->Describe(), "' is not a GPT: model parallelism splits a GPT's blocks"));
  }
  RM_ASSIGN_OR_RETURN(const pipeline::ScheduleOptions so, MeshSchedule(config, dp));
  RM_ASSIGN_OR_RETURN(const pipeline::Schedule schedule, pipeline::MakeSchedule(so));
  RM_ASSIGN_OR_RETURN(const pipeline::Timeline timeline, pipeline::Simulate(schedule));
  RM_ASSIGN_OR_RETURN(const auto blocks,
                      pipeline::SplitBlocks(gpt->options().layers, schedule.stages()));
  RM_ASSIGN_OR_RETURN(const data::BatchPlan plan, PlanPipelineBatches(config, dp));
  const int moments = OptimizerMoments(config.optimizer);
  const bool half = config.precision != Precision::kFloat32;
  std::vector<MeshRankPlan> plans;
  for (int r = 0; r < pp; ++r) {
    for (int t = 0; t < tp; ++t) {
      MeshRankPlan p;
      p.pp_rank = r;
      p.tp_rank = t;
      for (int st = r; st < schedule.stages(); st += pp) {
        nn::GptOptions slice = pipeline::StageOptions(gpt->options(), blocks, st);
        slice.tp_size = tp;
        slice.tp_rank = t;
        RM_ASSIGN_OR_RETURN(std::unique_ptr<pipeline::GptStage> stage,
                            pipeline::GptStage::Create(slice));
        const state::TensorTable& table = stage->model().table();
        p.elements += table.total_elements();
        p.block_elements += BlockElements(table);
        // Computed from the stage's buffer sizes, nothing run (exact: mesh_memory_test);
        // under zero_bubble with the output gradients each micro-batch keeps for its W.
        p.activation_bytes_per_micro_batch += stage->model().ActivationBytesFor(
            plan.max_micro_batch, so.kind == pipeline::ScheduleKind::kZeroBubble
                                      ? nn::GptModel::ActivationRun::kSliceDeferringWeights
                                      : nn::GptModel::ActivationRun::kSlice);
      }
      p.parameter_bytes = p.gradient_bytes = p.elements * 4;
      p.optimizer_bytes = p.elements * 4 * moments / (config.zero_stage >= 1 ? dp : 1);
      p.peak_in_flight = timeline.peak_activations[r];
      p.activation_bytes = static_cast<int64_t>(
          std::llround(static_cast<double>(p.activation_bytes_per_micro_batch) * p.peak_in_flight));
      if (half) p.compute_copy_bytes = p.elements * 4;
      if (config.zero_stage == 3 && pp == 1) {
        // The shard (the one stage's model) fully sharded over the dp ranks.
        nn::GptOptions shard = gpt->options();
        shard.tp_size = tp;
        shard.tp_rank = t;
        RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model, nn::GptModel::Create(shard));
        RM_ASSIGN_OR_RETURN(const RankMemoryPlan sharded,
                            PlanRankState(config, *model, dp, 3, config.fsdp.wrap));
        p.parameter_bytes = sharded.parameter_bytes;
        p.compute_copy_bytes = sharded.compute_copy_bytes;
        p.gradient_bytes = sharded.gradient_bytes;
        p.optimizer_bytes = sharded.optimizer_bytes;
        p.unit_buffer_bytes = sharded.unit_buffer_bytes;
      }
      plans.push_back(p);
    }
  }
  return plans;
}

}  // namespace ringmaster::train
