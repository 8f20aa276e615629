// gloo_bench: collectives of Gloo (Debian's libgloo 0.5, git 5b14351, TCP over
// loopback), measured with the conventions of bench/peers/peer_bench.h, so that
// `ringbench comm` can compare them.
//
// One process per rank; the ranks meet through a gloo::rendezvous::FileStore in a fresh
// directory. bench/peers/run_peer.sh starts them:
//
//   bazel-bin/bench/peers/run_peer gloo --ranks 2 -- --sizes 1K,64K,4M,64M,256M
//
// or by hand, one line per rank:
//
//   bazel-bin/bench/peers/gloo_bench --rank 0 --ranks 2 --store_dir /tmp/s --sizes 1K &
//   bazel-bin/bench/peers/gloo_bench --rank 1 --ranks 2 --store_dir /tmp/s --sizes 1K
//
// Every implementation Gloo offers is tried, and by default rank 0 prints, per op and
// size, the fastest (lowest median) one; --all_algorithms prints every one timed.
// Implementation names are gloo:<algorithm>:<mode>:
//
//   all_reduce      ring, ring_chunked, halving_doubling, bcube (the AllreduceRing, ...
//                   classes); opts_ring, opts_bcube (gloo::allreduce with AllreduceOptions,
//                   the API torch.distributed uses)
//   all_gather      ring (AllgatherRing); opts (gloo::allgather)
//   reduce_scatter  halving_doubling (ReduceScatterHalvingDoubling, Gloo's only one)
//   broadcast       one_to_all (BroadcastOneToAll); opts (gloo::broadcast)
//
//   modes (--modes): default    receives completed by the device's epoll thread
//                    sync       pairs in synchronous mode (setSync(true, false)): the
//                               calling thread blocks in recv()
//                    busy_poll  setSync(true, true): the calling thread spins on
//                               non-blocking recv(), as gloo/benchmark --sync --busy-poll
//   A pair cannot leave synchronous mode, so each mode has its own full mesh (context).
//   The opts_* algorithms use unbound buffers, which only the epoll thread serves: they
//   run in the default mode only. In the synchronous modes both ends of a pair send with
//   blocking writes, and above a few MiB per message they deadlock; those algorithms run
//   there only up to --sync_max_bytes (broadcast at every size). Gloo's all-reduce
//   algorithms work in place; so do reduce_scatter (the result is the first size/N bytes)
//   and broadcast.
//
// Hopeless implementations are skipped, so that a sweep stays within minutes (see
// --prune_factor; each skip is noted on stderr): with 4 ranks on 2 cores, busy_poll takes
// 16-70 ms at 1 KiB and opts_ring seconds per run from 1 MiB.
//
// A wrong result is an error on stderr and its line is left out; the sweep goes on and
// the exit status is 3 (--nofail_on_wrong_result: 0). Gloo's ReduceScatterHalvingDoubling
// in the default mode does this at 64 MiB and up now and then: it copies into the region
// that its asynchronous send to a peer is still reading. Other failures: status 1; bad
// flags: 2.
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/peers/peer_bench.h"
#include "common/status_macros.h"
#include "gloo/algorithm.h"
#include "gloo/allgather.h"
#include "gloo/allgather_ring.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

ABSL_FLAG(int, rank, -1, "This process's rank, in [0, --ranks).");
ABSL_FLAG(int, ranks, 0, "Number of ranks (processes).");
ABSL_FLAG(std::string, store_dir, "",
          "Directory for Gloo's FileStore rendezvous, the same for every rank and empty at "
          "the start (created when missing).");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter,broadcast",
          "Comma list of ops to measure.");
ABSL_FLAG(std::string, sizes, "1K,64K,4M,64M,256M",
          "Comma list of sizes in bytes, with optional K, M or G (powers of 1024).");
ABSL_FLAG(double, settle_s, 1, "small untimed collectives before the first measurement, seconds");
ABSL_FLAG(int, warmup, -1,
          "Untimed runs per implementation and size, the first checked; -1: 5, or 1 above "
          "16 MiB.");
