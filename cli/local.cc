#include "cli/local.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "spec/job_spec.h"
#include "worker/coordinator_client.h"

namespace ringmaster::cli {
namespace {

volatile sig_atomic_t g_cancel = 0;
void OnSignal(int) { g_cancel = 1; }

int Usage(const std::string& problem) {
  fprintf(stderr,
          "ringctl: %s\nusage:\n  ringctl local --workers N JOB.yaml [--set key=value ...] "
          "[--summary FILE] [--run_dir DIR]\n",
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

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Minimal reader of the trainer's flat summary object.
std::string JsonField(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\":");
  size_t p = json.find(k);
  if (p == std::string::npos) return "null";
  p += k.size();
  const size_t e = json.find_first_of(",}", p);
  return json.substr(p, e - p);
}

std::string RecoveriesJson(const Job& job) {
  std::vector<std::string> items;
  for (const Recovery& r : job.recoveries()) {
    items.push_back(absl::StrFormat(
        "{\"epoch\":%d,\"cause\":%s,\"reason\":%s,\"old_world\":%d,\"new_world\":%d,"
        "\"rendezvous_seconds\":%.3f,\"restore_seconds\":%.3f,\"first_step_seconds\":%.3f,"
        "\"lost_steps\":%d}",
        r.epoch(), JsonString(r.cause()), JsonString(r.reason()), r.old_world(), r.new_world(),
        r.rendezvous_s(), r.restore_s(), r.first_step_s(), r.lost_steps()));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

}  // namespace

int LocalCommand(int argc, char** argv) {
  std::multimap<std::string, std::string> flags;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!absl::StartsWith(a, "--")) {
      positional.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      flags.emplace(a.substr(0, eq), a.substr(eq + 1));
    } else if (i + 1 < argc) {
      flags.emplace(a, argv[++i]);
    } else {
      return Usage(absl::StrCat(a, " needs a value"));
    }
  }
  for (const auto& [flag, value] : flags) {
    if (flag != "--workers" && flag != "--set" && flag != "--summary" && flag != "--run_dir") {
      return Usage(absl::StrCat("local: unknown flag ", flag));
    }
  }
  if (positional.size() != 1) return Usage("local: give exactly one job spec file (JOB.yaml)");
  auto flag = [&](const std::string& name, const std::string& fallback) {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  };
  int workers = 0;
  if (!absl::SimpleAtoi(flag("--workers", "1"), &workers) || workers < 1 || workers > 256) {
    return Usage(absl::StrCat("--workers: \"", flag("--workers", ""),
                              "\" is not a number of workers in [1, 256]"));
  }
  std::vector<std::string> overrides;
  for (auto [it, end] = flags.equal_range("--set"); it != end; ++it) {
    overrides.push_back(it->second);
  }
  auto spec = spec::LoadJobSpecFile(positional[0], overrides);
  if (!spec.ok()) {
    fprintf(stderr, "ringctl: the job spec is not valid:\n%s\n",
            std::string(spec.status().message()).c_str());
    return 2;
  }
  // This machine's N workers are the job's slots: elastic between min_ranks and N.
  ElasticSpec* elastic = spec->mutable_elastic();
  if (elastic->max_ranks() == 0 || elastic->max_ranks() > workers) elastic->set_max_ranks(workers);
  if (elastic->min_ranks() > workers) {
    return Usage(absl::StrCat("elastic.min_ranks is ", elastic->min_ranks(), " but --workers is ",
                              workers));
  }
  const std::string ringmaster = FindBinary("coordinator", "ringmaster");
  const std::string ringworker = FindBinary("worker", "ringworker");
  const std::string trainer = FindBinary("worker", "ringtrainer");
  if (ringmaster.empty() || ringworker.empty() || trainer.empty()) {
    fprintf(stderr,
            "ringctl: cannot find ringmaster, ringworker and ringtrainer next to ringctl; build "
            "them: bazel build //cli:ringctl\n");
    return 1;
  }

  std::string run_dir = flag("--run_dir", "");
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
  // Recovering from a lost trainer needs a checkpoint: without checkpoint.dir the job gets
  // one in the run directory, every 100 steps.
  std::string checkpoint_note;
  if (spec->checkpoint().dir().empty()) {
    spec->mutable_checkpoint()->set_dir(run_dir + "/checkpoints");
    if (spec->checkpoint().every_steps() == 0 && spec->checkpoint().every_seconds() == 0) {
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
  printf("ringctl local: job %s on %d workers (a coordinator and one agent on this machine); "
         "run directory %s (effective spec, logs)%s\n",
         spec->name().c_str(), workers, run_dir.c_str(), checkpoint_note.c_str());
  fflush(stdout);

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // The coordinator, on a free loopback port that it prints on stdout.
  int port_pipe[2];
  if (pipe2(port_pipe, O_CLOEXEC) != 0) return 1;
  const int master_log =
      open((run_dir + "/ringmaster.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t master = Spawn({ringmaster, "--listen=127.0.0.1:0",
                              "--db=" + run_dir + "/ringmaster.db", "--heartbeat_s=0.5",
                              "--lease_s=3", "--slot_backoff_s=2", "--grow_after_s=2"},
                             port_pipe[1], master_log);
  close(port_pipe[1]);
  std::string first_line;
  const absl::Time started = absl::Now();
  while (first_line.find('\n') == std::string::npos && absl::Now() - started < absl::Seconds(20)) {
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
    kill(master, SIGKILL);
    Reap(master, absl::Seconds(1));
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // One agent with N slots.
  const int agent_log =
      open((run_dir + "/ringworker.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const double grace = spec->checkpoint().drain_grace_seconds() + 10;
  const pid_t agent =
      Spawn({ringworker, "--coordinator=" + address, "--node=local",
             absl::StrCat("--slots=", workers), "--work_dir=" + run_dir + "/node",
             "--trainer=" + trainer, absl::StrCat("--drain_grace_s=", grace)},
            agent_log, agent_log);

  worker::CoordinatorClientOptions co;
  co.address = address;
  auto client = worker::CoordinatorClient::Create(co);
  auto stop_all = [&] {
    kill(agent, SIGTERM);
    kill(agent, SIGTERM);  // the second SIGTERM: kill the trainers and leave
    Reap(agent, absl::Seconds(10));
    kill(master, SIGTERM);
    Reap(master, absl::Seconds(5));
  };
  absl::StatusOr<Job> submitted = client.ok() ? (*client)->Submit(*spec) : client.status();
  if (!submitted.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(submitted.status().message()).c_str());
    stop_all();
    return absl::IsInvalidArgument(submitted.status()) ? 2 : 1;
  }

  // Follow the job: rank 0's lines, until it ends or we are told to stop.
  const std::string job_dir = absl::StrCat(run_dir, "/node/", spec->name());
  LogFollower follower;
  std::string rank0_log;
  Job job = *submitted;
  bool cancelling = false, agent_gone = false;
  absl::Time cancel_deadline = absl::InfiniteFuture();
  while (true) {
    auto got = (*client)->Get(spec->name());
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
              "within %g s)\n", spec->checkpoint().drain_grace_seconds());
      kill(agent, SIGTERM);  // drain the node: the trainers save and leave
      cancel_deadline = absl::Now() + absl::Seconds(grace + 5);
    }
    if (!agent_gone && waitpid(agent, nullptr, WNOHANG) == agent) agent_gone = true;
    if (cancelling && (agent_gone || absl::Now() > cancel_deadline)) {
      if (!rank0_log.empty()) follower.Print(rank0_log);
      auto cancelled = (*client)->Cancel(spec->name());
      if (cancelled.ok()) job = *cancelled;
      break;
    }
    if (agent_gone && !cancelling) {
      fprintf(stderr, "ringctl: the agent exited unexpectedly (see %s/ringworker.log)\n",
              run_dir.c_str());
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!rank0_log.empty()) follower.Print(rank0_log);
  if (!agent_gone) {
    kill(agent, SIGTERM);
    kill(agent, SIGTERM);
    Reap(agent, absl::Seconds(10));
  }
  kill(master, SIGTERM);
  Reap(master, absl::Seconds(5));

  const std::string status = cancelling                               ? "cancelled"
                             : job.phase() == JOB_PHASE_SUCCEEDED ? "succeeded"
                                                                      : "failed";
  std::string result;
  if (status == "succeeded") {
    auto read = ReadFile(job_dir + "/summary.json");
    if (read.ok()) result = *read;
  }
  std::string summary = absl::StrCat("{\"status\":\"", status, "\",\"world_size\":",
                                     result.empty() ? "null" : JsonField(result, "world_size"),
                                     ",\"workers\":", workers);
  for (const char* key :
       {"steps", "final_loss", "eval_accuracy", "samples_per_second", "tokens_per_second",
        "skipped_steps", "parameters", "comm_seconds", "exposed_comm_seconds", "elapsed_seconds",
        "drained", "resumed_from_step", "checkpoints_saved", "checkpoint_failures"}) {
    absl::StrAppend(&summary, ",\"", key, "\":", result.empty() ? "null" : JsonField(result, key));
  }
  absl::StrAppend(&summary, ",\"epochs\":", job.epoch(), ",\"restarts\":", job.restarts(),
                  ",\"recoveries\":", RecoveriesJson(job));
  if (status != "succeeded" && !job.reason().empty()) {
    absl::StrAppend(&summary, ",\"error\":", JsonString(job.reason()));
  }
  absl::StrAppend(&summary, ",\"run_dir\":", JsonString(run_dir), "}\n");
  if (const std::string path = flag("--summary", ""); !path.empty()) {
    absl::Status s = WriteFileAtomically(path, summary);
    if (!s.ok()) fprintf(stderr, "ringctl: --summary: %s\n", s.ToString().c_str());
  }
  if (status == "succeeded") {
    printf("ringctl local: succeeded: %s steps, final loss %s, test accuracy %s, %s samples/s "
           "on %s workers%s\n",
           JsonField(result, "steps").c_str(), JsonField(result, "final_loss").c_str(),
           JsonField(result, "eval_accuracy").c_str(),
           JsonField(result, "samples_per_second").c_str(),
           JsonField(result, "world_size").c_str(),
           job.recoveries_size() > 0
               ? absl::StrCat(" (", job.recoveries_size(), " recoveries)").c_str()
               : "");
    return 0;
  }
  fprintf(stderr, "ringctl local: %s%s%s (logs in %s)\n", status.c_str(),
          job.reason().empty() ? "" : ": ", job.reason().c_str(), run_dir.c_str());
  return status == "cancelled" ? 130 : 1;
}

}  // namespace ringmaster::cli
