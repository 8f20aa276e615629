// fsdp_traffic: what one rank of a job sends per training step, from the communicator's own
// counters (comm/communicator.h Counters), which the trainer does not report. fsdpbench runs
// it beside each `ringctl local` run; it is a probe, not a launcher.
//
//   fsdp_traffic --spec JOB.yaml --world N [--steps 3] [--metrics FILE] [--link_gbit G]
//
// Forks N ranks on this machine, each with a TCP communicator (shared-memory rings between
// them, as under ringctl local) over a FileStore in a fresh directory, and trains the spec
// (with every override already applied) in-process for --steps steps (at most the spec's).
// The first step is not counted (it includes the start-up's collectives); after the others
// each rank prints one line (bench/fsdp_bench.h ParseProbeTraffic):
//   traffic rank=R steps=K all_gather=B/C reduce_scatter=B/C all_reduce=B/C
// with the payload bytes it sent and the calls, summed over the K counted steps. The
// all-reduces include the per-step control sums (a few doubles).
//
// --metrics: rank 0 writes its metrics.jsonl there (a record per diagnostics.log_every
// steps: window time, time in collectives, exposed communication), as ringtrainer's
// --metrics_jsonl does.
// --link_gbit G > 0: the ranks are joined by an emulated network link instead (each in a
// network namespace of its own, TCP only, every rank's egress limited to G Gbit/s by tc's
// tbf: bench/emulated_link.h), so that communication costs wire time; the traffic lines then
// end in " link_tx=B link_drops=P", what each rank's link interface sent over the counted
// steps and its token bucket dropped. Needs root and iproute2 (ip, tc): without them the
// probe says why and exits 3.
// Exit status: 0 when every rank printed its line; 1 when one failed (its error on stderr);
// 2 for bad flags or a bad spec; 3 when the emulated link cannot be made here.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/emulated_link.h"
#include "bench/fsdp_bench.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "train/trainer.h"

ABSL_FLAG(std::string, spec, "", "job spec (YAML) with every override applied");
ABSL_FLAG(int, world, 2, "ranks to fork on this machine");
ABSL_FLAG(int64_t, steps, 3, "steps to train; the first is not counted (at least 2)");
ABSL_FLAG(std::string, metrics, "", "where rank 0 writes its metrics.jsonl; empty: nowhere");
ABSL_FLAG(double, link_gbit, 0,
          "> 0: join the ranks by an emulated link of this rate (Gbit/s per rank's egress; "
          "network namespaces, TCP only; needs root and iproute2) instead of shared memory");

namespace ringmaster::bench {
namespace {

constexpr char kProgram[] = "fsdp_traffic";

StepTraffic Difference(const comm::Counters& after, const comm::Counters& before) {
  const auto sent = [&](comm::OpKind k) {
    return static_cast<double>(after.of(k).bytes_sent - before.of(k).bytes_sent);
  };
  const auto calls = [&](comm::OpKind k) {
    return static_cast<double>(after.of(k).calls - before.of(k).calls);
  };
  StepTraffic t;
  t.all_gather = sent(comm::OpKind::kAllGather);
  t.all_gather_calls = calls(comm::OpKind::kAllGather);
  t.reduce_scatter = sent(comm::OpKind::kReduceScatter);
  t.reduce_scatter_calls = calls(comm::OpKind::kReduceScatter);
  t.all_reduce = sent(comm::OpKind::kAllReduce);
  t.all_reduce_calls = calls(comm::OpKind::kAllReduce);
  return t;
}

struct RankOptions {
  int world = 1;
  int64_t steps = 3;
  std::string store_dir;
  std::string metrics;  // rank 0's metrics.jsonl; empty: none
  bool on_link = false;  // bind to the rank's link address, TCP only; read the link's counters
};

// One rank: trains and prints its traffic line.
absl::Status RunRank(const JobSpec& spec, int rank, const RankOptions& o) {
  const int world = o.world;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileStore> store,
                      comm::FileStore::Create({o.store_dir}));
  comm::TcpCommunicatorOptions co;
  co.rank = rank;
  co.size = world;
  co.store = store.get();
  co.prefix = "fsdp_traffic";
  if (o.on_link) {
    co.listen_host = LinkAddress(rank);
    co.shared_memory = false;
  }
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::TcpCommunicator> comm,
                      comm::TcpCommunicator::Create(co));
  if (o.on_link && comm->shared_memory_peers() != 0) {
    return absl::InternalError("the ranks share memory: the emulated link is bypassed");
  }
  RM_ASSIGN_OR_RETURN(train::TrainConfig config, config::TrainConfigFromSpec(spec));
  config.steps = std::min<int64_t>(config.steps, o.steps);
  config.metrics_jsonl = o.metrics;
  config.metrics_tensorboard.clear();
  config.checkpoint = {};
  train::TrainerOptions to;
  to.config = std::move(config);
  to.comm = comm.get();
  to.local_ranks = world;
  to.gpu = rank;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, train::Trainer::Create(to));
  RM_RETURN_IF_ERROR(trainer->Step());
  const comm::Counters first = comm->counters();
  LinkCounters link_first;
  if (o.on_link) {
    RM_ASSIGN_OR_RETURN(link_first, ReadLinkCounters());
  }
  const int64_t counted_from = trainer->steps_done();
  while (!trainer->finished()) RM_RETURN_IF_ERROR(trainer->Step());
  const int64_t counted = trainer->steps_done() - counted_from;
  if (counted <= 0) {
    return absl::InvalidArgumentError("--steps: train at least 2 steps (the first is not counted)");
  }
  StepTraffic traffic = Difference(comm->counters(), first);
  if (o.on_link) {
    RM_ASSIGN_OR_RETURN(const LinkCounters link, ReadLinkCounters());
    traffic.link_tx_bytes = static_cast<double>(link.tx_bytes - link_first.tx_bytes);
    traffic.link_drops = static_cast<double>(link.qdisc_drops - link_first.qdisc_drops);
  }
  const std::string line = ProbeTrafficLine(rank, counted, traffic) + "\n";
  if (write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return absl::InternalError("cannot write the traffic line to stdout");
  }
  return absl::OkStatus();
}

