// ringbench: ringmaster's benchmarks.
//
//   ringbench tp --ranks 2 [--batch B --in I --hidden H --out O --iters K]
//
// Column- and row-parallel linear layers (train/tp) on --ranks local processes against one
// large linear each on one rank: prints the largest differences of the output and every
// gradient, the all-reduces and bytes per forward and backward, and the step times; exits 0
// when within tolerance, 1 otherwise, 2 for bad flags (bench/tp_bench.h).
//
//   ringbench pipeline --ranks 2 [--schedules gpipe,1f1b,zero_bubble,interleaved_1f1b]
//       [--micro_batches 1,2,4,8] [--layers L --width W --heads H --context T --vocab V
//       --batch B --steps K]
//
// The pipeline schedules on --ranks local processes, a GPT cut into their stages: prints each
// schedule × m's measured bubble beside its formula and its simulation under the measured
// costs, step time, tokens/s, activation and message memory and micro-batches in flight per
// rank, and the goal lines (PASS or MISS); exits 0 when the run worked (a missed goal
// is reported, not a failure), 1 when a rank failed, 2 for bad flags (bench/pipeline_bench.h).
//
//   ringbench comm --ranks 4 --ops all_reduce,all_gather,reduce_scatter,broadcast
//       --sizes 1K,4K,...,1G --csv comm.csv --plot comm.svg [--peers gloo,mpi] [--tune]
//
// Starts --ranks local processes joined by the TCP backend over loopback, sweeps the
// sizes, prints a table (with the bytes each rank sent against the algorithm's formula),
// writes the CSV and an SVG plot of bus bandwidth against size (and X.latency.svg)
// with the loopback TCP limit measured in the same run. --peers runs Gloo (C++) and
// OpenMPI over TCP with the same conventions and prints our ratio to the best of them.
// --tune measures recursive doubling against the ring for all-reduce and prints the
// size where the ring starts to win (the backend's small-message threshold).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/comm_bench.h"
#include "bench/local_ranks.h"
#include "bench/loopback.h"
#include "bench/peers.h"
#include "bench/pipeline_bench.h"
#include "plot/plot.h"
#include "bench/tp_bench.h"
#include "comm/store.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "kernels/matmul.h"

ABSL_FLAG(int, ranks, 4, "number of local ranks (processes)");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter,broadcast",
          "collectives to measure (comma-separated, or \"all\")");
ABSL_FLAG(std::string, sizes, "1K,4K,...,1G",
          "message sizes: K/M/G suffixes, a,b,...,c for a geometric range");
ABSL_FLAG(std::string, csv, "", "write the results as CSV to this file");
ABSL_FLAG(std::string, plot, "",
          "draw bus bandwidth against size into this SVG file, and the small sizes' latency "
          "(log scale) into X.latency.svg beside it");
ABSL_FLAG(
    std::string, peers, "",
    "also measure these peers in the same run and print ratios: gloo, mpi (OpenMPI over TCP), "
    "mpi_shm (OpenMPI over its shared-memory transport)");
ABSL_FLAG(std::string, peers_csv, "", "write the peers' results as CSV to this file");
ABSL_FLAG(bool, tune, false,
          "measure ring vs recursive doubling all-reduce and print the crossover size");
ABSL_FLAG(int, warmup, 3, "warm-up iterations per size");
ABSL_FLAG(double, settle_s, 1,
          "small untimed collectives before the first measurement, seconds (ours and the "
          "peers')");
ABSL_FLAG(int, min_iters, 5, "fewest timed iterations per size");
ABSL_FLAG(int, max_iters, 200, "most timed iterations per size");
ABSL_FLAG(int64_t, spin_us, -1,
          "busy-poll microseconds before blocking; -1 = automatic (0 when ranks > cores)");
ABSL_FLAG(int64_t, socket_buffer_bytes, 0,
          "SO_SNDBUF/SO_RCVBUF of the data sockets (0 = kernel default)");
