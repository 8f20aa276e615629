// trainbench: training throughput of ringmaster against PyTorch on this machine, and the
// effect of overlapping the gradient all-reduce with backward.
//
//   trainbench [--sections throughput,overlap,gpt,parallel,resnet] [--worlds 1,2,4]
//       [--overlap_worlds 2,4] [--bucket_mb 0.25,1,25] [--steps 200] [--deep_steps 80]
//       [--gpt_worlds 1,2] [--gpt_layers 6 --gpt_width 256 --gpt_heads 4 --gpt_context 256
//        --gpt_batch 8 --gpt_steps 30] [--parallel_world 4 --parallel_layouts dp,tp2,...]
//       [--csv FILE]
//
// throughput: the Fashion-MNIST MLP 784-512-512-10, 128 samples per rank, SGD with
//   momentum, fp32, at each world size: ringmaster (`ringctl local`) and PyTorch (world 1
//   plain, more ranks DDP over Gloo; bench/peers/torch_ddp.py), run one after the other
//   per world size, both with OpenBLAS and cores ÷ world threads per rank. Prints samples/s
//   (median over logged windows after the warm-up), the ratio ours/PyTorch and each side's
//   scaling efficiency (samples/s at world W ÷ (W × samples/s at world 1)); world 1 also
//   with one thread per side (--one_thread_baseline), the base of a second efficiency.
// overlap: ringmaster's step time with parallelism.overlap off (buckets run after
//   backward) and on for each --bucket_mb, for the MLP and a deeper one (--deep_hidden),
//   with the communication time and the exposed part (the step waited for it) as
//   fractions of the step, from the trainer's metrics.
// gpt (issue 20; not in the default --sections): the GPT of train/nn/gpt.h (byte
//   vocabulary, fp32, AdamW) on --gpt_text at each --gpt_worlds size: ringmaster, then
//   PyTorch (bench/peers/torch_gpt.py: the same model in eager PyTorch, world 1 plain, more
//   ranks DDP over Gloo), cores ÷ world threads per rank on both sides. Prints tokens/s, the
//   ratio ours/PyTorch (only when both report the same parameter count) and the goal lines
//   ">= 2x PyTorch at world 1" and ">= 2x PyTorch DDP at world 2" (PASS or MISS; a MISS does
//   not fail the benchmark).
// parallel (issue 20; not in the default --sections): the GPT (--parallel_layers blocks,
//   --gpt_width/--gpt_heads/--gpt_context) at --parallel_world ranks under each of
//   --parallel_layouts (data, tensor and pipeline parallelism and their compositions; pipeline
//   layouts with --parallel_micro_batches micro-batches and their schedule), one `ringctl
//   local` job each (bench/parallel_bench.h): step time, tokens/s against data parallelism,
//   the largest rank's memory, bytes sent per rank per step by group, block parameters per
//   rank, the measured bubble beside the schedule's formula; and the goal line "TP2's block
//   parameters per rank half of TP1's (+-2 %)".
// resnet (issue 21; not in the default --sections): ResNet-18 (train/nn/resnet.h, width
//   --resnet_width, fp32, SGD with momentum) at each --resnet_worlds size: ringmaster on
//   Fashion-MNIST, then PyTorch (bench/peers/torch_resnet.py: the same network in eager
//   PyTorch on random images of the same shape, world 1 plain, more ranks DDP over Gloo,
//   convolutions through oneDNN as PyTorch does by default), cores / world threads per
//   rank on both sides. Prints samples/s, scaling efficiency, the ratio ours/PyTorch (only
//   when both report the same parameter count) and the goal lines ">= 1x PyTorch at world
//   1" and ">= 1.3x PyTorch DDP at world 2".
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
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
#include "bench/parallel_bench.h"
#include "bench/train_bench.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "kernels/matmul.h"

ABSL_FLAG(std::string, sections, "throughput,overlap",
          "what to measure: throughput (ours vs PyTorch), overlap (overlap on/off, buckets), "
          "gpt (the GPT, ours vs PyTorch), parallel (the GPT under mesh layouts)");
ABSL_FLAG(int, parallel_world, 4, "parallel: ranks of every layout");
ABSL_FLAG(std::string, parallel_layouts,
          "dp,tp2,pp2,tp2.pp2,pp4@gpipe,pp4@1f1b,pp4@zero_bubble,pp4@interleaved_1f1b",
          "parallel: the layouts, each tpN, ppN and dpN joined by '.' (dp takes the rest; "
          "\"dp\": all data parallelism), with ppN > 1 optionally @gpipe, @1f1b, "
          "@interleaved_1f1b (2 virtual stages) or @zero_bubble");
ABSL_FLAG(std::string, parallel_schedule, "1f1b",
          "parallel: the schedule of a pipeline layout without @schedule");
ABSL_FLAG(int64_t, parallel_layers, 8,
          "parallel: transformer blocks (pp x virtual stages at most this; width, heads and "
          "context from --gpt_width, --gpt_heads, --gpt_context)");
ABSL_FLAG(int64_t, parallel_batch, 16, "parallel: sequences a step over all ranks");
ABSL_FLAG(int, parallel_micro_batches, 8, "parallel: micro-batches of a pipeline layout");
ABSL_FLAG(int64_t, parallel_steps, 16, "parallel: steps per run");
ABSL_FLAG(int64_t, parallel_log_every, 4, "parallel: steps per timed window");
ABSL_FLAG(int64_t, parallel_warmup_steps, 4,
          "parallel: steps at the start of a run that are not counted");
ABSL_FLAG(std::string, worlds, "1,2,4", "throughput: world sizes (local ranks)");
ABSL_FLAG(bool, one_thread_baseline, true,
          "throughput: also run world 1 with one thread on both sides (PyTorch's two-thread "
          "pools collapse when another process shares the cores; eff1 scales from it)");
