// fsdpbench: a GPT under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP) × wrapping × prefetch at
// world 2 and 4 (issue 19's "Performance to reach"), trained through `ringctl local`.
//
//   fsdpbench [--worlds 2,4] [--stages 0,1,2,3] [--wraps layer,block,model]
//       [--prefetch none,both] [--precision_worlds 2] [--layers 8 --width 256 --context 256]
//       [--batch 2] [--steps 12] [--probe_steps 3] [--no_probe] [--link_gbit G [--link_only]]
//
// Per configuration: step time (median of the logged windows after the warm-up),
// communication and exposed communication per step (rank 0's metrics), memory per rank (every
// rank's memory line: state, unit buffers, activations; rank 0's peak RSS; the largest peak
// RSS of the job's processes), bytes sent per step per rank by the formula and measured (the
// fsdp_traffic probe's communicator counters, or the trainer's own fields once it reports
// them). Then the goals (PASS/MISS) and the seed exercises' tables: 35.13 (wrapping: memory
// and communication) and 35.14 (ZeRO-3 with fp32 vs bf16 parameters: memory and throughput).
// With --link_gbit, the goal configurations (world 2: DDP, ZeRO-3 block with prefetch none and
// both) again, trained by the probe over shared memory and over an emulated network link of
// that rate (bench/emulated_link.h), where communication costs wire time: step time,
// communication and exposed communication, and the two timing goals on each.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/emulated_link.h"
#include "bench/fsdp_bench.h"
#include "bench/train_bench.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "train/result.pb.h"

ABSL_FLAG(std::string, worlds, "2,4", "world sizes (local ranks)");
ABSL_FLAG(std::string, stages, "0,1,2,3", "ZeRO stages (0 = DDP)");
ABSL_FLAG(std::string, wraps, "layer,block,model", "ZeRO-3 wrappings");
ABSL_FLAG(std::string, prefetch, "none,both", "ZeRO-3 prefetch settings");
ABSL_FLAG(std::string, precision_worlds, "2",
          "worlds of the 35.14 runs (ZeRO-3 block, prefetch both, bf16 compute with fp32 and "
          "bf16 reductions); empty: none");
ABSL_FLAG(int64_t, layers, 8, "GPT blocks");
ABSL_FLAG(int64_t, heads, 4, "GPT attention heads");
ABSL_FLAG(int64_t, width, 256, "GPT width");
ABSL_FLAG(int64_t, context, 256, "GPT context (tokens)");
ABSL_FLAG(int64_t, batch, 2, "sequences per rank per step (global batch = batch x world)");
ABSL_FLAG(int64_t, steps, 16, "steps per run");
ABSL_FLAG(int64_t, log_every, 2, "steps per timed window");
ABSL_FLAG(int64_t, warmup_steps, 4, "steps at the start of a run that are not timed");
ABSL_FLAG(bool, probe, true,
          "measure bytes per step with the fsdp_traffic probe (a short in-process run of each "
          "configuration) when the trainer's summary does not report them");
ABSL_FLAG(int64_t, probe_steps, 3, "steps of a probe run (the first is not counted)");
ABSL_FLAG(std::string, text, "/usr/share/common-licenses/GPL-3", "the text to train on");
ABSL_FLAG(int, repeats, 1,
          "rounds over every configuration (interleaved, so that a change of the machine's load "
          "meets them all); each configuration's windows are pooled over them");
ABSL_FLAG(int, threads, 0, "BLAS threads per rank; 0 = cores / world (at least 1)");
ABSL_FLAG(std::string, ringctl, "", "the ringctl binary; empty = bazel-bin/cli/ringctl");
ABSL_FLAG(std::string, probe_binary, "", "the fsdp_traffic binary; empty = next to fsdpbench");
ABSL_FLAG(std::string, work_dir, "",
          "where runs keep their specs, logs and metrics; empty = a new /tmp/fsdpbench-*");
ABSL_FLAG(bool, keep_work_dir, false, "keep the /tmp/fsdpbench-* directory after the run");
ABSL_FLAG(int, timeout_s, 300, "limit of each run in seconds");
ABSL_FLAG(double, link_gbit, 0,
          "> 0: also train the goal configurations (world 2: DDP, ZeRO-3 block with prefetch "
          "none and both) on in-process ranks joined by an emulated network link of this rate "
          "(Gbit/s per rank's egress: network namespaces, veth, tc tbf; TCP only; "
          "fsdp_traffic --link_gbit), beside the same in-process runs over shared memory; "
          "needs root and iproute2");
ABSL_FLAG(bool, link_only, false,
          "only the emulated link's section (needs --link_gbit): no ringctl runs");

namespace ringmaster::bench {
namespace {

constexpr char kProgram[] = "fsdpbench";
constexpr double kMiB = 1 << 20;
constexpr double kMB = 1e6;

// What one configuration measured.
struct Result {
  FsdpCase c;
  int threads = 1;
  TrainStats stats;
  std::vector<RankMemory> ranks;  // every rank's memory line
  double rank0_peak_rss = -1;     // rank 0's summary
  double job_max_rss = 0;         // wait4 of ringctl: the largest process of the job
  double tokens_per_second = 0;   // the median window's samples/s x context
  CaseFormula formula;
  std::optional<StepTraffic> measured;  // rank 0's
  std::string measured_from;            // "probe" or "trainer"
  bool ranks_agree = true;              // the probe's ranks sent the same bytes
  double load_min = -1, load_max = -1;    // 1-minute load average around its runs
  std::vector<TrainWindow> windows;       // rank 0's, pooled over the rounds
  double fastest_step_ms = 0, slowest_step_ms = 0;
  std::string job_dir, run_dir;           // the first round's

