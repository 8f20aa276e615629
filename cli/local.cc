#include "cli/local.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/local_checks.h"
#include "cli/resources.h"
#include "cli/run_name.h"
#include "common/plural.h"
#include "common/env.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "google/protobuf/descriptor.h"
#include "spec/job_spec.h"
#include "train/device.h"
#include "client/grpc_coordinator_client.h"

namespace ringmaster::cli {
namespace {

volatile sig_atomic_t g_cancel = 0;
void OnSignal(int) { g_cancel = 1; }

int Usage(const std::string& problem) {
  fprintf(stderr, "ringctl local: %s\nRun `ringctl local --help` for the usage.\n",
          problem.c_str());
  return 2;
}

// `name` from `package`: next to ringctl (a release bundle), in bazel-bin, or in ringctl's
// runfiles.
std::string FindBinary(const std::string& package, const std::string& name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.find_last_of('/'));
  for (const std::string& c :
       {absl::StrCat(dir, "/", name), absl::StrCat(dir, "/../", package, "/", name),
        absl::StrCat(dir, "/ringctl.runfiles/ringmaster/", package, "/", name)}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

// Starts `args` in a process group of its own (so that Ctrl-C reaches only ringctl, which
// decides), with stdout to `out_fd` and stderr to `err_fd`.
pid_t Spawn(const std::vector<std::string>& args, int out_fd, int err_fd) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `timeout` for `pid`; SIGKILLs it after. Returns its wait status.
int Reap(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return status;
}

// Follows trainers' log files and prints the lines that are not glog's (the progress lines
// and errors rank 0 writes on stdout).
class LogFollower {
 public:
  void Print(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    int64_t& offset = offsets_[path];
    in.seekg(offset);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t last = chunk.rfind('\n');
    if (last == std::string::npos) return;
    offset += static_cast<int64_t>(last + 1);
    for (absl::string_view line : absl::StrSplit(chunk.substr(0, last), '\n')) {
      if (IsGlog(line) || absl::StartsWith(line, "WARNING: Logging before")) continue;
      printf("%.*s\n", static_cast<int>(line.size()), line.data());
    }
    fflush(stdout);
  }
  // Skips what the file holds now (a new rank 0's earlier lines were printed by another).
  void SkipTo(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) offsets_[path] = st.st_size;
  }

 private:
  static bool IsGlog(absl::string_view line) {
    return line.size() > 9 && (line[0] == 'I' || line[0] == 'W' || line[0] == 'E' ||
                               line[0] == 'F') &&
           absl::ascii_isdigit(line[1]) && absl::ascii_isdigit(line[8]);
  }
  std::map<std::string, int64_t> offsets_;
};

// The job spec of the run: the file, or for `-- PROGRAM ARGS...` a command job; --set,
// defaults and validation apply to either.
absl::StatusOr<JobSpec> LoadLocalSpec(const LocalOptions& options) {
  if (options.command.empty()) return spec::LoadJobSpecFile(options.spec_file, options.overrides);
  return CommandJobSpec(options.command, options.overrides);
}

}  // namespace

std::string CommandJobName(const std::vector<std::string>& argv) {
  std::string script = argv.empty() ? "" : argv[0];
  bool module = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (argv[i] == "-m") {
      module = true;
      continue;
    }
    if (argv[i] == "-c") break;  // code, not a script: the program names the job
    if (!argv[i].empty() && argv[i][0] != '-') {
      script = argv[i];
      break;
    }
    module = false;
  }
  std::string name = script.substr(script.find_last_of('/') + 1);
  if (!module) name = name.substr(0, name.find_last_of('.') == 0 ? name.size()
                                                                  : name.find_last_of('.'));
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (name.empty() || name == "." || name == "..") return "command";
  return name.substr(0, 64);
}

absl::StatusOr<JobSpec> CommandJobSpec(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& overrides) {
  JobSpec spec;
  spec.set_name(CommandJobName(argv));
  spec.mutable_command()->mutable_argv()->Assign(argv.begin(), argv.end());
  return spec::LoadJobSpecText(spec::JobSpecToYaml(spec), overrides);
}