ABSL_FLAG(std::string, overlap_worlds, "2,4", "overlap: world sizes");
ABSL_FLAG(std::string, bucket_mb, "0.25,1,25", "overlap: gradient bucket sizes in MiB");
ABSL_FLAG(int64_t, batch, 128, "samples per rank per step (global batch = batch x world)");
ABSL_FLAG(int64_t, steps, 200, "steps per run of the MLP 784-512-512-10");
ABSL_FLAG(std::string, deep_hidden, "1024,1024,1024,1024",
          "overlap: hidden widths of the deeper MLP (empty: leave it out)");
ABSL_FLAG(int64_t, deep_steps, 80, "steps per run of the deeper MLP");
ABSL_FLAG(int64_t, log_every, 10, "steps per timed window");
ABSL_FLAG(int64_t, warmup_steps, 20, "steps at the start of a run that are not counted");
ABSL_FLAG(int, repeats, 1,
          "rounds over every configuration; each configuration's windows are pooled over them");
ABSL_FLAG(int, threads, 0, "threads per rank on both sides; 0 = cores / world (at least 1)");
ABSL_FLAG(std::string, peer, "torch", "the peer of the throughput section: torch or none");
ABSL_FLAG(std::string, peer_data, "fashion_mnist",
          "the PyTorch peer's data: fashion_mnist (the same IDX files) or random");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with PyTorch");
ABSL_FLAG(std::string, blas_dir, "/usr/lib/x86_64-linux-gnu/openblas-pthread",
          "LD_LIBRARY_PATH of the PyTorch peer: where OpenBLAS's libblas.so.3 is");
ABSL_FLAG(std::string, ringctl, "", "the ringctl binary; empty = bazel-bin/cli/ringctl");
ABSL_FLAG(std::string, torch_script, "",
          "the PyTorch peer script; empty = bench/peers/torch_ddp.py in the runfiles");
ABSL_FLAG(std::string, work_dir, "",
          "where runs keep their specs, logs and metrics; empty = a new /tmp/trainbench-*");
ABSL_FLAG(bool, keep_work_dir, false,
          "keep the /tmp/trainbench-* work directory after a successful run (a --work_dir is "
          "always kept)");
ABSL_FLAG(std::string, gpt_worlds, "1,2", "gpt: world sizes (local ranks)");
ABSL_FLAG(int64_t, gpt_layers, 6, "gpt: transformer blocks");
ABSL_FLAG(int64_t, gpt_width, 256, "gpt: model width");
ABSL_FLAG(int64_t, gpt_heads, 4, "gpt: attention heads (divides --gpt_width)");
ABSL_FLAG(int64_t, gpt_context, 256, "gpt: tokens a sequence predicts");
ABSL_FLAG(bool, gpt2, false,
          "gpt: GPT-2's shape (model.gpt2: vocabulary 50257, LM head tied to wte) on both sides");
ABSL_FLAG(std::string, gpt_text, "/usr/share/common-licenses/GPL-3",
          "gpt: the byte file both sides train on");
ABSL_FLAG(int64_t, gpt_batch, 8, "gpt: sequences per rank per step (global = this x world)");
ABSL_FLAG(int64_t, gpt_steps, 30, "gpt: steps per run");
ABSL_FLAG(int64_t, gpt_log_every, 5, "gpt: steps per timed window");
ABSL_FLAG(int64_t, gpt_warmup_steps, 5, "gpt: steps at the start of a run that are not counted");
ABSL_FLAG(double, gpt_lr, 3e-4, "gpt: AdamW's learning rate (constant) on both sides");
ABSL_FLAG(std::string, resnet_worlds, "1,2,4", "resnet: world sizes (local ranks)");
ABSL_FLAG(int64_t, resnet_width, 64, "resnet: channels of the first stage (64: ResNet-18)");
ABSL_FLAG(bool, resnet_sync_batchnorm, false,
          "resnet: ringmaster's model.resnet18.sync_batchnorm (the peer keeps per-rank "
          "statistics)");
ABSL_FLAG(bool, resnet_torch_onednn, true,
          "resnet: PyTorch's convolutions through oneDNN (its default); false: its own im2col "
          "convolution over OpenBLAS, the BLAS ringmaster uses");
ABSL_FLAG(int64_t, resnet_batch, 32, "resnet: images per rank per step (global = this x world)");
ABSL_FLAG(int64_t, resnet_steps, 10, "resnet: steps per run");
ABSL_FLAG(int64_t, resnet_log_every, 2, "resnet: steps per timed window");
ABSL_FLAG(int64_t, resnet_warmup_steps, 2,
          "resnet: steps at the start of a run that are not counted");
ABSL_FLAG(double, resnet_lr, 0.01, "resnet: SGD's learning rate (constant) on both sides");
ABSL_FLAG(std::string, torch_resnet_script, "",
          "the PyTorch peer of the resnet section; empty = bench/peers/torch_resnet.py in the "
          "runfiles");
ABSL_FLAG(std::string, torch_gpt_script, "",
          "the PyTorch peer of the gpt section; empty = bench/peers/torch_gpt.py in the "
          "runfiles");
ABSL_FLAG(std::string, csv, "", "also write every result as CSV to this file");
ABSL_FLAG(int, timeout_s, 300, "limit of each run in seconds");

namespace ringmaster::bench {
namespace {

constexpr char kProgram[] = "trainbench";

// A comma-separated list of numbers, each at least `min`.
template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& text, T min) {
  std::vector<T> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    T v{};
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtod(item, &v);
    } else {
      ok = absl::SimpleAtoi(item, &v);
    }
    if (!ok || v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", item, "\" is not a number of at least ", min));
    }
    values.push_back(v);
  }
  return values;
}

// The first of `candidates` that exists, or the first one (for the error message).
std::string FirstExisting(const std::vector<std::string>& candidates) {
  for (const std::string& c : candidates) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return candidates.front();
}

std::string Percent(double fraction) {
  return fraction < 0 ? "-" : absl::StrFormat("%.1f", 100 * fraction);
}

std::string Ratio(double r) { return r < 0 ? "-" : absl::StrFormat("%.2f", r); }

