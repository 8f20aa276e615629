#include "bench/fsdp_bench.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "train/fsdp.h"
#include "train/grad_sync.h"
#include "train/model_factory.h"

namespace ringmaster::bench {
namespace {

constexpr double kMiB = 1 << 20;

int WireBytes(train::Precision p) { return p == train::Precision::kFloat32 ? 4 : 2; }

// The number after `key` in `line` (up to the next space), in MiB, as bytes; false when the
// key is absent or the number unreadable.
bool MiBAfter(absl::string_view line, absl::string_view key, double* bytes) {
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return false;
  absl::string_view rest = line.substr(at + key.size());
  double mib = 0;
  if (!absl::SimpleAtod(rest.substr(0, rest.find(' ')), &mib)) return false;
  *bytes = mib * kMiB;
  return true;
}

// "B/C": bytes and calls.
bool BytesAndCalls(absl::string_view text, double* bytes, double* calls) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '/');
  return parts.size() == 2 && absl::SimpleAtod(parts[0], bytes) &&
         absl::SimpleAtod(parts[1], calls) && *bytes >= 0 && *calls >= 0;
}

}  // namespace

const char kFsdpJobSpec[] = R"(# Written by fsdpbench.
name: fsdpbench
seed: 1
steps: 12
model:
  gpt: {layers: 8, heads: 4, width: 256, context: 256, vocab: 256}
data:
  text: {path: /usr/share/common-licenses/GPL-3}
  eval_every_epoch: false
optimizer:
  adamw: {beta1: 0.9, beta2: 0.95}
  lr: 0.0003
schedule:
  decay: constant
batch:
  global: 4
parallelism:
  threads: 1
diagnostics:
  fingerprint_every: 0
  log_every: 2
)";

std::string CaseLabel(const FsdpCase& c) {
  std::string label = c.zero_stage == 0 ? "DDP" : absl::StrCat("ZeRO-", c.zero_stage);
  if (c.zero_stage == 3) absl::StrAppend(&label, " ", c.wrap, ", prefetch ", c.prefetch);
  if (c.compute != "fp32") absl::StrAppend(&label, ", ", c.compute);
  if (c.reduce != "fp32") absl::StrAppend(&label, ", reduce ", c.reduce);
  return label;
}

std::vector<std::string> CaseOverrides(const FsdpCase& c, const GptBenchSize& size, int threads) {
  std::vector<std::string> sets = {
      absl::StrCat("model.gpt.layers=", size.layers),
      absl::StrCat("model.gpt.heads=", size.heads),
      absl::StrCat("model.gpt.width=", size.width),
      absl::StrCat("model.gpt.context=", size.context),
      absl::StrCat("data.text.path=", size.text),
      absl::StrCat("batch.global=", size.batch_per_rank * c.world),
      absl::StrCat("steps=", size.steps),
      absl::StrCat("diagnostics.log_every=", size.log_every),
      absl::StrCat("parallelism.threads=", threads),
      absl::StrCat("parallelism.zero_stage=", c.zero_stage),
      absl::StrCat("precision.compute=", c.compute),
  };
  if (c.zero_stage >= 2) sets.push_back(absl::StrCat("precision.reduce=", c.reduce));
  if (c.zero_stage == 3) {
    sets.push_back(absl::StrCat("parallelism.fsdp.wrap=", c.wrap));
    sets.push_back(absl::StrCat("parallelism.fsdp.prefetch=", c.prefetch));
  }
  return sets;
}

absl::StatusOr<std::string> CaseSpecYaml(const FsdpCase& c, const GptBenchSize& size,
                                         int threads) {
  RM_ASSIGN_OR_RETURN(JobSpec spec,
                      spec::LoadJobSpecText(kFsdpJobSpec, CaseOverrides(c, size, threads)));
  return spec::JobSpecToYaml(spec);
}

StepTraffic DataParallelTraffic(int64_t padded_elements, int world, int zero_stage) {
  StepTraffic t;
  const double moved = static_cast<double>(padded_elements) * 4 * (world - 1) / world;
  t.all_reduce = 2 * moved;
  if (zero_stage == 1) t.all_gather = moved;
  return t;
}

StepTraffic ShardedTraffic(const train::FsdpLayout& layout, int zero_stage,
                           bool reshard_after_forward, int gather_bytes, int reduce_bytes) {
  StepTraffic t;
  if (zero_stage == 3) {
    const train::PassTraffic pass =
        train::Zero3PassTraffic(layout, reshard_after_forward, gather_bytes, reduce_bytes);
    t.all_gather = static_cast<double>(pass.all_gather_bytes);
    t.reduce_scatter = static_cast<double>(pass.reduce_scatter_bytes);
    return t;
  }
  for (const train::FsdpUnit& u : layout.units) {
    const double moved = static_cast<double>(u.shard) * (layout.world - 1);
    t.reduce_scatter += moved * reduce_bytes;
    t.all_gather += moved * gather_bytes;
  }
  return t;
}

