// ringctl: the user's command line.
//
//   ringctl local --workers N JOB.yaml [--set key=value ...] [--summary FILE] [--run_dir DIR]
//       Runs the job on this machine with N trainer processes (file Store), prints rank 0's
//       progress, and exits with the job's status: 0 succeeded, 1 failed, 2 bad usage or
//       spec, 130 cancelled (Ctrl-C / SIGTERM).
//   ringctl submit|list|status|cancel|top|checkpoints ...
//       Talk to a coordinator (cli/jobs.h).
//   ringctl estimate memory --params 7B --world 8 [--zero 0..3] [--precision mixed|fp32]
//       [--optimizer adam|sgd]
//       Prints per-rank memory by the ZeRO formula.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/inspect.h"
#include "cli/jobs.h"
#include "checkpoint/manifest.h"
#include "common/env.h"
#include "common/file_util.h"
#include "spec/job_spec.h"
#include "train/memory_estimate.h"

namespace ringmaster::cli {
using train::DescribeEstimate;
using train::EstimateMemory;
using train::MemoryEstimateOptions;
using train::ParseParameterCount;
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  ringctl local --workers N JOB.yaml [--set key=value ...] [--summary FILE]"
    " [--run_dir DIR]\n"
    "  ringctl estimate memory --params 7B --world 8 [--zero 0|1|2|3]"
    " [--precision mixed|fp32] [--optimizer adam|sgd]\n"
    "  ringctl checkpoint list JOB_DIR       (checkpoint.dir/<job name>)\n"
    "  ringctl checkpoint inspect STEP_DIR   (JOB_DIR/step-<N>)\n"
    "  ringctl checkpoint verify STEP_DIR    (reads every byte, checks every checksum)\n";

int Usage(const std::string& problem) {
  fprintf(stderr, "ringctl: %s\n%s%s", problem.c_str(), kUsage, kJobsUsage);
  return 2;
}

// Splits "--flag=value" / "--flag value" argument lists. Returns false (with `error`) when
// a flag that takes a value has none.
struct Args {
  std::multimap<std::string, std::string> flags;
  std::vector<std::string> positional;
};

bool ParseArgs(int argc, char** argv, int first, Args* args, std::string* error) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (!absl::StartsWith(a, "--")) {
      args->positional.push_back(a);
      continue;
    }
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      args->flags.emplace(a.substr(0, eq), a.substr(eq + 1));
    } else if (i + 1 < argc) {
      args->flags.emplace(a, argv[++i]);
    } else {
      *error = absl::StrCat(a, " needs a value");
      return false;
    }
  }
  return true;
}

std::string Flag(const Args& args, const std::string& name, const std::string& fallback) {
  auto it = args.flags.find(name);
  return it == args.flags.end() ? fallback : it->second;
}

// Where ringtrainer is: next to ringctl (release bundle) or in bazel-bin/worker.
std::string FindTrainer() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.find_last_of('/'));
  for (const std::string& c : {dir + "/ringtrainer", dir + "/../worker/ringtrainer",
                               dir + "/ringctl.runfiles/ringmaster/worker/ringtrainer"}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

volatile sig_atomic_t g_cancel = 0;
void OnSignal(int) { g_cancel = 1; }

// Minimal JSON field reader for the trainer's flat summary object.
std::string JsonField(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\":");
  size_t p = json.find(k);
  if (p == std::string::npos) return "null";
  p += k.size();
  size_t e = json.find_first_of(",}", p);
  return json.substr(p, e - p);
}