// Median (min-max) of samples/s, times `scale` (a GPT sample's tokens).
std::string Spread(const TrainStats& s, double scale = 1) {
  return absl::StrCat(Thousands(scale * s.samples_per_second), " (",
                      Thousands(scale * s.min_samples_per_second), "-",
                      Thousands(scale * s.max_samples_per_second), ")");
}

// One configuration of one implementation; its windows pooled over the rounds.
struct Item {
  BenchRow row;
  std::vector<TrainWindow> windows;
  std::string peer_line;
  double parameters = -1;  // as the run reported it (the gpt section compares them)
};

std::string Label(const BenchRow& r) {
  std::string label = absl::StrCat(r.impl, " ", DescribeModel(r.config), " at world ",
                                   r.config.world, ", ", r.config.threads, " thread(s) per rank");
  if (r.impl == "ringmaster" && r.section == "overlap") {
    absl::StrAppend(&label, ", overlap ", r.config.overlap ? "on" : "off", ", ", r.config.bucket_mb,
                    " MiB buckets");
  }
  return label;
}

struct Bench {
  RingmasterOptions ringmaster;
  TorchOptions torch;
  int cores = 1;
  int forced_threads = 0;
  std::vector<Item> items;
  // The parallel section: its configuration, layouts and runs.
  ParallelConfig parallel;
  std::vector<ParallelLayout> layouts;
  std::vector<ParallelRun> parallel_runs;

  absl::Status RunParallel() {
    for (const ParallelLayout& layout : layouts) {
      printf("  ringmaster GPT at world %d, %s...\n", parallel.world, layout.Name().c_str());
      fflush(stdout);
      RM_ASSIGN_OR_RETURN(ParallelRun run, RunParallelLayout(ringmaster, parallel, layout));
      parallel_runs.push_back(std::move(run));
    }
    return absl::OkStatus();
  }

  TrainConfig Config(const std::vector<int64_t>& hidden, const std::string& model, int world,
                     int64_t steps) const {
    TrainConfig c;
    c.model = model;
    c.hidden = hidden;
    c.world = world;
    c.threads = forced_threads > 0 ? forced_threads : ThreadsPerRank(cores, world);
    c.batch_per_rank = absl::GetFlag(FLAGS_batch);
    c.steps = steps;
    c.log_every = absl::GetFlag(FLAGS_log_every);
    c.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
    return c;
  }

  void Add(const std::string& section, const std::string& impl, const TrainConfig& config) {
    Item item;
    item.row.section = section;
    item.row.impl = impl;
    item.row.config = config;
    items.push_back(item);
  }

  // Runs every item once, in order (a round); a failed run stops the benchmark.
  absl::Status RunRound(int round, int rounds) {
    for (Item& item : items) {
      printf("  %s%s...\n",
             rounds > 1 ? absl::StrCat("round ", round + 1, "/", rounds, ": ").c_str() : "",
             Label(item.row).c_str());
      fflush(stdout);
      const double before = LoadAverage();
      if (item.row.impl == "ringmaster") {
        absl::StatusOr<RingmasterRun> run = RunRingmaster(ringmaster, item.row.config);
        if (!run.ok()) return run.status();
        item.windows.insert(item.windows.end(), run->windows.begin(), run->windows.end());
        item.row.buckets = run->buckets;
        item.parameters = run->parameters;
      } else {
        absl::StatusOr<TorchRun> run = RunTorch(torch, item.row.config);
        if (!run.ok()) return run.status();
        item.windows.insert(item.windows.end(), run->windows.begin(), run->windows.end());
        item.peer_line = run->peer_line;
        item.parameters = run->parameters;
      }
      for (double load : {before, LoadAverage()}) {
        if (load < 0) continue;
        BenchRow& r = item.row;
        r.load_min = r.load_min < 0 ? load : std::min(r.load_min, load);
        r.load_max = std::max(r.load_max, load);
      }
    }
    return absl::OkStatus();
  }

  // Summarises each item's windows, then the ratios: throughput and gpt ours / PyTorch and
  // scaling efficiency per world; overlap: step time with overlap off / this one.
  absl::Status Summarize() {
    // samples/s by (section, impl, world, threads)
    std::map<std::tuple<std::string, std::string, int, int>, double> sps;
    std::map<std::tuple<std::string, std::string, int, int>, double> parameters;
    std::map<std::pair<std::string, int>, double> off_ms;  // model, world
    for (Item& item : items) {
      BenchRow& r = item.row;
      absl::StatusOr<TrainStats> stats = SummarizeWindows(item.windows, r.config.warmup_steps);
      if (!stats.ok()) {
        return absl::Status(stats.status().code(),
                            absl::StrCat(Label(r), ": ", stats.status().message()));
      }
      r.stats = *stats;
      sps[{r.section, r.impl, r.config.world, r.config.threads}] = r.stats.samples_per_second;
      parameters[{r.section, r.impl, r.config.world, r.config.threads}] = item.parameters;
      if (r.section == "overlap" && !r.config.overlap) {
        off_ms[{r.config.model, r.config.world}] = r.stats.step_ms;
      }
    }
    const int world1_threads = Config({}, "", 1, 0).threads;
    for (Item& item : items) {
      BenchRow& r = item.row;
      const TrainConfig& c = r.config;
      if (r.section != "overlap") {
        const double per_rank = r.stats.samples_per_second / c.world;
        auto one = sps.find({r.section, r.impl, 1, world1_threads});
        if (one != sps.end() && (c.world > 1 || c.threads == world1_threads)) {
          r.efficiency = per_rank / one->second;
        }
        auto one_thread = sps.find({r.section, r.impl, 1, 1});
        if (one_thread != sps.end()) r.efficiency_one_thread = per_rank / one_thread->second;
        auto peer = sps.find({r.section, "pytorch", c.world, c.threads});
        // The GPT's sides must be the same model: a ratio only for equal parameter counts.
        const bool same_model =
            (r.section != "gpt" && r.section != "resnet") ||
            parameters[{r.section, "pytorch", c.world, c.threads}] == item.parameters;
        if (r.impl == "ringmaster" && peer != sps.end() && same_model) {
          r.ratio = r.stats.samples_per_second / peer->second;
        }
      } else {
        auto off = off_ms.find({c.model, c.world});
        if (off != off_ms.end()) r.ratio = off->second / r.stats.step_ms;
      }
    }
    return absl::OkStatus();
  }