  // The largest peak (allocations) over the ranks.
  const RankMemory* Largest() const {
    const RankMemory* best = nullptr;
    for (const RankMemory& m : ranks) {
      if (best == nullptr || m.peak() > best->peak()) best = &m;
    }
    return best;
  }
};

struct Options {
  RingmasterOptions ringmaster;
  std::string probe_binary;
  bool probe = true;
  double link_gbit = 0;  // > 0: the emulated link's section
  bool link_only = false;
  GptBenchSize size;
  int cores = 1;
  int forced_threads = 0;
};

std::string RunName(const FsdpCase& c) {
  std::string name = absl::StrCat("w", c.world, "-z", c.zero_stage);
  if (c.zero_stage == 3) absl::StrAppend(&name, "-", c.wrap, "-", c.prefetch);
  absl::StrAppend(&name, "-", c.compute, "-", c.reduce);
  return name;
}

// One run of the fsdp_traffic probe on the case's spec: `steps` steps, rank 0's metrics to
// `metrics` (empty: none), over an emulated link of `link_gbit` (0: shared memory). Its
// output goes to <dir>/<name>.log. Returns every rank's traffic per step.
struct ProbeRun {
  std::string name = "probe";
  int64_t steps = 3;
  std::string metrics;
  double link_gbit = 0;
};
absl::StatusOr<std::vector<StepTraffic>> RunProbe(const Options& o, const FsdpCase& c,
                                                  const std::string& dir, int threads,
                                                  const ProbeRun& run) {
  if (access(o.probe_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the traffic probe is not at ", o.probe_binary,
                     "; build it: bazel build //bench:fsdp_traffic (or pass --probe_binary, or "
                     "--noprobe)"));
  }
  RM_ASSIGN_OR_RETURN(std::string yaml, CaseSpecYaml(c, o.size, threads));
  const std::string spec = dir + "/" + run.name + ".yaml";
  RM_RETURN_IF_ERROR(WriteFileAtomically(spec, yaml, {.durable = false}));
  ProcessOptions p;
  p.argv = {o.probe_binary, "--spec", spec, absl::StrCat("--world=", c.world),
            absl::StrCat("--steps=", run.steps)};
  if (!run.metrics.empty()) p.argv.push_back(absl::StrCat("--metrics=", run.metrics));
  if (run.link_gbit > 0) p.argv.push_back(absl::StrCat("--link_gbit=", run.link_gbit));
  p.output_path = dir + "/" + run.name + ".log";
  p.timeout = o.ringmaster.timeout;
  RM_ASSIGN_OR_RETURN(ProcessResult done, RunProcess(p));
  if (done.exit_code == 3 && run.link_gbit > 0) {
    RM_ASSIGN_OR_RETURN(std::string output, ReadFile(p.output_path));
    return absl::FailedPreconditionError(absl::StripTrailingAsciiWhitespace(output));
  }
  if (done.exit_code != 0) {
    return FailedRun(absl::StrCat("fsdp_traffic --world ", c.world,
                                  run.link_gbit > 0 ? absl::StrCat(" --link_gbit ", run.link_gbit)
                                                    : ""),
                     done.exit_code, p.output_path);
  }
  RM_ASSIGN_OR_RETURN(std::string output, ReadFile(p.output_path));
  return ParseProbeTraffic(output);
}

// Bytes by the probe: a short run of the case's spec.
absl::StatusOr<std::vector<StepTraffic>> Probe(const Options& o, const FsdpCase& c,
                                               const std::string& dir, int threads) {
  ProbeRun run;
  run.steps = o.size.probe_steps;
  return RunProbe(o, c, dir, threads, run);
}

// One run of r->c through ringctl local: its windows join r->windows. The first round also
// reads what does not change between runs: the formula, memory, summary and traffic.
absl::Status RunCase(const Options& o, bool first_round, Result* r) {
  const FsdpCase& c = r->c;
  LocalJobOptions job;
  job.run_name = RunName(c);
  job.job_name = "fsdpbench";
  job.spec_yaml = kFsdpJobSpec;
  job.overrides = CaseOverrides(c, o.size, r->threads);
  job.world = c.world;
  const double load_before = LoadAverage();
  RM_ASSIGN_OR_RETURN(LocalJobRun run, RunLocalJob(o.ringmaster, job));
  r->windows.insert(r->windows.end(), run.windows.begin(), run.windows.end());
  r->job_max_rss = std::max(r->job_max_rss, run.max_rss_bytes);
  // ringctl local's final checkpoint (~75 MiB a run at the default size) is not measured.
  std::error_code ec;
  std::filesystem::remove_all(run.dir + "/run/checkpoints", ec);
  if (first_round) {
    r->job_dir = run.job_dir;
    r->run_dir = run.dir;
  }
  for (double load : {load_before, LoadAverage()}) {
    if (load < 0) continue;
    r->load_min = r->load_min < 0 ? load : std::min(r->load_min, load);
    r->load_max = std::max(r->load_max, load);
  }
  if (!first_round) return absl::OkStatus();
  RM_ASSIGN_OR_RETURN(r->formula, FormulaFor(c, o.size));
  std::string logs;
  for (int rank = 0; rank < c.world; ++rank) {
    // ringctl local gives rank r slot r on its one node.
    RM_ASSIGN_OR_RETURN(std::string log,
                        ReadFile(absl::StrCat(r->job_dir, "/slot-", rank, ".log")));
    absl::StrAppend(&logs, log, "\n");
  }
  RM_ASSIGN_OR_RETURN(r->ranks, ParseRankMemory(logs));
  if (static_cast<int>(r->ranks.size()) != c.world) {
    return absl::InternalError(absl::StrCat(r->job_dir, ": ", r->ranks.size(), " of ", c.world,
                                            " ranks logged their memory line"));
  }
  const std::string summary_path = r->job_dir + "/summary.json";
  RM_ASSIGN_OR_RETURN(std::string summary_text, ReadFile(summary_path));
  train::TrainResult summary;
  RM_RETURN_IF_ERROR(FromJson(summary_text, &summary, summary_path));
  r->rank0_peak_rss = summary.peak_rss_bytes();
  UseExactBytes(summary, &r->ranks);
  if (std::optional<StepTraffic> t = TrafficFromSummary(summary_text)) {
    r->measured = t;
    r->measured_from = "trainer";
  } else if (o.probe) {
    RM_ASSIGN_OR_RETURN(std::vector<StepTraffic> ranks, Probe(o, c, r->run_dir, r->threads));
    r->measured = ranks.front();
    r->measured_from = "probe";
    for (const StepTraffic& t : ranks) {
      if (std::abs(t.total() - ranks.front().total()) > 0.01 * ranks.front().total() + 64) {
        r->ranks_agree = false;
      }
    }
  }
  return absl::OkStatus();
}

// The pooled windows' statistics, and the throughput from them.
absl::Status Summarize(const GptBenchSize& size, Result* r) {
  absl::StatusOr<TrainStats> stats = SummarizeWindows(r->windows, size.warmup_steps);
  if (!stats.ok()) {
    return absl::Status(stats.status().code(), absl::StrCat("world ", r->c.world, ", ",
                                                            CaseLabel(r->c), ": ",
                                                            stats.status().message()));
  }
  r->stats = *stats;
  r->tokens_per_second = r->stats.samples_per_second * static_cast<double>(size.context);
  // The fastest and slowest windows' step time.
  const double samples_per_step = static_cast<double>(size.batch_per_rank * r->c.world);
  r->fastest_step_ms = 1000 * samples_per_step / r->stats.max_samples_per_second;
  r->slowest_step_ms = 1000 * samples_per_step / r->stats.min_samples_per_second;
  return absl::OkStatus();
}

std::string MiB(double bytes) { return bytes < 0 ? "-" : absl::StrFormat("%.2f", bytes / kMiB); }
std::string MB(double bytes) { return bytes < 0 ? "-" : absl::StrFormat("%.2f", bytes / kMB); }

const Result* Find(const std::vector<Result>& results, int world, int stage,
                   const std::string& wrap = "block", const std::string& prefetch = "both",
                   const std::string& compute = "fp32", const std::string& reduce = "fp32") {
  for (const Result& r : results) {
    const FsdpCase& c = r.c;
    if (c.world == world && c.zero_stage == stage && c.compute == compute && c.reduce == reduce &&
        (stage != 3 || (c.wrap == wrap && c.prefetch == prefetch))) {
      return &r;
    }
  }
  return nullptr;
}

std::string Calls(const std::optional<StepTraffic>& t) {
  if (!t || t->all_gather_calls < 0) return "-";
  return absl::StrFormat("%.0f/%.0f/%.0f", t->all_gather_calls, t->reduce_scatter_calls,
                         t->all_reduce_calls);
}

void PrintTables(const std::vector<Result>& results, const GptBenchSize& size) {
  printf("\nStep time and communication per step (rank 0), median of %lld-step windows after "
         "%lld warm-up steps\n",
         static_cast<long long>(size.log_every), static_cast<long long>(size.warmup_steps));
  printf("%5s %-34s %8s %15s %7s %9s %8s %9s %8s %9s\n", "world", "configuration", "step ms",
         "(fastest-slow.)", "vs DDP", "tokens/s", "comm ms", "exposed", "exposed%", "load");
  for (const Result& r : results) {
    const Result* ddp = Find(results, r.c.world, 0);
    printf("%5d %-34s %8.1f %15s %7s %9.0f %8s %9s %8s %9s\n", r.c.world, CaseLabel(r.c).c_str(),
           r.stats.step_ms,
           absl::StrFormat("(%.0f-%.0f)", r.fastest_step_ms, r.slowest_step_ms).c_str(),
           ddp ? absl::StrFormat("%.2f", r.stats.step_ms / ddp->stats.step_ms).c_str() : "-",
           r.tokens_per_second,
           r.stats.comm_ms < 0 ? "-" : absl::StrFormat("%.1f", r.stats.comm_ms).c_str(),
           r.stats.exposed_comm_ms < 0 ? "-"
                                       : absl::StrFormat("%.1f", r.stats.exposed_comm_ms).c_str(),
           r.stats.exposed_comm_fraction < 0
               ? "-"
               : absl::StrFormat("%.1f", 100 * r.stats.exposed_comm_fraction).c_str(),
           absl::StrFormat("%.1f-%.1f", r.load_min, r.load_max).c_str());
  }

  printf("\nMemory per rank, MiB: measured from the allocations (the rank with the largest peak; "
         "params incl. ZeRO-2's compute copy); peak RSS: that rank's (when its memory line has "
         "it), rank 0's (its summary), the largest of the job's processes (wait4)\n");
  printf("%5s %-34s %4s %8s %8s %9s %8s %9s %9s %9s %9s %9s\n", "world", "configuration",
         "rank", "params", "grads", "optimizer", "units", "activ.", "peak", "its RSS", "RSS r0",
         "RSS max");
  for (const Result& r : results) {
    const RankMemory* m = r.Largest();
    if (m == nullptr) continue;
    printf("%5d %-34s %4d %8s %8s %9s %8s %9s %9s %9s %9s %9s\n", r.c.world,
           CaseLabel(r.c).c_str(), m->rank, MiB(m->parameters + m->compute_copy).c_str(),
           MiB(m->gradients).c_str(), MiB(m->optimizer).c_str(), MiB(m->unit_buffers).c_str(),
           MiB(m->activations).c_str(), MiB(m->peak()).c_str(), MiB(m->peak_rss).c_str(),
           MiB(r.rank0_peak_rss).c_str(), MiB(r.job_max_rss).c_str());
  }

  printf("\nBytes sent per step by one rank, MB (1e6): formula (all-gather + reduce-scatter + "
         "all-reduce) and measured (communicator counters, rank 0)\n");
  printf("%5s %-34s %8s %8s %8s %9s %9s %7s %12s %8s\n", "world", "configuration", "AG", "RS",
         "AR", "formula", "measured", "m/f", "calls AG/RS/AR", "source");
  for (const Result& r : results) {
    const StepTraffic& f = r.formula.traffic;
    const double measured = r.measured ? r.measured->total() : -1;
    printf("%5d %-34s %8s %8s %8s %9s %9s %7s %12s %8s\n", r.c.world, CaseLabel(r.c).c_str(),
           MB(f.all_gather).c_str(), MB(f.reduce_scatter).c_str(), MB(f.all_reduce).c_str(),
           MB(f.total()).c_str(), MB(measured).c_str(),
           measured < 0 ? "-" : absl::StrFormat("%.3f", measured / f.total()).c_str(),
           Calls(r.measured).c_str(),
           r.measured ? absl::StrCat(r.measured_from, r.ranks_agree ? "" : "!").c_str() : "-");
  }
  printf("formula: DDP 2(N-1)/N x padded params x 4 B; ZeRO-1 + (N-1)/N x 4 B (parameter "
         "gather); ZeRO-2/3 by their units (Zero3PassTraffic); measured all-reduces include the "
         "per-step control sums; '!' = the ranks' counts differ by > 1 %%\n");

  printf("\nSeed exercise 35.13: ZeRO-3 wrapping strategies (memory per rank, MiB; traffic per "
         "step, MB)\n");
  printf("%5s %-6s %-9s %6s %11s %8s %9s %9s %9s %9s %12s %8s\n", "world", "wrap", "prefetch",
         "units", "largest", "units", "peak", "RSS r0", "formula", "measured", "calls AG/RS",
         "step ms");
  for (const Result& r : results) {
    if (r.c.zero_stage != 3 || r.c.compute != "fp32" || r.c.reduce != "fp32") continue;
    const RankMemory* m = r.Largest();
    printf("%5d %-6s %-9s %6d %11s %8s %9s %9s %9s %9s %12s %8.1f\n", r.c.world, r.c.wrap.c_str(),
           r.c.prefetch.c_str(), r.formula.units, MiB(r.formula.largest_unit_bytes).c_str(),
           m ? MiB(m->unit_buffers).c_str() : "-", m ? MiB(m->peak()).c_str() : "-",
           MiB(r.rank0_peak_rss).c_str(), MB(r.formula.traffic.total()).c_str(),
           MB(r.measured ? r.measured->total() : -1).c_str(),
           r.measured && r.measured->all_gather_calls >= 0
               ? absl::StrFormat("%.0f/%.0f", r.measured->all_gather_calls,
                                 r.measured->reduce_scatter_calls)
                     .c_str()
               : "-",
           r.stats.step_ms);
  }

  printf("\nSeed exercise 35.14: ZeRO-3 block, prefetch both, fp32 vs bf16 gathered parameters "
         "(memory per rank, MiB; throughput)\n");
  printf("%5s %-8s %-7s %8s %9s %9s %9s %8s %9s %8s\n", "world", "compute", "reduce", "units",
         "peak", "RSS r0", "MB/step", "step ms", "tokens/s", "vs fp32");
  for (const Result& r : results) {
    if (r.c.zero_stage != 3 || r.c.wrap != "block" || r.c.prefetch != "both") continue;
    const Result* fp32 = Find(results, r.c.world, 3);
    if (fp32 == nullptr || Find(results, r.c.world, 3, "block", "both", "bf16") == nullptr) {
      continue;  // no bf16 run at this world
    }
    const RankMemory* m = r.Largest();
    printf("%5d %-8s %-7s %8s %9s %9s %9s %8.1f %9.0f %8s\n", r.c.world, r.c.compute.c_str(),
           r.c.reduce.c_str(), m ? MiB(m->unit_buffers).c_str() : "-",
           m ? MiB(m->peak()).c_str() : "-", MiB(r.rank0_peak_rss).c_str(),
           MB(r.measured ? r.measured->total() : r.formula.traffic.total()).c_str(),
           r.stats.step_ms, r.tokens_per_second,
           absl::StrFormat("%.2f", r.tokens_per_second / fp32->tokens_per_second).c_str());
  }
}

void PrintGoal(const GoalCheck& g) {
  printf("  %-62s %6.3f (limit %.2f) %s: %s\n", g.name.c_str(), g.ratio, g.limit,
         g.pass ? "PASS" : "MISS", g.numbers.c_str());
}

void PrintGoals(const std::vector<Result>& results) {
  printf("\nGoals (issue 19), from this run's measurements:\n");
  const Result* ddp2 = Find(results, 2, 0);
  const Result* z3 = Find(results, 2, 3, "block", "both");
  const Result* z3_none = Find(results, 2, 3, "block", "none");
  if (ddp2 && z3) {
    PrintGoal(StepTimeGoal(z3->stats.step_ms, ddp2->stats.step_ms));
  } else {
    printf("  step time: not measured (needs DDP and ZeRO-3 block/both at world 2)\n");
  }
  if (z3 && z3_none && z3->stats.exposed_comm_ms >= 0 && z3_none->stats.exposed_comm_ms >= 0) {
    PrintGoal(ExposedGoal(z3->stats.exposed_comm_ms, z3_none->stats.exposed_comm_ms));
  } else {
    printf("  exposed communication: not measured (needs ZeRO-3 block with prefetch both and "
           "none at world 2)\n");
  }
  bool any_memory = false;
  for (const Result& r : results) {
    if (r.c.zero_stage != 3 || r.c.wrap != "block" || r.c.prefetch != "both" ||
        r.c.compute != "fp32" || r.c.reduce != "fp32") {
      continue;
    }
    const Result* ddp = Find(results, r.c.world, 0);
    if (ddp == nullptr || ddp->ranks.empty()) continue;
    any_memory = true;
    printf("  world %d:\n", r.c.world);
    for (const RankMemory& m : r.ranks) {
      PrintGoal(MemoryGoal(m, ddp->ranks.front().state(), r.c.world, r.formula.largest_unit_bytes));
    }
  }
  if (!any_memory) {
    printf("  peak memory: not measured (needs DDP and ZeRO-3 block/both at the same world)\n");
  }
}

// The emulated link's section: the goal configurations at world 2 trained by the probe
// (in-process ranks, rank 0's metrics) over shared memory and over the link, in interleaved
// rounds.
struct LinkRun {
  FsdpCase c;
  double link_gbit = 0;  // 0: shared memory
  int threads = 1;
  std::vector<TrainWindow> windows;  // rank 0's, pooled over the rounds
  TrainStats stats;
  double fastest_step_ms = 0, slowest_step_ms = 0;
  std::vector<StepTraffic> ranks;  // per step, the first round's
  double load_min = -1, load_max = -1;