ABSL_FLAG(int64_t, oversubscribed_spin_us, -1,
          "busy-poll microseconds (yielding the core) when ranks outnumber cores; -1 = default");
ABSL_FLAG(std::string, transport, "shm",
          "how local ranks reach each other: shm (shared-memory rings, the default) or tcp "
          "(loopback TCP only)");
ABSL_FLAG(int64_t, shm_ring_bytes, 1 << 20, "capacity of each shared-memory ring");
ABSL_FLAG(int64_t, segment_bytes, 256 * 1024, "ring pipelining segment size");
ABSL_FLAG(int64_t, small_message_bytes,
          static_cast<int64_t>(ringmaster::comm::kDefaultSmallMessageBytes),
          "all-reduce/broadcast sizes at or below this use the latency-optimised algorithms");

ABSL_FLAG(int64_t, batch, 16,
          "ringbench tp: rows of the input; ringbench pipeline: samples per micro-batch "
          "(default 4 there)");
ABSL_FLAG(int64_t, in, 256, "ringbench tp: input features of the column-parallel layer");
ABSL_FLAG(int64_t, hidden, 1024,
          "ringbench tp: hidden features (the column layer's output, the row layer's input; "
          "split across the ranks, so a multiple of --ranks)");
ABSL_FLAG(int64_t, out, 256, "ringbench tp: output features of the row-parallel layer");
ABSL_FLAG(int, iters, 50, "ringbench tp: timed steps (after 5 warm-up steps)");

ABSL_FLAG(std::string, schedules, "gpipe,1f1b,zero_bubble,interleaved_1f1b",
          "ringbench pipeline: the schedules to measure (comma-separated)");
ABSL_FLAG(std::string, micro_batches, "1,2,4,8",
          "ringbench pipeline: the numbers of micro-batches m to measure (comma-separated)");
ABSL_FLAG(int64_t, layers, 8, "ringbench pipeline: the GPT's blocks");
ABSL_FLAG(int64_t, width, 256, "ringbench pipeline: the GPT's width");
ABSL_FLAG(int64_t, heads, 4, "ringbench pipeline: attention heads (must divide --width)");
ABSL_FLAG(int64_t, context, 128, "ringbench pipeline: tokens per sample");
ABSL_FLAG(int64_t, vocab, 256, "ringbench pipeline: vocabulary size");
ABSL_FLAG(bool, keep_probabilities, false,
          "ringbench pipeline: the attention keeps its probabilities for backward (a lighter "
          "input-gradient pass, more activation memory) instead of recomputing them");
ABSL_FLAG(int, steps, 5,
          "ringbench pipeline: timed steps per schedule and m (after 2 warm-up steps)");