  std::vector<const Item*> Section(const std::string& section) const {
    std::vector<const Item*> out;
    for (const Item& item : items) {
      if (item.row.section == section) out.push_back(&item);
    }
    return out;
  }
};

void PrintThroughput(const Bench& bench, int repeats) {
  const std::vector<const Item*> items = bench.Section("throughput");
  if (items.empty()) return;
  const TrainConfig& c = items.front()->row.config;
  printf("\nThroughput: MLP %s, %lld samples per rank, SGD momentum, fp32, Fashion-MNIST\n",
         DescribeMlp(c.hidden).c_str(), static_cast<long long>(c.batch_per_rank));
  printf(
      "samples/s over all ranks: median (min-max) of %lld-step windows after %lld warm-up "
      "steps; %lld steps a run, %d run(s) each\n",
      static_cast<long long>(c.log_every), static_cast<long long>(c.warmup_steps),
      static_cast<long long>(c.steps), repeats);
  printf("%5s %7s | %-26s %5s %5s %6s %6s | %-26s %5s %5s | %7s\n", "world", "threads",
         "ringmaster samples/s", "eff", "eff1", "comm%", "exp%", "PyTorch samples/s", "eff", "eff1",
         "ours/PT");
  for (const Item* item : items) {
    const BenchRow& ours = item->row;
    if (ours.impl != "ringmaster") continue;
    const BenchRow* peer = nullptr;
    for (const Item* other : items) {
      const TrainConfig& c = other->row.config;
      if (other->row.impl == "pytorch" && c.world == ours.config.world &&
          c.threads == ours.config.threads) {
        peer = &other->row;
      }
    }
    printf("%5d %7d | %-26s %5s %5s %6s %6s | %-26s %5s %5s | %7s\n", ours.config.world,
           ours.config.threads, Spread(ours.stats).c_str(), Ratio(ours.efficiency).c_str(),
           Ratio(ours.efficiency_one_thread).c_str(), Percent(ours.stats.comm_fraction).c_str(),
           Percent(ours.stats.exposed_comm_fraction).c_str(),
           peer ? Spread(peer->stats).c_str() : "-", peer ? Ratio(peer->efficiency).c_str() : "-",
           peer ? Ratio(peer->efficiency_one_thread).c_str() : "-", Ratio(ours.ratio).c_str());
  }
  printf(
      "eff = samples/s at world W / (W x samples/s at world 1 with cores/1 threads); eff1 = "
      "the same against world 1 with one thread\ncomm%%/exp%% = time in gradient "
      "collectives / of it the step waited for, as %% of the step\n");
  for (const Item* item : items) {
    if (!item->peer_line.empty()) printf("PyTorch peer: %s\n", item->peer_line.c_str());
  }
  // The goals of issue 3.
  for (const Item* item : items) {
    const BenchRow& r = item->row;
    if (r.impl != "ringmaster" || r.ratio < 0) continue;
    if (r.config.world == 1 && r.efficiency > 0) {
      printf("goal world 1: ours/PyTorch %.2f >= 1: %s\n", r.ratio,
             r.ratio >= 1 ? "met" : "NOT met");
    } else if (r.config.world == 2) {
      printf("goal world 2: ours/PyTorch DDP %.2f >= 1.5: %s; scaling efficiency %s >= 0.8: %s\n",
             r.ratio, r.ratio >= 1.5 ? "met" : "NOT met", Ratio(r.efficiency).c_str(),
             r.efficiency >= 0.8 ? "met" : "NOT met");
    }
  }
}

// The ringmaster and PyTorch items of the gpt section at one world size (null: not run).
std::pair<const Item*, const Item*> GptPair(const std::vector<const Item*>& items, int world) {
  std::pair<const Item*, const Item*> pair = {nullptr, nullptr};
  for (const Item* item : items) {
    if (item->row.config.world != world) continue;
    (item->row.impl == "ringmaster" ? pair.first : pair.second) = item;
  }
  return pair;
}

// The table of a section that runs one model on both sides at several world sizes (gpt,
// resnet): `unit` ("tokens/s", "samples/s") per world, `scale` of them per sample, then the
// parameter counts, the peer lines and the goals: ours >= targets[w] x PyTorch at world w.
void PrintSideBySide(const std::vector<const Item*>& items, const std::string& unit, double scale,
                     const std::vector<std::pair<int, double>>& targets) {
  printf("%5s %7s | %-26s %5s %8s | %-26s %5s %8s | %7s\n", "world", "threads",
         absl::StrCat("ringmaster ", unit).c_str(), "eff", "step ms",
         absl::StrCat("PyTorch ", unit).c_str(), "eff", "step ms", "ours/PT");
  std::vector<int> worlds;
  for (const Item* item : items) {
    if (std::find(worlds.begin(), worlds.end(), item->row.config.world) == worlds.end()) {
      worlds.push_back(item->row.config.world);
    }
  }
  for (int world : worlds) {
    const auto [ours, peer] = GptPair(items, world);
    // One side's columns: the rate, efficiency, step time ("-" when it was not measured).
    auto side = [&](const Item* item) {
      return item == nullptr
                 ? absl::StrFormat("%-26s %5s %8s", "-", "-", "-")
                 : absl::StrFormat("%-26s %5s %8.0f", Spread(item->row.stats, scale),
                                   Ratio(item->row.efficiency), item->row.stats.step_ms);
    };
    printf("%5d %7d | %s | %s | %7s\n", world, (ours ? ours : peer)->row.config.threads,
           side(ours).c_str(), side(peer).c_str(), ours ? Ratio(ours->row.ratio).c_str() : "-");
  }
  printf(
      "eff = %s at world W / (W x %s at world 1); ours/PT only where both report the same "
      "parameter count\n",
      unit.c_str(), unit.c_str());
  for (int world : worlds) {
    const auto [ours, peer] = GptPair(items, world);
    auto count = [](const Item* item) {
      return item == nullptr || item->parameters < 0 ? std::string("-")
                                                     : Thousands(item->parameters);
    };
    printf("parameters at world %d: ringmaster %s, PyTorch %s\n", world, count(ours).c_str(),
           count(peer).c_str());
    if (peer != nullptr && !peer->peer_line.empty()) {
      printf("PyTorch peer: %s\n", peer->peer_line.c_str());
    }
  }
  for (const auto& [world, target] : targets) {
    const auto [ours, peer] = GptPair(items, world);
    GptGoal goal;
    goal.world = world;
    goal.target = target;
    goal.unit = unit;
    if (ours != nullptr) {
      goal.ours_tokens_per_second = scale * ours->row.stats.samples_per_second;
      goal.ours_parameters = ours->parameters;
    }
    if (peer != nullptr) {
      goal.torch_tokens_per_second = scale * peer->row.stats.samples_per_second;
      goal.torch_parameters = peer->parameters;
    }
    printf("%s\n", GptGoalLine(goal).c_str());
  }
}

