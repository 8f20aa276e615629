// Pipeline schedules (ARCHITECTURE.md "Pipeline parallel"): for each rank of a pipeline group,
// the list of actions one executor runs in order — compute a model stage's forward, its
// backward (or, split, its input-gradient and weight-gradient parts), send a stage's output or
// input gradient to the rank holding the next or previous stage, receive one. GPipe, 1F1B,
// interleaved 1F1B and zero bubble (ZB-H1) are different lists over the same actions, and
// CheckSchedule proves a list set runs before an executor does; Simulate lays it out in time
// under given costs (the bubble, the activations kept, the timeline `ringctl estimate pipeline`
// prints).
//
// Model stages and ranks. The model's blocks are cut into S = P·v model stages (P ranks, v
// virtual stages per rank: 1 except for interleaved 1F1B); model stage s lives on rank s mod P
// (Megatron's interleaving: rank r holds stages r, r+P, r+2P, ...). Stage 0 takes the input
// (embeddings), stage S−1 ends in the loss. A micro-batch's forward goes through the stages in
// order, its backward in reverse; stage s's backward needs its own forward done and, but for
// the last stage, the gradient of its output (stage s+1's input gradient).
//
// Messages. Stage s's forward output (kActivation, stage s) goes from rank(s) to rank(s+1);
// its input gradient (kGradient, stage s) from rank(s) to rank(s−1); none when both stages are
// on one rank (P = 1). A message is named by (payload, stage, micro-batch) and sent once.
// The executor's contract: each maximal run of sends and receives between two computes is
// one batch (Communicator::SendRecv: its operations progress together, and the batch ends
// when all are done); messages from one rank to another are taken in the order sent.
// CheckSchedule proves a list set runs whether the transport buffers sends (a send is queued
// and the rank goes on) or not (a message moves only while its send and its receive are both
// posted); Simulate times the first.
//
// The schedules (each rank's compute order; a receive in the batch before the compute that
// needs it, a send in the batch after the one that makes it, but for interleaved 1F1B):
//   gpipe             every micro-batch's forward, then every backward (m activations kept).
//   1f1b              min(P − r − 1, m) forwards of warm-up on rank r, then one forward and
//                     one backward alternately, then the remaining backwards (at most P − r
//                     activations kept: PipeDream-Flush / Megatron's non-interleaved).
//   interleaved_1f1b  Megatron's interleaved schedule: v model chunks per rank, micro-batches
//                     in groups of P through each chunk in turn; warm-up of
//                     (P − r − 1)·2 + (v − 1)·P chunk-forwards (m·v at most), then 1F1B over
//                     chunk passes. m must be a multiple of P. Its messages are batched as
//                     Megatron batches them (a step's sends with the next step's receives,
//                     no message between a steady step's forward and backward): placed at
//                     their computes they deadlock without buffering.
//   zero_bubble       ZB-H1 ("Zero Bubble Pipeline Parallelism", Qi et al., 2024): the
//                     backward split into the input-gradient part B (what the previous stage
//                     waits for) and the weight-gradient part W (which nothing waits for), so
//                     W's fill the bubbles. Each rank keeps 1F1B's order of forwards and
//                     B's and runs a W when its next one is not ready yet (list scheduling
//                     under unit costs F = B = W = 1), a forward only while the rank keeps
//                     fewer than P micro-batches of activations (forwards without their W):
//                     every rank keeps up to the first rank's 1F1B peak, none more.
//                     Its bubble with those costs is (P − 1)(F + B − W) per rank, a third of
//                     1F1B's (P − 1)(F + B + W).
//                     What a run holds and measures differs from that, by design (measured
//                     2026-12-02 on this repository's 2-core CPU machine: examples/tiny_gpt.yaml,
//                     `ringctl local --workers 2 --set parallelism.mesh.pp=2`, m = 4 of 8
//                     samples, 30 steps, against `--set parallelism.pipeline.schedule=1f1b`):
//                     - Activations: a micro-batch's stay until its W, not its B, and its W
//                       needs every linear layer's output gradient (with checkpointing also
//                       its input) kept from B (train/nn/gpt.h SliceBackward's deferred
//                       weights: rows × blocks × (2 width + hidden + 3 attention width)
//                       floats, the LM head's vocab more on the last stage). So a
//                       rank keeps up to P micro-batches where 1F1B keeps P − r, each larger:
//                       rank 0 57.3 MiB against 1F1B's 39.3 (the same 2 micro-batches + 2 × 9
//                       MiB of deferred gradients), rank 1 62.3 against 21.2 (2 micro-batches
//                       instead of 1, + 2 × 10 MiB). The simulator's "activations kept" counts
//                       micro-batches; `ringctl estimate memory` with the mesh counts these
//                       bytes (57.27 and 62.30 MiB for this job, as the run measured).
//                     - Bubble: the formula and `ringctl estimate pipeline` take F = B = W = 1
//                       and equal stages; on the CPU a stage's B and W each cost other than its
//                       F, the first stage also runs the embeddings and the last the LM head
//                       and the loss, and the messages take time. The trainer's measured
//                       bubble (1 − compute ÷ step time, per rank) was 12.1 % and 9.6 % on the
//                       two ranks (18.8 % on another run of the same job: it varies with
//                       the machine's load) against the formula's 7.7 %; 1F1B measured 20.0 %
//                       and 8.4 % (formula 20.0 %). Still below 1F1B's on the rank that waits
//                       most, as the schedule intends.
//
// Thread-safety: values and pure functions.
#ifndef RINGMASTER_TRAIN_PIPELINE_SCHEDULE_H_
#define RINGMASTER_TRAIN_PIPELINE_SCHEDULE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster::train::pipeline {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved1F1B, kZeroBubble };
// "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble".
absl::string_view ScheduleName(ScheduleKind kind);
// INVALID_ARGUMENT listing the names for an unknown one.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int ranks = 1;           // P, >= 1
  int micro_batches = 1;   // m, >= 1
  int virtual_stages = 1;  // v, >= 1; > 1 only for interleaved_1f1b
};

