// What the peer benchmarks (gloo_bench, mpi_bench) share: flag parsing, buffer layouts,
// input patterns and result checks, the timed loop, statistics and CSV output. Keeping
// these in one place is what makes the two peers' numbers comparable with each other and
// with `ringbench comm`.
//
// Conventions (nccl-tests):
//   size        bytes per rank for all_reduce and broadcast; bytes of the gathered output
//               for all_gather; bytes of the input for reduce_scatter (each rank's chunk is
//               size/N). Element counts are rounded down to a multiple of N for all_gather
//               and reduce_scatter (at least N elements) and to whole float32 elements
//               (at least one) for the others; the reported `bytes` is the rounded size.
//   iteration   {barrier; t0; one blocking collective; t1}; its time is the maximum of
//               t1 - t0 over ranks, reduced after the timed loop so the loop is undisturbed.
//   time_us     the median over iterations.
//   algbw       bytes / time, in GB/s (1e9 bytes).
//   busbw       algbw * 2(N-1)/N for all_reduce, * (N-1)/N for all_gather and
//               reduce_scatter, * 1 for broadcast.
//
// Nothing here blocks except Measure(), which blocks inside the peer's own collectives.
#ifndef RINGMASTER_BENCH_PEERS_PEER_BENCH_H_
#define RINGMASTER_BENCH_PEERS_PEER_BENCH_H_

#include <cstddef>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/collectives.h"

namespace ringmaster::bench::peers {

// Operations, their names (CollectiveName), --ops and --sizes parsing (ParseOps,
// ParseSizes) and bus factors are shared with ringbench: bench/collectives.h.
using Op = CollectiveOp;

// Parses a comma list of names against `allowed` (for flags such as --modes).
// An empty value gives `allowed` itself. INVALID_ARGUMENT names `flag` and the
// bad entry.
absl::StatusOr<std::vector<std::string>> ParseNames(absl::string_view flag, absl::string_view value,
                                                    const std::vector<std::string>& allowed);

// The buffers of one op at one size on one rank, in float32 elements.
struct Layout {
  Op op = Op::kAllReduce;
  int ranks = 1;
  size_t bytes = 0;      // the size measured and reported, after rounding
  size_t in_count = 0;   // elements of each rank's input
  size_t out_count = 0;  // elements of each rank's output
};

// The rank that broadcasts.
inline constexpr int kBroadcastRoot = 0;

// The layout of `op` for a requested size of `bytes` with `ranks` ranks (see
// the top of this file). INVALID_ARGUMENT when the element count does not fit
// an int (MPI and Gloo count in int).
absl::StatusOr<Layout> MakeLayout(Op op, size_t bytes, int ranks);

// The largest input and output element counts over every op and size of a
// sweep. The benchmarks allocate their buffers once at these sizes and use
// prefixes: allocating afresh per size would page-fault hundreds of MiB again
// for every op (about 2.8 ms per MiB on this machine), which dominates a
// sweep's run time.
struct Counts {
  size_t in = 0;
  size_t out = 0;
};
absl::StatusOr<Counts> LargestCounts(const std::vector<Op>& ops, const std::vector<size_t>& sizes,
                                     int ranks);

// Iterations used when --warmup / --iters are not given (negative): 50 timed
// iterations up to 1 MiB, 20 up to 16 MiB, 5 above; 5 warm-up runs up to 16
// MiB, above that only the checked run (it touches every buffer; one run of 256
// MiB takes 0.1-2 s here).
// Checks --iters (>= 1, or -1 for the default), --warmup (>= 0, or -1) and --timeout_s
// (>= 1); INVALID_ARGUMENT names the flag.
absl::Status ValidateRunFlags(int iters, int warmup, int timeout_s);

int DefaultIters(size_t bytes);
int DefaultWarmup(size_t bytes);

// Writes rank `rank`'s input pattern into `in` (layout.in_count elements; for
// broadcast only the root has an input). Values are small integers, so every
// sum is exact in float32 whatever the order of the additions.
void FillInput(int rank, absl::Span<float> in);

// Fills an output buffer with a value no correct result contains.
void FillSentinel(absl::Span<float> out);

// Checks rank `rank`'s output against values computed here from the input
// pattern, not by any collective. DATA_LOSS names the op, `impl`, the rank, the
// first bad index, the value found and the value expected.
absl::Status CheckOutput(const Layout& layout, int rank, absl::string_view impl,
                         absl::Span<const float> out);

// The ranks of one communicator, as the timed loop needs them. Both calls are
// blocking collectives that every rank must make in the same order.
class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual absl::Status Barrier() = 0;
  // Replaces each element of `values` by its maximum over ranks.
  virtual absl::Status MaxOverRanks(absl::Span<double> values) = 0;
};

// Runs small collectives (MaxOverRanks of one value) for at least `time`, as rank 0's
// clock decides, so that every rank runs the same number. Every harness (ours and the
// peers') does this before its first measurement: 4 ranks that have just started on 2 cores
// run small collectives several times slower for a fraction of a second (measured: 170 us
// instead of 25 us per 1 KiB all-reduce for the first ~300 operations), whatever the
// library; the sweep measures the steady state.
absl::Status Settle(Group& group, absl::Duration time);

