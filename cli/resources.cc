#include "cli/resources.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "config/train_config.h"
#include "train/rank_memory.h"

namespace ringmaster::cli {

std::string FillMemoryEstimate(JobSpec* spec) {
  if (spec->resources().memory_per_rank_mib() != 0) return "";
  absl::StatusOr<train::TrainConfig> config = config::TrainConfigFromSpec(*spec);
  if (!config.ok()) return "";
  absl::StatusOr<int64_t> bytes =
      train::EstimateRankStateBytes(*config, std::max(1, spec->elastic().min_ranks()));
  if (!bytes.ok() || *bytes <= 0) return "";
  const int64_t mib = (*bytes + (1 << 20) - 1) >> 20;
  spec->mutable_resources()->set_memory_per_rank_mib(mib);
  return absl::StrCat("memory per rank: ", mib,
                      " MiB (estimated from the model; resources.memory_per_rank_mib states it)");
}

}  // namespace ringmaster::cli