void PrintGpt(const Bench& bench, int repeats) {
  const std::vector<const Item*> items = bench.Section("gpt");
  if (items.empty()) return;
  const TrainConfig& c = items.front()->row.config;
  const GptShape& g = *c.gpt;
  printf(
      "\nGPT: %lld blocks x %lld wide, %lld heads, context %lld, %s; %lld "
      "sequences per rank, AdamW, fp32, %s\n",
      static_cast<long long>(g.layers), static_cast<long long>(g.width),
      static_cast<long long>(g.heads), static_cast<long long>(g.context),
      g.gpt2 ? "GPT-2's vocabulary of 50257 and tied head" : "byte vocabulary",
      static_cast<long long>(c.batch_per_rank), g.text.c_str());
  printf(
      "tokens/s over all ranks: median (min-max) of %lld-step windows after %lld warm-up "
      "steps; %lld steps a run, %d run(s) each\n",
      static_cast<long long>(c.log_every), static_cast<long long>(c.warmup_steps),
      static_cast<long long>(c.steps), repeats);
  // The goals of issue 20 (2x PyTorch); with --gpt2 issue 21's (a GPT-2-shaped model at least
  // as fast as the PyTorch script).
  const double target = g.gpt2 ? 1.0 : 2.0;
  PrintSideBySide(items, "tokens/s", static_cast<double>(g.context), {{1, target}, {2, target}});
}

void PrintResnet(const Bench& bench, int repeats) {
  const std::vector<const Item*> items = bench.Section("resnet");
  if (items.empty()) return;
  const TrainConfig& c = items.front()->row.config;
  printf(
      "\nResNet-18: width %lld, 28x28 images padded to 32x32 x 3; %lld images per rank, SGD "
      "momentum, fp32; BatchNorm statistics %s (PyTorch: per rank); PyTorch's convolutions "
      "%s\n",
      static_cast<long long>(c.resnet->width), static_cast<long long>(c.batch_per_rank),
      c.resnet->sync_batchnorm ? "synchronized" : "per rank",
      c.resnet->torch_onednn ? "through oneDNN (its default)" : "its own im2col over OpenBLAS");
  printf(
      "samples/s over all ranks: median (min-max) of %lld-step windows after %lld warm-up "
      "steps; %lld steps a run, %d run(s) each\n",
      static_cast<long long>(c.log_every), static_cast<long long>(c.warmup_steps),
      static_cast<long long>(c.steps), repeats);
  // The goals of issue 21.
  PrintSideBySide(items, "samples/s", 1.0, {{1, 1.0}, {2, 1.3}});
}

void PrintOverlap(const Bench& bench) {
  const std::vector<const Item*> items = bench.Section("overlap");
  if (items.empty()) return;
  printf(
      "\nOverlap: ringmaster step time, median of %lld-step windows after %lld warm-up "
      "steps\n",
      static_cast<long long>(items.front()->row.config.log_every),
      static_cast<long long>(items.front()->row.config.warmup_steps));
  printf("%-28s %5s %7s %7s %7s %9s %10s %6s %6s %8s\n", "model", "world", "overlap", "bucket",
         "buckets", "step ms", "samples/s", "comm%", "exp%", "off/this");
  for (const Item* item : items) {
    const BenchRow& r = item->row;
    printf("%-28s %5d %7s %7s %7s %9.2f %10s %6s %6s %8s\n", DescribeMlp(r.config.hidden).c_str(),
           r.config.world, r.config.overlap ? "on" : "off",
           absl::StrCat(r.config.bucket_mb, "M").c_str(),
           r.buckets < 0 ? "-" : absl::StrCat(r.buckets).c_str(), r.stats.step_ms,
           Thousands(r.stats.samples_per_second).c_str(), Percent(r.stats.comm_fraction).c_str(),
           Percent(r.stats.exposed_comm_fraction).c_str(), Ratio(r.ratio).c_str());
  }
  printf(
      "off/this = step time with overlap off (one 25 MiB bucket after backward) / this "
      "configuration's (> 1: faster)\n");
}

// A list flag: its values, each at least `min`; INVALID_ARGUMENT naming the flag.
template <typename T>
absl::StatusOr<std::vector<T>> ListFlag(const std::string& flag, const std::string& text, T min,
                                        bool may_be_empty) {
  absl::StatusOr<std::vector<T>> values = ParseList<T>(text, min);
  if (!values.ok()) return FlagError(flag, std::string(values.status().message()));
  if (values->empty() && !may_be_empty) return FlagError(flag, "give at least one value");
  return values;
}

