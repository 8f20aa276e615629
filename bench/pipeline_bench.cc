#include "bench/pipeline_bench.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/matmul.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/random.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/gpt_stage.h"

namespace ringmaster::bench {
namespace {

using train::Batch;
using train::ForwardBackwardOptions;
using train::pipeline::Costs;
using train::pipeline::GptStage;
using train::pipeline::PipelineExecutorOptions;
using train::pipeline::PipelineRunStats;
using train::pipeline::PipelineStage;
using train::pipeline::Schedule;
using train::pipeline::ScheduleKind;
using train::pipeline::ScheduleName;
using train::pipeline::ScheduleOptions;

constexpr absl::Duration kTimeout = absl::Seconds(120);

// A stage whose calls are timed: the forward, the whole backward, and zero_bubble's
// input-gradient and weight parts, each summed with its count of calls.
class TimedStage final : public PipelineStage {
 public:
  struct Sum {
    absl::Duration time;
    absl::Duration cpu;  // the thread's CPU time
    int calls = 0;
    double mean_ms() const { return calls == 0 ? 0 : absl::ToDoubleMilliseconds(time) / calls; }
  };

  explicit TimedStage(PipelineStage* inner) : inner_(inner) {}

  void Reset() { forward_ = backward_ = backward_input_ = backward_weight_ = Sum(); }
  const Sum& forward() const { return forward_; }
  const Sum& backward() const { return backward_; }
  const Sum& backward_input() const { return backward_input_; }
  const Sum& backward_weight() const { return backward_weight_; }

  int64_t input_elements(int micro) const override { return inner_->input_elements(micro); }
  int64_t output_elements(int micro) const override { return inner_->output_elements(micro); }
  absl::Status Forward(int micro, absl::Span<const float> input,
                       absl::Span<float> output) override {
    return Timed(&forward_, [&] { return inner_->Forward(micro, input, output); });
  }
  absl::Status Backward(int micro, absl::Span<const float> output_grad,
                        absl::Span<float> input_grad) override {
    return Timed(&backward_, [&] { return inner_->Backward(micro, output_grad, input_grad); });
  }
  absl::Status BackwardInput(int micro, absl::Span<const float> output_grad,
                             absl::Span<float> input_grad) override {
    return Timed(&backward_input_,
                 [&] { return inner_->BackwardInput(micro, output_grad, input_grad); });
  }
  absl::Status BackwardWeight(int micro) override {
    return Timed(&backward_weight_, [&] { return inner_->BackwardWeight(micro); });
  }

 private:
  template <typename F>
  static absl::Status Timed(Sum* sum, const F& call) {
    const absl::Time start = absl::Now();
    const absl::Duration cpu_start = ThreadCpuTime();
    absl::Status s = call();
    sum->cpu += ThreadCpuTime() - cpu_start;
    sum->time += absl::Now() - start;
    ++sum->calls;
    return s;
  }

  static absl::Duration ThreadCpuTime() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return absl::DurationFromTimespec(t);
  }

  PipelineStage* inner_;
  Sum forward_, backward_, backward_input_, backward_weight_;
};

// n samples of context + 1 token ids, uniform over the vocabulary.
Batch RandomSamples(int64_t n, const PipelineBenchOptions& o, uint64_t seed) {
  Batch b;
  b.size = n;
  b.context = o.context;
  train::nn::SplitMix64 rng(seed);
  b.tokens.resize(n * (o.context + 1));
  for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.Next() % o.vocab);
  return b;
}

train::nn::GptOptions Gpt(const PipelineBenchOptions& o) {
  train::nn::GptOptions g;
  g.layers = o.layers;
  g.width = o.width;
  g.heads = o.heads;
  g.context = o.context;
  g.vocab = o.vocab;
  g.memory_efficient_attention = !o.keep_probabilities;
  return g;
}

// Why `schedule` × m cannot run on `ranks` ranks; empty when it can.
std::string WhySkipped(const PipelineBenchOptions& o, ScheduleKind kind, int m, int ranks,
                       int v) {
  if (kind == ScheduleKind::kInterleaved1F1B && m % ranks != 0) {
    return absl::StrCat("needs m a multiple of P (", ranks, ")");
  }
  if (o.layers < static_cast<int64_t>(ranks) * v) {
    return absl::StrCat("needs at least P·v = ", ranks * v, " blocks, --layers is ", o.layers);
  }
  return "";
}