ABSL_FLAG(int, iters, -1,
          "Timed runs per implementation and size; -1: 50 up to 1 MiB, 20 up to 16 MiB, "
          "5 above.");
ABSL_FLAG(int, timeout_s, 120,
          "Limit on one implementation at one size (check, warm-up and timed runs) and on "
          "each rendezvous, in seconds; Gloo's own timeout (every send and receive) is "
          "half of it.");
ABSL_FLAG(std::string, modes, "default,busy_poll",
          "Comma list of Gloo pair modes: default, sync, busy_poll.");
ABSL_FLAG(std::string, sync_max_bytes, "4M",
          "Largest size measured in the sync and busy_poll modes by algorithms whose peers "
          "send to each other at once: above a few MiB Gloo's synchronous pairs deadlock "
          "(both ends blocked in writev). Broadcast is not limited.");
ABSL_FLAG(std::string, algorithms, "",
          "Comma list of algorithm names to measure (empty: all); see the file's comment.");
ABSL_FLAG(double, prune_factor, 3,
          "Do not time an implementation whose fastest untimed run, or whose time at a "
          "smaller size, is over this many times the best median so far at this op and "
          "size, nor one that was 4x this factor behind the best at the last smaller size "
          "(each noted on stderr); 0 measures everything, which takes many minutes with 4 "
          "ranks.");
ABSL_FLAG(bool, all_algorithms, false,
          "Print every implementation's line, not only the fastest per op and size.");
ABSL_FLAG(bool, fail_on_wrong_result, true,
          "Exit with status 3 when an implementation computed a wrong result. Either way "
          "its line is left out, the error goes to stderr and the sweep goes on.");
ABSL_FLAG(bool, keep_malloc_memory, false,
          "Keep freed memory in glibc's heap (mallopt) so that the peer's per-call "
          "temporaries of 32 MiB or more are not page-faulted afresh on every call; impl "
          "names get the suffix :keep_malloc. Off: the peer as shipped.");
ABSL_FLAG(std::string, tail_csv, "",
          "Also write op,ranks,bytes,impl,p50_us,p90_us,max_us to this file (rank 0).");

namespace ringmaster::bench::peers {
namespace {

constexpr char kLoopback[] = "127.0.0.1";

enum class Mode { kDefault, kSync, kBusyPoll };

absl::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kDefault:
      return "default";
    case Mode::kSync:
      return "sync";
    case Mode::kBusyPoll:
      return "busy_poll";
  }
  return "unknown";
}

constexpr Mode kAllModes[] = {Mode::kDefault, Mode::kSync, Mode::kBusyPoll};

// "gloo:<algorithm>:<mode>", the CSV's impl column.
std::string ImplName(absl::string_view algorithm, Mode mode) {
  return absl::StrCat("gloo:", algorithm, ":", ModeName(mode));
}