namespace ringmaster::bench {
namespace {

using plot::FormatBytes;
using plot::PlotSpec;
using plot::Series;
using plot::WriteSvg;

// `--plot`'s latency panel shows the sizes up to this (latency-bound ones).
constexpr uint64_t kLatencyPlotMaxBytes = 1 << 20;

struct Outcome {
  std::vector<Row> rows;
  std::string transport;  // what carried the messages (TransportName)
  absl::Status status;
};

// Runs the sweep on `ranks` forked processes; rank 0 sends the rows back as text.
Outcome RunLocalSweep(int ranks, const SweepOptions& sweep,
                      const comm::TcpCommunicatorOptions& base) {
  Outcome outcome;
  absl::StatusOr<std::string> ran = RunLocalRanks(
      ranks, base, [&sweep](comm::TcpCommunicator& comm) -> absl::StatusOr<std::string> {
        RM_ASSIGN_OR_RETURN(std::vector<Row> rows, RunSweep(comm, sweep));
        std::string text = absl::StrCat("transport ", TransportName(comm), "\n");
        for (const Row& r : rows) {
          absl::StrAppend(&text, static_cast<int>(r.op), " ", r.ranks, " ", r.bytes, " ",
                          absl::StrFormat("%.6f %.6f %.6f %.3f %.3f", r.time_us, r.p90_us, r.max_us,
                                          r.sent_bytes, r.formula_bytes),
                          "\n");
        }
        return text;
      });
  if (!ran.ok()) {
    outcome.status = ran.status();
    return outcome;
  }
  const std::string& text = *ran;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "transport ")) {
      outcome.transport = std::string(line);
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    Row r;
    int op = 0;
    if (f.size() != 8 || !absl::SimpleAtoi(f[0], &op) || !absl::SimpleAtoi(f[1], &r.ranks) ||
        !absl::SimpleAtoi(f[2], &r.bytes) || !absl::SimpleAtod(f[3], &r.time_us) ||
        !absl::SimpleAtod(f[4], &r.p90_us) || !absl::SimpleAtod(f[5], &r.max_us) ||
        !absl::SimpleAtod(f[6], &r.sent_bytes) || !absl::SimpleAtod(f[7], &r.formula_bytes)) {
      continue;
    }
    r.op = static_cast<CollectiveOp>(op);
    r.algbw_gbps = r.bytes / (r.time_us * 1e-6) / 1e9;
    r.busbw_gbps = r.algbw_gbps * BusFactor(r.op, r.ranks);
    outcome.rows.push_back(r);
  }
  return outcome;
}

std::string Time(double us) {
  if (us < 1000) return absl::StrFormat("%.1f us", us);
  if (us < 1e6) return absl::StrFormat("%.2f ms", us / 1000);
  return absl::StrFormat("%.2f s", us / 1e6);
}

int Tune(int ranks, SweepOptions sweep, const comm::TcpCommunicatorOptions& base) {
  sweep.ops = {CollectiveOp::kAllReduce};
  sweep.sizes.clear();
  for (uint64_t s = 1 << 10; s <= (4u << 20); s *= 2) sweep.sizes.push_back(s);
  using Algo = comm::TcpCommunicator::AllReduceAlgorithm;
  sweep.algorithm = Algo::kRecursiveDoubling;
  Outcome rd = RunLocalSweep(ranks, sweep, base);
  sweep.algorithm = Algo::kRing;
  Outcome ring = RunLocalSweep(ranks, sweep, base);
  if (!rd.status.ok() || !ring.status.ok()) {
    fprintf(stderr, "ringbench comm --tune: %s %s\n", rd.status.ToString().c_str(),
            ring.status.ToString().c_str());
    return 1;
  }
  printf("all-reduce, %d ranks: recursive doubling vs ring (median time)\n", ranks);
  printf("%10s %14s %14s  %s\n", "bytes", "rec.doubling", "ring", "faster");
  uint64_t threshold = 0;
  for (size_t i = 0; i < rd.rows.size() && i < ring.rows.size(); ++i) {
    bool rd_wins = rd.rows[i].time_us <= ring.rows[i].time_us;
    printf("%10s %14s %14s  %s\n", FormatBytes(rd.rows[i].bytes).c_str(),
           Time(rd.rows[i].time_us).c_str(), Time(ring.rows[i].time_us).c_str(),
           rd_wins ? "recursive doubling" : "ring");
    if (rd_wins && threshold == rd.rows[i].bytes / 2) threshold = rd.rows[i].bytes;
    if (i == 0 && rd_wins) threshold = rd.rows[i].bytes;
  }
  printf("recursive doubling wins up to %s (current small_message_bytes: %s)\n",
         FormatBytes(threshold).c_str(), FormatBytes(base.small_message_bytes).c_str());
  return 0;
}

