// ringtrainer: one rank of a training job. Started by `ringctl local` or by ringworker,
// never by hand in normal use:
//
//   ringtrainer --spec JOB.yaml --rank R --world_size N --store_dir DIR --prefix P
//               [--local_ranks L] [--summary FILE] [--log_dir DIR]
//   ringtrainer --spec JOB.yaml --coordinator HOST:PORT --job J --epoch E --node N --slot S
//               --membership_token_file F [--advertise_host H] [--local_ranks L]
//               [--tls_ca F [--tls_client_cert F --tls_client_key F]]
//
// The first form is a fixed world (rank and size given). The second is elastic: the rank
// and world come from the coordinator for each epoch (worker/elastic_trainer.h), and
// SIGTERM makes this trainer leave the job after the drain save.
//
// Rank 0 prints progress lines on stdout and writes the job's result as JSON to --summary.
// Exit status: 0 when the job finished, 1 when it failed (the error on stderr), 2 for bad
// flags or a bad spec, 3 (kExitCodePermanent) when memory ran out on a thread that could not
// report it.
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

extern char** environ;

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "comm/store.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/out_of_memory.h"
#include "common/version.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "train/trainer.h"
#include "client/grpc_coordinator_client.h"
#include "worker/command_runner.h"
#include "worker/elastic_trainer.h"

ABSL_FLAG(std::string, spec, "", "job spec (YAML), already with every override applied");
ABSL_FLAG(int, rank, -1, "this trainer's rank, in [0, world_size)");
ABSL_FLAG(int, world_size, 0, "number of ranks");
ABSL_FLAG(std::string, store_dir, "", "FileStore directory shared by the ranks (bootstrap)");
ABSL_FLAG(std::string, prefix, "job", "store key prefix of this job's communicator");
ABSL_FLAG(int, local_ranks, 0, "ranks on this host (default: world_size)");
ABSL_FLAG(std::string, summary, "", "rank 0 writes the result here as JSON");
ABSL_FLAG(std::string, log_dir, "", "write logs here instead of stderr");
ABSL_FLAG(int, op_timeout_s, 120, "deadline of each collective, seconds");
ABSL_FLAG(int64_t, stop_at_step, 0,
          "stop (like a drain: checkpoint, then exit) once the job has taken this many steps");
ABSL_FLAG(int, connect_timeout_s, 60, "deadline of the communicator's bootstrap, seconds");
ABSL_FLAG(std::string, coordinator, "", "elastic mode: the coordinator's host:port");
ABSL_FLAG(std::string, job, "", "elastic mode: the job id");
ABSL_FLAG(int64_t, epoch, 1, "elastic mode: the epoch this trainer was started for");
ABSL_FLAG(std::string, node, "", "elastic mode: this trainer's node");
ABSL_FLAG(int, slot, -1, "elastic mode: this trainer's slot on the node");
ABSL_FLAG(std::string, membership_token_file, "",
          "elastic mode: file holding the membership token (from the agent)");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1",
          "elastic mode: the address peers reach this trainer at");
ABSL_FLAG(std::string, tls_ca, "", "elastic mode: PEM CA of the coordinator's certificate (TLS)");
ABSL_FLAG(std::string, tls_client_cert, "",
          "elastic mode: PEM client certificate (a coordinator with mutual TLS)");
ABSL_FLAG(std::string, tls_client_key, "", "elastic mode: PEM key of --tls_client_cert");

