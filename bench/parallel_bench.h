// trainbench's parallel section (issue 20): one GPT trained at one world size under several
// layouts of the mesh (data, tensor and pipeline parallelism and their compositions), each a
// `ringctl local` job, side by side: step time, tokens/s, memory, traffic and block
// parameters per rank (from each rank's figures in the run's summary, TrainResult.ranks), and
// the pipeline's measured bubble beside its formula.
#ifndef RINGMASTER_BENCH_PARALLEL_BENCH_H_
#define RINGMASTER_BENCH_PARALLEL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/train_bench.h"
#include "train/result.pb.h"

namespace ringmaster::bench {

// One layout of the mesh at a world size: tp x pp x dp = world.
struct ParallelLayout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  // With pp > 1: gpipe, 1f1b, interleaved_1f1b (2 virtual stages) or zero_bubble.
  std::string schedule;
  int virtual_stages = 1;
  // "dp4", "tp2.dp2", "pp2.dp2 1f1b", "pp4 interleaved_1f1b v2".
  std::string Name() const;
};

// The layouts of --parallel_layouts at `world` ranks: comma-separated items, each a
// '.'-joined list of tpN, ppN and dpN (a missing one is 1, dp then the rest of the world;
// "dp" alone is all data parallelism), with pp > 1 optionally "@schedule" (else
// `default_schedule`). INVALID_ARGUMENT naming --parallel_layouts and the item: an unknown
// part or schedule, a size below 1, tp x pp not dividing the world, a dp that does not fill
// it, a schedule without pipeline parallelism, no item at all.
absl::StatusOr<std::vector<ParallelLayout>> ParseParallelLayouts(
    absl::string_view text, int world, const std::string& default_schedule);

// What every layout shares.
struct ParallelConfig {
  GptShape gpt;
  int world = 4;
  int64_t global_batch = 16;  // sequences a step, over all ranks
  int micro_batches = 8;      // pipeline micro-batches (layouts with pp > 1)
  int threads = 1;            // BLAS threads per rank
  int64_t steps = 16;
  int64_t log_every = 4;
  int64_t warmup_steps = 4;
  double lr = 3e-4;
};

// INVALID_ARGUMENT naming the flag: the GPT's (CheckGptFlags), --parallel_batch not a
// multiple of --parallel_world, --parallel_micro_batches below 1 or more than a replica's
// share, a tp that does not divide the heads, more stages than blocks.
absl::Status CheckParallelConfig(const ParallelConfig& config,
                                 const std::vector<ParallelLayout>& layouts);

// The `ringctl local` job of one layout: trainbench's GPT job (RingmasterJob) with the mesh
// and schedule set.
LocalJobOptions ParallelJob(const RingmasterOptions& options, const ParallelConfig& config,
                            const ParallelLayout& layout);

// A layout's run: its timed windows and rank 0's summary (with every rank's figures).
struct ParallelRun {
  ParallelLayout layout;
  TrainStats stats;
  train::TrainResult summary;
};

// Runs the layout's job and reads what it left. Errors as RunLocalJob's; INTERNAL when the
// summary is missing or lists another number of ranks than the world.
absl::StatusOr<ParallelRun> RunParallelLayout(const RingmasterOptions& options,
                                              const ParallelConfig& config,
                                              const ParallelLayout& layout);

// The figures of one row, over the run's ranks.
struct ParallelFigures {
  double step_ms = 0;
  double tokens_per_second = 0;
  double peak_rss_bytes = 0;     // the largest rank's
  double state_bytes = 0;        // parameters + gradients + optimizer state, largest rank's
  double activation_bytes = 0;   // largest rank's peak
  double block_parameters = 0;   // largest rank's
  double dp_bytes_per_step = 0;  // sent per rank per step, mean over ranks: data-parallel
  double pp_bytes_per_step = 0;  // (and the other sums), pipeline, tensor-parallel
  double tp_bytes_per_step = 0;
  double bubble = -1;  // mean over ranks; -1 without a pipeline
  double bubble_formula = -1;
};
ParallelFigures Figures(const ParallelRun& run, int64_t context);

// The table of every run (a header, a row each, the legend).
std::string ParallelTable(const std::vector<ParallelRun>& runs, const ParallelConfig& config);

// The goal: TP2's per-rank block parameters half of TP1's (+-2 %), from the first
// layout with tp 2 and pp 1 against the first with tp 1 and pp 1, e.g. "goal: TP2's
// block parameters per rank = 0.501 x TP1's (half +-2 %): PASS (395,648 vs 789,760)", or why
// it was not checked.
std::string TensorParallelGoalLine(const std::vector<ParallelRun>& runs);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_PARALLEL_BENCH_H_
