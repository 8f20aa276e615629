#include "train/rank_memory.h"

#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "train/model_factory.h"

namespace ringmaster::train {

MemoryEstimateOptions RankMemoryOptions(const TrainConfig& config, const state::TensorTable& table,
                                        int world) {
  MemoryEstimateOptions mo;
  mo.parameters = static_cast<double>(table.parameter_count());
  mo.world_size = world;
  mo.zero_stage = std::min(config.zero_stage, 1);  // gradients stay whole on CPU
  mo.mixed_precision = false;
  mo.optimizer = std::holds_alternative<SgdOptions>(config.optimizer)
                     ? MemoryEstimateOptions::Optimizer::kSgdMomentum
                     : MemoryEstimateOptions::Optimizer::kAdam;
  return mo;
}

absl::Status CheckHostMemory(const TrainConfig& config, const state::TensorTable& table, int world,
                             bool gradients_on_host, int local_ranks) {
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(RankMemoryOptions(config, table, world));
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (!e.ok() || pages <= 0 || page <= 0) return absl::OkStatus();  // nothing to compare
  const double machine = static_cast<double>(pages) * static_cast<double>(page);
  const double rank =
      e->parameter_bytes + (gradients_on_host ? e->gradient_bytes : 0) + e->optimizer_bytes;
  const int ranks = std::max(1, local_ranks);
  if (rank * ranks <= machine) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  return MarkPermanent(absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: the model's %d parameters need %.4g GiB on each rank (parameters "
      "%.4g GiB, gradients %.4g GiB, optimizer state %.4g GiB): %.4g GiB for the %d rank(s) on "
      "this host, which has %.4g GiB; make the model smaller (model), or use more ranks with "
      "parallelism.zero_stage, or fewer ranks per node",
      table.parameter_count(), rank / kGiB, e->parameter_bytes / kGiB,
      gradients_on_host ? e->gradient_bytes / kGiB : 0.0, e->optimizer_bytes / kGiB,
      rank * ranks / kGiB, ranks, machine / kGiB)));
}

absl::StatusOr<int64_t> EstimateRankStateBytes(const TrainConfig& config, int world) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      CreateModel(config.model, DescribeJobData(config)));
  RM_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(RankMemoryOptions(
                                            config, model->table(), std::max(1, world))));
  return static_cast<int64_t>(e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes);
}

}  // namespace ringmaster::train