namespace ringmaster {
namespace {

std::atomic<bool> g_drain{false};
std::atomic<bool> g_save{false};
static_assert(std::atomic<bool>::is_always_lock_free);  // used from signal handlers

// Prints the error as "ringtrainer rank R: ..." (a fixed world) or "ringtrainer NODE/SLOT:
// ..." (elastic: the rank changes with the epochs).
int Fail(int code, const std::string& message) {
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    fprintf(stderr, "ringtrainer %s/%d: %s\n", absl::GetFlag(FLAGS_node).c_str(),
            absl::GetFlag(FLAGS_slot), message.c_str());
  } else {
    fprintf(stderr, "ringtrainer rank %d: %s\n", absl::GetFlag(FLAGS_rank), message.c_str());
  }
  return code;
}
int Fail(int code, const absl::Status& status) {
  return Fail(code, status.ToString(absl::StatusToStringMode::kWithNoExtraData));
}

void PrintProgress(const std::string& line) {
  // On a terminal, step lines overwrite each other (a live progress line); epoch results
  // and everything else stay. Elsewhere (files, pipes) every line is kept.
  static const bool live = isatty(STDOUT_FILENO) == 1;
  static bool pending = false;
  const bool transient = live && line.rfind("step ", 0) == 0 &&
                         line.find("test_accuracy") == std::string::npos &&
                         line.find("val_perplexity") == std::string::npos;
  if (transient) {
    printf("\r\033[K%s", line.c_str());
    pending = true;
  } else {
    printf("%s%s\n", pending ? "\r\033[K" : "", line.c_str());
    pending = false;
  }
  fflush(stdout);
}

void InstallSignalHandlers() {
  // SIGTERM (the launcher cancelling, systemd or Kubernetes stopping us, a spot reclaim)
  // drains: the ranks stop after the current step, saving a checkpoint when the job has
  // them. A second SIGTERM leaves at once. SIGUSR1 asks for a checkpoint now.
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = [](int) {
    if (g_drain.exchange(true)) _exit(143);
  };
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = [](int) { g_save.store(true); };
  sigaction(SIGUSR1, &sa, nullptr);
}

void InitTrainerLogging() {
  LoggingOptions lo;
  lo.program_name = "ringtrainer";
  lo.log_dir = absl::GetFlag(FLAGS_log_dir);
  lo.to_stderr_only = lo.log_dir.empty();
  InitLogging(lo);
}

// The directory holding the ringmaster Python module (ringmaster/__init__.py) that a command
// job's program may import: python/ beside bin/ in the release bundle, else in this binary's
// Bazel runfiles (a build tree's, a test's). Empty (logged) when there is none.
std::string PythonModuleDir() {
  std::vector<std::string> candidates;
  char self[4096];
  if (const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1); n > 0) {
    const std::string exe(self, static_cast<size_t>(n));
    candidates.push_back(exe.substr(0, exe.find_last_of('/')) + "/../python");
    candidates.push_back(exe + ".runfiles/ringmaster/python");
  }
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* dir = getenv(var);
    if (dir != nullptr && *dir != '\0') candidates.push_back(absl::StrCat(dir, "/ringmaster/python"));
  }
  for (const std::string& c : candidates) {
    if (access((c + "/ringmaster/__init__.py").c_str(), R_OK) != 0) continue;
    char real[PATH_MAX];
    return realpath(c.c_str(), real) != nullptr ? std::string(real) : c;
  }
  fprintf(stderr,
          "ringtrainer: the ringmaster Python module (python/ringmaster/__init__.py) is neither "
          "beside this binary's bin/ nor in its runfiles: a command job's program cannot import "
          "ringmaster unless its own PYTHONPATH finds it\n");
  return "";
}

