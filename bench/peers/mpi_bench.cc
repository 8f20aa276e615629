// mpi_bench: collectives of OpenMPI (Debian's openmpi-bin 4.1, TCP over loopback), measured
// with the conventions of bench/peers/peer_bench.h, so that `ringbench comm` can compare them.
// MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block and MPI_Bcast (root 0), float32
// sum, out of place except broadcast; OpenMPI's `tuned` component picks the algorithm per
// size.
//
// Launch (what bench/peers/run_peer.sh mpi runs; works as root, 4 ranks on 2 cores), as
// one command line:
//
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 --mca pml ob1
//       --mca btl tcp,self --mca btl_tcp_if_include lo
//       bazel-bin/bench/peers/mpi_bench --sizes 1K,64K,4M,64M,256M
//       --ops all_reduce,all_gather,reduce_scatter,broadcast
//
//   --allow-run-as-root   mpirun refuses root otherwise (or set OMPI_ALLOW_RUN_AS_ROOT=1
//                         and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
//   --oversubscribe       more ranks than cores (4 on 2); OpenMPI then also yields the
//                         CPU while it waits (mpi_yield_when_idle)
//   --bind-to none        no core binding, as the Gloo ranks and our own; with
//                         oversubscription OpenMPI binds nothing anyway
//   --mca pml ob1 --mca btl tcp,self
//                         point-to-point over TCP only: no shared memory (vader), no UCX
//   --mca btl_tcp_if_include lo
//                         loopback only
//
// Rank 0 prints the CSV; every rank reports its errors on stderr and a failure aborts the
// whole job (MPI_Abort), so mpirun exits non-zero.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/peers/peer_bench.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter,broadcast",
          "Comma list of ops to measure.");
ABSL_FLAG(std::string, sizes, "1K,64K,4M,64M,256M",
          "Comma list of sizes in bytes, with optional K, M or G (powers of 1024).");
ABSL_FLAG(int, warmup, -1, "Untimed runs per size, the first checked; -1: 5, or 1 above 16 MiB.");
ABSL_FLAG(double, settle_s, 1, "small untimed collectives before the first measurement, seconds");
ABSL_FLAG(int, iters, -1, "Timed runs per size; -1: 50 up to 1 MiB, 20 up to 16 MiB, 5 above.");
ABSL_FLAG(int, timeout_s, 120,
          "Limit on one op at one size (check, warm-up and timed runs), in "
          "seconds: a rank "
          "past it exits and mpirun ends the job.");
ABSL_FLAG(bool, keep_malloc_memory, false,
          "Keep freed memory in glibc's heap (mallopt) so that the peer's per-call "
          "temporaries of 32 MiB or more are not page-faulted afresh on every call; "
          "impl "
          "names get the suffix :keep_malloc. Off: the peer as shipped.");
ABSL_FLAG(std::string, transport, "tcp",
          "What mpirun was told to use, for the impl names: tcp (btl tcp,self) or shm "
          "(btl vader,self: OpenMPI's shared memory); impl names get the suffix -shm.");
ABSL_FLAG(std::string, tail_csv, "",
          "Also write op,ranks,bytes,impl,p50_us,p90_us,max_us to this file "
          "(rank 0).");

namespace ringmaster::bench::peers {
namespace {

#ifdef OPEN_MPI
constexpr char kImpl[] = "openmpi";
#else
constexpr char kImpl[] = "mpi";
#endif

absl::Status MpiCall(absl::string_view what, int rc) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  return absl::UnavailableError(absl::StrCat(what, ": ", absl::string_view(message, length)));
}

class MpiGroup final : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  absl::Status Barrier() override { return MpiCall("MPI_Barrier", MPI_Barrier(comm_)); }

  absl::Status MaxOverRanks(absl::Span<double> values) override {
    return MpiCall("MPI_Allreduce(MPI_MAX)",
                   MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                                 MPI_DOUBLE, MPI_MAX, comm_));
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

struct BenchOptions {
  std::vector<Op> ops;
  std::vector<size_t> sizes;
  int warmup = -1;
  int iters = -1;
  absl::Duration timeout;
  bool keep_malloc_memory = false;
  bool shared_memory = false;
  std::string tail_csv;
  absl::Duration settle;
};

absl::StatusOr<BenchOptions> OptionsFromFlags() {
  BenchOptions options;
  RM_ASSIGN_OR_RETURN(options.ops, ParseOps(absl::GetFlag(FLAGS_ops)));
  RM_ASSIGN_OR_RETURN(options.sizes, ParseSizes(absl::GetFlag(FLAGS_sizes)));
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.iters = absl::GetFlag(FLAGS_iters);
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  RM_RETURN_IF_ERROR(ValidateRunFlags(options.iters, options.warmup, timeout_s));
  options.timeout = absl::Seconds(timeout_s);
  options.keep_malloc_memory = absl::GetFlag(FLAGS_keep_malloc_memory);
  options.tail_csv = absl::GetFlag(FLAGS_tail_csv);
  options.settle = absl::Seconds(absl::GetFlag(FLAGS_settle_s));
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "tcp" && transport != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport: \"", transport, "\" is neither tcp nor shm"));
  }
  options.shared_memory = transport == "shm";
  return options;
}

