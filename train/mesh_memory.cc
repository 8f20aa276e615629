#include "train/mesh_memory.h"

#include <cmath>
#include <memory>
#include <new>

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
namespace {

// One micro-batch of `samples` synthetic sequences forward and backward through `stage` (alone:
// its neighbours' activations and gradients zeros); the activation bytes its model then holds.
absl::StatusOr<int64_t> MeasureStage(pipeline::GptStage& stage, int64_t samples,
                                     Precision precision) {
  const nn::GptModel& model = stage.model();
  const int64_t context = model.options().context;
  Batch batch;
  batch.size = samples;
  batch.context = context;
  batch.tokens.assign(static_cast<size_t>(samples * (context + 1)), 0);
  const int64_t elements = model.table().total_elements();
  state::FlatBuffer params(elements), grads(elements);
  ForwardBackwardOptions options;
  options.precision = precision;
  RM_RETURN_IF_ERROR(
      stage.BeginStep(absl::MakeConstSpan(&batch, 1), params.span(), grads.span(), options));
  std::vector<float> input(static_cast<size_t>(stage.input_elements(0)));
  std::vector<float> output(static_cast<size_t>(stage.output_elements(0)));
  RM_RETURN_IF_ERROR(stage.Forward(0, input, absl::MakeSpan(output)));
  RM_RETURN_IF_ERROR(stage.Backward(0, output, absl::MakeSpan(input)));
  return stage.activation_bytes();
}

}  // namespace

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
  try {
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
          // Measured alone: a group of one's sum leaves the partial values as they are.
          if (tp > 1)
            stage->set_tensor_parallel_sum([](absl::Span<float>) { return absl::OkStatus(); });
          const state::TensorTable& table = stage->model().table();
          p.elements += table.total_elements();
          p.block_elements += BlockElements(table);
          RM_ASSIGN_OR_RETURN(const int64_t bytes,
                              MeasureStage(*stage, plan.max_micro_batch, config.precision));
          p.activation_bytes_per_micro_batch += bytes;
        }
        p.parameter_bytes = p.gradient_bytes = p.elements * 4;
        p.optimizer_bytes = p.elements * 4 * moments / (config.zero_stage >= 1 ? dp : 1);
        p.peak_in_flight = timeline.peak_activations[r];
        p.activation_bytes = static_cast<int64_t>(std::llround(
            static_cast<double>(p.activation_bytes_per_micro_batch) * p.peak_in_flight));
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
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory measuring one micro-batch's activations of a pipeline stage on this "
        "machine");
  }
  return plans;
}

}  // namespace ringmaster::train