// A command job (worker/command_runner.h): the user's program instead of the built-in
// trainer; its output is this trainer's (the agent's slot log).
int CommandMain(JobSpec spec, client::TrainerCalls* client) {
  worker::CommandRunnerOptions co;
  co.client = client;
  co.job = absl::GetFlag(FLAGS_job);
  co.slot.set_node(absl::GetFlag(FLAGS_node));
  co.slot.set_slot(absl::GetFlag(FLAGS_slot));
  co.first_epoch = absl::GetFlag(FLAGS_epoch);
  co.spec = std::move(spec);
  co.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  for (char** e = environ; *e != nullptr; ++e) co.base_env.push_back(*e);
  // The job's directory on this node (the agent writes the spec there): the error files go
  // there, and the program runs there unless command.workdir says where.
  const std::string& spec_path = absl::GetFlag(FLAGS_spec);
  const size_t slash = spec_path.find_last_of('/');
  co.error_file_dir = slash == std::string::npos ? "." : spec_path.substr(0, slash);
  if (co.spec.command().workdir().empty()) co.spec.mutable_command()->set_workdir(co.error_file_dir);
  co.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  co.leave_requested = &g_drain;
  co.python_module_dir = PythonModuleDir();
  auto result = worker::RunCommandJob(co);
  if (!result.ok()) return Fail(1, result.status());
  if (result->left) {
    printf("ringtrainer %s/%d: left job %s (its program stopped)\n", co.slot.node().c_str(),
           co.slot.slot(), co.job.c_str());
  }
  return 0;
}