// One implementation of one op at one size, ready to run on one rank.
struct Candidate {
  // Names the peer, algorithm and mode, e.g. "gloo:halving_doubling:busy_poll".
  std::string impl;
  // The group whose Barrier() precedes each timed run (the collective's own
  // communicator).
  Group* group = nullptr;
  // Where the input is written and the output read; they may alias (in-place
  // algorithms). For broadcast, `in` is empty on ranks other than the root.
  absl::Span<float> in;
  absl::Span<float> out;
  // Runs the collective once and blocks until it is complete on this rank.
  std::function<absl::Status()> run;
};

struct Stats {
  double p50_us = 0;
  double p90_us = 0;
  double max_us = 0;
};

// Median (mean of the middle two for an even count), p90 (nearest rank) and
// maximum. `times_us` must not be empty.
Stats Summarize(std::vector<double> times_us);

struct MeasureOptions {
  int warmup = 5;  // untimed runs; the first one is checked (one runs even at 0)
  int iters = 20;  // timed runs, at least 1
  // Skip the timed runs when the fastest untimed run (check and warm-up; each
  // the maximum over ranks, so every rank decides alike) took longer than this.
  // Lets a sweep skip hopeless implementations: some Gloo configurations take
  // seconds per run where the best takes milliseconds.
  double prune_above_us = std::numeric_limits<double>::infinity();
};

struct Measurement {
  // The fastest untimed run (check and warm-up), maximum over ranks.
  double untimed_us = 0;
  // True when untimed_us exceeded MeasureOptions::prune_above_us: `stats` is
  // empty.
  bool pruned = false;
  Stats stats;
};

// Writes the input and a sentinel output, runs the candidate once and checks
// the result on every rank (any rank's mismatch fails all ranks), runs the
// remaining warm-up iterations, then (unless pruned) the timed ones, and
// returns the statistics of the per-iteration maximum over ranks. Errors:
// DATA_LOSS for a wrong result (this rank's CheckOutput message, or one saying
// another rank saw it; the ranks stay in step and the group stays usable), or
// whatever the collective returned.
absl::StatusOr<Measurement> Measure(const Layout& layout, const MeasureOptions& options,
                                    Candidate& candidate);

// One measured row.
struct Result {
  Layout layout;
  std::string impl;
  Stats stats;
};

double AlgBwGbps(const Result& result);
double BusBwGbps(const Result& result);

// "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl" and one line per result
// (no newline). time_us is the median.
std::string CsvHeader();
std::string CsvLine(const Result& result);
// "op,ranks,bytes,impl,p50_us,p90_us,max_us" and one line per result (no
// newline).
std::string TailCsvHeader();
std::string TailCsvLine(const Result& result);

// Rank 0's output: the CSV on stdout (flushed line by line, so a partial sweep
// is still useful) and, when a path is given, the tail CSV. Other ranks write
// nothing.
class Report {
 public:
  // Opens `tail_csv_path` (when not empty) on rank 0 and writes the headers.
  // Errors: the errno of a failed open, naming --tail_csv.
  static absl::StatusOr<Report> Create(int rank, const std::string& tail_csv_path);

  void Add(const Result& result);

 private:
  struct FileCloser {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  Report(bool active, std::unique_ptr<std::FILE, FileCloser> tail)
      : active_(active), tail_(std::move(tail)) {}

  bool active_;
  std::unique_ptr<std::FILE, FileCloser> tail_;
};

// Makes glibc's malloc serve blocks below 1 GiB from its heap and keep freed
// memory, instead of mapping fresh pages for every block of 32 MiB or more and
// unmapping them on free. Peers that allocate temporaries per call (OpenMPI's
// ring and Rabenseifner all-reduce, its reduce-scatter, Gloo's gloo::allreduce
// BCUBE) otherwise page-fault their way through every large collective: on this
// machine a fresh 64 MiB costs about 180 ms of page faults, 9 ms when reused.
// Process-wide; call from main before any large allocation. INTERNAL when glibc
// refuses.
absl::Status KeepMallocMemory();

// Appended to the impl column of measurements taken with KeepMallocMemory().
inline constexpr char kKeepMallocSuffix[] = ":keep_malloc";

// Ends the process when one step of the benchmark (a rendezvous, or one
// implementation at one size: check, warm-up and timed runs) runs longer than
// its limit: it prints the step to stderr and exits with code 124. A rank stuck
// in a peer's collective cannot be interrupted otherwise (MPI has no timeouts;
// Gloo's do not cover every blocking call). The thread sleeps until the current
// deadline, so it does not disturb the timed loop.
//
// Thread-safety: Start() may be called from any thread.
class Watchdog {
 public:
  // `who` prefixes the message, e.g. "gloo_bench rank 3".
  Watchdog(absl::Duration limit, std::string who);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Begins a step, named in the message if it overruns; the limit counts from
  // now.
  void Start(absl::string_view step);

 private:
  void Loop();

  const absl::Duration limit_;
  const std::string who_;
  absl::Mutex mu_;
  std::string step_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Of several candidates' results for one op and size, the one with the lowest
// median. `results` must not be empty.
const Result& Best(const std::vector<Result>& results);

}  // namespace ringmaster::bench::peers

#endif  // RINGMASTER_BENCH_PEERS_PEER_BENCH_H_