// Reads and checks the flags and fills `bench` with the configurations to measure.
// INVALID_ARGUMENT naming the flag when one is wrong.
absl::Status Plan(Bench* bench) {
  bool throughput = false, overlap = false, gpt = false, parallel = false, resnet = false;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sections), ',', absl::SkipWhitespace())) {
    if (s == "throughput") {
      throughput = true;
    } else if (s == "overlap") {
      overlap = true;
    } else if (s == "gpt") {
      gpt = true;
    } else if (s == "parallel") {
      parallel = true;
    } else if (s == "resnet") {
      resnet = true;
    } else {
      return FlagError("sections",
                       absl::StrCat("unknown section \"", s,
                                    "\"; use throughput, overlap, gpt, parallel and/or resnet"));
    }
  }
  if (!throughput && !overlap && !gpt && !parallel && !resnet) {
    return FlagError("sections", "name at least one section");
  }
  RM_ASSIGN_OR_RETURN(std::vector<int> worlds,
                      ListFlag<int>("worlds", absl::GetFlag(FLAGS_worlds), 1, !throughput));
  RM_ASSIGN_OR_RETURN(
      std::vector<int> overlap_worlds,
      ListFlag<int>("overlap_worlds", absl::GetFlag(FLAGS_overlap_worlds), 1, !overlap));
  RM_ASSIGN_OR_RETURN(
      std::vector<double> buckets,
      ListFlag<double>("bucket_mb", absl::GetFlag(FLAGS_bucket_mb), 0.001, !overlap));
  RM_ASSIGN_OR_RETURN(std::vector<int> gpt_worlds,
                      ListFlag<int>("gpt_worlds", absl::GetFlag(FLAGS_gpt_worlds), 1, !gpt));
  GptShape shape;
  shape.layers = absl::GetFlag(FLAGS_gpt_layers);
  shape.width = absl::GetFlag(FLAGS_gpt_width);
  shape.heads = absl::GetFlag(FLAGS_gpt_heads);
  shape.context = absl::GetFlag(FLAGS_gpt_context);
  shape.text = absl::GetFlag(FLAGS_gpt_text);
  shape.gpt2 = absl::GetFlag(FLAGS_gpt2);
  if (gpt) {
    for (const auto& [name, value, min] :
         {std::tuple<const char*, int64_t, int64_t>{"gpt_log_every",
                                                    absl::GetFlag(FLAGS_gpt_log_every), 1},
          {"gpt_warmup_steps", absl::GetFlag(FLAGS_gpt_warmup_steps), 0}}) {
      if (value < min) return FlagError(name, absl::StrCat(value, " is less than ", min));
    }
    if (!(absl::GetFlag(FLAGS_gpt_lr) > 0)) return FlagError("gpt_lr", "must be positive");
    RM_RETURN_IF_ERROR(
        CheckGptFlags(shape, absl::GetFlag(FLAGS_gpt_batch), absl::GetFlag(FLAGS_gpt_steps),
                      absl::GetFlag(FLAGS_gpt_warmup_steps), absl::GetFlag(FLAGS_gpt_log_every),
                      *std::max_element(gpt_worlds.begin(), gpt_worlds.end())));
  }
  RM_ASSIGN_OR_RETURN(
      std::vector<int> resnet_worlds,
      ListFlag<int>("resnet_worlds", absl::GetFlag(FLAGS_resnet_worlds), 1, !resnet));
  if (resnet) {
    for (const auto& [name, value, min] :
         {std::tuple<const char*, int64_t, int64_t>{"resnet_width",
                                                    absl::GetFlag(FLAGS_resnet_width), 1},
          {"resnet_batch", absl::GetFlag(FLAGS_resnet_batch), 2},
          {"resnet_log_every", absl::GetFlag(FLAGS_resnet_log_every), 1},
          {"resnet_warmup_steps", absl::GetFlag(FLAGS_resnet_warmup_steps), 0},
          {"resnet_steps", absl::GetFlag(FLAGS_resnet_steps),
           absl::GetFlag(FLAGS_resnet_warmup_steps) + absl::GetFlag(FLAGS_resnet_log_every)}}) {
      if (value < min) return FlagError(name, absl::StrCat(value, " is less than ", min));
    }
    if (!(absl::GetFlag(FLAGS_resnet_lr) > 0)) return FlagError("resnet_lr", "must be positive");
  }
  if (parallel) {
    ParallelConfig& p = bench->parallel;
    p.gpt = shape;
    p.gpt.layers = absl::GetFlag(FLAGS_parallel_layers);
    p.world = absl::GetFlag(FLAGS_parallel_world);
    if (p.world < 1) return FlagError("parallel_world", "must be at least 1");
    p.global_batch = absl::GetFlag(FLAGS_parallel_batch);
    p.micro_batches = absl::GetFlag(FLAGS_parallel_micro_batches);
    p.steps = absl::GetFlag(FLAGS_parallel_steps);
    p.log_every = absl::GetFlag(FLAGS_parallel_log_every);
    p.warmup_steps = absl::GetFlag(FLAGS_parallel_warmup_steps);
    p.lr = absl::GetFlag(FLAGS_gpt_lr);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p.threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                 : ThreadsPerRank(cores, p.world);
    if (p.gpt.layers < 1) return FlagError("parallel_layers", "must be at least 1");
    if (p.log_every < 1) return FlagError("parallel_log_every", "must be at least 1");
    if (p.warmup_steps < 0) return FlagError("parallel_warmup_steps", "must be at least 0");
    if (p.global_batch < 1) return FlagError("parallel_batch", "must be at least 1");
    RM_ASSIGN_OR_RETURN(bench->layouts,
                        ParseParallelLayouts(absl::GetFlag(FLAGS_parallel_layouts), p.world,
                                             absl::GetFlag(FLAGS_parallel_schedule)));
    RM_RETURN_IF_ERROR(CheckParallelConfig(p, bench->layouts));
  }
  RM_ASSIGN_OR_RETURN(std::vector<int64_t> deep_hidden,
                      ListFlag<int64_t>("deep_hidden", absl::GetFlag(FLAGS_deep_hidden), 1, true));
  for (const auto& [name, value, min] :
       {std::tuple<const char*, int64_t, int64_t>{"batch", absl::GetFlag(FLAGS_batch), 1},
        {"steps", absl::GetFlag(FLAGS_steps), 1},
        {"deep_steps", absl::GetFlag(FLAGS_deep_steps), 1},
        {"log_every", absl::GetFlag(FLAGS_log_every), 1},
        {"warmup_steps", absl::GetFlag(FLAGS_warmup_steps), 0},
        {"repeats", absl::GetFlag(FLAGS_repeats), 1},
        {"threads", absl::GetFlag(FLAGS_threads), 0},
        {"timeout_s", absl::GetFlag(FLAGS_timeout_s), 1}}) {
    if (value < min) return FlagError(name, absl::StrCat(value, " is less than ", min));
  }
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t deep_steps = absl::GetFlag(FLAGS_deep_steps);
  for (const auto& [name, n] :
       {std::pair<const char*, int64_t>{"steps", steps}, {"deep_steps", deep_steps}}) {
    if (n < absl::GetFlag(FLAGS_warmup_steps) + absl::GetFlag(FLAGS_log_every)) {
      return FlagError(name, "must be at least --warmup_steps + --log_every (one timed window)");
    }
  }
  const std::string peer = absl::GetFlag(FLAGS_peer);
  if (peer != "torch" && peer != "none") {
    return FlagError("peer", absl::StrCat("\"", peer, "\" is neither torch nor none"));
  }
  const std::string peer_data = absl::GetFlag(FLAGS_peer_data);
  if (peer_data != "fashion_mnist" && peer_data != "random") {
    return FlagError("peer_data",
                     absl::StrCat("\"", peer_data, "\" is neither fashion_mnist nor random"));
  }
  const std::string csv = absl::GetFlag(FLAGS_csv);
  if (!csv.empty()) {
    const size_t slash = csv.find_last_of('/');
    const std::string dir =
        slash == std::string::npos ? "." : csv.substr(0, std::max<size_t>(slash, 1));
    if (access(dir.c_str(), W_OK) != 0) {
      return FlagError(
          "csv", absl::StrCat(csv, ": directory ", dir, " does not exist or is not writable"));
    }
  }

  bench->cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bench->forced_threads = absl::GetFlag(FLAGS_threads);
  bench->torch.data = peer_data;
  if (throughput) {
    // Ours and the peer one after the other at each world size, so both meet the same load.
    for (int world : worlds) {
      TrainConfig c = bench->Config({512, 512}, "mlp", world, steps);
      bench->Add("throughput", "ringmaster", c);
      if (peer == "torch") bench->Add("throughput", "pytorch", c);
      if (world == 1 && c.threads > 1 && absl::GetFlag(FLAGS_one_thread_baseline)) {
        c.threads = 1;
        bench->Add("throughput", "ringmaster", c);
        if (peer == "torch") bench->Add("throughput", "pytorch", c);
      }
    }
  }
  if (gpt) {
    // Ours and the peer one after the other at each world size, as throughput.
    for (int world : gpt_worlds) {
      TrainConfig c = bench->Config({}, "gpt", world, absl::GetFlag(FLAGS_gpt_steps));
      c.gpt = shape;
      c.batch_per_rank = absl::GetFlag(FLAGS_gpt_batch);
      c.log_every = absl::GetFlag(FLAGS_gpt_log_every);
      c.warmup_steps = absl::GetFlag(FLAGS_gpt_warmup_steps);
      c.lr = absl::GetFlag(FLAGS_gpt_lr);
      bench->Add("gpt", "ringmaster", c);
      bench->Add("gpt", "pytorch", c);
    }
  }
  if (resnet) {
    // Ours and the peer one after the other at each world size, as throughput.
    for (int world : resnet_worlds) {
      TrainConfig c = bench->Config({}, "resnet18", world, absl::GetFlag(FLAGS_resnet_steps));
      c.resnet =
          ResnetShape{absl::GetFlag(FLAGS_resnet_width), absl::GetFlag(FLAGS_resnet_sync_batchnorm),
                      absl::GetFlag(FLAGS_resnet_torch_onednn)};
      c.batch_per_rank = absl::GetFlag(FLAGS_resnet_batch);
      c.log_every = absl::GetFlag(FLAGS_resnet_log_every);
      c.warmup_steps = absl::GetFlag(FLAGS_resnet_warmup_steps);
      c.lr = absl::GetFlag(FLAGS_resnet_lr);
      bench->Add("resnet", "ringmaster", c);
      if (peer == "torch") bench->Add("resnet", "pytorch", c);
    }
  }
  if (overlap) {
    std::vector<std::tuple<std::string, std::vector<int64_t>, int64_t>> models = {
        {"mlp", {512, 512}, steps}};
    if (!deep_hidden.empty()) models.emplace_back("deep_mlp", deep_hidden, deep_steps);
    for (const auto& [name, hidden, model_steps] : models) {
      for (int world : overlap_worlds) {
        TrainConfig c = bench->Config(hidden, name, world, model_steps);
        c.overlap = false;
        c.bucket_mb = 25;
        bench->Add("overlap", "ringmaster", c);
        for (double mb : buckets) {
          c.overlap = true;
          c.bucket_mb = mb;
          bench->Add("overlap", "ringmaster", c);
        }
      }
    }
  }
  return absl::OkStatus();
}