// The TCP backend's options from the flags; INVALID_ARGUMENT naming a bad --transport.
absl::StatusOr<comm::TcpCommunicatorOptions> TcpOptionsFromFlags() {
  comm::TcpCommunicatorOptions base;
  base.spin = absl::GetFlag(FLAGS_spin_us) < 0 ? absl::Microseconds(-1)
                                               : absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  base.segment_bytes = absl::GetFlag(FLAGS_segment_bytes);
  base.oversubscribed_spin = absl::Microseconds(absl::GetFlag(FLAGS_oversubscribed_spin_us));
  base.socket_buffer_bytes = static_cast<int>(absl::GetFlag(FLAGS_socket_buffer_bytes));
  base.small_message_bytes = absl::GetFlag(FLAGS_small_message_bytes);
  base.shm_ring_bytes = absl::GetFlag(FLAGS_shm_ring_bytes);
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "shm" && transport != "tcp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport: \"", transport, "\" is neither shm nor tcp"));
  }
  base.shared_memory = transport == "shm";
  return base;
}

// --ranks; 0, said on stderr for `command`, when outside [1, 64].
int RanksFlag(const char* command) {
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 1 || ranks > 64) {
    fprintf(stderr, "ringbench %s: --ranks must be between 1 and 64, got %d\n", command, ranks);
    return 0;
  }
  return ranks;
}

