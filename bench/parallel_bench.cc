#include "bench/parallel_bench.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace ringmaster::bench {
namespace {

constexpr char kLayoutsFlag[] = "parallel_layouts";
constexpr const char* kSchedules[] = {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"};

absl::Status LayoutError(absl::string_view item, absl::string_view problem) {
  return FlagError(kLayoutsFlag, absl::StrCat("\"", item, "\": ", problem));
}

bool KnownSchedule(absl::string_view s) {
  return std::find(std::begin(kSchedules), std::end(kSchedules), s) != std::end(kSchedules);
}

constexpr double kMiB = 1 << 20;

std::string MiB(double bytes) { return absl::StrFormat("%.2f", bytes / kMiB); }

}  // namespace

std::string ParallelLayout::Name() const {
  std::vector<std::string> parts;
  if (tp > 1) parts.push_back(absl::StrCat("tp", tp));
  if (pp > 1) parts.push_back(absl::StrCat("pp", pp));
  if (dp > 1 || parts.empty()) parts.push_back(absl::StrCat("dp", dp));
  std::string name = absl::StrJoin(parts, ".");
  if (pp > 1) absl::StrAppend(&name, " ", schedule);
  if (virtual_stages > 1) absl::StrAppend(&name, " v", virtual_stages);
  return name;
}

absl::StatusOr<std::vector<ParallelLayout>> ParseParallelLayouts(
    absl::string_view text, int world, const std::string& default_schedule) {
  std::vector<ParallelLayout> layouts;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> at = absl::StrSplit(item, absl::MaxSplits('@', 1));
    ParallelLayout l;
    int dp = 0;  // 0: the rest of the world
    for (absl::string_view part : absl::StrSplit(at[0], '.')) {
      int* size = nullptr;
      absl::string_view digits = part;
      if (absl::ConsumePrefix(&digits, "tp")) {
        size = &l.tp;
      } else if (absl::ConsumePrefix(&digits, "pp")) {
        size = &l.pp;
      } else if (absl::ConsumePrefix(&digits, "dp")) {
        size = &dp;
        if (digits.empty()) continue;  // "dp": the rest
      } else {
        return LayoutError(item, absl::StrCat("unknown part \"", part,
                                              "\"; write tpN, ppN and dpN joined by '.'"));
      }
      if (!absl::SimpleAtoi(digits, size) || *size < 1) {
        return LayoutError(item, absl::StrCat("\"", part, "\" needs a size of at least 1"));
      }
    }
    if (world % (l.tp * l.pp) != 0) {
      return LayoutError(item, absl::StrCat("tp x pp = ", l.tp * l.pp, " does not divide the ",
                                            world, " ranks of --parallel_world"));
    }
    l.dp = world / (l.tp * l.pp);
    if (dp != 0 && dp != l.dp) {
      return LayoutError(item, absl::StrCat("tp x pp x dp = ", l.tp * l.pp * dp, ", not the ",
                                            world, " ranks of --parallel_world"));
    }
    if (at.size() > 1) {
      if (l.pp == 1) return LayoutError(item, "a schedule needs pipeline parallelism (ppN)");
      if (!KnownSchedule(at[1])) {
        return LayoutError(item, absl::StrCat("unknown schedule \"", at[1],
                                              "\"; use gpipe, 1f1b, interleaved_1f1b or "
                                              "zero_bubble"));
      }
      l.schedule = std::string(at[1]);
    } else if (l.pp > 1) {
      if (!KnownSchedule(default_schedule)) {
        return FlagError("parallel_schedule",
                         absl::StrCat("unknown schedule \"", default_schedule, "\" (for \"", item,
                                      "\"); use gpipe, 1f1b, interleaved_1f1b or zero_bubble"));
      }
      l.schedule = default_schedule;
    }
    if (l.schedule == "interleaved_1f1b") l.virtual_stages = 2;
    layouts.push_back(l);
  }
  if (layouts.empty()) return FlagError(kLayoutsFlag, "name at least one layout");
  return layouts;
}