// The stages rank `group.rank()` holds for one schedule, run for the warm-up and timed steps.
absl::StatusOr<PipelineRankMeasure> MeasureRank(comm::Communicator& group,
                                                const PipelineBenchOptions& o,
                                                const Schedule& schedule,
                                                const std::vector<Batch>& batches) {
  const int ranks = group.size(), rank = group.rank(), stages = schedule.stages();
  const int m = schedule.options.micro_batches;
  RM_ASSIGN_OR_RETURN(auto blocks, train::pipeline::SplitBlocks(o.layers, stages));
  struct Held {
    std::unique_ptr<GptStage> stage;
    std::unique_ptr<TimedStage> timed;
    state::FlatBuffer params, grads;
  };
  std::map<int, Held> held;
  PipelineExecutorOptions eo;
  eo.schedule = &schedule;
  eo.rank = rank;
  eo.comm = &group;
  eo.op_timeout = kTimeout;
  for (int st = rank; st < stages; st += ranks) {
    const train::nn::GptOptions slice = train::pipeline::StageOptions(Gpt(o), blocks, st);
    Held& h = held[st];
    RM_ASSIGN_OR_RETURN(h.stage, GptStage::Create(slice));
    const int64_t n = h.stage->model().table().total_elements();
    h.params = state::FlatBuffer(n);
    h.grads = state::FlatBuffer(n);
    h.stage->model().Init(o.seed, h.params);
    h.timed = std::make_unique<TimedStage>(h.stage.get());
    eo.stages[st] = h.timed.get();
  }
  ForwardBackwardOptions fb;
  fb.loss_divisor = static_cast<double>(m * o.batch * o.context);

  absl::Duration compute, total;
  PipelineRankMeasure r;
  for (int step = 0; step < kPipelineWarmupSteps + o.steps; ++step) {
    if (step == kPipelineWarmupSteps) {
      for (auto& [st, h] : held) h.timed->Reset();
    }
    for (auto& [st, h] : held) {
      RM_RETURN_IF_ERROR(h.stage->BeginStep(batches, h.params.span(), h.grads.span(), fb));
    }
    RM_ASSIGN_OR_RETURN(PipelineRunStats s, train::pipeline::RunPipeline(eo));
    if (step < kPipelineWarmupSteps) continue;
    compute += s.compute;
    total += s.total;
    r.peak_buffer_bytes = std::max(r.peak_buffer_bytes, s.peak_buffer_bytes);
  }
  absl::Duration cpu, wall;
  for (const auto& [st, h] : held) {
    for (const TimedStage::Sum* sum : {&h.timed->forward(), &h.timed->backward(),
                                       &h.timed->backward_input(), &h.timed->backward_weight()}) {
      cpu += sum->cpu;
      wall += sum->time;
    }
  }
  r.cpu_share = wall > absl::ZeroDuration() ? absl::FDivDuration(cpu, wall) : 0;
  const double total_ms = absl::ToDoubleMilliseconds(total);
  r.bubble = total_ms > 0 ? 1 - absl::ToDoubleMilliseconds(compute) / total_ms : 0;
  r.step_ms = total_ms / o.steps;
  r.tokens_per_s = r.step_ms > 0 ? m * o.batch * o.context / (r.step_ms / 1000) : 0;
  for (const auto& [st, h] : held) {
    const TimedStage& t = *h.timed;
    r.forward_ms += t.forward().mean_ms();
    r.backward_input_ms += t.backward().mean_ms() + t.backward_input().mean_ms();
    r.backward_weight_ms += t.backward_weight().mean_ms();
    r.activation_bytes += h.stage->activation_bytes();
    r.in_flight += static_cast<double>(h.stage->peak_in_flight()) /
                   schedule.options.virtual_stages;
  }
  return r;
}

// A rank's measure as doubles and back, for the all-gather.
constexpr int kMeasureFields = 10;

void Pack(const PipelineRankMeasure& r, double* out) {
  const double v[kMeasureFields] = {r.bubble,
                                    r.step_ms,
                                    r.tokens_per_s,
                                    r.forward_ms,
                                    r.backward_input_ms,
                                    r.backward_weight_ms,
                                    static_cast<double>(r.activation_bytes),
                                    static_cast<double>(r.peak_buffer_bytes),
                                    r.in_flight,
                                    r.cpu_share};
  std::copy(v, v + kMeasureFields, out);
}