int Local(int argc, char** argv) {
  Args args;
  std::string error;
  if (!ParseArgs(argc, argv, 2, &args, &error)) return Usage(error);
  for (const auto& [flag, value] : args.flags) {
    if (flag != "--workers" && flag != "--set" && flag != "--summary" && flag != "--run_dir") {
      return Usage(absl::StrCat("local: unknown flag ", flag));
    }
  }
  if (args.positional.size() != 1) {
    return Usage("local: give exactly one job spec file (JOB.yaml)");
  }
  int workers = 0;
  if (!absl::SimpleAtoi(Flag(args, "--workers", "1"), &workers) || workers < 1 || workers > 256) {
    return Usage(absl::StrCat("--workers: \"", Flag(args, "--workers", ""),
                              "\" is not a number of workers in [1, 256]"));
  }
  std::vector<std::string> overrides;
  for (auto [it, end] = args.flags.equal_range("--set"); it != end; ++it) {
    overrides.push_back(it->second);
  }
  auto spec = spec::LoadJobSpecFile(args.positional[0], overrides);
  if (!spec.ok()) {
    fprintf(stderr, "ringctl: the job spec is not valid:\n%s\n",
            std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string trainer = FindTrainer();
  if (trainer.empty()) {
    fprintf(stderr,
            "ringctl: cannot find the ringtrainer binary next to ringctl; build it: "
            "bazel build //cli:ringctl //worker:ringtrainer\n");
    return 1;
  }

  // The run directory: the effective spec, the store, each rank's log and the result.
  std::string run_dir = Flag(args, "--run_dir", "");
  if (run_dir.empty()) {
    char tmpl[] = "/tmp/ringctl-local-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      fprintf(stderr, "ringctl: cannot create a run directory in /tmp: %s\n", strerror(errno));
      return 1;
    }
    run_dir = tmpl;
  } else if (mkdir(run_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "ringctl: --run_dir %s: %s\n", run_dir.c_str(), strerror(errno));
    return 1;
  }
  const std::string spec_path = run_dir + "/job.yaml";
  const std::string result_path = run_dir + "/result.json";
  absl::Status wrote = WriteFileAtomically(spec_path, spec::JobSpecToYaml(*spec));
  if (!wrote.ok()) {
    fprintf(stderr, "ringctl: %s\n", wrote.ToString().c_str());
    return 1;
  }
  unlink(result_path.c_str());
  printf("ringctl local: job %s on %d workers; run directory %s (effective spec, logs)\n",
         spec->name().c_str(), workers, run_dir.c_str());
  fflush(stdout);

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const std::string prefix = absl::StrCat(spec->name(), "-", getpid());
  std::vector<pid_t> pids(workers, -1);
  for (int r = 0; r < workers; ++r) {
    std::vector<std::string> argv_s = {trainer,
                                       "--spec=" + spec_path,
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--world_size=", workers),
                                       "--store_dir=" + run_dir + "/store",
                                       "--prefix=" + prefix,
                                       absl::StrCat("--local_ranks=", workers),
                                       "--log_dir=" + run_dir};
    if (r == 0) argv_s.push_back("--summary=" + result_path);
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "ringctl: fork: %s\n", strerror(errno));
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGTERM);
      }
      return 1;
    }
    if (pid == 0) {
      // Ranks other than 0 write their stdout/stderr to their log; rank 0's stdout is ours
      // (the progress lines) and its stderr goes to the terminal too.
      if (r != 0) {
        std::string log = absl::StrCat(run_dir, "/rank-", r, ".out");
        int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
          dup2(fd, 1);
          dup2(fd, 2);
          close(fd);
        }
      }
      signal(SIGINT, SIG_IGN);  // ringctl decides; Ctrl-C reaches the whole group
      std::vector<char*> cargv;
      for (std::string& s : argv_s) cargv.push_back(s.data());
      cargv.push_back(nullptr);
      execv(trainer.c_str(), cargv.data());
      fprintf(stderr, "ringctl: cannot run %s: %s\n", trainer.c_str(), strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
  }

  // Wait for every rank. The first failure stops the others (they would only time out).
  std::vector<int> exit_status(workers, -1);
  int running = workers;
  bool failed = false, cancelled = false;
  std::string first_failure;
  absl::Time kill_at = absl::InfiniteFuture();
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < workers; ++r) {
        if (pids[r] != pid) continue;
        exit_status[r] = status;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !failed && !cancelled) {
          failed = true;
          first_failure =
              WIFEXITED(status)
                  ? absl::StrCat("rank ", r, " exited with status ", WEXITSTATUS(status))
                  : absl::StrCat("rank ", r, " was killed by signal ", WTERMSIG(status));
          for (int q = 0; q < workers; ++q) {
            if (exit_status[q] < 0) kill(pids[q], SIGTERM);
          }
          kill_at = absl::Now() + absl::Seconds(10);
        }
      }
      continue;
    }
    if (g_cancel && !cancelled && !failed) {
      cancelled = true;
      // The trainers drain: finish the step, save a checkpoint when the job has them.
      const double grace =
          spec->checkpoint().dir().empty() ? 0 : spec->checkpoint().drain_grace_seconds();
      fprintf(stderr, "ringctl: cancelling the job (the trainers drain%s)\n",
              grace > 0 ? absl::StrFormat(", saving a checkpoint within %g s", grace).c_str() : "");
      for (int q = 0; q < workers; ++q) {
        if (exit_status[q] < 0) kill(pids[q], SIGTERM);
      }
      kill_at = absl::Now() + absl::Seconds(grace + 10);
    }
    if (absl::Now() > kill_at) {
      for (int q = 0; q < workers; ++q) {
        if (exit_status[q] < 0) kill(pids[q], SIGKILL);
      }
      kill_at = absl::InfiniteFuture();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }

  std::string result;
  if (!failed && !cancelled) {
    auto read = ReadFile(result_path);
    if (!read.ok()) {
      failed = true;
      first_failure = absl::StrCat("rank 0 wrote no result: ", read.status().message());
    } else {
      result = *read;
    }
  }
  const std::string status = cancelled ? "cancelled" : failed ? "failed" : "succeeded";
  std::string summary = absl::StrCat("{\"status\":\"", status, "\",\"world_size\":", workers);
  for (const char* key :
       {"steps", "final_loss", "eval_accuracy", "samples_per_second", "tokens_per_second",
        "skipped_steps", "parameters", "comm_seconds", "exposed_comm_seconds", "elapsed_seconds",
        "drained", "resumed_from_step", "checkpoints_saved", "checkpoint_failures"}) {
    absl::StrAppend(&summary, ",\"", key, "\":", result.empty() ? "null" : JsonField(result, key));
  }
  if (!first_failure.empty()) {
    std::string escaped;
    for (char c : first_failure) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    absl::StrAppend(&summary, ",\"error\":\"", escaped, "\"");
  }
  absl::StrAppend(&summary, ",\"run_dir\":\"", run_dir, "\"}\n");
  const std::string summary_path = Flag(args, "--summary", "");
  if (!summary_path.empty()) {
    absl::Status s = WriteFileAtomically(summary_path, summary);
    if (!s.ok()) fprintf(stderr, "ringctl: --summary: %s\n", s.ToString().c_str());
  }
  if (status == "succeeded") {
    printf(
        "ringctl local: succeeded: %s steps, final loss %s, test accuracy %s, %s samples/s "
        "on %d workers\n",
        JsonField(result, "steps").c_str(), JsonField(result, "final_loss").c_str(),
        JsonField(result, "eval_accuracy").c_str(), JsonField(result, "samples_per_second").c_str(),
        workers);
    return 0;
  }
  fprintf(stderr, "ringctl local: %s%s%s (logs in %s)\n", status.c_str(),
          first_failure.empty() ? "" : ": ", first_failure.c_str(), run_dir.c_str());
  return cancelled ? 130 : 1;
}