absl::Status CheckParallelConfig(const ParallelConfig& config,
                                 const std::vector<ParallelLayout>& layouts) {
  if (config.global_batch % config.world != 0) {
    return FlagError("parallel_batch",
                     absl::StrCat(config.global_batch, " sequences do not split evenly over the ",
                                  config.world, " ranks of --parallel_world"));
  }
  RM_RETURN_IF_ERROR(CheckGptFlags(config.gpt, config.global_batch / config.world, config.steps,
                                   config.warmup_steps, config.log_every, config.world));
  if (config.micro_batches < 1) return FlagError("parallel_micro_batches", "must be at least 1");
  for (const ParallelLayout& l : layouts) {
    if (config.gpt.heads % l.tp != 0) {
      return FlagError(kLayoutsFlag, absl::StrCat(l.Name(), ": tp ", l.tp, " does not divide the ",
                                                  config.gpt.heads, " heads of --gpt_heads"));
    }
    if (l.pp * l.virtual_stages > config.gpt.layers) {
      return FlagError(kLayoutsFlag, absl::StrCat(l.Name(), ": ", l.pp * l.virtual_stages,
                                                  " stages, more than the ", config.gpt.layers,
                                                  " blocks of --gpt_layers"));
    }
    if (l.pp > 1 && config.micro_batches > config.global_batch / l.dp) {
      return FlagError(
          "parallel_micro_batches",
          absl::StrCat(config.micro_batches, " micro-batches, but ", l.Name(), "'s replicas get ",
                       config.global_batch / l.dp, " sequences each"));
    }
    if (l.virtual_stages > 1 && config.micro_batches % l.pp != 0) {
      return FlagError("parallel_micro_batches",
                       absl::StrCat(l.Name(), " needs a multiple of ", l.pp, " micro-batches"));
    }
  }
  return absl::OkStatus();
}

LocalJobOptions ParallelJob(const RingmasterOptions& options, const ParallelConfig& config,
                            const ParallelLayout& layout) {
  TrainConfig c;
  c.model = "gpt";
  c.gpt = config.gpt;
  c.world = config.world;
  c.threads = config.threads;
  c.batch_per_rank = config.global_batch / config.world;
  c.steps = config.steps;
  c.log_every = config.log_every;
  c.warmup_steps = config.warmup_steps;
  c.lr = config.lr;
  LocalJobOptions job = RingmasterJob(options, c);
  std::string name = layout.Name();
  std::replace(name.begin(), name.end(), ' ', '-');
  job.run_name = absl::StrCat("parallel-", name);
  job.overrides.push_back(absl::StrCat("parallelism.mesh.tp=", layout.tp));
  job.overrides.push_back(absl::StrCat("parallelism.mesh.pp=", layout.pp));
  if (layout.pp > 1) {
    job.overrides.push_back("parallelism.pipeline.schedule=" + layout.schedule);
    job.overrides.push_back(
        absl::StrCat("parallelism.pipeline.micro_batches=", config.micro_batches));
    job.overrides.push_back(
        absl::StrCat("parallelism.pipeline.virtual_stages=", layout.virtual_stages));
  }
  return job;
}

absl::StatusOr<ParallelRun> RunParallelLayout(const RingmasterOptions& options,
                                              const ParallelConfig& config,
                                              const ParallelLayout& layout) {
  RM_ASSIGN_OR_RETURN(LocalJobRun local,
                      RunLocalJob(options, ParallelJob(options, config, layout)));
  ParallelRun run;
  run.layout = layout;
  RM_ASSIGN_OR_RETURN(run.stats, SummarizeWindows(local.windows, config.warmup_steps));
  const std::string path = local.job_dir + "/summary.json";
  RM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (absl::Status s = FromJson(text, &run.summary, path); !s.ok()) {
    return absl::InternalError(s.message());
  }
  if (run.summary.ranks_size() != config.world) {
    return absl::InternalError(absl::StrCat(path, " lists ", run.summary.ranks_size(),
                                            " ranks' figures; the job had ", config.world));
  }
  return run;
}

ParallelFigures Figures(const ParallelRun& run, int64_t context) {
  ParallelFigures f;
  f.step_ms = run.stats.step_ms;
  f.tokens_per_second = run.stats.samples_per_second * static_cast<double>(context);
  const int n = run.summary.ranks_size();
  double bubble = 0;
  for (const train::RankResult& r : run.summary.ranks()) {
    f.peak_rss_bytes = std::max(f.peak_rss_bytes, r.peak_rss_bytes());
    f.state_bytes = std::max(f.state_bytes,
                             r.parameter_bytes() + r.gradient_bytes() + r.optimizer_state_bytes());
    f.activation_bytes = std::max(f.activation_bytes, r.activation_bytes_peak());
    f.block_parameters = std::max(f.block_parameters, r.block_parameters());
    f.pp_bytes_per_step += r.pipeline_bytes_per_step() / n;
    f.tp_bytes_per_step += r.tensor_parallel_bytes_per_step() / n;
    f.dp_bytes_per_step += std::max(0.0, r.comm_bytes_per_step() - r.pipeline_bytes_per_step() -
                                             r.tensor_parallel_bytes_per_step()) /
                           n;
    bubble += r.pipeline_bubble() / n;
  }
  if (run.layout.pp > 1) {
    f.bubble = bubble;
    f.bubble_formula = run.summary.pipeline_bubble_formula();
  }
  return f;
}