// Runs `fn`, turning Gloo's exceptions into a status. Gloo reports timeouts and broken
// connections alike as IoException; its message tells them apart.
template <typename Fn>
absl::Status GlooCall(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const std::string message = absl::StrCat(what, ": ", e.what());
    if (absl::StrContains(e.what(), "Timed out")) {
      return absl::DeadlineExceededError(message);
    }
    return absl::UnavailableError(message);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// A float32 buffer. Value-initialised, so allocating it touches every page. (Gloo's own
// gloo::aligned_allocator does not compile as C++20; large blocks are page-aligned by
// malloc anyway, plus 16 bytes, as the MPI peer's.)
using Buffer = std::vector<float>;

struct GroupOptions {
  int rank = 0;
  int ranks = 1;
  Mode mode = Mode::kDefault;
  std::chrono::milliseconds timeout{0};
};

// One full mesh of TCP pairs in one mode.
class GlooGroup final : public Group {
 public:
  // Rendezvous through `store` (keys under the mode's name) and, for the synchronous
  // modes, switches every pair. Blocks until every rank has connected or the timeout.
  static absl::StatusOr<std::unique_ptr<GlooGroup>> Create(
      const GroupOptions& options, gloo::rendezvous::Store& store,
      std::shared_ptr<gloo::transport::Device> device) {
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.ranks);
    context->setTimeout(options.timeout);
    const std::string prefix(ModeName(options.mode));
    RM_RETURN_IF_ERROR(GlooCall(absl::StrCat("rendezvous of the ", prefix, " mesh"), [&] {
      gloo::rendezvous::PrefixStore prefix_store(prefix, store);
      context->connectFullMesh(prefix_store, device);
    }));
    if (options.mode != Mode::kDefault) {
      RM_RETURN_IF_ERROR(GlooCall("switching pairs to synchronous mode", [&] {
        for (int peer = 0; peer < options.ranks; ++peer) {
          if (peer == options.rank) continue;
          context->getPair(peer)->setSync(/*sync=*/true,
                                          /*busyPoll=*/options.mode == Mode::kBusyPoll);
        }
      }));
    }
    auto group = std::unique_ptr<GlooGroup>(new GlooGroup(options.mode, context));
    RM_RETURN_IF_ERROR(GlooCall("creating a barrier", [&] {
      group->barrier_ = std::make_unique<gloo::BarrierAllToAll>(context);
    }));
    return group;
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  Mode mode() const { return mode_; }
  const std::shared_ptr<gloo::Context>& context() const { return context_; }

  absl::Status Barrier() override {
    return GlooCall("barrier", [&] { barrier_->run(); });
  }

  absl::Status MaxOverRanks(absl::Span<double> values) override {
    return GlooCall("max over ranks", [&] {
      gloo::AllreduceRing<double> max(context_, {values.data()}, static_cast<int>(values.size()),
                                      gloo::ReductionFunction<double>::max);
      max.run();
    });
  }

 private:
  GlooGroup(Mode mode, std::shared_ptr<gloo::Context> context)
      : mode_(mode), context_(std::move(context)) {}

  const Mode mode_;
  const std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::BarrierAllToAll> barrier_;
};

// The buffers of one op at one size, shared by its candidates one after the other:
// prefixes of storage allocated once for the whole sweep.
struct Buffers {
  absl::Span<float> a;  // input, and output of in-place algorithms
  absl::Span<float> b;  // output of out-of-place algorithms (all_gather)
};

// Makes a Candidate that owns `algorithm` (a gloo::Algorithm, or the options of a
// function-style collective) and runs it with `run`.
template <typename T, typename RunFn>
Candidate MakeCandidate(GlooGroup& group, absl::string_view algorithm_name, absl::Span<float> in,
                        absl::Span<float> out, std::shared_ptr<T> algorithm, RunFn run) {
  Candidate candidate;
  candidate.impl = ImplName(algorithm_name, group.mode());
  candidate.group = &group;
  candidate.in = in;
  candidate.out = out;
  candidate.run = [algorithm = std::move(algorithm), run, name = candidate.impl] {
    return GlooCall(name, [&] { run(*algorithm); });
  };
  return candidate;
}

// Where an algorithm can run in the synchronous modes (sync, busy_poll).
enum class SyncModes {
  // Never: it uses unbound buffers, which only the epoll thread serves.
  kNone,
  // Up to --sync_max_bytes: peers send to each other at the same time, each with a
  // blocking writev, and above a few MiB per message both block with full socket buffers
  // and deadlock until Gloo's timeout (seen on this machine, net.core.wmem_max = 4 MiB:
  // ring at 8 MiB, the others at 16 MiB; 4 MiB works for every algorithm and N = 2, 4).
  kUpToLimit,
  // At every size: sends go one way (broadcast).
  kAll,
};

// An algorithm Gloo offers for an op: its name, where it runs in the synchronous modes,
// and how to set it up for one layout on one group.
struct Algorithm {
  Op op;
  std::string name;
  SyncModes sync_modes;
  std::function<Candidate(GlooGroup&, const Layout&, Buffers&)> make;
};

// Gloo's classic algorithms take the element count as an int; MakeLayout guarantees it
// fits.
template <template <typename> class AllreduceClass>
Algorithm ClassicAllreduce(std::string name) {
  return {Op::kAllReduce, name, SyncModes::kUpToLimit,
          [name](GlooGroup& group, const Layout& layout, Buffers& buffers) {
            absl::Span<float> data = buffers.a;
            auto algorithm = std::make_shared<AllreduceClass<float>>(
                group.context(), std::vector<float*>{data.data()},
                static_cast<int>(layout.in_count), gloo::ReductionFunction<float>::sum);
            return MakeCandidate(group, name, data, data, std::move(algorithm),
                                 [](gloo::Algorithm& a) { a.run(); });
          }};
}

Algorithm OptionsAllreduce(std::string name, gloo::AllreduceOptions::Algorithm which) {
  return {Op::kAllReduce, name, SyncModes::kNone,
          [name, which](GlooGroup& group, const Layout& layout, Buffers& buffers) {
            absl::Span<float> data = buffers.a;
            auto options = std::make_shared<gloo::AllreduceOptions>(group.context());
            options->setAlgorithm(which);
            options->setOutput(data.data(), layout.in_count);
            options->setReduceFunction(
                static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
            return MakeCandidate(group, name, data, data, std::move(options),
                                 [](gloo::AllreduceOptions& o) { gloo::allreduce(o); });
          }};
}

std::vector<Algorithm> AllAlgorithms() {
  std::vector<Algorithm> algorithms;
  algorithms.push_back(ClassicAllreduce<gloo::AllreduceRing>("ring"));
  algorithms.push_back(ClassicAllreduce<gloo::AllreduceRingChunked>("ring_chunked"));
  algorithms.push_back(ClassicAllreduce<gloo::AllreduceHalvingDoubling>("halving_doubling"));
  algorithms.push_back(ClassicAllreduce<gloo::AllreduceBcube>("bcube"));
  algorithms.push_back(OptionsAllreduce("opts_ring", gloo::AllreduceOptions::Algorithm::RING));
  algorithms.push_back(OptionsAllreduce("opts_bcube", gloo::AllreduceOptions::Algorithm::BCUBE));

  algorithms.push_back({Op::kAllGather, "ring", SyncModes::kUpToLimit,
                        [](GlooGroup& group, const Layout& layout, Buffers& buffers) {
                          absl::Span<float> in = buffers.a;
                          absl::Span<float> out = buffers.b;
                          auto algorithm = std::make_shared<gloo::AllgatherRing<float>>(
                              group.context(), std::vector<const float*>{in.data()}, out.data(),
                              static_cast<int>(layout.in_count));
                          return MakeCandidate(group, "ring", in, out, std::move(algorithm),
                                               [](gloo::Algorithm& a) { a.run(); });
                        }});
  algorithms.push_back({Op::kAllGather, "opts", SyncModes::kNone,
                        [](GlooGroup& group, const Layout& layout, Buffers& buffers) {
                          absl::Span<float> in = buffers.a;
                          absl::Span<float> out = buffers.b;
                          auto options = std::make_shared<gloo::AllgatherOptions>(group.context());
                          options->setInput(in.data(), layout.in_count);
                          options->setOutput(out.data(), layout.out_count);
                          return MakeCandidate(
                              group, "opts", in, out, std::move(options),
                              [](gloo::AllgatherOptions& o) { gloo::allgather(o); });
                        }});

  algorithms.push_back(
      {Op::kReduceScatter, "halving_doubling", SyncModes::kUpToLimit,
       [](GlooGroup& group, const Layout& layout, Buffers& buffers) {
         absl::Span<float> data = buffers.a;
         auto algorithm = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
             group.context(), std::vector<float*>{data.data()}, static_cast<int>(layout.in_count),
             std::vector<int>(layout.ranks, static_cast<int>(layout.out_count)),
             gloo::ReductionFunction<float>::sum);
         return MakeCandidate(group, "halving_doubling", data, data.subspan(0, layout.out_count),
                              std::move(algorithm), [](gloo::Algorithm& a) { a.run(); });
       }});

  algorithms.push_back(
      {Op::kBroadcast, "one_to_all", SyncModes::kAll,
       [](GlooGroup& group, const Layout& layout, Buffers& buffers) {
         absl::Span<float> data = buffers.a;
         auto algorithm = std::make_shared<gloo::BroadcastOneToAll<float>>(
             group.context(), std::vector<float*>{data.data()}, layout.in_count, kBroadcastRoot);
         return MakeCandidate(group, "one_to_all",
                              group.rank() == kBroadcastRoot ? data : absl::Span<float>(), data,
                              std::move(algorithm), [](gloo::Algorithm& a) { a.run(); });
       }});
  algorithms.push_back(
      {Op::kBroadcast, "opts", SyncModes::kNone,
       [](GlooGroup& group, const Layout& layout, Buffers& buffers) {
         absl::Span<float> data = buffers.a;
         auto options = std::make_shared<gloo::BroadcastOptions>(group.context());
         options->setOutput(data.data(), layout.in_count);
         options->setRoot(kBroadcastRoot);
         return MakeCandidate(
             group, "opts", group.rank() == kBroadcastRoot ? data : absl::Span<float>(), data,
             std::move(options), [](gloo::BroadcastOptions& o) { gloo::broadcast(o); });
       }});
  return algorithms;
}

// An implementation more than kHopelessFactor * --prune_factor times slower than the best
// at one size is not tried at larger sizes.
constexpr double kHopelessFactor = 4;

// Rank 0 tells the person running the sweep what it skipped, on stderr.
void Note(int rank, const std::string& message) {
  if (rank != 0) return;
  std::fprintf(stderr, "gloo_bench: %s\n", message.c_str());
  std::fflush(stderr);
}

// Adds the likely cause to a failure in a synchronous mode.
absl::Status ExplainFailure(Mode mode, const absl::Status& status) {
  if (mode == Mode::kDefault ||
      !(absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status))) {
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat(status.message(),
                                   " (Gloo's synchronous pairs deadlock when peers send each "
                                   "other large messages at once; lower --sync_max_bytes)"));
}