// `ringctl checkpoint list|inspect|verify DIR`. Exit 0 when fine, 1 when the checkpoint is
// damaged or missing (the error names the file and offset), 2 for bad usage.
int CheckpointCommand(int argc, char** argv) {
  if (argc != 4) return Usage("checkpoint: give list, inspect or verify and one directory");
  const std::string what = argv[2], dir = argv[3];
  Env* env = Env::Default();
  if (what == "list") {
    auto list = checkpoint::ListCheckpoints(env, dir);
    if (!list.ok()) {
      fprintf(stderr, "ringctl checkpoint list: %s\n", list.status().ToString().c_str());
      return 1;
    }
    if (list->empty()) {
      printf("no committed checkpoint in %s\n", dir.c_str());
      return 0;
    }
    printf("%s", checkpoint::DescribeCheckpoints(*list).c_str());
    return 0;
  }
  if (what == "inspect") {
    auto manifest = checkpoint::ReadManifest(env, dir);
    if (!manifest.ok()) {
      fprintf(stderr, "ringctl checkpoint inspect: %s\n", manifest.status().ToString().c_str());
      return 1;
    }
    printf("%s", checkpoint::DescribeManifest(*manifest).c_str());
    return 0;
  }
  if (what == "verify") {
    auto report = checkpoint::VerifyCheckpoint(env, dir);
    if (!report.ok()) {
      fprintf(stderr, "ringctl checkpoint verify: %s: %s\n", dir.c_str(),
              report.status().ToString().c_str());
      return 1;
    }
    printf("%s: step %ld verified: %d files, %ld bytes, %ld checksums\n", dir.c_str(),
           static_cast<long>(report->step), report->files, static_cast<long>(report->bytes),
           static_cast<long>(report->blocks));
    return 0;
  }
  return Usage(absl::StrCat("checkpoint: unknown subcommand \"", what, "\""));
}