absl::StatusOr<CaseFormula> FormulaFor(const FsdpCase& c, const GptBenchSize& size) {
  RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kFsdpJobSpec, CaseOverrides(c, size, 1)));
  RM_ASSIGN_OR_RETURN(train::TrainConfig config, config::TrainConfigFromSpec(spec));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<train::Model> model,
                      train::CreateModel(config.model, train::DescribeJobData(config)));
  CaseFormula f;
  f.parameters = model->table().parameter_count();
  if (c.zero_stage < 2) {
    f.traffic = DataParallelTraffic(
        train::PaddedElements(model->table().total_elements(), c.world), c.world, c.zero_stage);
    return f;
  }
  train::ShardedOptions o = train::ShardedOptionsFor(config, *model);
  o.zero_stage = c.zero_stage;
  RM_ASSIGN_OR_RETURN(train::FsdpLayout layout, train::ShardedLayout(o, c.world));
  f.traffic = ShardedTraffic(layout, c.zero_stage, config.fsdp.reshard_after_forward,
                             WireBytes(config.precision), WireBytes(config.reduce_precision));
  f.units = static_cast<int>(layout.units.size());
  f.largest_unit_bytes = static_cast<double>(layout.largest_unit) * 4;
  f.units_description = layout.Describe();
  return f;
}

absl::StatusOr<std::vector<RankMemory>> ParseRankMemory(absl::string_view logs) {
  constexpr absl::string_view kStart = "memory on rank ";
  std::map<int, RankMemory> by_rank;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(logs, '\n')) {
    ++line_number;
    const size_t at = line.find(kStart);
    if (at == absl::string_view::npos) continue;
    line = line.substr(at + kStart.size());
    RankMemory m;
    const bool ok =
        absl::SimpleAtoi(line.substr(0, line.find(' ')), &m.rank) && m.rank >= 0 &&
        MiBAfter(line, ": parameters ", &m.parameters) &&
        MiBAfter(line, ", gradients ", &m.gradients) &&
        MiBAfter(line, ", optimizer state ", &m.optimizer) &&
        MiBAfter(line, ", activations peak ", &m.activations);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": not a memory line the bench can read: \"",
                       line.substr(0, 200), "\""));
    }
    // Optional parts: a copy of the parameters, the unit buffers (ZeRO-2/3).
    if (!MiBAfter(line, "(+ the whole compute copy, ", &m.compute_copy)) {
      MiBAfter(line, "(+ a 16-bit copy, ", &m.compute_copy);
    }
    MiBAfter(line, ", unit buffers peak ", &m.unit_buffers);
    MiBAfter(line, ", peak RSS ", &m.peak_rss);
    by_rank.emplace(m.rank, m);
  }
  std::vector<RankMemory> ranks;
  for (const auto& [rank, m] : by_rank) ranks.push_back(m);
  return ranks;
}

void UseExactBytes(const train::TrainResult& summary, std::vector<RankMemory>* ranks) {
  for (const train::RankResult& exact : summary.ranks()) {
    for (RankMemory& m : *ranks) {
      if (m.rank != exact.rank()) continue;
      if (m.compute_copy == 0) m.parameters = exact.parameter_bytes();
      m.gradients = exact.gradient_bytes();
      m.optimizer = exact.optimizer_state_bytes();
      m.activations = exact.activation_bytes_peak();
      m.unit_buffers = exact.unit_buffer_bytes();
    }
  }
}

std::string ProbeTrafficLine(int rank, int64_t steps, const StepTraffic& t) {
  return absl::StrFormat("traffic rank=%d steps=%d all_gather=%.0f/%.0f reduce_scatter=%.0f/%.0f "
                         "all_reduce=%.0f/%.0f",
                         rank, steps, t.all_gather, t.all_gather_calls, t.reduce_scatter,
                         t.reduce_scatter_calls, t.all_reduce, t.all_reduce_calls) +
         (t.link_tx_bytes < 0 ? ""
                              : absl::StrFormat(" link_tx=%.0f link_drops=%.0f", t.link_tx_bytes,
                                                t.link_drops));
}