int Main() {
  const int world = absl::GetFlag(FLAGS_world);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (world < 1) {
    fprintf(stderr, "%s: --world: %d is less than 1\n", kProgram, world);
    return 2;
  }
  if (steps < 2) {
    fprintf(stderr, "%s: --steps: %lld is less than 2 (the first is not counted)\n", kProgram,
            static_cast<long long>(steps));
    return 2;
  }
  if (absl::GetFlag(FLAGS_spec).empty()) {
    fprintf(stderr, "%s: --spec is required\n", kProgram);
    return 2;
  }
  absl::StatusOr<JobSpec> spec = spec::LoadJobSpecFile(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) {
    fprintf(stderr, "%s: --spec: %s\n", kProgram, std::string(spec.status().message()).c_str());
    return 2;
  }
  const double link_gbit = absl::GetFlag(FLAGS_link_gbit);
  if (!(link_gbit >= 0) || !std::isfinite(link_gbit)) {
    fprintf(stderr, "%s: --link_gbit: %g is not a rate (0: no link)\n", kProgram, link_gbit);
    return 2;
  }
  if (link_gbit > 0) {
    if (absl::Status s = CheckLinkSupport(); !s.ok()) {
      fprintf(stderr, "%s: --link_gbit: %s\n", kProgram, std::string(s.message()).c_str());
      return 3;
    }
  }
  char store_dir[] = "/tmp/fsdp_traffic-XXXXXX";
  if (mkdtemp(store_dir) == nullptr) {
    perror("fsdp_traffic: mkdtemp /tmp/fsdp_traffic-XXXXXX");
    return 1;
  }
  RankOptions o;
  o.world = world;
  o.steps = steps;
  o.store_dir = store_dir;
  o.metrics = absl::GetFlag(FLAGS_metrics);
  o.on_link = link_gbit > 0;
  int failed = 0;
  if (o.on_link) {
    EmulatedLinkOptions link;
    link.gbit = link_gbit;
    const absl::Status s =
        RunRanksOnLink(world, link, [&](int rank) { return RunRank(*spec, rank, o); });
    if (!s.ok()) {
      fprintf(stderr, "%s: %s\n", kProgram, std::string(s.message()).c_str());
      failed = 1;
    }
  } else {
    fflush(stdout);
    std::vector<pid_t> ranks;
    for (int rank = 0; rank < world; ++rank) {
      const pid_t pid = fork();
      if (pid < 0) {
        perror("fsdp_traffic: fork");
        for (pid_t p : ranks) kill(p, SIGKILL);
        return 1;
      }
      if (pid == 0) {
        absl::Status s = RunRank(*spec, rank, o);
        if (!s.ok()) fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, s.ToString().c_str());
        fflush(stderr);
        _exit(s.ok() ? 0 : 1);
      }
      ranks.push_back(pid);
    }
    for (pid_t p : ranks) {
      int status = 0;
      if (waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    if (failed > 0) fprintf(stderr, "%s: %d of %d ranks failed\n", kProgram, failed, world);
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  if (failed > 0) return 1;
  return 0;
}

}  // namespace
}  // namespace ringmaster::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "bytes a rank sends per training step, from the communicator's counters\n"
      "  fsdp_traffic --spec JOB.yaml --world N [--steps 3] [--metrics FILE] [--link_gbit G]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    fprintf(stderr, "fsdp_traffic: unexpected argument \"%s\" (everything is a --flag)\n",
            args[1]);
    return 2;
  }
  return ringmaster::bench::Main();
}