int CommMain() {
  const int ranks = RanksFlag("comm");
  if (ranks == 0) return 2;
  SweepOptions sweep;
  auto ops = ParseOps(absl::GetFlag(FLAGS_ops));
  auto sizes = ParseSizes(absl::GetFlag(FLAGS_sizes));
  if (!ops.ok() || !sizes.ok()) {
    fprintf(stderr, "ringbench comm: %s\n",
            std::string((!ops.ok() ? ops.status() : sizes.status()).message()).c_str());
    return 2;
  }
  sweep.ops = *ops;
  sweep.sizes = *sizes;
  sweep.warmup = absl::GetFlag(FLAGS_warmup);
  sweep.settle = absl::Seconds(absl::GetFlag(FLAGS_settle_s));
  sweep.min_iters = absl::GetFlag(FLAGS_min_iters);
  sweep.max_iters = absl::GetFlag(FLAGS_max_iters);
  if (sweep.min_iters < 1 || sweep.max_iters < sweep.min_iters || sweep.warmup < 0) {
    fprintf(stderr,
            "ringbench comm: need --min_iters >= 1, --max_iters >= --min_iters, --warmup >= 0\n");
    return 2;
  }
  absl::StatusOr<comm::TcpCommunicatorOptions> options = TcpOptionsFromFlags();
  if (!options.ok()) {
    fprintf(stderr, "ringbench comm: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  const comm::TcpCommunicatorOptions& base = *options;
  if (absl::GetFlag(FLAGS_tune)) return Tune(ranks, sweep, base);

  std::vector<std::string> peer_names =
      absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipWhitespace());
  for (const std::string& p : peer_names) {
    if (p != "gloo" && p != "mpi" && p != "mpi_shm") {
      fprintf(stderr,
              "ringbench comm: --peers: unknown peer \"%s\"; use gloo, mpi and/or mpi_shm\n",
              p.c_str());
      return 2;
    }
  }

  // Fail before a long sweep, not after it, when an output cannot be written.
  for (const auto& [flag, path] :
       {std::pair<const char*, std::string>{"--csv", absl::GetFlag(FLAGS_csv)},
        {"--plot", absl::GetFlag(FLAGS_plot)},
        {"--peers_csv", absl::GetFlag(FLAGS_peers_csv)}}) {
    if (path.empty()) continue;
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
    if (access(dir.c_str(), W_OK) != 0) {
      fprintf(stderr, "ringbench comm: %s %s: directory %s does not exist or is not writable\n",
              flag, path.c_str(), dir.c_str());
      return 2;
    }
  }

  printf("ringbench comm: %d ranks, TCP backend (%s), float32 sum\n", ranks,
         base.shared_memory ? "shared-memory rings between local ranks" : "loopback TCP only");
  fflush(stdout);
  Outcome ours = RunLocalSweep(ranks, sweep, base);
  if (!ours.status.ok()) {
    fprintf(stderr, "ringbench comm: %s\n", ours.status.ToString().c_str());
    return 1;
  }
  auto loopback = MeasureLoopback(absl::Milliseconds(500));
  std::vector<PeerRow> peer_rows;
  for (const std::string& p : peer_names) {
    // Each peer as shipped, and with freed memory kept by malloc (OpenMPI and Gloo allocate
    // temporaries per call; on this VM their page faults dominate large messages).
    for (const char* extra : {"", "--keep_malloc_memory"}) {
      printf("measuring peer %s %s...\n", p.c_str(), extra);
      fflush(stdout);
      auto rows = RunPeer(p, ranks, absl::GetFlag(FLAGS_ops), sweep.sizes, extra);
      if (!rows.ok()) {
        fprintf(stderr, "ringbench comm: peer %s: %s\n", p.c_str(),
                rows.status().ToString().c_str());
        continue;
      }
      peer_rows.insert(peer_rows.end(), rows->begin(), rows->end());
    }
  }

  printf("transport measured: %s\n%s", ours.transport.c_str(),
         PeerTransportNote(peer_rows, ours.transport).c_str());
  // Table.
  printf("\n%-15s %5s %8s %11s %11s %11s %11s %11s %10s %10s %6s", "op", "ranks", "size", "time",
         "p90", "max", "algbw GB/s", "busbw GB/s", "sent/rank", "formula", "ratio");
  if (!peer_rows.empty()) printf(" %11s %-34s %7s", "best peer", "peer (impl)", "ratio");
  printf("\n");
  for (const Row& r : ours.rows) {
    printf("%-15s %5d %8s %11s %11s %11s %11.3f %11.3f %10s %10s %6s",
           std::string(CollectiveName(r.op)).c_str(), r.ranks, FormatBytes(r.bytes).c_str(),
           Time(r.time_us).c_str(), Time(r.p90_us).c_str(), Time(r.max_us).c_str(), r.algbw_gbps,
           r.busbw_gbps, FormatBytes(r.sent_bytes).c_str(), FormatBytes(r.formula_bytes).c_str(),
           r.formula_bytes > 0 ? absl::StrFormat("%.3f", r.sent_bytes / r.formula_bytes).c_str()
                               : "-");
    if (!peer_rows.empty()) {
      const PeerRow* best = BestPeer(peer_rows, CollectiveName(r.op), r.bytes, ours.transport);
      if (best != nullptr) {
        printf(" %11.3f %-34s %6.2fx", best->busbw_gbps, best->impl.c_str(),
               best->time_us / r.time_us);
      } else {
        printf(" %11s %-34s %7s", "-", absl::StrCat("(none over ", ours.transport, ")").c_str(), "-");
      }
    }
    printf("\n");
  }
  if (loopback.ok()) {
    printf("\nloopback TCP on this machine: %.2f GB/s one way, %.2f GB/s per direction both ways\n",
           loopback->one_way_gbps, loopback->bidirectional_gbps);
  }
  if (!peer_rows.empty()) {
    printf("ratio = the fastest peer's median time over the same transport (%s) / ours (> 1: "
           "ringmaster is faster)\n",
           ours.transport.c_str());
  }
  printf(
      "sent/rank: bytes one rank sent per call (the ranks' mean, measured by the "
      "communicator);\nformula: the chosen algorithm's, e.g. ring all-reduce 2(N-1)/N x size\n");

  // CSV.
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    absl::Status s = WriteFileAtomically(absl::GetFlag(FLAGS_csv), ToCsv(ours.rows));
    if (!s.ok()) {
      fprintf(stderr, "ringbench comm: --csv: %s\n", s.ToString().c_str());
      return 1;
    }
    printf("wrote %s\n", absl::GetFlag(FLAGS_csv).c_str());
  }
  if (!absl::GetFlag(FLAGS_peers_csv).empty()) {
    absl::Status s = WriteFileAtomically(absl::GetFlag(FLAGS_peers_csv), PeersToCsv(peer_rows));
    if (!s.ok()) {
      fprintf(stderr, "ringbench comm: --peers_csv: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  // Plot.
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    PlotSpec spec;
    spec.title = absl::StrCat("ringmaster collectives, ", ranks, " ranks, ", ours.transport,
                              ours.transport == "TCP" ? " over loopback" : " between local ranks");
    spec.x_label = "message size (bytes, nccl-tests convention)";
    spec.y_label = "bus bandwidth (GB/s)";
    std::map<std::string, Series> by_op;
    for (const Row& r : ours.rows) {
      Series& s = by_op[std::string(CollectiveName(r.op))];
      s.label = absl::StrCat("ringmaster ", CollectiveName(r.op));
      s.points.push_back({static_cast<double>(r.bytes), r.busbw_gbps});
    }
    for (auto& [name, s] : by_op) spec.series.push_back(s);
    std::map<std::string, Series> peer_series;
    for (const PeerRow& p : peer_rows) {
      const PeerRow* best = BestPeer(peer_rows, p.op, p.bytes, ours.transport);
      if (best != &p) continue;
      Series& s = peer_series[p.op];
      s.label = absl::StrCat("best peer ", p.op, " (", p.transport, ")");
      s.dashed = true;
      s.points.push_back({static_cast<double>(p.bytes), p.busbw_gbps});
    }
    for (auto& [name, s] : peer_series) spec.series.push_back(s);
    // The limit of the transport that carried the run: a shared-memory ring copies each
    // message in and out of the ring (so half of one copy's bandwidth), TCP is loopback's.
    if (ours.transport != "TCP") {
      const double copy = MeasureCopyGbps(64 << 20, 10);
      spec.lines.push_back(
          {absl::StrFormat("shared memory: one memcpy %.2f GB/s", copy), copy, ""});
      spec.lines.push_back(
          {absl::StrFormat("shared memory: copy in + out %.2f GB/s", copy / 2), copy / 2, ""});
    }
    if (loopback.ok() && ours.transport != "shared memory") {
      spec.lines.push_back(
          {absl::StrFormat("loopback TCP, both ways: %.2f GB/s", loopback->bidirectional_gbps),
           loopback->bidirectional_gbps, ""});
      spec.lines.push_back(
          {absl::StrFormat("loopback TCP, one way: %.2f GB/s", loopback->one_way_gbps),
           loopback->one_way_gbps, ""});
    }
    // Latency-bound below the all-reduce's half-performance size n1/2 (where it first
    // reaches half of its best bus bandwidth), bandwidth-bound above.
    double peak = 0, half_size = 0;
    for (const Row& r : ours.rows) peak = std::max(peak, r.busbw_gbps);
    for (const Row& r : ours.rows) {
      if (r.busbw_gbps >= peak / 2 && (half_size == 0 || r.bytes < half_size)) half_size = r.bytes;
    }
    if (half_size > 0) {
      spec.regions.push_back({"latency-bound", 0, half_size, "#d0e0ff"});
      spec.regions.push_back({"bandwidth-bound", half_size, 1e30, "#ffe0c0"});
    }
    absl::Status s = WriteSvg(spec, absl::GetFlag(FLAGS_plot));
    if (!s.ok()) {
      fprintf(stderr, "ringbench comm: --plot: %s\n", s.ToString().c_str());
      return 1;
    }
    printf("wrote %s\n", absl::GetFlag(FLAGS_plot).c_str());

    // The small sizes' latency on a log scale, beside the bandwidth plot: X.svg -> X.latency.svg.
    PlotSpec latency;
    latency.title = absl::StrCat("ringmaster collectives, ", ranks, " ranks, ", ours.transport,
                                 ": latency of small messages");
    latency.x_label = spec.x_label;
    latency.y_label = "median time per call (us, log scale)";
    latency.log_y = true;
    std::map<std::string, Series> times;
    for (const Row& r : ours.rows) {
      if (r.bytes > kLatencyPlotMaxBytes) continue;
      Series& t = times[std::string(CollectiveName(r.op))];
      t.label = absl::StrCat("ringmaster ", CollectiveName(r.op));
      t.points.push_back({static_cast<double>(r.bytes), r.time_us});
    }
    for (auto& [name, t] : times) latency.series.push_back(t);
    std::string path = absl::GetFlag(FLAGS_plot);
    if (absl::EndsWith(path, ".svg")) path.resize(path.size() - 4);
    path += ".latency.svg";
    s = WriteSvg(latency, path);
    if (!s.ok()) {
      fprintf(stderr, "ringbench comm: --plot: %s\n", s.ToString().c_str());
      return 1;
    }
    printf("wrote %s\n", path.c_str());
  }
  return 0;
}

// Runs `run` on `ranks` local ranks; rank 0's result comes back through its text form.
template <typename Result, typename Run>
absl::StatusOr<Result> RunBenchOnLocalRanks(
    int ranks, const comm::TcpCommunicatorOptions& base, const Run& run,
    std::string (*to_text)(const Result&),
    absl::StatusOr<Result> (*from_text)(absl::string_view)) {
  absl::StatusOr<std::string> text = RunLocalRanks(
      ranks, base, [&run, to_text](comm::TcpCommunicator& comm) -> absl::StatusOr<std::string> {
        absl::StatusOr<Result> result = run(comm);
        if (!result.ok()) return result.status();
        return to_text(*result);
      });
  if (!text.ok()) return text.status();
  return from_text(*text);
}

int TpMain() {
  const int ranks = RanksFlag("tp");
  if (ranks == 0) return 2;
  TpBenchOptions options;
  options.batch = absl::GetFlag(FLAGS_batch);
  options.in = absl::GetFlag(FLAGS_in);
  options.hidden = absl::GetFlag(FLAGS_hidden);
  options.out = absl::GetFlag(FLAGS_out);
  options.iters = absl::GetFlag(FLAGS_iters);
  absl::Status valid = ValidateTpBench(options, ranks);
  absl::StatusOr<comm::TcpCommunicatorOptions> base = TcpOptionsFromFlags();
  if (!valid.ok() || !base.ok()) {
    fprintf(stderr, "ringbench tp: %s\n",
            std::string((!valid.ok() ? valid : base.status()).message()).c_str());
    return 2;
  }
  absl::StatusOr<TpBenchResult> result = RunBenchOnLocalRanks<TpBenchResult>(
      ranks, *base,
      [&options](comm::TcpCommunicator& comm) { return RunTpBench(comm, options); },
      TpResultToText, TpResultFromText);
  if (!result.ok()) {
    fprintf(stderr, "ringbench tp: %s\n", result.status().ToString().c_str());
    return 1;
  }
  printf("%s", FormatTpTable(options, *result).c_str());
  if (!result->ok()) {
    printf("\nFAILED: the tensor-parallel layers differ from the unsplit ones beyond the "
           "tolerance, or ran other than one all-reduce per forward and per backward\n");
    return 1;
  }
  printf("\nOK: the column- and row-parallel layers match the unsplit layers\n");
  return 0;
}

// Whether the command line sets flag `name` ("--name", "-name", "--name=..."), before a "--".
bool FlagGiven(int argc, char** argv, absl::string_view name) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
    if (arg == name || absl::StartsWith(arg, absl::StrCat(name, "="))) return true;
  }
  return false;
}

