// The measurement behind `ringbench comm`: sweeps collectives over message sizes on one
// rank of a communicator, with nccl-tests' conventions.
//
// size: bytes per rank for all-reduce and broadcast, bytes of the gathered output for
// all-gather, of the input for reduce-scatter. Each timed iteration is {barrier; time one
// blocking collective}; an iteration's time is the maximum over ranks; the reported time
// is the median over iterations after warm-up. algbw = size / time; busbw = algbw x
// 2(N-1)/N for all-reduce, x (N-1)/N for all-gather and reduce-scatter, x 1 for broadcast.
#ifndef RINGMASTER_BENCH_COMM_BENCH_H_
#define RINGMASTER_BENCH_COMM_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/collectives.h"
#include "comm/communicator.h"
#include "comm/tcp/tcp_communicator.h"

namespace ringmaster::bench {

struct SweepOptions {
  std::vector<CollectiveOp> ops;
  std::vector<uint64_t> sizes;
  // Warm-up iterations per size: at least this many, and at least half the timed ones.
  int warmup = 3;
  // Small untimed collectives before the first measurement (see RunSweep).
  absl::Duration settle = absl::Seconds(1);
  // Iterations per size: max(min_iters, min(max_iters, bytes_budget / size)).
  int min_iters = 5;
  int max_iters = 200;
  uint64_t bytes_budget = 2ull << 30;
  absl::Duration op_timeout = absl::Seconds(120);
  // For all-reduce: force an algorithm (tuning), or let the communicator choose.
  comm::TcpCommunicator::AllReduceAlgorithm algorithm =
      comm::TcpCommunicator::AllReduceAlgorithm::kAuto;
};

struct Row {
  CollectiveOp op;
  int ranks = 0;
  uint64_t bytes = 0;
  double time_us = 0;  // median
  double p90_us = 0;
  double max_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  // Bytes one rank sent per call, the mean over the ranks and the timed calls: measured by
  // the communicator, and by the formula of the algorithm it chose (comm/communicator.h
  // OpCounters::formula_bytes_sent).
  double sent_bytes = 0;
  double formula_bytes = 0;
};

// What carried `comm`'s messages: "shared memory" (every peer through shared-memory
// rings), "TCP" (none), or "shared memory and TCP" (some).
std::string TransportName(const comm::TcpCommunicator& comm);

// Runs the sweep on this rank (every rank calls it with the same options). Every rank
// returns the same rows. Results are checked once per size; a wrong result is INTERNAL.
absl::StatusOr<std::vector<Row>> RunSweep(comm::TcpCommunicator& comm, const SweepOptions& options);

// Memory bandwidth as one copy sees it (GB/s, best of `reps` memcpy of `bytes`): what a
// shared-memory ring, which copies each message in and out, is bounded by.
double MeasureCopyGbps(size_t bytes, int reps);

// CSV with the header "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,sent_bytes,formula_bytes".
std::string ToCsv(const std::vector<Row>& rows);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_COMM_BENCH_H_