std::string ParallelTable(const std::vector<ParallelRun>& runs, const ParallelConfig& config) {
  const GptShape& g = config.gpt;
  std::string out = absl::StrFormat(
      "GPT %d blocks x %d wide, %d heads, context %d, byte vocabulary; %d ranks, %d "
      "sequences a step, %d pipeline micro-batches, %d BLAS thread(s) per rank, AdamW, fp32\n"
      "step time and tokens/s: median of %d-step windows after %d warm-up steps; memory: the "
      "largest rank's; sent: MiB per rank per step (mean over ranks); bubble: mean over ranks\n",
      g.layers, g.width, g.heads, g.context, config.world, config.global_batch,
      config.micro_batches, config.threads, config.log_every, config.warmup_steps);
  absl::StrAppendFormat(&out, "%-26s %8s %9s %6s %8s %8s %8s %10s %7s %7s %7s %7s %7s\n", "layout",
                        "step ms", "tokens/s", "vs dp", "RSS MiB", "state", "activ", "block par",
                        "sent dp", "pp", "tp", "bubble", "formula");
  double dp_tokens = -1;
  for (const ParallelRun& run : runs) {
    if (run.layout.tp == 1 && run.layout.pp == 1) {
      dp_tokens = Figures(run, g.context).tokens_per_second;
      break;
    }
  }
  for (const ParallelRun& run : runs) {
    const ParallelFigures f = Figures(run, g.context);
    auto percent = [](double v) {
      return v < 0 ? std::string("-") : absl::StrFormat("%.1f%%", 100 * v);
    };
    absl::StrAppendFormat(
        &out, "%-26s %8.0f %9s %6s %8.1f %8s %8s %10s %7s %7s %7s %7s %7s\n", run.layout.Name(),
        f.step_ms, Thousands(f.tokens_per_second),
        dp_tokens > 0 ? absl::StrFormat("%.2f", f.tokens_per_second / dp_tokens) : "-",
        f.peak_rss_bytes / kMiB, MiB(f.state_bytes), MiB(f.activation_bytes),
        Thousands(f.block_parameters), MiB(f.dp_bytes_per_step), MiB(f.pp_bytes_per_step),
        MiB(f.tp_bytes_per_step), percent(f.bubble), percent(f.bubble_formula));
  }
  absl::StrAppend(
      &out,
      "state = parameters + gradients + optimizer state; activ = activations' peak; block "
      "par = elements of the transformer blocks a rank computes with; sent dp = the "
      "data-parallel reduction and the small sums; formula = the schedule's bubble "
      "((P-1)/(m+P-1) for gpipe and 1f1b)\n");
  return out;
}

std::string TensorParallelGoalLine(const std::vector<ParallelRun>& runs) {
  const ParallelRun *tp1 = nullptr, *tp2 = nullptr;
  for (const ParallelRun& run : runs) {
    if (run.layout.pp != 1) continue;
    if (run.layout.tp == 1 && tp1 == nullptr) tp1 = &run;
    if (run.layout.tp == 2 && tp2 == nullptr) tp2 = &run;
  }
  constexpr char kGoal[] = "goal: TP2's block parameters per rank half of TP1's (+-2 %)";
  if (tp1 == nullptr || tp2 == nullptr) {
    return absl::StrCat(kGoal,
                        ": not checked (needs a layout with tp 1 and one with tp 2, "
                        "both with pp 1, in --parallel_layouts)");
  }
  const double one = Figures(*tp1, 1).block_parameters;
  const double two = Figures(*tp2, 1).block_parameters;
  if (!(one > 0)) return absl::StrCat(kGoal, ": not checked (TP1 reported no block parameters)");
  const double ratio = two / one;
  return absl::StrFormat("%s: %s (%.3f x: %s vs %s)", kGoal,
                         std::abs(ratio - 0.5) <= 0.01 ? "PASS" : "MISS", ratio, Thousands(two),
                         Thousands(one));
}

}  // namespace ringmaster::bench
