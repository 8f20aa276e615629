// The measurement behind `fsdpbench`: a GPT trained through `ringctl local` under plain data
// parallelism (ZeRO-0), ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP) with each wrapping and prefetch
// (issue 19), and what each configuration costs: step time and exposed communication (rank
// 0's metrics.jsonl), memory per rank (the ranks' "memory on rank" lines, measured from their
// allocations; rank 0's peak RSS from its summary; the largest peak RSS of the job's
// processes from wait4), and the bytes a rank sends per step: by the formula
// (train/fsdp_layout.h Zero3PassTraffic; ring all-reduce 2(N−1)/N·Ψ·4) and measured by the
// communicator's counters, which the trainer does not report: a probe (fsdp_traffic_main.cc)
// trains the same spec for a few steps in-process and reads them, or, once TrainResult has
// them, the trainer's own `gathered_bytes` / `reduced_bytes`.
//
// The pure parts (spec overrides, log parsing, formulas, goal checks) are here for the tests;
// the runs block like RunLocalJob's. Not thread-safe.
#ifndef RINGMASTER_BENCH_FSDP_BENCH_H_
#define RINGMASTER_BENCH_FSDP_BENCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/train_bench.h"
#include "train/fsdp_layout.h"
#include "train/result.pb.h"

namespace ringmaster::bench {

// The GPT every configuration trains (byte-level text, AdamW, constant lr, fp32 unless a
// case says otherwise, no evaluation, no fingerprints) and how long.
struct GptBenchSize {
  int64_t layers = 8;
  int64_t heads = 4;
  int64_t width = 256;
  int64_t context = 256;
  int64_t batch_per_rank = 2;  // sequences; one micro-batch (no accumulation)
  int64_t steps = 16;
  int64_t log_every = 2;
  int64_t warmup_steps = 4;  // windows ending at or before it are not counted
  int64_t probe_steps = 3;   // a traffic probe's steps; its first is not counted
  std::string text = "/usr/share/common-licenses/GPL-3";
};

// One configuration.
struct FsdpCase {
  int world = 2;
  int zero_stage = 0;
  std::string wrap = "block";     // zero_stage 3: layer, block or model
  std::string prefetch = "both";  // zero_stage 3: none, forward, backward or both
  std::string compute = "fp32";   // precision.compute: fp32, bf16 or fp16
  std::string reduce = "fp32";    // precision.reduce (zero_stage 2 and 3): fp32 or bf16
};

// "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 block, prefetch both"; with ", bf16" (compute) and
// ", reduce bf16" when not fp32.
std::string CaseLabel(const FsdpCase& c);

// The job spec every case starts from; CaseOverrides makes it the case's.
extern const char kFsdpJobSpec[];

// The --set assignments that make kFsdpJobSpec train `c` at `size` with `threads` BLAS
// threads per rank. The stage's own fields only under that stage (the spec refuses
// parallelism.fsdp under another stage, precision.reduce under stages 0 and 1).
std::vector<std::string> CaseOverrides(const FsdpCase& c, const GptBenchSize& size, int threads);

// The case's job spec as YAML with every override applied and defaults filled (what the
// runs and the formula read). INVALID_ARGUMENT naming the field when the spec refuses it.
absl::StatusOr<std::string> CaseSpecYaml(const FsdpCase& c, const GptBenchSize& size,
                                         int threads);

// Bytes one rank sends per step, by collective. Calls are -1 when not known (formulas).
struct StepTraffic {
  double all_gather = 0;
  double reduce_scatter = 0;
  double all_reduce = 0;
  double all_gather_calls = -1;
  double reduce_scatter_calls = -1;
  double all_reduce_calls = -1;
  // Measured on an emulated link (fsdp_traffic --link_gbit): what the rank's interface sent
  // (headers and TCP's acknowledgements included) and its token bucket dropped (packets).
  // -1: not on a link.
  double link_tx_bytes = -1;
  double link_drops = -1;
  double total() const { return all_gather + reduce_scatter + all_reduce; }
};

// Plain data parallelism (stage 0) and ZeRO-1 over `padded_elements` fp32 gradients (the
// flat buffer padded for the shards, train/grad_sync.h PaddedElements): a ring all-reduce
// sends 2(N−1)/N of them per rank; ZeRO-1 also all-gathers the updated parameters after the
// optimizer step, (N−1)/N. One micro-batch per step.
StepTraffic DataParallelTraffic(int64_t padded_elements, int world, int zero_stage);

// ZeRO-2 and ZeRO-3 over the strategy's units, one micro-batch per step. Stage 3:
// Zero3PassTraffic. Stage 2: every unit (bucket) reduce-scattered once ((N−1)·shard elements
// of reduce_bytes) and, after the optimizer step, all-gathered into the compute copy
// ((N−1)·shard of gather_bytes).
StepTraffic ShardedTraffic(const train::FsdpLayout& layout, int zero_stage,
                           bool reshard_after_forward, int gather_bytes, int reduce_bytes);

// What the formula says of a case: its traffic and, for stages 2 and 3, the units. Builds
// the model's tensor table (no parameters are allocated, no data read).
struct CaseFormula {
  StepTraffic traffic;
  int64_t parameters = 0;
  int units = 0;                    // stages 2 and 3; 0 otherwise
  double largest_unit_bytes = 0;    // fp32 bytes of the largest (padded) unit
  std::string units_description;    // FsdpLayout::Describe()
};
absl::StatusOr<CaseFormula> FormulaFor(const FsdpCase& c, const GptBenchSize& size);

// One rank's memory line ("memory on rank R (host): parameters P MiB[ (this rank's
// shard)][ (+ the whole compute copy, C MiB)], gradients G MiB, optimizer state O MiB[
// (formula: ...)], activations peak A MiB[, unit buffers peak U MiB][, peak RSS R MiB]"), in
// bytes.
struct RankMemory {
  int rank = -1;
  double parameters = 0;    // fp32 parameters this rank keeps (its shard under ZeRO-2/3)
  double compute_copy = 0;  // ZeRO-2's whole compute copy, or a GPU's 16-bit copy
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double unit_buffers = 0;
  double peak_rss = -1;  // ", peak RSS R MiB" when the line has it (not yet); -1 otherwise
  // Parameters, copy, gradients and optimizer state.
  double state() const { return parameters + compute_copy + gradients + optimizer; }
  // state() + unit buffers + activations: the training memory's peak, from allocations.
  double peak() const { return state() + unit_buffers + activations; }
};

// Every rank's memory line in `logs` (trainer logs, glog prefixes and all; a rank seen twice
// keeps its first line), sorted by rank. INVALID_ARGUMENT naming the line when one that starts
// like a memory line cannot be read.
absl::StatusOr<std::vector<RankMemory>> ParseRankMemory(absl::string_view logs);

// Replaces the memory lines' figures (rounded to 0.01 MiB) by the exact bytes of the same
// ranks in `summary` (rank 0's TrainResult: its `ranks`), which the goal's comparison needs
// (ZeRO-3's state is DDP's ÷ N to the byte): gradients, optimizer state, activations, unit
// buffers, and the parameters where the line shows no compute copy (the result counts
// ZeRO-2's with them). Ranks the summary lacks keep the lines' figures.
void UseExactBytes(const train::TrainResult& summary, std::vector<RankMemory>* ranks);

// The traffic probe's output: one line per rank, "traffic rank=R steps=K all_gather=B/C
// reduce_scatter=B/C all_reduce=B/C" (bytes/calls sent in the K counted steps), on an
// emulated link followed by " link_tx=B link_drops=P". Returns the lines by rank, per step. INVALID_ARGUMENT naming the line when one is malformed;
// NOT_FOUND when there is none.
absl::StatusOr<std::vector<StepTraffic>> ParseProbeTraffic(absl::string_view output);
// The line the probe prints for one rank (the inverse of the above).
std::string ProbeTrafficLine(int rank, int64_t steps, const StepTraffic& totals);

// The trainer's own counters when its summary (rank 0's TrainResult JSON) has them:
// gathered_bytes (all-gathers) and reduced_bytes (reduce-scatters and all-reduces) summed
// over the run's `steps` steps, per step; nullopt when the fields are absent.
std::optional<StepTraffic> TrafficFromSummary(absl::string_view summary_json);

// A goal of issue 19 checked on measured numbers.
struct GoalCheck {
  std::string name;
  double ratio = 0;  // measured / reference
  double limit = 0;  // the ratio it must not exceed
  bool pass = false;
  std::string numbers;  // what was compared, with units
};
// ZeRO-3 block with prefetch at world 2: step time ≤ 1.15 × DDP's.
GoalCheck StepTimeGoal(double zero3_step_ms, double ddp_step_ms);
// Its exposed communication per step ≤ 0.5 × the non-prefetched run's.
GoalCheck ExposedGoal(double prefetch_exposed_ms, double no_prefetch_exposed_ms);
// Peak memory per rank (RankMemory::peak, measured) ≤ DDP's state ÷ N + two of the largest
// units (fp32) + the rank's activations.
GoalCheck MemoryGoal(const RankMemory& zero3, double ddp_state_bytes, int world,
                     double largest_unit_bytes);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_FSDP_BENCH_H_