// Each implementation's time at the sizes measured so far (the median, or the fastest
// untimed run when it was pruned) and how many times slower than that size's best it
// was, for skipping at larger sizes what is already hopeless.
class History {
 public:
  struct Entry {
    size_t bytes = 0;
    double time_us = 0;
    double ratio_to_best = 0;  // 0 until FinishSize()
  };

  void Record(Op op, const std::string& impl, size_t bytes, double time_us) {
    entries_[{op, impl}].push_back({bytes, time_us, 0});
  }

  // Sets the ratios of the entries at `bytes` once that size's best is known.
  void FinishSize(Op op, size_t bytes, double best_us) {
    for (auto& [key, entries] : entries_) {
      if (key.first != op) continue;
      for (Entry& entry : entries) {
        if (entry.bytes == bytes) entry.ratio_to_best = entry.time_us / best_us;
      }
    }
  }

  // The entry at the largest size below `bytes`; all zero when there is none.
  Entry Smaller(Op op, const std::string& impl, size_t bytes) const {
    Entry found;
    auto it = entries_.find({op, impl});
    if (it == entries_.end()) return found;
    for (const Entry& entry : it->second) {
      if (entry.bytes < bytes && entry.bytes >= found.bytes) found = entry;
    }
    return found;
  }

 private:
  std::map<std::pair<Op, std::string>, std::vector<Entry>> entries_;
};