PipelineRankMeasure Unpack(const double* v) {
  PipelineRankMeasure r;
  r.bubble = v[0];
  r.step_ms = v[1];
  r.tokens_per_s = v[2];
  r.forward_ms = v[3];
  r.backward_input_ms = v[4];
  r.backward_weight_ms = v[5];
  r.activation_bytes = static_cast<int64_t>(v[6]);
  r.peak_buffer_bytes = static_cast<int64_t>(v[7]);
  r.in_flight = v[8];
  r.cpu_share = v[9];
  return r;
}

// The formulas and the simulation of `c` under the costs its ranks measured.
absl::Status FillModel(const Schedule& schedule, PipelineCase& c) {
  const int ranks = schedule.options.ranks;
  Costs costs;
  costs.forward = costs.backward_input = costs.backward_weight = 0;
  for (const PipelineRankMeasure& r : c.ranks) {
    costs.forward += r.forward_ms / ranks;
    costs.backward_input += r.backward_input_ms / ranks;
    costs.backward_weight += r.backward_weight_ms / ranks;
  }
  if (c.kind == ScheduleKind::kGPipe || c.kind == ScheduleKind::kOneFOneB) {
    c.formula_simple = static_cast<double>(ranks - 1) / (c.micro_batches + ranks - 1);
  }
  c.formula = train::pipeline::FormulaBubble(schedule.options, costs);
  RM_ASSIGN_OR_RETURN(train::pipeline::Timeline timeline,
                      train::pipeline::Simulate(schedule, costs));
  c.simulated = timeline.Bubble();
  c.simulated_in_flight = timeline.peak_activations;
  return absl::OkStatus();
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

const PipelineCase* FindCase(const PipelineBenchResult& r, ScheduleKind kind, int m) {
  for (const PipelineCase& c : r.cases) {
    if (c.kind == kind && c.micro_batches == m && c.skipped.empty() && !c.ranks.empty()) {
      return &c;
    }
  }
  return nullptr;
}

}  // namespace

double PipelineCase::mean_bubble() const {
  double sum = 0;
  for (const PipelineRankMeasure& r : ranks) sum += r.bubble;
  return ranks.empty() ? 0 : sum / ranks.size();
}

double PipelineCase::max_bubble() const {
  double most = 0;
  for (const PipelineRankMeasure& r : ranks) most = std::max(most, r.bubble);
  return most;
}

absl::Status ValidatePipelineBench(const PipelineBenchOptions& o, int ranks) {
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--layers", o.layers},
                                    {"--width", o.width},
                                    {"--heads", o.heads},
                                    {"--context", o.context},
                                    {"--vocab", o.vocab},
                                    {"--batch", o.batch},
                                    {"--steps", o.steps},
                                    {"--ranks", ranks}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, got ", value));
    }
  }
  if (o.width % o.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heads (", o.heads,
                                                   ") must divide --width (", o.width, ")"));
  }
  if (o.layers < ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layers (", o.layers, ") must be at least --ranks (", ranks,
                     "): every pipeline stage needs a block"));
  }
  if (o.schedules.empty()) {
    return absl::InvalidArgumentError("--schedules must name at least one schedule");
  }
  if (o.micro_batches.empty()) {
    return absl::InvalidArgumentError("--micro_batches must list at least one count");
  }
  for (int m : o.micro_batches) {
    if (m < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--micro_batches: every count must be positive, got ", m));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ScheduleKind>> ParsePipelineSchedules(absl::string_view text) {
  std::vector<ScheduleKind> kinds;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<ScheduleKind> kind = train::pipeline::ParseScheduleKind(absl::StripAsciiWhitespace(name));
    if (!kind.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--schedules: ", kind.status().message()));
    }
    kinds.push_back(*kind);
  }
  if (kinds.empty()) {
    return absl::InvalidArgumentError("--schedules must name at least one schedule");
  }
  return kinds;
}

absl::StatusOr<std::vector<int>> ParseMicroBatchCounts(absl::string_view text) {
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int m = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &m) || m < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--micro_batches: \"", part, "\" is not a positive integer (e.g. --micro_batches 1,2,4,8)"));
    }
    counts.push_back(m);
  }
  if (counts.empty()) {
    return absl::InvalidArgumentError("--micro_batches must list at least one count");
  }
  return counts;
}