absl::StatusOr<std::vector<StepTraffic>> ParseProbeTraffic(absl::string_view output) {
  std::map<int, StepTraffic> by_rank;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    ++line_number;
    if (!absl::ConsumePrefix(&line, "traffic ")) continue;
    std::map<std::string, std::string> kv;
    for (absl::string_view item : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
      std::pair<std::string, std::string> p = absl::StrSplit(item, absl::MaxSplits('=', 1));
      kv[p.first] = p.second;
    }
    int rank = -1;
    int64_t steps = 0;
    StepTraffic t;
    const bool ok = absl::SimpleAtoi(kv["rank"], &rank) && rank >= 0 &&
                    absl::SimpleAtoi(kv["steps"], &steps) && steps > 0 &&
                    BytesAndCalls(kv["all_gather"], &t.all_gather, &t.all_gather_calls) &&
                    BytesAndCalls(kv["reduce_scatter"], &t.reduce_scatter,
                                  &t.reduce_scatter_calls) &&
                    BytesAndCalls(kv["all_reduce"], &t.all_reduce, &t.all_reduce_calls) &&
                    (kv.count("link_tx") == 0 ||
                     (absl::SimpleAtod(kv["link_tx"], &t.link_tx_bytes) &&
                      absl::SimpleAtod(kv["link_drops"], &t.link_drops)));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, ": not a traffic line (want \"traffic rank=R steps=K "
          "all_gather=B/C reduce_scatter=B/C all_reduce=B/C\"): \"", line, "\""));
    }
    const double k = static_cast<double>(steps);
    for (double* v : {&t.all_gather, &t.reduce_scatter, &t.all_reduce, &t.all_gather_calls,
                      &t.reduce_scatter_calls, &t.all_reduce_calls}) {
      *v /= k;
    }
    if (t.link_tx_bytes >= 0) {
      t.link_tx_bytes /= k;
      t.link_drops /= k;
    }
    by_rank[rank] = t;
  }
  if (by_rank.empty()) return absl::NotFoundError("no \"traffic rank=...\" line in the output");
  std::vector<StepTraffic> ranks;
  for (const auto& [rank, t] : by_rank) ranks.push_back(t);
  return ranks;
}

std::optional<StepTraffic> TrafficFromSummary(absl::string_view summary_json) {
  const nlohmann::json j = nlohmann::json::parse(summary_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto number = [&j](const char* key) -> std::optional<double> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const std::optional<double> gathered = number("gathered_bytes");
  const std::optional<double> reduced = number("reduced_bytes");
  const std::optional<double> steps = number("steps");
  if (!gathered || !reduced || !steps || *steps <= 0) return std::nullopt;
  StepTraffic t;
  t.all_gather = *gathered / *steps;
  t.reduce_scatter = *reduced / *steps;  // reduce-scatters and all-reduces together
  return t;
}

namespace {

// measured / reference <= limit; not met without a positive reference.
GoalCheck RatioGoal(std::string name, double measured, double reference, double limit,
                    std::string numbers) {
  GoalCheck g;
  g.name = std::move(name);
  g.limit = limit;
  g.ratio = reference > 0 ? measured / reference : 0;
  g.pass = reference > 0 && g.ratio <= limit;
  g.numbers = std::move(numbers);
  return g;
}

}  // namespace

GoalCheck StepTimeGoal(double zero3_step_ms, double ddp_step_ms) {
  return RatioGoal("ZeRO-3 block+prefetch step time <= 1.15 x DDP's (world 2)", zero3_step_ms,
                   ddp_step_ms, 1.15,
                   absl::StrFormat("%.1f ms vs DDP %.1f ms", zero3_step_ms, ddp_step_ms));
}

GoalCheck ExposedGoal(double prefetch_exposed_ms, double no_prefetch_exposed_ms) {
  return RatioGoal("its exposed communication <= 0.5 x without prefetch", prefetch_exposed_ms,
                   no_prefetch_exposed_ms, 0.5,
                   absl::StrFormat("%.2f ms/step vs %.2f ms/step without prefetch",
                                   prefetch_exposed_ms, no_prefetch_exposed_ms));
}

GoalCheck MemoryGoal(const RankMemory& zero3, double ddp_state_bytes, int world,
                     double largest_unit_bytes) {
  const double bound = ddp_state_bytes / world + 2 * largest_unit_bytes + zero3.activations;
  return RatioGoal(
      absl::StrCat("peak memory of rank ", zero3.rank, " <= DDP state / N + 2 units + activations"),
      zero3.peak(), bound, 1,
      absl::StrFormat(
      "peak %.2f MiB (state %.2f + unit buffers %.2f + activations %.2f) vs bound %.2f MiB "
      "(DDP state %.2f / %d = %.2f + 2 x unit %.2f + activations %.2f)",
      zero3.peak() / kMiB, zero3.state() / kMiB, zero3.unit_buffers / kMiB,
      zero3.activations / kMiB, bound / kMiB, ddp_state_bytes / kMiB, world,
      ddp_state_bytes / world / kMiB, largest_unit_bytes / kMiB, zero3.activations / kMiB));
}

}  // namespace ringmaster::bench