struct BenchOptions {
  int rank = -1;
  int ranks = 0;
  std::string store_dir;
  std::vector<Op> ops;
  std::vector<size_t> sizes;
  std::vector<Mode> modes;
  std::vector<std::string> algorithms;  // names to run
  int warmup = -1;
  int iters = -1;
  absl::Duration timeout;
  size_t sync_max_bytes = 0;
  double prune_factor = 3;
  bool all_algorithms = false;
  bool fail_on_wrong_result = true;
  bool keep_malloc_memory = false;
  std::string tail_csv;
  absl::Duration settle;
};

absl::StatusOr<BenchOptions> OptionsFromFlags() {
  BenchOptions options;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.ranks = absl::GetFlag(FLAGS_ranks);
  if (options.ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks: must be at least 1, not ", options.ranks));
  }
  if (options.rank < 0 || options.rank >= options.ranks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--rank: must be in [0, %d) for --ranks=%d, not %d", options.ranks,
                        options.ranks, options.rank));
  }
  options.store_dir = absl::GetFlag(FLAGS_store_dir);
  if (options.store_dir.empty()) {
    return absl::InvalidArgumentError(
        "--store_dir: required; a directory every rank can reach, empty at the start");
  }
  RM_ASSIGN_OR_RETURN(options.ops, ParseOps(absl::GetFlag(FLAGS_ops)));
  RM_ASSIGN_OR_RETURN(options.sizes, ParseSizes(absl::GetFlag(FLAGS_sizes)));

  std::vector<std::string> mode_names;
  for (Mode mode : kAllModes) mode_names.emplace_back(ModeName(mode));
  RM_ASSIGN_OR_RETURN(std::vector<std::string> modes,
                      ParseNames("--modes", absl::GetFlag(FLAGS_modes), mode_names));
  for (const std::string& name : modes) {
    for (Mode mode : kAllModes) {
      if (ModeName(mode) == name) options.modes.push_back(mode);
    }
  }

  std::vector<std::string> algorithm_names;
  for (const Algorithm& algorithm : AllAlgorithms()) {
    if (std::find(algorithm_names.begin(), algorithm_names.end(), algorithm.name) ==
        algorithm_names.end()) {
      algorithm_names.push_back(algorithm.name);
    }
  }
  RM_ASSIGN_OR_RETURN(options.algorithms,
                      ParseNames("--algorithms", absl::GetFlag(FLAGS_algorithms), algorithm_names));

  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.iters = absl::GetFlag(FLAGS_iters);
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  RM_RETURN_IF_ERROR(ValidateRunFlags(options.iters, options.warmup, timeout_s));
  options.timeout = absl::Seconds(timeout_s);
  RM_ASSIGN_OR_RETURN(std::vector<size_t> sync_max,
                      ParseSizes(absl::GetFlag(FLAGS_sync_max_bytes)));
  if (sync_max.size() != 1) {
    return absl::InvalidArgumentError("--sync_max_bytes: give one size, such as 4M");
  }
  options.sync_max_bytes = sync_max[0];
  options.prune_factor = absl::GetFlag(FLAGS_prune_factor);
  if (!(options.prune_factor == 0 || options.prune_factor >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prune_factor: must be 0 (measure everything) or at least 1, not ",
                     options.prune_factor));
  }
  options.all_algorithms = absl::GetFlag(FLAGS_all_algorithms);
  options.fail_on_wrong_result = absl::GetFlag(FLAGS_fail_on_wrong_result);
  options.keep_malloc_memory = absl::GetFlag(FLAGS_keep_malloc_memory);
  options.tail_csv = absl::GetFlag(FLAGS_tail_csv);
  options.settle = absl::Seconds(absl::GetFlag(FLAGS_settle_s));
  return options;
}