absl::StatusOr<PipelineBenchResult> RunPipelineBench(comm::Communicator& group,
                                                     const PipelineBenchOptions& o) {
  const int ranks = group.size();
  RM_RETURN_IF_ERROR(ValidatePipelineBench(o, ranks));
  kernels::SetBlasThreads(1);
  PipelineBenchResult result;
  result.ranks = ranks;
  result.steps = o.steps;
  for (ScheduleKind kind : o.schedules) {
    for (int m : o.micro_batches) {
      PipelineCase c;
      c.kind = kind;
      c.micro_batches = m;
      c.virtual_stages = kind == ScheduleKind::kInterleaved1F1B ? 2 : 1;
      c.skipped = WhySkipped(o, kind, m, ranks, c.virtual_stages);
      if (!c.skipped.empty()) {
        result.cases.push_back(std::move(c));
        continue;
      }
      ScheduleOptions so;
      so.kind = kind;
      so.ranks = ranks;
      so.micro_batches = m;
      so.virtual_stages = c.virtual_stages;
      RM_ASSIGN_OR_RETURN(Schedule schedule, train::pipeline::MakeSchedule(so));
      RM_RETURN_IF_ERROR(train::pipeline::CheckSchedule(schedule));
      std::vector<Batch> batches;
      for (int i = 0; i < m; ++i) batches.push_back(RandomSamples(o.batch, o, o.seed + 1 + i));
      RM_ASSIGN_OR_RETURN(PipelineRankMeasure mine, MeasureRank(group, o, schedule, batches));
      std::vector<double> send(kMeasureFields), all(kMeasureFields * ranks);
      Pack(mine, send.data());
      RM_RETURN_IF_ERROR(group.AllGather(send.data(), all.data(), kMeasureFields,
                                         DataType::kFloat64, absl::Now() + kTimeout));
      for (int r = 0; r < ranks; ++r) c.ranks.push_back(Unpack(&all[r * kMeasureFields]));
      RM_RETURN_IF_ERROR(FillModel(schedule, c));
      result.cases.push_back(std::move(c));
    }
  }
  return result;
}

std::string PipelineResultToText(const PipelineBenchResult& result) {
  std::string text = absl::StrFormat("pipeline %d %d\n", result.ranks, result.steps);
  for (const PipelineCase& c : result.cases) {
    if (!c.skipped.empty()) {
      absl::StrAppendFormat(&text, "skip %s %d %d %s\n", ScheduleName(c.kind), c.micro_batches,
                            c.virtual_stages, c.skipped);
      continue;
    }
    std::vector<std::string> sim;
    for (double a : c.simulated_in_flight) sim.push_back(absl::StrFormat("%.17g", a));
    absl::StrAppendFormat(&text, "case %s %d %d %.17g %.17g %.17g %s\n", ScheduleName(c.kind),
                          c.micro_batches, c.virtual_stages, c.formula_simple, c.formula,
                          c.simulated, sim.empty() ? "-" : absl::StrJoin(sim, ","));
    for (const PipelineRankMeasure& r : c.ranks) {
      absl::StrAppendFormat(&text, "rank %.17g %.17g %.17g %.17g %.17g %.17g %d %d %.17g %.17g\n",
                            r.bubble, r.step_ms, r.tokens_per_s, r.forward_ms,
                            r.backward_input_ms, r.backward_weight_ms, r.activation_bytes,
                            r.peak_buffer_bytes, r.in_flight, r.cpu_share);
    }
  }
  return text;
}

absl::StatusOr<PipelineBenchResult> PipelineResultFromText(absl::string_view text) {
  PipelineBenchResult result;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    bool ok = false;
    if (f[0] == "pipeline" && f.size() == 3) {
      ok = absl::SimpleAtoi(f[1], &result.ranks) && absl::SimpleAtoi(f[2], &result.steps);
    } else if ((f[0] == "case" && f.size() == 8) || (f[0] == "skip" && f.size() >= 5)) {
      PipelineCase c;
      absl::StatusOr<ScheduleKind> kind = train::pipeline::ParseScheduleKind(f[1]);
      ok = kind.ok() && absl::SimpleAtoi(f[2], &c.micro_batches) &&
           absl::SimpleAtoi(f[3], &c.virtual_stages);
      if (ok) c.kind = *kind;
      if (ok && f[0] == "skip") {
        c.skipped = std::string(
            std::vector<absl::string_view>(absl::StrSplit(line, absl::MaxSplits(' ', 4)))[4]);
      } else if (ok) {
        ok = absl::SimpleAtod(f[4], &c.formula_simple) && absl::SimpleAtod(f[5], &c.formula) &&
             absl::SimpleAtod(f[6], &c.simulated);
        if (ok && f[7] != "-") {
          for (absl::string_view a : absl::StrSplit(f[7], ',')) {
            double v = 0;
            ok = ok && absl::SimpleAtod(a, &v);
            c.simulated_in_flight.push_back(v);
          }
        }
      }
      result.cases.push_back(std::move(c));
    } else if (f[0] == "rank" && f.size() == 11 && !result.cases.empty() &&
               result.cases.back().skipped.empty()) {
      PipelineRankMeasure r;
      ok = absl::SimpleAtod(f[1], &r.bubble) && absl::SimpleAtod(f[2], &r.step_ms) &&
           absl::SimpleAtod(f[3], &r.tokens_per_s) && absl::SimpleAtod(f[4], &r.forward_ms) &&
           absl::SimpleAtod(f[5], &r.backward_input_ms) &&
           absl::SimpleAtod(f[6], &r.backward_weight_ms) &&
           absl::SimpleAtoi(f[7], &r.activation_bytes) &&
           absl::SimpleAtoi(f[8], &r.peak_buffer_bytes) && absl::SimpleAtod(f[9], &r.in_flight) &&
           absl::SimpleAtod(f[10], &r.cpu_share);
      result.cases.back().ranks.push_back(r);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline result: bad line \"", line, "\""));
    }
  }
  return result;
}

