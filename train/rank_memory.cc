#include "train/rank_memory.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"

namespace ringmaster::train {

namespace {

// The stage whose memory a rank keeps: under a mesh ZeRO-2 keeps the whole gradient buffer
// (the pipeline's micro-batches accumulate into it), as ZeRO-1.
int MemoryZeroStage(const TrainConfig& config) {
  return HasMesh(config) ? std::min(config.zero_stage, 1) : config.zero_stage;
}

}  // namespace

MemoryEstimateOptions RankMemoryOptions(const TrainConfig& config, const state::TensorTable& table,
                                        int world) {
  MemoryEstimateOptions mo;
  mo.parameters = static_cast<double>(table.parameter_count());
  mo.world_size = world;
  mo.zero_stage = MemoryZeroStage(config);
  mo.mixed_precision = false;
  mo.optimizer = std::holds_alternative<SgdOptions>(config.optimizer)
                     ? MemoryEstimateOptions::Optimizer::kSgdMomentum
                     : MemoryEstimateOptions::Optimizer::kAdam;
  return mo;
}

namespace {

// One rank's host memory, by term, against the machine's.
struct HostState {
  double parameters = 0, gradients = 0, optimizer = 0, unit_buffers = 0;
  double total() const { return parameters + gradients + optimizer + unit_buffers; }
};

absl::Status CheckAgainstMachine(const HostState& rank, int64_t parameter_count, int local_ranks) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return absl::OkStatus();  // nothing to compare
  const double machine = static_cast<double>(pages) * static_cast<double>(page);
  const int ranks = std::max(1, local_ranks);
  if (rank.total() * ranks <= machine) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  const std::string buffers =
      rank.unit_buffers > 0 ? absl::StrFormat(", unit buffers %.4g GiB", rank.unit_buffers / kGiB)
                            : std::string();
  return MarkPermanent(absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: the model's %d parameters need %.4g GiB on each rank (parameters "
      "%.4g GiB, gradients %.4g GiB, optimizer state %.4g GiB%s): %.4g GiB for the %d rank(s) "
      "on this host, which has %.4g GiB; make the model smaller (model), or use more ranks with "
      "parallelism.zero_stage, or fewer ranks per node",
      parameter_count, rank.total() / kGiB, rank.parameters / kGiB, rank.gradients / kGiB,
      rank.optimizer / kGiB, buffers, rank.total() * ranks / kGiB, ranks, machine / kGiB)));
}

}  // namespace

absl::Status CheckHostMemory(const TrainConfig& config, const state::TensorTable& table, int world,
                             bool gradients_on_host, int local_ranks) {
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(RankMemoryOptions(config, table, world));
  if (!e.ok()) return absl::OkStatus();  // nothing to compare
  HostState rank;
  rank.parameters = e->parameter_bytes;
  rank.gradients = gradients_on_host ? e->gradient_bytes : 0;
  rank.optimizer = e->optimizer_bytes;
  return CheckAgainstMachine(rank, table.parameter_count(), local_ranks);
}

absl::Status CheckHostMemory(const TrainConfig& config, const Model& model, int world,
                             bool gradients_on_host, int local_ranks) {
  RM_ASSIGN_OR_RETURN(
      const RankMemoryPlan plan,
      PlanRankState(config, model, std::max(1, world), MemoryZeroStage(config), config.fsdp.wrap));
  HostState rank;
  rank.parameters = static_cast<double>(plan.parameter_bytes + plan.compute_copy_bytes);
  rank.gradients = gradients_on_host ? static_cast<double>(plan.gradient_bytes) : 0;
  rank.optimizer = static_cast<double>(plan.optimizer_bytes);
  rank.unit_buffers = static_cast<double>(plan.unit_buffer_bytes);
  return CheckAgainstMachine(rank, model.table().parameter_count(), local_ranks);
}

absl::StatusOr<int64_t> EstimateRankStateBytes(const TrainConfig& config, int world) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      CreateModel(config.model, DescribeJobData(config)));
  RM_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(RankMemoryOptions(
                                            config, model->table(), std::max(1, world))));
  return static_cast<int64_t>(e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes);
}

}  // namespace ringmaster::train
