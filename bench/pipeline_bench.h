// The measurement behind `ringbench pipeline`: the pipeline bubble of each schedule
// (train/pipeline/schedule.h) measured on a GPT cut into stages, next to its formula and to
// the schedule's simulation under the costs measured in the same run (issue 20, "Performance
// to reach").
//
// Every rank of the pipeline group makes the GPT's slices it holds (SplitBlocks into P·v
// stages, v = 2 for interleaved_1f1b and 1 otherwise; rank r holds stages r, r+P, ...), their
// parameters from the whole model's seed, and m micro-batches of `batch` random samples. For
// each schedule × m it makes fresh GptStages (their peak in flight counts from creation), runs
// two warm-up steps and then `steps` timed steps of RunPipeline, one BLAS thread per rank, and
// takes from PipelineRunStats, summed over the timed steps:
//   measured bubble  1 − compute ÷ total (time inside the stages' calls ÷ the rank's time in
//                    RunPipeline; the steps run back to back, so a later rank's wait for the
//                    first forward of a step is counted in that step);
//   step time        total ÷ steps; tokens/s = m·batch·context ÷ step time.
// A timing decorator around each stage measures its forward, backward (or zero_bubble's
// input-gradient and weight parts) per micro-batch; their mean over the ranks (a rank's chunks
// summed: one P-stage's worth) are the costs given to Simulate and FormulaBubble. A combined
// backward counts as backward_input with backward_weight 0 (Simulate adds them).
#ifndef RINGMASTER_BENCH_PIPELINE_BENCH_H_
#define RINGMASTER_BENCH_PIPELINE_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::bench {

struct PipelineBenchOptions {
  std::vector<train::pipeline::ScheduleKind> schedules = {
      train::pipeline::ScheduleKind::kGPipe, train::pipeline::ScheduleKind::kOneFOneB,
      train::pipeline::ScheduleKind::kZeroBubble,
      train::pipeline::ScheduleKind::kInterleaved1F1B};
  std::vector<int> micro_batches = {1, 2, 4, 8};
  int64_t layers = 8;
  int64_t width = 256;
  int64_t heads = 4;
  int64_t context = 128;
  int64_t vocab = 256;
  int64_t batch = 4;  // samples per micro-batch
  // The attention keeps its probabilities for backward instead of recomputing them from the
  // log-sum-exps (nn::GptOptions::memory_efficient_attention false): a lighter backward's
  // input-gradient part, more activation memory.
  bool keep_probabilities = false;
  int steps = 5;      // timed steps per schedule × m, after kPipelineWarmupSteps
  uint64_t seed = 1;
};

inline constexpr int kPipelineWarmupSteps = 2;
// The goals' thresholds (issue 20): the measured bubble within this of the formula for gpipe
// and 1f1b at P = 2, and zero_bubble's at most this fraction of 1f1b's at m = 4.
inline constexpr double kBubbleGoalPoints = 0.03;
inline constexpr double kZeroBubbleGoalRatio = 0.5;

// One rank's figures for one schedule × m.
struct PipelineRankMeasure {
  double bubble = 0;        // 1 − compute ÷ total, over the timed steps
  double step_ms = 0;       // mean time in RunPipeline per step
  double tokens_per_s = 0;  // m·batch·context ÷ step time
  // Per micro-batch, this rank's stages summed: forward, backward (the input-gradient part,
  // or the whole backward when not split) and the weight part (0 when not split).
  double forward_ms = 0, backward_input_ms = 0, backward_weight_ms = 0;
  int64_t activation_bytes = 0;   // GptStage::activation_bytes(), this rank's stages summed
  int64_t peak_buffer_bytes = 0;  // PipelineRunStats' peak, the largest over the steps
  // GptStage::peak_in_flight() summed over this rank's stages ÷ v (a chunk is 1/v of a
  // micro-batch, as Simulate counts it; with v > 1 the chunks' peaks may not coincide).
  double in_flight = 0;
  // CPU time of this rank's thread inside the stages' calls ÷ their wall time: about 1 when
  // the rank had its core to itself while computing, lower when another process shared it
  // (compute then stretches while waiting does not, and the measured bubble shrinks).
  double cpu_share = 0;
};

struct PipelineCase {
  train::pipeline::ScheduleKind kind = train::pipeline::ScheduleKind::kOneFOneB;
  int micro_batches = 1;
  int virtual_stages = 1;
  std::string skipped;  // why this combination did not run; empty when it ran
  std::vector<PipelineRankMeasure> ranks;  // by rank (empty when skipped)
  double formula_simple = -1;  // (P−1)/(m+P−1) for gpipe and 1f1b, −1 for the others
  double formula = 0;          // FormulaBubble with the measured costs
  double simulated = 0;        // Simulate's bubble with the measured costs
  std::vector<double> simulated_in_flight;  // Simulate's peak_activations, by rank

  double mean_bubble() const;  // over the ranks
  double max_bubble() const;
};

struct PipelineBenchResult {
  int ranks = 0;
  int steps = 0;
  std::vector<PipelineCase> cases;  // by schedule, then m, as the options list them
};

// INVALID_ARGUMENT naming the flag (--layers, --width, --heads, --context, --vocab, --batch,
// --steps, --micro_batches, --schedules, --ranks) for a value that is not positive, --heads
// not dividing --width, an empty list, or fewer --layers than --ranks (a stage needs a block).
absl::Status ValidatePipelineBench(const PipelineBenchOptions& options, int ranks);

// "gpipe,1f1b" → the kinds; INVALID_ARGUMENT naming --schedules for an unknown or no name.
absl::StatusOr<std::vector<train::pipeline::ScheduleKind>> ParsePipelineSchedules(
    absl::string_view text);
// "1,2,4,8" → the counts; INVALID_ARGUMENT naming --micro_batches for one not a positive int.
absl::StatusOr<std::vector<int>> ParseMicroBatchCounts(absl::string_view text);

// Runs every schedule × m on every rank of `group` (the same options everywhere); skips, on
// every rank alike, interleaved_1f1b where m is not a multiple of P or the model has fewer
// blocks than its P·2 stages. Every rank returns every rank's figures; the formulas and the
// simulation are filled in too. Errors: the communicator's, a stage's, INVALID_ARGUMENT as
// ValidatePipelineBench.
absl::StatusOr<PipelineBenchResult> RunPipelineBench(comm::Communicator& group,
                                                     const PipelineBenchOptions& options);

// A result as lines of text and back (rank 0 hands it to the parent process this way).
// Parsing errors: INVALID_ARGUMENT naming the line.
std::string PipelineResultToText(const PipelineBenchResult& result);
absl::StatusOr<PipelineBenchResult> PipelineResultFromText(absl::string_view text);

// The goals, computed from the result: whether each was checked (its cases ran, and
// for the first P = 2), met, and a line "goal: ...: PASS|MISS|not checked (...)".
struct PipelineGoal {
  bool checked = false;
  bool pass = false;
  std::string line;
};
std::vector<PipelineGoal> PipelineGoals(const PipelineBenchResult& result);

// The tables `ringbench pipeline` prints (a summary per schedule × m, then per rank), the
// skipped combinations and the goal lines.
std::string FormatPipelineTable(const PipelineBenchOptions& options,
                                const PipelineBenchResult& result);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_PIPELINE_BENCH_H_