enum class ActionKind {
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // zero_bubble's B
  kBackwardWeight,  // zero_bubble's W
  kSend,
  kReceive,
};
enum class Payload { kActivation, kGradient };
// "activation", "gradient".
absl::string_view PayloadName(Payload payload);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;  // the model stage computed, or whose output / input gradient is sent
  int micro_batch = 0;
  Payload payload = Payload::kActivation;  // kSend, kReceive
  int peer = -1;                           // kSend, kReceive: the other rank

  bool is_compute() const { return kind != ActionKind::kSend && kind != ActionKind::kReceive; }
  // "F3@s1" (forward of micro-batch 3 on stage 1), "B", "Bi", "W", "send act s1 m3 -> r2",
  // "recv grad s2 m3 <- r2".
  std::string DebugString() const;
};

struct Schedule {
  ScheduleOptions options;
  std::vector<std::vector<Action>> ranks;  // rank r's actions, in order

  int stages() const { return options.ranks * options.virtual_stages; }
  int RankOfStage(int stage) const { return stage % options.ranks; }
};

// The schedule `options` asks for. INVALID_ARGUMENT naming the option (ranks, micro_batches,
// virtual_stages) for a value out of range, virtual_stages > 1 with a schedule other than
// interleaved_1f1b, or interleaved_1f1b with micro_batches not a multiple of ranks.
absl::StatusOr<Schedule> MakeSchedule(const ScheduleOptions& options);

// Whether `schedule` is one an executor can run, under the contract above: every model stage's
// forward and backward (or B and W) of every micro-batch computed exactly once, on the stage's
// rank, the backward after the forward (W after B); every message sent exactly once by the rank
// that computes it, after computing it, to the rank that needs it, and received there exactly
// once, before the compute that needs it, in the order sent; and running the lists ends, with
// buffered sends and without (no rank waits forever). INTERNAL naming the first rank and
// action that break a rule, or, for a deadlock, where every stuck rank waits.
absl::Status CheckSchedule(const Schedule& schedule);