std::vector<PipelineGoal> PipelineGoals(const PipelineBenchResult& result) {
  std::vector<PipelineGoal> goals;
  const bool two = result.ranks == 2;
  const std::string not_two =
      absl::StrCat("not checked: the goal is for P = 2 (one rank per core), this run has P = ",
                   result.ranks);

  // The measured bubble against (P−1)/(m+P−1) for gpipe and 1f1b.
  {
    PipelineGoal g;
    const PipelineCase* worst = nullptr;
    int found = 0;
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      for (int m : {1, 2, 4, 8}) {
        const PipelineCase* c = FindCase(result, kind, m);
        if (c == nullptr) continue;
        ++found;
        if (worst == nullptr || std::abs(c->mean_bubble() - c->formula_simple) >
                                    std::abs(worst->mean_bubble() - worst->formula_simple)) {
          worst = c;
        }
      }
    }
    g.checked = two && found == 8;
    std::string worst_text = "none ran";
    if (worst != nullptr) {
      const double diff = worst->mean_bubble() - worst->formula_simple;
      g.pass = g.checked && std::abs(diff) <= kBubbleGoalPoints;
      worst_text = absl::StrFormat("%s m = %d, %s measured vs %s formula, %+.1f points",
                                   ScheduleName(worst->kind), worst->micro_batches,
                                   Percent(worst->mean_bubble()), Percent(worst->formula_simple),
                                   100 * diff);
    }
    const std::string verdict =
        g.checked ? (g.pass ? "PASS" : "MISS")
                  : (two ? "not checked: needs gpipe and 1f1b at m = 1, 2, 4, 8" : not_two);
    g.line = absl::StrFormat(
        "goal: measured bubble within %.0f percentage points of the formula for gpipe and 1f1b "
        "at m = 1, 2, 4, 8 (P = 2): %s (worst: %s)",
        100 * kBubbleGoalPoints, verdict, worst_text);
    goals.push_back(std::move(g));
  }

  // zero_bubble against 1f1b at m = 4.
  {
    PipelineGoal g;
    const PipelineCase* zb = FindCase(result, ScheduleKind::kZeroBubble, 4);
    const PipelineCase* ofob = FindCase(result, ScheduleKind::kOneFOneB, 4);
    g.checked = two && zb != nullptr && ofob != nullptr;
    std::string detail = "needs zero_bubble and 1f1b at m = 4";
    if (zb != nullptr && ofob != nullptr) {
      g.pass = g.checked && zb->mean_bubble() <= kZeroBubbleGoalRatio * ofob->mean_bubble();
      detail = absl::StrFormat("%s vs %s, ratio %.2f", Percent(zb->mean_bubble()),
                               Percent(ofob->mean_bubble()),
                               ofob->mean_bubble() > 0 ? zb->mean_bubble() / ofob->mean_bubble()
                                                       : 0.0);
    }
    const std::string verdict = g.checked ? (g.pass ? "PASS" : "MISS")
                                          : (two ? "not checked" : not_two);
    g.line = absl::StrFormat("goal: zero_bubble's bubble at most half of 1f1b's at m = 4: %s (%s)",
                             verdict, detail);
    goals.push_back(std::move(g));
  }
  return goals;
}