namespace {

using CoordinatorClient = std::unique_ptr<client::GrpcCoordinatorClient>;

// What one `ringctl local` run holds between its parts.
struct LocalRun {
  JobSpec spec;
  std::string metrics_file;  // NameRun's: empty without metrics
  std::string ringmaster, ringworker, trainer;
  std::string run_dir;
  bool temporary = false;        // a run directory ringctl made, not --run_dir
  bool own_checkpoints = false;  // checkpoints in the run directory (no checkpoint.dir)
  pid_t master = -1, agent = -1;
  std::string address;  // the coordinator's
  double grace = 0;     // the agent's --drain_grace_s
};

// How following the job ended.
struct FollowedJob {
  Job job;
  bool cancelling = false;  // Ctrl-C (or SIGTERM) reached ringctl
  bool agent_gone = false;  // the agent exited (and was reaped)
};

// The spec of the run, checked against this machine's --workers, and the binaries that run
// it. Returns the exit code when the run cannot start.
std::optional<int> ResolveSpec(const LocalOptions& options, LocalRun* run) {
  const int workers = options.workers;
  if (workers < 1 || workers > 256) {
    return Usage(absl::StrCat("--workers: ", workers, " is not a number of workers in [1, 256]"));
  }
  auto spec = LoadLocalSpec(options);
  if (!spec.ok()) {
    fprintf(stderr, "ringctl: the job spec is not valid:\n%s\n",
            std::string(spec.status().message()).c_str());
    return 2;
  }
  // The coordinator places ranks within the node's memory (the agent reports it).
  FillMemoryEstimate(&*spec);
  char cwd[4096] = "";
  const absl::StatusOr<std::string> metrics_file =
      NameRun(&*spec, absl::Now(), getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "");
  if (!metrics_file.ok()) return Usage(std::string(metrics_file.status().message()));
  // A command job's relative paths are the user's: it runs where ringctl was run.
  if (spec->has_command() && spec->command().workdir().empty() && cwd[0] != '\0') {
    spec->mutable_command()->set_workdir(cwd);
  }
  // This machine's N workers are the job's slots: elastic between min_ranks and N.
  ElasticSpec* elastic = spec->mutable_elastic();
  if (elastic->max_ranks() == 0 || elastic->max_ranks() > workers) elastic->set_max_ranks(workers);
  if (elastic->min_ranks() > workers) {
    return Usage(absl::StrCat("elastic.min_ranks is ", elastic->min_ranks(), " but --workers is ",
                              workers));
  }
  LocalChecks checks;
  checks.workers = workers;
  checks.summary = options.summary;
  if (spec->device() == JobSpec::DEVICE_CUDA) checks.cuda_devices = train::CudaDeviceCount();
  if (absl::Status s = CheckLocalRun(*spec, checks); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  run->ringmaster = FindBinary("coordinator", "ringmaster");
  run->ringworker = FindBinary("worker", "ringworker");
  run->trainer = FindBinary("worker", "ringtrainer");
  if (run->ringmaster.empty() || run->ringworker.empty() || run->trainer.empty()) {
    fprintf(stderr,
            "ringctl: cannot find ringmaster, ringworker and ringtrainer next to ringctl; build "
            "them: bazel build //cli:ringctl\n");
    return 1;
  }
  run->spec = *std::move(spec);
  run->metrics_file = *metrics_file;
  return std::nullopt;
}

// Makes the run directory (--run_dir, or a temporary one), writes the effective spec into it
// and says where things are. Returns the exit code when it cannot.
std::optional<int> PrepareRunDir(const LocalOptions& options, LocalRun* run) {
  JobSpec* spec = &run->spec;
  std::string run_dir = options.run_dir;
  run->temporary = run_dir.empty();
  if (run->temporary) {
    std::string tmpl = absl::StrCat(options.temp_dir, "/ringctl-local-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      fprintf(stderr, "ringctl: cannot create a run directory in %s: %s\n",
              options.temp_dir.c_str(), strerror(errno));
      return 1;
    }
    run_dir = tmpl;
  } else if (mkdir(run_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "ringctl: --run_dir %s: %s\n", run_dir.c_str(), strerror(errno));
    return 1;
  }
  run->run_dir = run_dir;
  // Recovering from a lost trainer needs a checkpoint: without checkpoint.dir the job gets
  // one in the run directory, every 100 steps.
  std::string checkpoint_note;
  run->own_checkpoints = spec->checkpoint().dir().empty();
  if (run->own_checkpoints) {
    spec->mutable_checkpoint()->set_dir(run_dir + "/checkpoints");
    // (A command job's program checkpoints by itself, to RINGMASTER_CHECKPOINT_DIR.)
    if (spec->checkpoint().every_steps() == 0 && spec->checkpoint().every_seconds() == 0 &&
        !spec->has_command()) {
      spec->mutable_checkpoint()->set_every_steps(100);
    }
    checkpoint_note = absl::StrCat("; checkpoints in ", run_dir, "/checkpoints (no checkpoint.dir given)");
  }
  if (absl::Status s = WriteFileAtomically(run_dir + "/job.yaml", spec::JobSpecToYaml(*spec));
      !s.ok()) {
    fprintf(stderr, "ringctl: %s\n", s.ToString().c_str());
    return 1;
  }
  unlink((run_dir + "/ringmaster.db").c_str());
  unlink((run_dir + "/ringmaster.db-wal").c_str());
  printf("ringctl local: job %s on %s (a coordinator and one agent on this machine)%s; "
         "run directory %s (effective spec, logs%s)%s\n",
         spec->name().c_str(), Plural(options.workers, "worker").c_str(),
         options.rank_memory_limit_mib > 0
             ? absl::StrCat(", each rank limited to ", options.rank_memory_limit_mib,
                            " MiB of memory (RLIMIT_DATA)")
                   .c_str()
             : "",
         run_dir.c_str(),
         run->temporary && !options.keep_run_dir ? "; removed at the end, --keep_run_dir keeps it"
                                                 : "",
         checkpoint_note.c_str());
  if (!run->metrics_file.empty()) {
    printf("ringctl local: metrics of run %s in %s\n", spec->metrics().run().c_str(),
           run->metrics_file.c_str());
  }
  fflush(stdout);
  return std::nullopt;
}

// Ctrl-C and SIGTERM reach ringctl (g_cancel), which decides: it cancels the job.
void InstallSignalHandlers() {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Starts the coordinator, on a free loopback port that it prints on stdout, and says where it
// is. Returns the exit code when it did not start.
std::optional<int> StartCoordinator(const LocalOptions& options, LocalRun* run) {
  const std::string& run_dir = run->run_dir;
  int port_pipe[2];
  if (pipe2(port_pipe, O_CLOEXEC) != 0) return 1;
  const int master_log =
      open((run_dir + "/ringmaster.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::vector<std::string> master_args = {run->ringmaster, "--listen=127.0.0.1:0",
                                          "--db=" + run_dir + "/ringmaster.db",
                                          "--heartbeat_s=0.5", "--lease_s=3",
                                          "--slot_backoff_s=2", "--grow_after_s=2"};
  // With a metrics port, ringmaster prints its URL on a second line.
  const size_t lines = options.metrics_listen.empty() ? 1 : 2;
  if (lines == 2) master_args.push_back("--metrics_listen=" + options.metrics_listen);
  run->master = Spawn(master_args, port_pipe[1], master_log);
  close(port_pipe[1]);
  std::string first_line;
  const absl::Time started = absl::Now();
  while (static_cast<size_t>(std::count(first_line.begin(), first_line.end(), '\n')) < lines &&
         absl::Now() - started < absl::Seconds(20)) {
    pollfd p{port_pipe[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[256];
      const ssize_t n = read(port_pipe[0], buf, sizeof(buf));
      if (n <= 0) break;
      first_line.append(buf, n);
    }
  }
  int port = 0;
  const size_t at = first_line.find("(port ");
  if (at == std::string::npos ||
      !absl::SimpleAtoi(first_line.substr(at + 6, first_line.find(')', at) - at - 6), &port)) {
    fprintf(stderr, "ringctl: the coordinator did not start (see %s/ringmaster.log)\n",
            run_dir.c_str());
    kill(run->master, SIGKILL);
    Reap(run->master, absl::Seconds(1));
    return 1;
  }
  const std::string& name = run->spec.name();
  run->address = absl::StrCat("127.0.0.1:", port);
  printf("ringctl local: coordinator at %s (ringctl top %s --coordinator %s)\n",
         run->address.c_str(), name.c_str(), run->address.c_str());
  if (const size_t url = first_line.find("metrics on "); url != std::string::npos) {
    const std::string metrics = first_line.substr(url + 11, first_line.find('\n', url) - url - 11);
    printf("ringctl local: metrics at %s\n", metrics.c_str());
    // The dashboard is served on the same port (coordinator/dashboard.h).
    if (absl::EndsWith(metrics, "/metrics")) {
      printf("ringctl local: dashboard at %s/jobs/%s\n",
             metrics.substr(0, metrics.size() - 8).c_str(), name.c_str());
    }
  }
  fflush(stdout);
  return std::nullopt;
}

// Starts one agent with --workers slots, against the coordinator.
void StartAgent(const LocalOptions& options, LocalRun* run) {
  const int workers = options.workers;
  const JobSpec& spec = run->spec;
  const int agent_log = open((run->run_dir + "/ringworker.log").c_str(),
                             O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  // A command job's program gets command.stop_grace_s between SIGTERM and SIGKILL.
  run->grace =
      std::max(spec.checkpoint().drain_grace_seconds(), spec.command().stop_grace_s()) + 10;
  std::vector<std::string> agent_args = {
      run->ringworker, "--coordinator=" + run->address, "--node=local",
      absl::StrCat("--slots=", workers), "--work_dir=" + run->run_dir + "/node",
      "--trainer=" + run->trainer, absl::StrCat("--drain_grace_s=", run->grace)};
  if (options.rank_memory_limit_mib > 0) {
    agent_args.push_back(
        absl::StrCat("--trainer_memory_limit_mib=", options.rank_memory_limit_mib));
    // The limit counts OpenBLAS's workspace, 128 MiB per thread of its pool, which it maps
    // when it loads, for as many threads as there are cores: only as many as a rank uses
    // (the trainer's default, cores / ranks on the node), unless the user chose.
    if (getenv("OPENBLAS_NUM_THREADS") == nullptr) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      setenv("OPENBLAS_NUM_THREADS", absl::StrCat(std::max(1, cores / workers)).c_str(), 1);
    }
  }
  run->agent = Spawn(agent_args, agent_log, agent_log);
}

// Stops the agent (the second SIGTERM kills the trainers), then the coordinator.
void StopAgentAndCoordinator(const LocalRun& run, bool agent_gone) {
  if (!agent_gone) {
    kill(run.agent, SIGTERM);
    kill(run.agent, SIGTERM);  // the second SIGTERM: kill the trainers and leave
    Reap(run.agent, absl::Seconds(10));
  }
  kill(run.master, SIGTERM);
  Reap(run.master, absl::Seconds(5));
}

// Submits the job once the agent has registered. On a refusal stops everything and returns
// the exit code (2 for an invalid job); sets `*client` and `*submitted` otherwise.
std::optional<int> SubmitJob(const LocalOptions& options, const LocalRun& run,
                             absl::StatusOr<CoordinatorClient>* coordinator, Job* submitted) {
  client::CoordinatorClientOptions co;
  co.address = run.address;
  *coordinator = ringmaster::client::GrpcCoordinatorClient::Create(co);
  // The agent registers first (with its memory), so that the coordinator judges the job
  // against this machine: one it cannot hold is refused, not left pending for ever.
  if (coordinator->ok()) {
    for (const absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
      auto nodes = (**coordinator)->ListNodes();
      if (nodes.ok() && nodes->nodes_size() > 0) break;
      if (waitpid(run.agent, nullptr, WNOHANG) == run.agent) break;  // said why in its log
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  absl::StatusOr<Job> job =
      coordinator->ok() ? (**coordinator)->Submit(run.spec) : coordinator->status();
  if (!job.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(job.status().message()).c_str());
    StopAgentAndCoordinator(run, /*agent_gone=*/false);
    // Refused, nothing ran: a temporary run directory holds nothing worth keeping.
    if (absl::IsInvalidArgument(job.status()) && run.temporary && !options.keep_run_dir) {
      (void)DeleteRecursively(Env::Default(), run.run_dir);
    }
    return absl::IsInvalidArgument(job.status()) ? 2 : 1;
  }
  *submitted = *std::move(job);
  return std::nullopt;
}

// Follows the job: prints rank 0's lines until it ends, the agent exits, or a Ctrl-C's
// cancellation is done (the trainers drain first).
FollowedJob FollowJob(const LocalRun& run, client::GrpcCoordinatorClient& client,
                      const Job& submitted) {
  const JobSpec& spec = run.spec;
  const std::string job_dir = absl::StrCat(run.run_dir, "/node/", spec.name());
  LogFollower follower;
  std::string rank0_log;
  FollowedJob followed;
  followed.job = submitted;
  Job& job = followed.job;
  bool& cancelling = followed.cancelling;
  bool& agent_gone = followed.agent_gone;
  absl::Time cancel_deadline = absl::InfiniteFuture();
  while (true) {
    auto got = client.Get(spec.name());
    if (got.ok()) job = *got;
    for (const Member& m : job.members()) {
      if (m.rank() != 0) continue;
      const std::string log = absl::StrCat(job_dir, "/slot-", m.slot().slot(), ".log");
      if (log != rank0_log) {
        if (!rank0_log.empty()) {
          follower.Print(rank0_log);
          follower.SkipTo(log);
        }
        rank0_log = log;
      }
    }
    if (!rank0_log.empty()) follower.Print(rank0_log);
    const ringmaster::JobPhase phase = job.phase();
    if (phase == JOB_PHASE_SUCCEEDED || phase == JOB_PHASE_FAILED ||
        phase == JOB_PHASE_CANCELLED) {
      break;
    }
    if (g_cancel && !cancelling) {
      cancelling = true;
      fprintf(stderr, "ringctl: cancelling the job (the trainers drain, saving a checkpoint "
              "within %g s)\n", spec.checkpoint().drain_grace_seconds());
      kill(run.agent, SIGTERM);  // drain the node: the trainers save and leave
      cancel_deadline = absl::Now() + absl::Seconds(run.grace + 5);
    }
    if (!agent_gone && waitpid(run.agent, nullptr, WNOHANG) == run.agent) agent_gone = true;
    if (cancelling && (agent_gone || absl::Now() > cancel_deadline)) {
      if (!rank0_log.empty()) follower.Print(rank0_log);
      // The job's own word: one whose last step was done before the Ctrl-C has succeeded
      // (the coordinator says so, and refuses to cancel it).
      auto cancelled = client.Cancel(spec.name());
      if (cancelled.ok()) {
        job = *cancelled;
      } else if (auto got = client.Get(spec.name()); got.ok()) {
        job = *got;
      }
      break;
    }
    if (agent_gone && !cancelling) {
      fprintf(stderr, "ringctl: the agent exited unexpectedly (see %s/ringworker.log)\n",
              run.run_dir.c_str());
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!rank0_log.empty()) follower.Print(rank0_log);
  return followed;
}

// Rank 0's summary.json in `job_dir`, when there is one and it reads.
std::optional<train::TrainResult> ReadTrainResult(const std::string& job_dir) {
  std::optional<train::TrainResult> result;
  const std::string path = job_dir + "/summary.json";
  if (auto read = ReadFile(path); read.ok()) {
    result.emplace();
    if (absl::Status s = FromJson(*read, &*result, path); !s.ok()) {
      fprintf(stderr, "ringctl: the trainer's summary: %s\n", std::string(s.message()).c_str());
      result.reset();
    }
  }
  return result;
}

// The run directory: a temporary one goes, unless asked to keep it or the job failed (its
// logs say why). Sets outcome->run_dir_kept; returns what to say about it.
std::string FinishRunDir(const LocalOptions& options, const LocalRun& run,
                         LocalOutcome* outcome) {
  const std::string& run_dir = run.run_dir;
  outcome->run_dir_kept = !run.temporary || options.keep_run_dir || outcome->status == "failed";
  std::string run_dir_note;
  if (!outcome->run_dir_kept) {
    if (absl::Status s = DeleteRecursively(Env::Default(), run_dir); s.ok()) {
      run_dir_note = absl::StrCat("removed the run directory ", run_dir,
                                  " (--keep_run_dir keeps it)");
    } else {
      outcome->run_dir_kept = true;
      run_dir_note = absl::StrCat("could not remove the run directory ", run_dir, ": ",
                                  s.ToString());
    }
  } else {
    run_dir_note = absl::StrCat(
        "kept the run directory ", run_dir, " (spec, logs",
        run.own_checkpoints ? ", checkpoints" : "", ")",
        run.temporary && !options.keep_run_dir ? ": the job failed, its logs say why" : "");
  }
  if (!run.own_checkpoints) {
    absl::StrAppend(&run_dir_note, "; checkpoints in ", run.spec.checkpoint().dir(), "/",
                    run.spec.name());
  }
  return run_dir_note;
}

// The line of a succeeded training job (and, for tp or pp, the ranks' table).
void PrintTrainingSuccess(const LocalSummary& summary, const JobSpec& spec, const Job& job,
                          const train::TrainResult* result) {
  // Numbers as a person reads them; "none" for what the trainer did not tell.
  auto number = [](bool has, double v, const absl::FormatSpec<double>& format) -> std::string {
    return has ? absl::StrFormat(format, v) : std::string("none");
  };
  const std::string evaluation = EvaluationText(summary, spec);
  // The throughput is the training steps' (TrainResult.training_seconds); evaluations
  // are timed apart.
  const std::string timing =
      summary.has_training_seconds()
          ? absl::StrFormat("; %.1f s training, %.1f s in %s%s",
                            summary.training_seconds(), summary.eval_seconds(),
                            Plural(summary.evaluations(), "evaluation"),
                            spec.data().final_eval() ? "" : " (data.final_eval: false)")
          : std::string();
  printf("ringctl local: succeeded: %s steps, final loss %s, %s, %s samples/s on %s%s%s\n",
         number(summary.has_steps(), summary.steps(), "%.0f").c_str(),
         number(summary.has_final_loss(), summary.final_loss(), "%.6g").c_str(),
         evaluation.c_str(),
         number(summary.has_samples_per_second(), summary.samples_per_second(), "%.0f").c_str(),
         summary.has_world_size() ? Plural(summary.world_size(), "worker").c_str()
                                  : "an unknown number of workers",
         job.recoveries_size() > 0
             ? absl::StrCat(" (", Plural(job.recoveries_size(), "recovery", "recoveries"), ")")
                   .c_str()
             : "",
         timing.c_str());
  const ParallelismSpec& parallelism = spec.parallelism();
  if (result != nullptr && (parallelism.mesh().tp() > 1 || parallelism.mesh().pp() > 1)) {
    printf("%s", RanksTable(*result).c_str());
  }
}

// Writes --summary, says how the job ended and what became of the run directory. Returns
// the exit code: 0 succeeded, 130 cancelled, 1 failed.
int ReportOutcome(const LocalOptions& options, const LocalRun& run, const FollowedJob& followed) {
  const JobSpec& spec = run.spec;
  const Job& job = followed.job;
  const int workers = options.workers;
  // Cancelled here (Ctrl-C) or by `ringctl cancel` on its coordinator; a job whose last
  // step was done before the Ctrl-C has succeeded.
  const std::string status = job.phase() == JOB_PHASE_SUCCEEDED ? "succeeded"
                             : followed.cancelling || job.phase() == JOB_PHASE_CANCELLED
                                 ? "cancelled"
                                 : "failed";
  std::optional<train::TrainResult> result;  // rank 0's summary, when there is one
  if (status == "succeeded") {
    result = ReadTrainResult(absl::StrCat(run.run_dir, "/node/", spec.name()));
  }
  LocalOutcome outcome;
  outcome.status = status;
  outcome.workers = workers;
  outcome.job = job;
  outcome.run_dir = run.run_dir;
  const std::string run_dir_note = FinishRunDir(options, run, &outcome);

  const LocalSummary summary = MakeLocalSummary(outcome, result ? &*result : nullptr);
  if (!options.summary.empty()) {
    absl::Status s = WriteFileAtomically(options.summary, ToJsonLine(summary) + "\n");
    if (!s.ok()) fprintf(stderr, "ringctl: --summary: %s\n", s.ToString().c_str());
  }
  printf("ringctl local: %s\n", run_dir_note.c_str());
  if (status == "succeeded" && spec.has_command()) {
    printf("ringctl local: succeeded: %s (%s) on %s%s\n", spec.command().argv(0).c_str(),
           job.reason().empty() ? "every rank exited 0" : job.reason().c_str(),
           Plural(workers, "worker").c_str(),
           job.recoveries_size() > 0
               ? absl::StrCat(" (", Plural(job.recoveries_size(), "recovery", "recoveries"), ")")
                     .c_str()
               : "");
    return 0;
  }
  if (status == "succeeded") {
    PrintTrainingSuccess(summary, spec, job, result ? &*result : nullptr);
    return 0;
  }
  fprintf(stderr, "ringctl local: %s%s%s%s\n", status.c_str(), job.reason().empty() ? "" : ": ",
          job.reason().c_str(),
          outcome.run_dir_kept ? absl::StrCat(" (logs in ", run.run_dir, ")").c_str() : "");
  return status == "cancelled" ? 130 : 1;
}

}  // namespace

int LocalCommand(const LocalOptions& options) {
  LocalRun run;
  if (std::optional<int> code = ResolveSpec(options, &run)) return *code;
  if (std::optional<int> code = PrepareRunDir(options, &run)) return *code;
  InstallSignalHandlers();
  if (std::optional<int> code = StartCoordinator(options, &run)) return *code;
  StartAgent(options, &run);
  absl::StatusOr<CoordinatorClient> client = absl::UnknownError("not created");
  Job submitted;
  if (std::optional<int> code = SubmitJob(options, run, &client, &submitted)) return *code;
  const FollowedJob followed = FollowJob(run, **client, submitted);
  StopAgentAndCoordinator(run, followed.agent_gone);
  return ReportOutcome(options, run, followed);
}

std::string EvaluationText(const LocalSummary& summary, const JobSpec& spec) {
  // A language model's evaluation is its perplexity; a classifier's its accuracy.
  if (summary.has_eval_perplexity()) {
    return absl::StrFormat("validation perplexity %.4g (loss %.4f)", summary.eval_perplexity(),
                           summary.eval_loss());
  }
  if (spec.model().has_gpt() || spec.model().has_gpt2()) {
    return spec.data().has_tokens() && !spec.data().tokens().validation().empty()
               ? "no validation perplexity (no evaluation ran)"
               : "no validation (a language model is validated on data.tokens.validation)";
  }
  if (summary.has_eval_accuracy()) {
    return absl::StrFormat("test accuracy %.4f", summary.eval_accuracy());
  }
  return "no test accuracy (not evaluated)";
}

std::string RanksTable(const train::TrainResult& result) {
  if (result.ranks().empty()) return "";
  constexpr double kMiB = 1 << 20;
  std::string out =
      absl::StrFormat("%4s %3s %3s %3s | %10s %10s %10s %10s %9s | %9s %9s %9s | %7s\n", "rank",
                      "pp", "dp", "tp", "params MiB", "grads MiB", "optim MiB", "activ MiB",
                      "RSS MiB", "sent pp", "tp", "other", "bubble");
  for (const train::RankResult& r : result.ranks()) {
    // Bytes of the whole less the two groups' (per-step means: clamped at 0 against rounding).
    const double other = std::max(0.0, r.comm_bytes_per_step() - r.pipeline_bytes_per_step() -
                                           r.tensor_parallel_bytes_per_step());
    absl::StrAppendFormat(&out,
                          "%4d %3d %3d %3d | %10.2f %10.2f %10.2f %10.2f %9.1f | %9.3f %9.3f "
                          "%9.3f | %6.1f%%\n",
                          r.rank(), r.pp_rank(), r.dp_rank(), r.tp_rank(),
                          r.parameter_bytes() / kMiB, r.gradient_bytes() / kMiB,
                          r.optimizer_state_bytes() / kMiB, r.activation_bytes_peak() / kMiB,
                          r.peak_rss_bytes() / kMiB, r.pipeline_bytes_per_step() / kMiB,
                          r.tensor_parallel_bytes_per_step() / kMiB, other / kMiB,
                          100 * r.pipeline_bubble());
  }
  absl::StrAppend(&out,
                  "(sent: MiB a step through the rank's pipeline group, its tensor-parallel "
                  "group, and the rest: the data-parallel reduction and the small sums)\n");
  return out;
}

LocalSummary MakeLocalSummary(const LocalOutcome& outcome, const train::TrainResult* trainer) {
  LocalSummary summary;
  summary.set_status(outcome.status);
  summary.set_workers(outcome.workers);
  if (trainer != nullptr) {
    // The fields both messages have, by name: what the trainer told and the summary shows.
    using google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* from = trainer->GetReflection();
    const google::protobuf::Reflection* to = summary.GetReflection();
    for (int i = 0; i < summary.GetDescriptor()->field_count(); ++i) {
      const FieldDescriptor* f = summary.GetDescriptor()->field(i);
      const FieldDescriptor* g = trainer->GetDescriptor()->FindFieldByName(f->name());
      if (g == nullptr || g->cpp_type() != f->cpp_type() || g->is_repeated() ||
          (g->has_presence() && !from->HasField(*trainer, g))) {
        continue;
      }
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          to->SetInt32(&summary, f, from->GetInt32(*trainer, g));
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          to->SetDouble(&summary, f, from->GetDouble(*trainer, g));
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          to->SetBool(&summary, f, from->GetBool(*trainer, g));
          break;
        default:
          break;
      }
    }
  }
  const Job& job = outcome.job;
  summary.set_rendezvous_count(static_cast<int32_t>(job.epoch()));
  summary.set_restarts(static_cast<int32_t>(job.restarts()));
  for (const Recovery& r : job.recoveries()) {
    LocalRecovery* item = summary.add_recoveries();
    item->set_epoch(static_cast<int32_t>(r.epoch()));
    item->set_cause(r.cause());
    item->set_reason(r.reason());
    item->set_old_world(r.old_world());
    item->set_new_world(r.new_world());
    item->set_rendezvous_seconds(r.rendezvous_s());
    item->set_restore_seconds(r.restore_s());
    item->set_first_step_seconds(r.first_step_s());
    item->set_lost_steps(static_cast<int32_t>(r.lost_steps()));
  }
  if (outcome.status != "succeeded" && !job.reason().empty()) summary.set_error(job.reason());
  summary.set_run_dir(outcome.run_dir);
  summary.set_run_dir_kept(outcome.run_dir_kept);
  return summary;
}

}  // namespace ringmaster::cli