// Durations of one model stage's work when the model is cut into P stages (a chunk of an
// interleaved schedule takes 1/v of them); a combined backward takes backward_input +
// backward_weight. `message` is the time from a send to its arrival.
struct Costs {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double message = 0;
};

struct Timeline {
  struct Slot {
    int rank = 0;
    double start = 0, end = 0;
    Action action;  // a compute action
  };
  std::vector<Slot> slots;   // by rank, then start
  double makespan = 0;       // the step: the last compute's end
  std::vector<double> busy;  // per rank, compute time
  // Per rank, the most micro-batches whose activations it keeps at once: forward done, its
  // backward (W for zero_bubble) not yet, each chunk counted as 1/v of a micro-batch.
  std::vector<double> peak_activations;

  // Idle time over all ranks ÷ (ranks × makespan).
  double Bubble() const;
};

// Runs the lists in time: each rank in order, a compute as soon as the rank is free and the
// messages it received have arrived; a send at once. INTERNAL as CheckSchedule's for a list
// set that cannot finish; INVALID_ARGUMENT for a negative or all-zero cost.
absl::StatusOr<Timeline> Simulate(const Schedule& schedule, const Costs& costs = {});

// The bubble in closed form with `costs`: (P−1)/(m+P−1) for gpipe and 1f1b (whatever the
// costs), (P−1)/(v·m+P−1) for interleaved_1f1b, and for zero_bubble
// (P−1)(F+B−W) / (m(F+B+W) + (P−1)(F+B−W)) (ZB-H1's, exact when W <= F and B = F: the paper's
// setting).
double FormulaBubble(const ScheduleOptions& options, const Costs& costs = {});

// One line per rank, time running right, a cell per `unit` of time (the shortest compute): a
// compute fills as many cells as it lasts, each showing its kind and micro-batch ("F3" a
// forward of micro-batch 3, "B3" a backward, "b3" and "W3" zero bubble's input and weight
// parts; with virtual stages also the chunk, "F3.1"), "." an idle cell. Then the bubble and
// the peak activations per rank. Ends with a newline.
std::string TimelineText(const Schedule& schedule, const Timeline& timeline);

// The timeline as a self-contained SVG: a row per rank, a box per compute coloured by kind and
// labelled by micro-batch, the bubble in the title.
std::string TimelineSvg(const Schedule& schedule, const Timeline& timeline);

// The bubble against the number of micro-batches (seed exercise 26.6): for each P of `ranks`,
// the simulated bubble (unit costs) and the formula at m = 1, 2, 4, ... 256 (multiples of P
// for interleaved_1f1b), and the smallest m whose simulated bubble is below `below` (0 when
// none up to 4096).
struct BubbleSweep {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int virtual_stages = 1;
  double below = 0.1;
  struct Point {
    int ranks = 0, micro_batches = 0;
    double bubble = 0, formula = 0;
  };
  std::vector<Point> points;                        // by P, then m
  std::vector<std::pair<int, int>> smallest_below;  // (P, m)
};
// INVALID_ARGUMENT as MakeSchedule's, or for `below` outside (0, 1).
absl::StatusOr<BubbleSweep> SweepBubble(ScheduleKind kind, const std::vector<int>& ranks,
                                        int virtual_stages = 1, double below = 0.1);
// A table (a row per m, a column pair per P) and the smallest m per P; newline-terminated.
std::string SweepText(const BubbleSweep& sweep);
// The bubble against m (log scale), a line per P, the formula dashed, as an SVG.
std::string SweepSvg(const BubbleSweep& sweep);

}  // namespace ringmaster::train::pipeline

#endif  // RINGMASTER_TRAIN_PIPELINE_SCHEDULE_H_