int ElasticMain() {
  if (absl::GetFlag(FLAGS_spec).empty()) return Fail(2, "--spec is required");
  if (absl::GetFlag(FLAGS_job).empty()) return Fail(2, "--job is required with --coordinator");
  if (absl::GetFlag(FLAGS_node).empty()) return Fail(2, "--node is required with --coordinator");
  if (absl::GetFlag(FLAGS_slot) < 0) return Fail(2, "--slot is required with --coordinator");
  if (absl::GetFlag(FLAGS_membership_token_file).empty()) {
    return Fail(2, "--membership_token_file is required with --coordinator");
  }
  InitTrainerLogging();
  InstallSignalHandlers();
  auto spec = spec::LoadJobSpecFile(absl::GetFlag(FLAGS_spec), {});
  if (!spec.ok()) return Fail(2, std::string(spec.status().message()));
  auto token = ReadSecretFile(absl::GetFlag(FLAGS_membership_token_file));
  if (!token.ok()) return Fail(2, std::string(token.status().message()));
  client::CoordinatorClientOptions co;
  co.address = absl::GetFlag(FLAGS_coordinator);
  co.token = std::string(absl::StripAsciiWhitespace(*token));
  if (absl::Status s = client::ReadTlsFiles({absl::GetFlag(FLAGS_tls_ca),
                                             absl::GetFlag(FLAGS_tls_client_cert),
                                             absl::GetFlag(FLAGS_tls_client_key)},
                                            &co);
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  auto client = ringmaster::client::GrpcCoordinatorClient::Create(co);
  if (!client.ok()) return Fail(2, std::string(client.status().message()));

  if (spec->has_command()) return CommandMain(*std::move(spec), client->get());

  worker::ElasticTrainerOptions eo;
  eo.client = client->get();
  eo.job = absl::GetFlag(FLAGS_job);
  eo.slot.set_node(absl::GetFlag(FLAGS_node));
  eo.slot.set_slot(absl::GetFlag(FLAGS_slot));
  eo.first_epoch = absl::GetFlag(FLAGS_epoch);
  eo.spec = *std::move(spec);
  eo.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  eo.local_ranks = std::max(1, absl::GetFlag(FLAGS_local_ranks));
  eo.op_timeout = absl::Seconds(absl::GetFlag(FLAGS_op_timeout_s));
  eo.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  eo.progress = PrintProgress;
  eo.leave_requested = &g_drain;
  // Rank 0's result is on disk before the coordinator can call the job succeeded, so whoever
  // watches the job (ringctl local) finds it.
  eo.before_finished = [](const worker::ElasticResult& r) -> absl::Status {
    if (r.last_rank != 0 || absl::GetFlag(FLAGS_summary).empty()) return absl::OkStatus();
    return WriteFileAtomically(absl::GetFlag(FLAGS_summary), train::TrainResultJson(r.last));
  };
  auto result = worker::RunElasticTrainer(eo);
  if (!result.ok()) return Fail(1, result.status());
  if (result->left) {
    printf("ringtrainer %s/%d: left job %s after the drain save\n", eo.slot.node().c_str(),
           eo.slot.slot(), eo.job.c_str());
  }
  return 0;
}

int Main() {
  if (!absl::GetFlag(FLAGS_coordinator).empty()) return ElasticMain();
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world_size);
  if (world < 1) return Fail(2, "--world_size must be >= 1");
  if (rank < 0 || rank >= world) {
    return Fail(2, absl::StrCat("--rank ", rank, " is outside [0, ", world, ")"));
  }
  if (absl::GetFlag(FLAGS_spec).empty()) return Fail(2, "--spec is required");
  if (absl::GetFlag(FLAGS_store_dir).empty()) return Fail(2, "--store_dir is required");
  InitTrainerLogging();
  InstallSignalHandlers();

  auto spec = spec::LoadJobSpecFile(absl::GetFlag(FLAGS_spec), {});
  if (!spec.ok()) return Fail(2, std::string(spec.status().message()));
  if (spec->has_command()) {
    return Fail(2, "a job with command runs under a coordinator (ringctl local, or ringworker "
                   "with --coordinator), not with --rank and --world_size");
  }

  auto store = comm::FileStore::Create({absl::GetFlag(FLAGS_store_dir)});
  if (!store.ok()) return Fail(1, store.status());
  comm::TcpCommunicatorOptions co;
  co.rank = rank;
  co.size = world;
  co.store = store->get();
  co.prefix = absl::GetFlag(FLAGS_prefix);
  co.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  auto comm = comm::TcpCommunicator::Create(co);
  if (!comm.ok()) return Fail(1, comm.status());

  auto config = config::TrainConfigFromSpec(*spec);
  if (!config.ok()) return Fail(2, std::string(config.status().message()));

  train::TrainerOptions to;
  to.config = *std::move(config);
  to.comm = comm->get();
  to.local_ranks = absl::GetFlag(FLAGS_local_ranks) > 0 ? absl::GetFlag(FLAGS_local_ranks) : world;
  to.gpu = rank % to.local_ranks;  // every rank is on this machine
  to.nccl_store = store->get();
  to.nccl_prefix = absl::StrCat(absl::GetFlag(FLAGS_prefix), "/nccl");
  to.op_timeout = absl::Seconds(absl::GetFlag(FLAGS_op_timeout_s));
  to.progress = PrintProgress;
  to.drain_requested = &g_drain;
  to.save_requested = &g_save;
  to.stop_at_step = absl::GetFlag(FLAGS_stop_at_step);
  auto result = train::RunTraining(to);
  if (!result.ok()) {
    (*comm)->Abort();  // peers stop at once instead of at their deadline
    return Fail(1, result.status());
  }
  if (rank == 0 && !absl::GetFlag(FLAGS_summary).empty()) {
    absl::Status s =
        WriteFileAtomically(absl::GetFlag(FLAGS_summary), train::TrainResultJson(*result));
    if (!s.ok()) return Fail(1, s);
  }
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  // First, before flags and threads: may re-execute the trainer with OpenBLAS kernels this
  // CPU runs when the library did not recognise it (kernels/matmul.h).
  ringmaster::train::UseBestCpuKernels(argv);
  absl::SetProgramUsageMessage("one rank of a ringmaster training job (started by ringctl)");
  ringmaster::ParseFlagsWithUsage(argc, argv, "ringtrainer");
  // Memory that runs out on a background thread: a named line and kExitCodePermanent, which
  // the coordinator takes as an error no restart fixes (the training thread's own failures
  // are reported as statuses).
  static const std::string who =
      absl::GetFlag(FLAGS_coordinator).empty()
          ? absl::StrCat("ringtrainer rank ", absl::GetFlag(FLAGS_rank))
          : absl::StrCat("ringtrainer ", absl::GetFlag(FLAGS_node), "/", absl::GetFlag(FLAGS_slot));
  ringmaster::InstallOutOfMemoryExit(who.c_str());
  return ringmaster::Main();
}
