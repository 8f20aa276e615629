#include "train/process_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "kernels/matmul.h"
#include "train/fsdp.h"
#include "train/memory_plan.h"

namespace ringmaster::train {
namespace {

constexpr double kMiB = 1 << 20;

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / kMiB); }

// Has the BLAS library map this thread's workspace now, by a small product, so that the
// process's data size holds it (OpenBLAS maps it at a thread's first product, and loops for
// ever when it cannot).
void MapBlasWorkspace() {
  static thread_local bool mapped = false;
  if (mapped) return;
  constexpr int kSide = 64;  // big enough for OpenBLAS's buffered path
  std::vector<float> a(kSide * kSide, 0.0f), c(kSide * kSide);
  kernels::MatMul(kernels::Transpose::kNo, kernels::Transpose::kNo, kSide, kSide, kSide,
                  a.data(), a.data(), c.data(), kernels::OutputMode::kOverwrite);
  mapped = true;
}

}  // namespace

std::optional<ProcessMemoryLimit> ReadProcessMemoryLimit() {
  std::optional<ProcessMemoryLimit> limit;
  const struct {
    int resource;
    const char* source;
    const char* counted;
  } kinds[] = {
      {RLIMIT_DATA,
       "RLIMIT_DATA, this process's data limit (ringworker --trainer_memory_limit_mib, "
       "ringctl local --rank_memory_limit, ulimit -d)",
       "VmData"},
      {RLIMIT_AS, "RLIMIT_AS, this process's address-space limit (ulimit -v)", "VmSize"},
  };
  for (const auto& kind : kinds) {
    struct rlimit r;
    if (getrlimit(kind.resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) continue;
    const int64_t bytes = static_cast<int64_t>(r.rlim_cur);
    if (!limit || bytes < limit->bytes) {
      limit = ProcessMemoryLimit{bytes, kind.source, kind.counted};
    }
  }
  return limit;
}

int64_t ProcessMappedBytes(const ProcessMemoryLimit& limit) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = limit.counted + ":";
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    rest = absl::StripSuffix(absl::StripAsciiWhitespace(rest), "kB");
    int64_t kib = 0;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib) ? kib * 1024 : 0;
  }
  return 0;
}

absl::StatusOr<RankStateBytes> PlanRankState(const RankStateInputs& inputs) {
  if (inputs.config == nullptr || inputs.model == nullptr || inputs.strategy == nullptr) {
    return absl::InvalidArgumentError("PlanRankState: a config, a model and a strategy");
  }
  const TrainConfig& config = *inputs.config;
  RankStateBytes state;
  state.moments = OptimizerMoments(config.optimizer);
  state.parameters = inputs.strategy->local_elements() * 4;
  if (inputs.state_on_host) {
    state.gradients = state.parameters;
    state.optimizer = inputs.strategy->update_window().size() * 4 * state.moments;
  }
  if (!config.checkpoint.dir.empty()) {
    int64_t saved = 0;
    for (const state::PlacedRange& p : inputs.strategy->saved_pieces()) saved += p.range.size();
    constexpr int64_t kPage = int64_t{2} << 20;
    const int64_t snapshot = saved * 4 * (1 + state.moments);
    state.checkpoint_staging = snapshot > 0 ? ((snapshot + kPage - 1) / kPage + 1) * kPage : 0;
  }
  if (!UsesShardedStrategy(config)) return state;
  // The unit buffers' bound and ZeRO-2's compute copy as train/memory_plan.h plans them, for
  // where this rank trains (device auto resolved).
  TrainConfig resolved = config;
  resolved.device =
      inputs.state_on_host ? TrainConfig::Device::kCpu : TrainConfig::Device::kCuda;
  RM_ASSIGN_OR_RETURN(const RankMemoryPlan plan,
                      train::PlanRankState(resolved, *inputs.model, std::max(1, inputs.world),
                                           config.zero_stage, config.fsdp.wrap));
  state.unit_buffers = plan.unit_buffer_bytes;
  if (config.zero_stage == 2) state.compute_copy = plan.compute_copy_bytes;
  return state;
}

absl::Status CheckRankStateFits(const RankStateBytes& state, int64_t in_use,
                                int64_t blas_workspace, const ProcessMemoryLimit& limit,
                                int world, int zero_stage) {
  const int64_t needed = in_use + state.total() + blas_workspace;
  if (needed <= limit.bytes) return absl::OkStatus();
  const std::string advice =
      zero_stage == 3
          ? absl::StrFormat("run on more ranks (parallelism.zero_stage: 3 keeps 1/N of the "
                            "parameters, gradients and optimizer state on each of N ranks; "
                            "this is %d)",
                            world)
          : absl::StrFormat("shard the state with parallelism.zero_stage: 3 (each of N ranks "
                            "keeps 1/N of the parameters, gradients and optimizer state), on "
                            "%d or more ranks",
                            world);
  return MarkPermanent(absl::ResourceExhaustedError(absl::StrCat(
      "out of memory: this rank's training state does not fit its memory limit of ",
      MiB(limit.bytes), " (", limit.source, "): it needs ", MiB(state.total()), " (parameters ",
      MiB(state.parameters), ", gradients ", MiB(state.gradients), ", optimizer state ",
      MiB(state.optimizer), " for ", state.moments, " moment(s), unit buffers ",
      MiB(state.unit_buffers),
      state.checkpoint_staging > 0
          ? absl::StrCat(", checkpoint staging ", MiB(state.checkpoint_staging))
          : "",
      ")",
      state.compute_copy > 0
          ? absl::StrCat(" besides ZeRO-2's compute copy of ", MiB(state.compute_copy))
          : "",
      " on top of the ", MiB(in_use),
      " the process has mapped already (libraries, thread stacks, the BLAS library's workspace, "
      "the data and the model)",
      blas_workspace > 0 ? absl::StrCat(" and the ", MiB(blas_workspace),
                                        " the BLAS library maps at its first "
                                        "product")
                         : "",
      ": ", MiB(needed), " in all, and activations and batches come on top; ", advice,
      ", or raise the limit")));
}

absl::Status CheckProcessMemoryLimit(const RankStateInputs& inputs) {
  const std::optional<ProcessMemoryLimit> limit = ReadProcessMemoryLimit();
  if (!limit) return absl::OkStatus();
  RM_ASSIGN_OR_RETURN(const RankStateBytes state, PlanRankState(inputs));
  int64_t in_use = ProcessMappedBytes(*limit);
  int64_t blas_workspace = kBlasWorkspaceBytes;
  if (in_use + blas_workspace <= limit->bytes) {  // else the product could not get it
    MapBlasWorkspace();
    in_use = ProcessMappedBytes(*limit);
    blas_workspace = 0;
  }
  return CheckRankStateFits(state, in_use, blas_workspace, *limit, inputs.world,
                            inputs.config->zero_stage);
}

}  // namespace ringmaster::train