  std::string Transport() const {
    return link_gbit > 0 ? absl::StrFormat("link %g Gbit/s", link_gbit) : "shared memory";
  }
};

std::vector<LinkRun> LinkPlan(const Options& o) {
  std::vector<LinkRun> runs;
  FsdpCase ddp;
  ddp.world = 2;
  ddp.zero_stage = 0;
  FsdpCase none = ddp;
  none.zero_stage = 3;
  none.wrap = "block";
  none.prefetch = "none";
  FsdpCase both = none;
  both.prefetch = "both";
  for (double gbit : {0.0, o.link_gbit}) {
    for (const FsdpCase& c : {ddp, none, both}) {
      LinkRun r;
      r.c = c;
      r.link_gbit = gbit;
      r.threads = o.forced_threads > 0 ? o.forced_threads : ThreadsPerRank(o.cores, c.world);
      runs.push_back(r);
    }
  }
  return runs;
}

absl::Status RunOnLink(const Options& o, const std::string& work_dir, int round, LinkRun* r) {
  RM_ASSIGN_OR_RETURN(
      const std::string dir,
      MakeRunDir(work_dir, absl::StrCat(r->link_gbit > 0 ? "link-" : "shm-", RunName(r->c))));
  ProbeRun run;
  run.name = "train";
  run.steps = o.size.steps;
  run.metrics = dir + "/metrics.jsonl";
  run.link_gbit = r->link_gbit;
  const double load_before = LoadAverage();
  RM_ASSIGN_OR_RETURN(std::vector<StepTraffic> ranks, RunProbe(o, r->c, dir, r->threads, run));
  for (double load : {load_before, LoadAverage()}) {
    if (load < 0) continue;
    r->load_min = r->load_min < 0 ? load : std::min(r->load_min, load);
    r->load_max = std::max(r->load_max, load);
  }
  RM_ASSIGN_OR_RETURN(const std::string metrics, ReadFile(run.metrics));
  RM_ASSIGN_OR_RETURN(std::vector<TrainWindow> windows, ParseTrainMetrics(metrics));
  r->windows.insert(r->windows.end(), windows.begin(), windows.end());
  if (round == 0) r->ranks = std::move(ranks);
  return absl::OkStatus();
}

absl::Status SummarizeLinkRun(const GptBenchSize& size, LinkRun* r) {
  absl::StatusOr<TrainStats> stats = SummarizeWindows(r->windows, size.warmup_steps);
  if (!stats.ok()) {
    return absl::Status(stats.status().code(),
                        absl::StrCat(r->Transport(), ", ", CaseLabel(r->c), ": ",
                                     stats.status().message()));
  }
  r->stats = *stats;
  const double samples_per_step = static_cast<double>(size.batch_per_rank * r->c.world);
  r->fastest_step_ms = 1000 * samples_per_step / r->stats.max_samples_per_second;
  r->slowest_step_ms = 1000 * samples_per_step / r->stats.min_samples_per_second;
  return absl::OkStatus();
}

const LinkRun* FindLinkRun(const std::vector<LinkRun>& runs, double gbit, int stage,
                           const std::string& prefetch) {
  for (const LinkRun& r : runs) {
    if (r.link_gbit == gbit && r.c.zero_stage == stage &&
        (stage != 3 || r.c.prefetch == prefetch)) {
      return &r;
    }
  }
  return nullptr;
}

void PrintLinkSection(const Options& o, const std::vector<LinkRun>& runs, int repeats) {
  printf("\nEmulated link (issue 19's exposure goal where communication costs wire time): world "
         "2, in-process ranks (fsdp_traffic), rank 0's metrics; %d round(s) of %lld steps, "
         "median of %lld-step windows after %lld warm-up steps. Link: every rank in a network "
         "namespace of its own, TCP only, its egress limited to %g Gbit/s by tc's tbf "
         "(bench/emulated_link.h); shared memory: the same probe with shared-memory rings\n",
         repeats, static_cast<long long>(o.size.steps), static_cast<long long>(o.size.log_every),
         static_cast<long long>(o.size.warmup_steps), o.link_gbit);
  // What a block costs on the wire against what it costs to compute.
  absl::StatusOr<CaseFormula> f = FormulaFor(runs.back().c, o.size);
  const LinkRun* shm_ddp = FindLinkRun(runs, 0, 0, "");
  if (f.ok() && shm_ddp != nullptr && shm_ddp->stats.comm_ms >= 0) {
    const double per_rank = f->largest_unit_bytes / 2;  // (N-1)/N of the unit, N = 2
    printf("a block's all-gather sends %.2f MB per rank: %.1f ms at %g Gbit/s (payload only); a "
           "block's compute (forward + backward) ~ %.1f ms = (shared-memory DDP step %.1f - "
           "its comm %.1f ms) / %lld blocks\n",
           per_rank / kMB, 1000 * per_rank * 8 / (o.link_gbit * 1e9), o.link_gbit,
           (shm_ddp->stats.step_ms - shm_ddp->stats.comm_ms) / static_cast<double>(o.size.layers),
           shm_ddp->stats.step_ms, shm_ddp->stats.comm_ms, static_cast<long long>(o.size.layers));
  }
  printf("%-20s %-30s %8s %15s %8s %9s %8s %10s %10s %8s %9s\n", "transport", "configuration",
         "step ms", "(fastest-slow.)", "comm ms", "exposed", "exposed%", "MB/step", "link MB",
         "drops", "load");
  for (const LinkRun& r : runs) {
    const StepTraffic* t = r.ranks.empty() ? nullptr : &r.ranks.front();
    printf("%-20s %-30s %8.1f %15s %8.1f %9.1f %8.1f %10s %10s %8s %9s\n", r.Transport().c_str(),
           CaseLabel(r.c).c_str(), r.stats.step_ms,
           absl::StrFormat("(%.0f-%.0f)", r.fastest_step_ms, r.slowest_step_ms).c_str(),
           r.stats.comm_ms, r.stats.exposed_comm_ms, 100 * r.stats.exposed_comm_fraction,
           t ? MB(t->total()).c_str() : "-",
           t && t->link_tx_bytes >= 0 ? MB(t->link_tx_bytes).c_str() : "-",
           t && t->link_drops >= 0 ? absl::StrFormat("%.1f", t->link_drops).c_str() : "-",
           absl::StrFormat("%.1f-%.1f", r.load_min, r.load_max).c_str());
  }
  printf("MB/step: the communicator's payload bytes sent by rank 0 per step (steps 2 on, first "
         "round); link MB: what rank 0's link interface sent (headers, acknowledgements and "
         "the probe's own connections included); drops: packets its token bucket dropped per "
         "step\n");
  for (double gbit : {o.link_gbit, 0.0}) {
    const LinkRun* ddp = FindLinkRun(runs, gbit, 0, "");
    const LinkRun* none = FindLinkRun(runs, gbit, 3, "none");
    const LinkRun* both = FindLinkRun(runs, gbit, 3, "both");
    if (ddp == nullptr || none == nullptr || both == nullptr) continue;
    printf("Goals over %s:\n", both->Transport().c_str());
    PrintGoal(StepTimeGoal(both->stats.step_ms, ddp->stats.step_ms));
    PrintGoal(ExposedGoal(both->stats.exposed_comm_ms, none->stats.exposed_comm_ms));
  }
}

// Runs the link's section (its rounds interleaved) and prints it. FAILED_PRECONDITION when
// the link cannot be made here (the message says why).
absl::Status LinkSection(const Options& o, const std::string& work_dir, int repeats) {
  std::vector<LinkRun> runs = LinkPlan(o);
  for (int round = 0; round < repeats; ++round) {
    for (LinkRun& r : runs) {
      printf("  %s%s, world %d, %s...\n",
             repeats > 1 ? absl::StrCat("round ", round + 1, "/", repeats, ": ").c_str() : "",
             r.Transport().c_str(), r.c.world, CaseLabel(r.c).c_str());
      fflush(stdout);
      if (absl::Status s = RunOnLink(o, work_dir, round, &r); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(r.Transport(), ", world ", r.c.world, ", ",
                                                   CaseLabel(r.c), ": ", s.message()));
      }
    }
  }
  for (LinkRun& r : runs) RM_RETURN_IF_ERROR(SummarizeLinkRun(o.size, &r));
  PrintLinkSection(o, runs, repeats);
  return absl::OkStatus();
}