std::string FormatPipelineTable(const PipelineBenchOptions& o, const PipelineBenchResult& r) {
  std::string t = absl::StrFormat(
      "GPT %d blocks x %d wide, %d heads, context %d, vocab %d%s; %d samples per micro-batch; "
      "P = %d ranks (1 BLAS thread each); %d warm-up + %d timed steps per row\n"
      "bubble: 1 - compute / time in the executor, per rank over the timed steps (mean and max "
      "over ranks); formula (P-1)/(m+P-1) for gpipe and 1f1b; FormulaBubble and Simulate with "
      "the F/B/W costs measured in the row (ms per micro-batch and P-stage, mean over ranks; "
      "B is the whole backward unless W is split out); cpu: CPU time / wall time inside the "
      "stages' calls (below ~95%%: the core was shared while computing)\n\n",
      o.layers, o.width, o.heads, o.context, o.vocab,
      o.keep_probabilities ? ", attention keeping probabilities" : "", o.batch, r.ranks,
      kPipelineWarmupSteps, r.steps);
  absl::StrAppendFormat(&t, "%-17s %3s %2s %7s %7s %9s %9s %9s %9s %9s %7s %7s %7s %5s\n",
                        "schedule", "m", "v", "bubble", "max", "(P-1)/", "formula", "simulated",
                        "step ms", "tokens/s", "F ms", "B ms", "W ms", "cpu");
  absl::StrAppendFormat(&t, "%-17s %3s %2s %7s %7s %9s %9s %9s\n", "", "", "", "mean", "",
                        "(m+P-1)", "(costs)", "(costs)");
  std::vector<std::string> skipped;
  for (const PipelineCase& c : r.cases) {
    if (!c.skipped.empty()) {
      skipped.push_back(absl::StrFormat("  %s m = %d: %s", ScheduleName(c.kind), c.micro_batches,
                                        c.skipped));
      continue;
    }
    double step = 0, tokens = 0, f = 0, b = 0, w = 0, cpu = 0;
    for (const PipelineRankMeasure& m : c.ranks) {
      step = std::max(step, m.step_ms);
      tokens += m.tokens_per_s / c.ranks.size();
      f += m.forward_ms / c.ranks.size();
      b += m.backward_input_ms / c.ranks.size();
      w += m.backward_weight_ms / c.ranks.size();
      cpu += m.cpu_share / c.ranks.size();
    }
    absl::StrAppendFormat(&t,
                          "%-17s %3d %2d %7s %7s %9s %9s %9s %9.1f %9.0f %7.2f %7.2f %7.2f %5.0f%%\n",
                          ScheduleName(c.kind), c.micro_batches, c.virtual_stages,
                          Percent(c.mean_bubble()), Percent(c.max_bubble()),
                          c.formula_simple < 0 ? "-" : Percent(c.formula_simple),
                          Percent(c.formula), Percent(c.simulated), step, tokens, f, b, w,
                          100 * cpu);
  }
  absl::StrAppendFormat(&t, "\nper rank%s\n%-17s %3s %4s %7s %9s %9s %11s %11s %9s %9s %5s\n",
                        " (activations: GptStage::activation_bytes; in flight: micro-batches "
                        "held at once, chunks as 1/v; sim: Simulate's peak)",
                        "schedule", "m", "rank", "bubble", "step ms", "tokens/s", "act MiB",
                        "msg buf KiB", "in flight", "sim", "cpu");
  for (const PipelineCase& c : r.cases) {
    for (size_t i = 0; i < c.ranks.size(); ++i) {
      const PipelineRankMeasure& m = c.ranks[i];
      absl::StrAppendFormat(
          &t, "%-17s %3d %4d %7s %9.1f %9.0f %11.2f %11.1f %9.2f %9.2f %4.0f%%\n",
          ScheduleName(c.kind),
          c.micro_batches, i, Percent(m.bubble), m.step_ms, m.tokens_per_s,
          m.activation_bytes / 1048576.0, m.peak_buffer_bytes / 1024.0, m.in_flight,
          i < c.simulated_in_flight.size() ? c.simulated_in_flight[i] : 0.0, 100 * m.cpu_share);
    }
  }
  if (!skipped.empty()) absl::StrAppend(&t, "\nskipped:\n", absl::StrJoin(skipped, "\n"), "\n");
  absl::StrAppend(&t, "\n");
  for (const PipelineGoal& g : PipelineGoals(r)) absl::StrAppend(&t, g.line, "\n");
  return t;
}

}  // namespace ringmaster::bench