// `batch_given`: whether the command line sets --batch, which `ringbench tp` shares (rows of
// its input there, default 16): the pipeline's default is its own.
int PipelineMain(bool batch_given) {
  const int ranks = RanksFlag("pipeline");
  if (ranks == 0) return 2;
  PipelineBenchOptions options;
  if (batch_given) {
    options.batch = absl::GetFlag(FLAGS_batch);
  }
  options.layers = absl::GetFlag(FLAGS_layers);
  options.width = absl::GetFlag(FLAGS_width);
  options.heads = absl::GetFlag(FLAGS_heads);
  options.context = absl::GetFlag(FLAGS_context);
  options.vocab = absl::GetFlag(FLAGS_vocab);
  options.keep_probabilities = absl::GetFlag(FLAGS_keep_probabilities);
  options.steps = absl::GetFlag(FLAGS_steps);
  absl::StatusOr<std::vector<train::pipeline::ScheduleKind>> schedules =
      ParsePipelineSchedules(absl::GetFlag(FLAGS_schedules));
  absl::StatusOr<std::vector<int>> micro_batches =
      ParseMicroBatchCounts(absl::GetFlag(FLAGS_micro_batches));
  absl::Status valid = schedules.ok() ? micro_batches.status() : schedules.status();
  if (valid.ok()) {
    options.schedules = *schedules;
    options.micro_batches = *micro_batches;
    valid = ValidatePipelineBench(options, ranks);
  }
  absl::StatusOr<comm::TcpCommunicatorOptions> base = TcpOptionsFromFlags();
  if (!valid.ok() || !base.ok()) {
    fprintf(stderr, "ringbench pipeline: %s\n",
            std::string((!valid.ok() ? valid : base.status()).message()).c_str());
    return 2;
  }
  absl::StatusOr<PipelineBenchResult> result = RunBenchOnLocalRanks<PipelineBenchResult>(
      ranks, *base,
      [&options](comm::TcpCommunicator& comm) { return RunPipelineBench(comm, options); },
      PipelineResultToText, PipelineResultFromText);
  if (!result.ok()) {
    fprintf(stderr, "ringbench pipeline: %s\n", result.status().ToString().c_str());
    return 1;
  }
  printf("%s", FormatPipelineTable(options, *result).c_str());
  return 0;
}

}  // namespace
}  // namespace ringmaster::bench