absl::Status FlagError(const std::string& flag, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

// A comma-separated list of ints within [min, max].
absl::StatusOr<std::vector<int>> IntList(const std::string& flag, const std::string& text, int min,
                                         int max) {
  std::vector<int> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < min || v > max) {
      return FlagError(flag, absl::StrCat("\"", item, "\" is not a whole number in [", min, ", ",
                                          max, "]"));
    }
    values.push_back(v);
  }
  return values;
}

// A comma-separated list of names, each one of `allowed`.
absl::StatusOr<std::vector<std::string>> NameList(const std::string& flag, const std::string& text,
                                                  const std::vector<std::string>& allowed) {
  std::vector<std::string> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
      return FlagError(flag, absl::StrCat("\"", item, "\" is not one of ",
                                          absl::StrJoin(allowed, ", ")));
    }
    values.emplace_back(item);
  }
  return values;
}

// The configurations the flags ask for, in run order (per world: DDP first).
absl::StatusOr<std::vector<FsdpCase>> Plan(Options* o) {
  RM_ASSIGN_OR_RETURN(std::vector<int> worlds, IntList("worlds", absl::GetFlag(FLAGS_worlds), 1, 64));
  RM_ASSIGN_OR_RETURN(std::vector<int> stages, IntList("stages", absl::GetFlag(FLAGS_stages), 0, 3));
  RM_ASSIGN_OR_RETURN(std::vector<std::string> wraps,
                      NameList("wraps", absl::GetFlag(FLAGS_wraps), {"layer", "block", "model"}));
  RM_ASSIGN_OR_RETURN(
      std::vector<std::string> prefetch,
      NameList("prefetch", absl::GetFlag(FLAGS_prefetch), {"none", "forward", "backward", "both"}));
  RM_ASSIGN_OR_RETURN(std::vector<int> precision_worlds,
                      IntList("precision_worlds", absl::GetFlag(FLAGS_precision_worlds), 1, 64));
  if (worlds.empty()) return FlagError("worlds", "give at least one world size");
  if (stages.empty()) return FlagError("stages", "give at least one stage");
  for (const auto& [name, value, min] : {
           std::tuple<const char*, int64_t, int64_t>{"layers", absl::GetFlag(FLAGS_layers), 1},
           {"heads", absl::GetFlag(FLAGS_heads), 1},
           {"width", absl::GetFlag(FLAGS_width), 1},
           {"context", absl::GetFlag(FLAGS_context), 2},
           {"batch", absl::GetFlag(FLAGS_batch), 1},
           {"log_every", absl::GetFlag(FLAGS_log_every), 1},
           {"warmup_steps", absl::GetFlag(FLAGS_warmup_steps), 0},
           {"probe_steps", absl::GetFlag(FLAGS_probe_steps), 2},
           {"threads", absl::GetFlag(FLAGS_threads), 0},
           {"repeats", absl::GetFlag(FLAGS_repeats), 1},
           {"timeout_s", absl::GetFlag(FLAGS_timeout_s), 1}}) {
    if (value < min) return FlagError(name, absl::StrCat(value, " is less than ", min));
  }
  if (absl::GetFlag(FLAGS_width) % absl::GetFlag(FLAGS_heads) != 0) {
    return FlagError("heads", "must divide --width");
  }
  o->link_gbit = absl::GetFlag(FLAGS_link_gbit);
  o->link_only = absl::GetFlag(FLAGS_link_only);
  if (!(o->link_gbit >= 0) || !std::isfinite(o->link_gbit)) {
    return FlagError("link_gbit", absl::StrCat(o->link_gbit, " is not a rate (0: no link)"));
  }
  if (o->link_only && o->link_gbit == 0) {
    return FlagError("link_only", "give the link's rate with --link_gbit");
  }
  if (absl::GetFlag(FLAGS_steps) < absl::GetFlag(FLAGS_warmup_steps) + absl::GetFlag(FLAGS_log_every)) {
    return FlagError("steps", "must be at least --warmup_steps + --log_every (one timed window)");
  }
  GptBenchSize& s = o->size;
  s.layers = absl::GetFlag(FLAGS_layers);
  s.heads = absl::GetFlag(FLAGS_heads);
  s.width = absl::GetFlag(FLAGS_width);
  s.context = absl::GetFlag(FLAGS_context);
  s.batch_per_rank = absl::GetFlag(FLAGS_batch);
  s.steps = absl::GetFlag(FLAGS_steps);
  s.log_every = absl::GetFlag(FLAGS_log_every);
  s.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  s.probe_steps = absl::GetFlag(FLAGS_probe_steps);
  s.text = absl::GetFlag(FLAGS_text);
  if (access(s.text.c_str(), R_OK) != 0) {
    return FlagError("text", absl::StrCat(s.text, " is not a readable file"));
  }
  std::vector<FsdpCase> cases;
  for (int world : worlds) {
    for (int stage : stages) {
      FsdpCase c;
      c.world = world;
      c.zero_stage = stage;
      if (stage < 3) {
        cases.push_back(c);
        continue;
      }
      for (const std::string& wrap : wraps) {
        for (const std::string& p : prefetch) {
          c.wrap = wrap;
          c.prefetch = p;
          cases.push_back(c);
        }
      }
    }
    if (std::find(precision_worlds.begin(), precision_worlds.end(), world) !=
        precision_worlds.end()) {
      FsdpCase c;
      c.world = world;
      c.zero_stage = 3;
      c.compute = "bf16";
      cases.push_back(c);  // compute in 16 bits, reduce in fp32
      c.reduce = "bf16";
      cases.push_back(c);  // and reduce in 16 bits too
    }
  }
  return cases;
}

