// The measurement behind `ringbench tp`: column- and row-parallel linear layers
// (train/tp/parallel_linear.h) against the same layers unsplit (seed exercise 35.10).
//
// Every rank of the tensor-parallel group makes the same whole weights from a seed (uniform
// in ±1/sqrt(fan-in), as nn.Linear), takes its shards and runs an MLP step on them:
// column-parallel up-projection [in → hidden], GELU (local), row-parallel down-projection
// [hidden → out], forward, then backward from a fixed output gradient. Rank 0 then runs the
// same step alone with the whole weights (the layers on a group of one rank: one large
// linear each), and compares the output, the input gradient and the four parameter
// gradients (reassembled from the shards with an all-gather) with it. Step times are medians
// over the timed iterations after five warm-up steps, one BLAS thread per rank.
#ifndef RINGMASTER_BENCH_TP_BENCH_H_
#define RINGMASTER_BENCH_TP_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace ringmaster::bench {

struct TpBenchOptions {
  int64_t batch = 16;    // rows of x
  int64_t in = 256;      // input features
  int64_t hidden = 1024; // the MLP's hidden features: split across the ranks
  int64_t out = 256;     // output features
  int iters = 50;        // timed steps
  uint64_t seed = 1;
};

// The largest |tensor-parallel − unsplit| over a tensor must be at most this times the
// unsplit tensor's largest magnitude: fp32 on both sides, summed in a different order.
inline constexpr double kTpTolerance = 1e-5;

// One tensor compared with the unsplit layers'.
struct TpCheck {
  std::string name;
  double max_difference = 0;
  double largest = 0;  // the unsplit tensor's largest magnitude
  bool ok() const { return max_difference <= kTpTolerance * largest; }
};

struct TpBenchResult {
  int ranks = 0;
  std::vector<TpCheck> checks;  // output, input gradient, then the parameters' gradients
  // Per step, on rank 0, from the communicator's counters.
  double forward_all_reduces = 0;
  double forward_bytes_sent = 0;
  double backward_all_reduces = 0;
  double backward_bytes_sent = 0;
  double other_operations = 0;  // anything but an all-reduce during the steps (should be 0)
  double tp_step_us = 0;        // median step time with the shards
  double single_step_us = 0;    // median step time of rank 0 alone with the whole weights
  // Every check within tolerance and exactly one all-reduce per forward and per backward.
  bool ok() const;
};

// INVALID_ARGUMENT naming the flag (--batch, --in, --hidden, --out, --iters) when a size or
// the iterations are not positive, or --hidden is not a multiple of `ranks`.
absl::Status ValidateTpBench(const TpBenchOptions& options, int ranks);

// Runs the step on every rank of `group` (the same options everywhere). Rank 0's result has
// the checks and the single-rank time; the others' only their own traffic and step time.
// Errors: the communicator's; INVALID_ARGUMENT as ValidateTpBench.
absl::StatusOr<TpBenchResult> RunTpBench(comm::Communicator& group, const TpBenchOptions& options);

// A result as lines of text and back (rank 0 hands it to the parent process this way).
// Parsing errors: INVALID_ARGUMENT naming the line.
std::string TpResultToText(const TpBenchResult& result);
absl::StatusOr<TpBenchResult> TpResultFromText(absl::string_view text);

// The table `ringbench tp` prints.
std::string FormatTpTable(const TpBenchOptions& options, const TpBenchResult& result);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_TP_BENCH_H_