absl::Status Run(const BenchOptions& options) {
  const std::string who = absl::StrCat("gloo_bench rank ", options.rank);
  if (options.keep_malloc_memory) RM_RETURN_IF_ERROR(KeepMallocMemory());
  Watchdog watchdog(options.timeout, who);
  RM_ASSIGN_OR_RETURN(Report report, Report::Create(options.rank, options.tail_csv));

  std::error_code error;
  std::filesystem::create_directories(options.store_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--store_dir: cannot create %s: %s", options.store_dir, error.message()));
  }

  // One device (one epoll thread) for every mesh; the synchronous meshes leave it.
  std::shared_ptr<gloo::transport::Device> device;
  RM_RETURN_IF_ERROR(GlooCall("creating the TCP device", [&] {
    gloo::transport::tcp::attr attr(kLoopback);
    attr.ai_family = AF_INET;
    device = gloo::transport::tcp::CreateDevice(attr);
  }));
  std::unique_ptr<gloo::rendezvous::FileStore> store;
  RM_RETURN_IF_ERROR(GlooCall("opening --store_dir", [&] {
    store = std::make_unique<gloo::rendezvous::FileStore>(options.store_dir);
  }));

  // Half the watchdog's limit, so that a stuck send or receive is reported by Gloo (and
  // explained below) before the watchdog ends the process.
  const auto timeout = std::chrono::milliseconds(
      std::max<int64_t>(absl::ToInt64Milliseconds(options.timeout) / 2, 1000));
  std::vector<std::unique_ptr<GlooGroup>> groups;
  for (Mode mode : options.modes) {
    watchdog.Start(absl::StrCat("rendezvous of the ", ModeName(mode), " mesh"));
    RM_ASSIGN_OR_RETURN(
        std::unique_ptr<GlooGroup> group,
        GlooGroup::Create({options.rank, options.ranks, mode, timeout}, *store, device));
    groups.push_back(std::move(group));
  }

  RM_ASSIGN_OR_RETURN(Counts largest, LargestCounts(options.ops, options.sizes, options.ranks));
  RM_ASSIGN_OR_RETURN(Counts largest_all_gather,
                      LargestCounts(std::find(options.ops.begin(), options.ops.end(),
                                              Op::kAllGather) != options.ops.end()
                                        ? std::vector<Op>{Op::kAllGather}
                                        : std::vector<Op>{},
                                    options.sizes, options.ranks));
  Buffer storage_a(largest.in);
  Buffer storage_b(largest_all_gather.out);

  // Every mesh settles (each is its own set of connections).
  for (auto& group : groups) RM_RETURN_IF_ERROR(Settle(*group, options.settle));
  const std::vector<Algorithm> algorithms = AllAlgorithms();
  History history;
  int wrong_results = 0;
  for (Op op : options.ops) {
    for (size_t size : options.sizes) {
      RM_ASSIGN_OR_RETURN(Layout layout, MakeLayout(op, size, options.ranks));
      MeasureOptions measure;
      measure.warmup = options.warmup >= 0 ? options.warmup : DefaultWarmup(layout.bytes);
      measure.iters = options.iters >= 1 ? options.iters : DefaultIters(layout.bytes);
      Buffers buffers;
      buffers.a = absl::MakeSpan(storage_a).subspan(0, layout.in_count);
      if (op == Op::kAllGather) {
        buffers.b = absl::MakeSpan(storage_b).subspan(0, layout.out_count);
      }

      std::vector<Result> results;
      // Every rank sees the same agreed times, so every rank skips alike.
      auto prune_limit_us = [&] {
        return options.prune_factor > 0 && !results.empty()
                   ? options.prune_factor * Best(results).stats.p50_us
                   : std::numeric_limits<double>::infinity();
      };
      for (const std::unique_ptr<GlooGroup>& group : groups) {
        for (const Algorithm& algorithm : algorithms) {
          if (algorithm.op != op) continue;
          if (group->mode() != Mode::kDefault && (algorithm.sync_modes == SyncModes::kNone ||
                                                  (algorithm.sync_modes == SyncModes::kUpToLimit &&
                                                   layout.bytes > options.sync_max_bytes))) {
            continue;
          }
          if (std::find(options.algorithms.begin(), options.algorithms.end(), algorithm.name) ==
              options.algorithms.end()) {
            continue;
          }
          const std::string impl =
              absl::StrCat(ImplName(algorithm.name, group->mode()),
                           options.keep_malloc_memory ? kKeepMallocSuffix : "");
          // Skip what cannot win here: an implementation is not faster at this size
          // than at a smaller one, and one that was far behind the best at the last
          // smaller size (Gloo's opts_ring with 4 ranks: 60x at 64 KiB, then a minute
          // per run at 64 MiB) stays behind.
          const History::Entry earlier = history.Smaller(op, impl, layout.bytes);
          if (options.prune_factor > 0 && earlier.time_us > prune_limit_us()) {
            Note(options.rank,
                 absl::StrFormat("%s %s at %d bytes: skipped; it took %.0f us at %d bytes, "
                                 "over %g x the best here so far (%.0f us)",
                                 CollectiveName(op), impl, layout.bytes, earlier.time_us, earlier.bytes,
                                 options.prune_factor, Best(results).stats.p50_us));
            continue;
          }
          if (options.prune_factor > 0 &&
              earlier.ratio_to_best > kHopelessFactor * options.prune_factor) {
            Note(options.rank,
                 absl::StrFormat("%s %s at %d bytes: skipped; at %d bytes it took %.1f x "
                                 "that size's best (%.0f us)",
                                 CollectiveName(op), impl, layout.bytes, earlier.bytes,
                                 earlier.ratio_to_best, earlier.time_us));
            continue;
          }
          Candidate candidate;
          RM_RETURN_IF_ERROR(GlooCall(absl::StrCat("setting up ", impl), [&] {
            candidate = algorithm.make(*group, layout, buffers);
          }));
          candidate.impl = impl;
          watchdog.Start(absl::StrFormat("%s %s at %d bytes", CollectiveName(op), impl, layout.bytes));
          measure.prune_above_us = prune_limit_us();
          absl::StatusOr<Measurement> measurement = Measure(layout, measure, candidate);
          if (absl::IsDataLoss(measurement.status())) {
            // A wrong result from Gloo itself (ReduceScatterHalvingDoubling in the default
            // mode reuses its buffer while its asynchronous sends still read it): leave
            // the line out, tell, and carry on; the ranks are still in step.
            std::fprintf(stderr, "%s: ERROR: %s; left out of the results\n", who.c_str(),
                         std::string(measurement.status().message()).c_str());
            ++wrong_results;
            continue;
          }
          if (!measurement.ok()) return ExplainFailure(group->mode(), measurement.status());
          if (measurement->pruned) {
            history.Record(op, impl, layout.bytes, measurement->untimed_us);
            Note(options.rank,
                 absl::StrFormat("%s %s at %d bytes: not timed; its fastest untimed run "
                                 "took %.0f us, over %g x the best here so far (%.0f us)",
                                 CollectiveName(op), impl, layout.bytes, measurement->untimed_us,
                                 options.prune_factor, Best(results).stats.p50_us));
            continue;
          }
          history.Record(op, impl, layout.bytes, measurement->stats.p50_us);
          results.push_back({layout, impl, measurement->stats});
          if (options.all_algorithms) report.Add(results.back());
        }
      }
      if (results.empty()) {
        Note(options.rank,
             absl::StrFormat("%s at %d bytes: no implementation measured (see above, or "
                             "--modes and --algorithms)",
                             CollectiveName(op), layout.bytes));
        continue;
      }
      history.FinishSize(op, layout.bytes, Best(results).stats.p50_us);
      if (!options.all_algorithms) report.Add(Best(results));
    }
  }
  watchdog.Start("shutdown");
  // Leave together: a rank that exits early closes its sockets under a peer still
  // finishing its last collective.
  if (!groups.empty()) RM_RETURN_IF_ERROR(groups.front()->Barrier());
  if (wrong_results > 0 && options.fail_on_wrong_result) {
    return absl::DataLossError(
        absl::StrCat(wrong_results,
                     " measurement(s) computed wrong results (see above) and were left "
                     "out; --nofail_on_wrong_result makes this exit 0"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ringmaster::bench::peers

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures Gloo's collectives; run one process per rank (see bench/peers/README.md).");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<ringmaster::bench::peers::BenchOptions> options =
      ringmaster::bench::peers::OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "gloo_bench: %s\n", options.status().ToString().c_str());
    return 2;
  }
  absl::Status status = ringmaster::bench::peers::Run(*options);
  if (!status.ok()) {
    std::fprintf(stderr, "gloo_bench rank %d: %s\n", options->rank, status.ToString().c_str());
    return absl::IsDataLoss(status) ? 3 : 1;
  }
  return 0;
}