int Main() {
  Bench bench;
  if (absl::Status s = Plan(&bench); !s.ok()) {
    fprintf(stderr, "%s: %s\n", kProgram, std::string(s.message()).c_str());
    return 2;
  }
  const std::string self_dir = SelfDir();
  absl::StatusOr<WorkDir> opened = OpenWorkDir(absl::GetFlag(FLAGS_work_dir), kProgram);
  if (!opened.ok()) {
    fprintf(stderr, "%s: %s\n", kProgram, std::string(opened.status().message()).c_str());
    return absl::IsInvalidArgument(opened.status()) ? 2 : 1;
  }
  const std::string work_dir = opened->path;
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  bench.ringmaster.ringctl = absl::GetFlag(FLAGS_ringctl).empty()
                                 ? FirstExisting({self_dir + "/../cli/ringctl"})
                                 : absl::GetFlag(FLAGS_ringctl);
  bench.ringmaster.data_dir = absl::GetFlag(FLAGS_data_dir);
  bench.ringmaster.work_dir = work_dir;
  bench.ringmaster.timeout = timeout;
  bench.torch.python = absl::GetFlag(FLAGS_python);
  bench.torch.script =
      absl::GetFlag(FLAGS_torch_script).empty()
          ? FirstExisting({self_dir + "/trainbench.runfiles/ringmaster/bench/peers/torch_ddp.py",
                           self_dir + "/peers/torch_ddp.py"})
          : absl::GetFlag(FLAGS_torch_script);
  bench.torch.gpt_script =
      absl::GetFlag(FLAGS_torch_gpt_script).empty()
          ? FirstExisting({self_dir + "/trainbench.runfiles/ringmaster/bench/peers/torch_gpt.py",
                           self_dir + "/peers/torch_gpt.py"})
          : absl::GetFlag(FLAGS_torch_gpt_script);
  bench.torch.resnet_script =
      absl::GetFlag(FLAGS_torch_resnet_script).empty()
          ? FirstExisting({self_dir + "/trainbench.runfiles/ringmaster/bench/peers/torch_resnet.py",
                           self_dir + "/peers/torch_resnet.py"})
          : absl::GetFlag(FLAGS_torch_resnet_script);
  bench.torch.blas_dir = absl::GetFlag(FLAGS_blas_dir);
  bench.torch.data_dir = absl::GetFlag(FLAGS_data_dir);
  bench.torch.work_dir = work_dir;
  bench.torch.timeout = timeout;

  if (!bench.Section("resnet").empty()) {
    absl::StatusOr<std::string> images =
        MakeShortTestSplitDir(bench.ringmaster.data_dir, work_dir, 64);
    if (!images.ok()) {
      fprintf(stderr, "%s: %s\n", kProgram, images.status().ToString().c_str());
      return 1;
    }
    bench.ringmaster.resnet_data_dir = *images;
  }
  KillRunsOnSignals();
  const double load_start = LoadAverage();
  printf("%s: %d cores, load average %.2f at start; runs in %s\n", kProgram, bench.cores,
         load_start, work_dir.c_str());
  fflush(stdout);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  absl::Status status;
  for (int round = 0; round < repeats && status.ok(); ++round) {
    status = bench.RunRound(round, repeats);
  }
  if (status.ok()) status = bench.RunParallel();
  if (status.ok()) status = bench.Summarize();
  if (!status.ok()) {
    fprintf(stderr, "%s: %s\n(runs kept in %s)\n", kProgram, status.ToString().c_str(),
            work_dir.c_str());
    return 1;
  }
  PrintThroughput(bench, repeats);
  PrintGpt(bench, repeats);
  PrintResnet(bench, repeats);
  PrintOverlap(bench);
  if (!bench.parallel_runs.empty()) {
    printf("\nParallel layouts at world %d\n%s%s\n", bench.parallel.world,
           ParallelTable(bench.parallel_runs, bench.parallel).c_str(),
           TensorParallelGoalLine(bench.parallel_runs).c_str());
  }
  std::vector<BenchRow> rows;
  for (const Item& item : bench.items) rows.push_back(item.row);
  double lowest = 1e9, highest = -1;
  for (const BenchRow& r : rows) {
    for (double l : {r.load_min, r.load_max}) {
      if (l < 0) continue;
      lowest = std::min(lowest, l);
      highest = std::max(highest, l);
    }
  }
  if (highest >= 0) {
    printf("\nload average (1 min) during the runs: %.2f to %.2f on %d cores; now %.2f\n", lowest,
           highest, bench.cores, LoadAverage());
  } else {
    printf("\nload average (1 min) now %.2f on %d cores\n", LoadAverage(), bench.cores);
  }
  if (const std::string csv = absl::GetFlag(FLAGS_csv); !csv.empty()) {
    absl::Status s = WriteFileAtomically(csv, BenchRowsToCsv(rows));
    if (!s.ok()) {
      fprintf(stderr, "%s: --csv: %s\n", kProgram, s.ToString().c_str());
      return 1;
    }
    printf("wrote %s\n", csv.c_str());
  }
  CloseWorkDir(*opened, absl::GetFlag(FLAGS_keep_work_dir));
  return 0;
}

}  // namespace
}  // namespace ringmaster::bench

int main(int argc, char** argv) {
  // OpenBLAS kernels this CPU runs, for every run: the environment (OPENBLAS_CORETYPE) passes
  // to ringmaster's trainers and the PyTorch peers alike, so both sides run the same BLAS.
  const std::string blas = ringmaster::kernels::UseBestBlasKernels(argv);
  absl::SetProgramUsageMessage(
      "training throughput of ringmaster vs PyTorch DDP (MLP and GPT), and overlap on/off.\n"
      "  trainbench [--sections throughput,overlap,gpt,parallel,resnet] [--worlds 1,2,4] [--csv "
      "FILE] "
      "...");
  // --help lists this program's flags (Abseil's own looks for a file named after the
  // program, and found none: "No flags matched"); bad usage exits 2.
  std::vector<char*> args = ringmaster::ParseFlagsWithUsage(argc, argv, "trainbench");
  if (args.size() > 1) {
    fprintf(stderr, "trainbench: unexpected argument \"%s\" (everything is a --flag)\n", args[1]);
    return 2;
  }
  if (!blas.empty()) printf("%s\n", blas.c_str());
  return ringmaster::bench::Main();
}