int EstimateMemoryCommand(int argc, char** argv) {
  Args args;
  std::string error;
  if (!ParseArgs(argc, argv, 3, &args, &error)) return Usage(error);
  for (const auto& [flag, value] : args.flags) {
    if (flag != "--params" && flag != "--world" && flag != "--zero" && flag != "--precision" &&
        flag != "--optimizer") {
      return Usage(absl::StrCat("estimate memory: unknown flag ", flag));
    }
  }
  MemoryEstimateOptions o;
  auto params = ParseParameterCount(Flag(args, "--params", ""));
  if (!params.ok()) return Usage(std::string(params.status().message()));
  o.parameters = *params;
  if (!absl::SimpleAtoi(Flag(args, "--world", "1"), &o.world_size)) {
    return Usage("--world: not a number of ranks");
  }
  if (!absl::SimpleAtoi(Flag(args, "--zero", "0"), &o.zero_stage)) {
    return Usage("--zero: not a ZeRO stage (0, 1, 2 or 3)");
  }
  const std::string precision = Flag(args, "--precision", "mixed");
  if (precision != "mixed" && precision != "fp32") {
    return Usage("--precision: use mixed (16-bit compute, fp32 master) or fp32");
  }
  o.mixed_precision = precision == "mixed";
  const std::string optimizer = Flag(args, "--optimizer", "adam");
  if (optimizer != "adam" && optimizer != "sgd") return Usage("--optimizer: use adam or sgd");
  o.optimizer = optimizer == "adam" ? MemoryEstimateOptions::Optimizer::kAdam
                                    : MemoryEstimateOptions::Optimizer::kSgdMomentum;
  auto e = EstimateMemory(o);
  if (!e.ok()) return Usage(std::string(e.status().message()));
  printf("%s", DescribeEstimate(o, *e).c_str());
  return 0;
}

}  // namespace
}  // namespace ringmaster::cli

int main(int argc, char** argv) {
  using namespace ringmaster::cli;
  if (argc < 2) return Usage("no command");
  const std::string command = argv[1];
  if (command == "local") return Local(argc, argv);
  if (command == "estimate") {
    if (argc < 3 || std::string(argv[2]) != "memory") return Usage("estimate: use estimate memory");
    return EstimateMemoryCommand(argc, argv);
  }
  if (command == "checkpoint") return CheckpointCommand(argc, argv);
  if (IsJobsCommand(command)) return JobsCommand(command, argc - 1, argv + 1);
  if (command == "--help" || command == "help") {
    printf("%s%s", kUsage, kJobsUsage);
    return 0;
  }
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}