int Main() {
  Options o;
  absl::StatusOr<std::vector<FsdpCase>> cases = Plan(&o);
  if (!cases.ok()) {
    fprintf(stderr, "%s: %s\n", kProgram, std::string(cases.status().message()).c_str());
    return 2;
  }
  const std::string self_dir = SelfDir();
  absl::StatusOr<WorkDir> opened = OpenWorkDir(absl::GetFlag(FLAGS_work_dir), kProgram);
  if (!opened.ok()) {
    fprintf(stderr, "%s: %s\n", kProgram, std::string(opened.status().message()).c_str());
    return absl::IsInvalidArgument(opened.status()) ? 2 : 1;
  }
  const std::string work_dir = opened->path;
  o.ringmaster.ringctl = absl::GetFlag(FLAGS_ringctl).empty() ? self_dir + "/../cli/ringctl"
                                                              : absl::GetFlag(FLAGS_ringctl);
  o.ringmaster.work_dir = work_dir;
  o.ringmaster.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  o.probe_binary = absl::GetFlag(FLAGS_probe_binary).empty() ? self_dir + "/fsdp_traffic"
                                                             : absl::GetFlag(FLAGS_probe_binary);
  o.probe = absl::GetFlag(FLAGS_probe);
  o.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.forced_threads = absl::GetFlag(FLAGS_threads);

  if (o.link_gbit > 0) {
    if (absl::Status link = CheckLinkSupport(); !link.ok()) {
      fprintf(stderr, "%s: --link_gbit: %s\n", kProgram, std::string(link.message()).c_str());
      CloseWorkDir(*opened, absl::GetFlag(FLAGS_keep_work_dir));
      return 1;
    }
  }
  KillRunsOnSignals();
  const GptBenchSize& s = o.size;
  printf("%s: %d cores, load average %.2f at start; runs in %s\n", kProgram, o.cores,
         LoadAverage(), work_dir.c_str());
  printf("GPT %lld blocks x width %lld (%lld heads), context %lld, vocab 256, AdamW; %lld "
         "sequences per rank per step (one micro-batch); %lld steps a run, windows of %lld after "
         "%lld warm-up steps; %zu configurations\n",
         static_cast<long long>(s.layers), static_cast<long long>(s.width),
         static_cast<long long>(s.heads), static_cast<long long>(s.context),
         static_cast<long long>(s.batch_per_rank), static_cast<long long>(s.steps),
         static_cast<long long>(s.log_every), static_cast<long long>(s.warmup_steps),
         o.link_only ? 0 : cases->size());
  fflush(stdout);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (o.link_only) {
    absl::Status link = LinkSection(o, work_dir, repeats);
    printf("\nload average (1 min) now %.2f on %d cores\n", LoadAverage(), o.cores);
    if (!link.ok()) {
      fprintf(stderr, "%s: %s\n(runs kept in %s)\n", kProgram, link.ToString().c_str(),
              work_dir.c_str());
      return 1;
    }
    CloseWorkDir(*opened, absl::GetFlag(FLAGS_keep_work_dir));
    return 0;
  }
  std::vector<Result> results;
  for (const FsdpCase& c : *cases) {
    Result r;
    r.c = c;
    r.threads = o.forced_threads > 0 ? o.forced_threads : ThreadsPerRank(o.cores, c.world);
    results.push_back(r);
  }
  for (int round = 0; round < repeats; ++round) {
    for (Result& r : results) {
      printf("  %sworld %d, %s...\n",
             repeats > 1 ? absl::StrCat("round ", round + 1, "/", repeats, ": ").c_str() : "",
             r.c.world, CaseLabel(r.c).c_str());
      fflush(stdout);
      if (absl::Status s = RunCase(o, round == 0, &r); !s.ok()) {
        fprintf(stderr, "%s: world %d, %s: %s\n(runs kept in %s)\n", kProgram, r.c.world,
                CaseLabel(r.c).c_str(), s.ToString().c_str(), work_dir.c_str());
        return 1;
      }
    }
  }
  double load_min = 1e9, load_max = -1;
  for (Result& r : results) {
    if (absl::Status s = Summarize(o.size, &r); !s.ok()) {
      fprintf(stderr, "%s: %s\n(runs kept in %s)\n", kProgram, s.ToString().c_str(),
              work_dir.c_str());
      return 1;
    }
    if (r.load_min >= 0) load_min = std::min(load_min, r.load_min);
    load_max = std::max(load_max, r.load_max);
  }
  if (!results.empty()) {
    printf("\nModel: %lld parameters; ZeRO-3 units: ", static_cast<long long>(results.front().formula.parameters));
    std::vector<std::string> seen;
    for (const Result& r : results) {
      if (r.c.zero_stage != 3) continue;
      const std::string d = absl::StrCat(r.c.wrap, " at world ", r.c.world, ": ",
                                         r.formula.units_description);
      if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
    }
    printf("%s\n", seen.empty() ? "-" : absl::StrJoin(seen, "; ").c_str());
  }
  PrintTables(results, o.size);
  PrintGoals(results);
  printf("\nload average (1 min) around the runs: %.2f to %.2f on %d cores; now %.2f\n", load_min,
         load_max, o.cores, LoadAverage());
  if (o.link_gbit > 0) {
    if (absl::Status link = LinkSection(o, work_dir, repeats); !link.ok()) {
      fprintf(stderr, "%s: %s\n(runs kept in %s)\n", kProgram, link.ToString().c_str(),
              work_dir.c_str());
      return 1;
    }
    printf("\nload average (1 min) now %.2f\n", LoadAverage());
  }
  CloseWorkDir(*opened, absl::GetFlag(FLAGS_keep_work_dir));
  return 0;
}

}  // namespace
}  // namespace ringmaster::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "a GPT under DDP, ZeRO-1/2/3 x wrapping x prefetch: step time, memory, traffic, goals\n"
      "  fsdpbench [--worlds 2,4] [--stages 0,1,2,3] [--wraps layer,block,model] ...");
  // --help lists this program's flags (Abseil's own looks for a file named after the
  // program, and found none: "No flags matched"); bad usage exits 2.
  std::vector<char*> args = ringmaster::ParseFlagsWithUsage(argc, argv, "fsdpbench");
  if (args.size() > 1) {
    fprintf(stderr, "fsdpbench: unexpected argument \"%s\" (everything is a --flag)\n", args[1]);
    return 2;
  }
  return ringmaster::bench::Main();
}