// `in` and `out` hold at least layout.in_count and layout.out_count elements.
Candidate MakeCandidate(MpiGroup& group, const Layout& layout, std::string impl,
                        absl::Span<float> in, absl::Span<float> out) {
  Candidate candidate;
  candidate.impl = std::move(impl);
  candidate.group = &group;
  candidate.in = in.subspan(0, layout.in_count);
  candidate.out = out.subspan(0, layout.out_count);
  const MPI_Comm comm = group.comm();
  float* send = in.data();
  float* recv = out.data();
  const int in_count = static_cast<int>(layout.in_count);
  const int out_count = static_cast<int>(layout.out_count);
  switch (layout.op) {
    case Op::kAllReduce:
      candidate.run = [=] {
        return MpiCall("MPI_Allreduce",
                       MPI_Allreduce(send, recv, in_count, MPI_FLOAT, MPI_SUM, comm));
      };
      break;
    case Op::kAllGather:
      candidate.run = [=] {
        return MpiCall("MPI_Allgather",
                       MPI_Allgather(send, in_count, MPI_FLOAT, recv, in_count, MPI_FLOAT, comm));
      };
      break;
    case Op::kReduceScatter:
      candidate.run = [=] {
        return MpiCall("MPI_Reduce_scatter_block",
                       MPI_Reduce_scatter_block(send, recv, out_count, MPI_FLOAT, MPI_SUM, comm));
      };
      break;
    case Op::kBroadcast:
      // In place: the root's input is its output.
      candidate.in = group.rank() == kBroadcastRoot ? candidate.out : absl::Span<float>();
      candidate.run = [=] {
        return MpiCall("MPI_Bcast", MPI_Bcast(recv, in_count, MPI_FLOAT, kBroadcastRoot, comm));
      };
      break;
  }
  return candidate;
}

absl::Status Run(const BenchOptions& options, MpiGroup& group) {
  Watchdog watchdog(options.timeout, absl::StrCat("mpi_bench rank ", group.rank()));
  if (options.keep_malloc_memory) RM_RETURN_IF_ERROR(KeepMallocMemory());
  const std::string impl = absl::StrCat(kImpl, options.shared_memory ? "-shm" : "",
                                        options.keep_malloc_memory ? kKeepMallocSuffix : "");
  RM_ASSIGN_OR_RETURN(Report report, Report::Create(group.rank(), options.tail_csv));
  // Allocated once for the whole sweep; value-initialised, so every page is
  // touched.
  RM_ASSIGN_OR_RETURN(Counts largest, LargestCounts(options.ops, options.sizes, group.size()));
  std::vector<float> in(largest.in);
  std::vector<float> out(largest.out);
  RM_RETURN_IF_ERROR(Settle(group, options.settle));
  for (Op op : options.ops) {
    for (size_t size : options.sizes) {
      RM_ASSIGN_OR_RETURN(Layout layout, MakeLayout(op, size, group.size()));
      MeasureOptions measure;
      measure.warmup = options.warmup >= 0 ? options.warmup : DefaultWarmup(layout.bytes);
      measure.iters = options.iters >= 1 ? options.iters : DefaultIters(layout.bytes);
      Candidate candidate =
          MakeCandidate(group, layout, impl, absl::MakeSpan(in), absl::MakeSpan(out));
      watchdog.Start(
          absl::StrFormat("%s %s at %d bytes", CollectiveName(op), candidate.impl, layout.bytes));
      RM_ASSIGN_OR_RETURN(Measurement measurement, Measure(layout, measure, candidate));
      report.Add({layout, candidate.impl, measurement.stats});
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ringmaster::bench::peers

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures OpenMPI's collectives; launch with "
      "mpirun (see bench/peers/README.md).");
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Errors come back as codes, not as the default abort, so they can be
  // reported.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  absl::StatusOr<ringmaster::bench::peers::BenchOptions> options =
      ringmaster::bench::peers::OptionsFromFlags();
  if (!options.ok()) {
    if (rank == 0) {
      std::fprintf(stderr, "mpi_bench: %s\n", options.status().ToString().c_str());
    }
    MPI_Finalize();
    return 2;
  }
  ringmaster::bench::peers::MpiGroup group(MPI_COMM_WORLD);
  absl::Status status = ringmaster::bench::peers::Run(*options, group);
  if (!status.ok()) {
    std::fprintf(stderr, "mpi_bench rank %d: %s\n", rank, status.ToString().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