int main(int argc, char** argv) {
  // tp and pipeline compute on the CPU: OpenBLAS kernels this CPU runs (kernels/matmul.h).
  const std::string blas = ringmaster::kernels::UseBestBlasKernels(argv);
  const bool batch_given = ringmaster::bench::FlagGiven(argc, argv, "batch");
  absl::SetProgramUsageMessage(
      "ringmaster benchmarks.\n  ringbench comm [--ranks N] [--ops ...] [--sizes ...] "
      "[--csv FILE] [--plot FILE.svg] [--peers gloo,mpi] [--tune]\n"
      "  ringbench tp [--ranks N] [--batch B] [--in I] [--hidden H] [--out O] [--iters K]\n"
      "  ringbench pipeline [--ranks P] [--schedules gpipe,1f1b,zero_bubble,interleaved_1f1b] "
      "[--micro_batches 1,2,4,8] [--layers L] [--width W] [--heads H] [--context T] "
      "[--vocab V] [--batch B] [--steps K]");
  std::vector<char*> args = ringmaster::ParseFlagsWithUsage(argc, argv, "ringbench");
  ringmaster::LoggingOptions logging;
  logging.program_name = argv[0];
  logging.min_severity = 1;  // warnings and errors: the table is the output
  ringmaster::InitLogging(logging);
  signal(SIGPIPE, SIG_IGN);
  if (args.size() < 2) {
    fprintf(stderr, "usage: ringbench comm|tp|pipeline [flags]  (ringbench --help for the flags)\n");
    return 2;
  }
  std::string command = args[1];
  if (!blas.empty() && command != "comm") printf("%s\n", blas.c_str());
  if (command == "comm") return ringmaster::bench::CommMain();
  if (command == "tp") return ringmaster::bench::TpMain();
  if (command == "pipeline") return ringmaster::bench::PipelineMain(batch_given);
  fprintf(stderr, "ringbench: unknown command \"%s\"; the commands are: comm, tp, pipeline\n",
          command.c_str());
  return 2;
}
