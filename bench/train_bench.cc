#include "bench/train_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "train/result.pb.h"

namespace ringmaster::bench {
namespace {

// The process group of the run in progress (0: none), for KillRunningProcesses.
std::atomic<pid_t> running_group{0};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The last `lines` lines of a log, for error messages.
std::string LogTail(const std::string& path, int lines = 15) {
  auto text = ReadFile(path);
  if (!text.ok()) return absl::StrCat("(no log: ", text.status().message(), ")");
  std::vector<absl::string_view> all = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

}  // namespace

absl::Status FailedRun(const std::string& what, int exit_code, const std::string& log_path) {
  return absl::InternalError(absl::StrCat(what, " exited with status ", exit_code, " (log ",
                                          log_path, "):\n", LogTail(log_path)));
}

absl::StatusOr<ProcessResult> RunProcess(const ProcessOptions& options) {
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out = open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0) {
    return absl::InternalError(
        absl::StrCat("cannot write ", options.output_path, ": ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(out);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out, 1);
    dup2(out, 2);
    close(out);
    for (const std::string& e : options.extra_env) putenv(const_cast<char*>(e.c_str()));
    execv(argv[0], argv.data());
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(out);
  setpgid(pid, pid);  // also here, so that a kill before the child ran reaches the group
  running_group = pid;
  const absl::Time deadline = absl::Now() + options.timeout;
  int status = 0;
  struct rusage usage {};
  while (true) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      const int error = errno;
      kill(-pid, SIGKILL);
      running_group = 0;
      return absl::InternalError(absl::StrCat("waitpid: ", strerror(error)));
    }
    if (absl::Now() > deadline) {
      kill(-pid, SIGTERM);
      absl::SleepFor(absl::Seconds(3));
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      running_group = 0;
      return absl::DeadlineExceededError(absl::StrCat(
          options.argv[0], " did not finish within ", absl::FormatDuration(options.timeout),
          "; killed it (log: ", options.output_path, ")"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // A finished launcher may leave stragglers (a PyTorch rank): they must not run on.
  kill(-pid, SIGKILL);
  running_group = 0;
  if (!WIFEXITED(status)) {
    return absl::InternalError(absl::StrCat(options.argv[0], " was killed by signal ",
                                            WTERMSIG(status), ":\n", LogTail(options.output_path)));
  }
  return ProcessResult{WEXITSTATUS(status), static_cast<double>(usage.ru_maxrss) * 1024};
}

absl::StatusOr<std::string> MakeRunDir(const std::string& work_dir, const std::string& name) {
  std::string path = absl::StrCat(work_dir, "/", name, "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", path, ": ", strerror(errno)));
  }
  return path;
}

namespace {

std::string RunName(absl::string_view impl, const TrainConfig& c) {
  return absl::StrCat(impl, "-", c.model, "-w", c.world);
}

// Reads a run's metrics file and appends its windows.
absl::Status AppendWindows(const std::string& metrics_path, std::vector<TrainWindow>* all) {
  RM_ASSIGN_OR_RETURN(std::string text, ReadFile(metrics_path));
  auto windows = ParseTrainMetrics(text);
  if (!windows.ok()) {
    return absl::InternalError(absl::StrCat(metrics_path, ": ", windows.status().message()));
  }
  all->insert(all->end(), windows->begin(), windows->end());
  return absl::OkStatus();
}

// The job spec of a benchmark run; everything that varies comes as --set overrides.
constexpr char kJobSpec[] = R"(# Written by trainbench.
name: trainbench
seed: 1
steps: 200
model:
  mlp:
    hidden: [512, 512]
    activation: relu
data:
  fashion_mnist:
    normalize: true
  eval_every_epoch: false
optimizer:
  sgd:
    momentum: 0.9
  lr: 0.01
schedule:
  decay: constant
batch:
  global: 128
parallelism:
  bucket_mb: 25
  overlap: true
diagnostics:
  fingerprint_every: 0
  log_every: 10
)";

// The gpt section's AdamW, on both sides (ringmaster's spec and the PyTorch peer's flags).
constexpr double kGptBeta1 = 0.9;
constexpr double kGptBeta2 = 0.95;
constexpr double kGptWeightDecay = 0.1;
constexpr double kGptClipGradNorm = 1.0;

// "; buckets N (" in the trainer's start-up line.
int BucketsFromLog(const std::string& log_path) {
  auto text = ReadFile(log_path);
  if (!text.ok()) return -1;
  constexpr char kKey[] = "; buckets ";
  size_t p = text->find(kKey);
  if (p == std::string::npos) return -1;
  absl::string_view rest = absl::string_view(*text).substr(p + strlen(kKey));
  int buckets = -1;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &buckets)) return -1;
  return buckets;
}

std::string Optional(double v, const absl::FormatSpec<double>& format) {
  return v < 0 ? std::string() : absl::StrFormat(format, v);
}

// The `parameters` of a run's summary.json (rank 0's TrainResult), or -1 without one.
double SummaryParameters(const std::string& summary_path) {
  auto text = ReadFile(summary_path);
  train::TrainResult result;
  if (!text.ok() || !FromJson(*text, &result, summary_path).ok()) return -1;
  return result.parameters();
}

// N of " parameters=N" in the peer's line, or -1.
double PeerParameters(absl::string_view peer_line) {
  for (absl::string_view field : absl::StrSplit(peer_line, ' ', absl::SkipEmpty())) {
    double n = -1;
    if (absl::ConsumePrefix(&field, "parameters=") && absl::SimpleAtod(field, &n)) return n;
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::vector<TrainWindow>> ParseTrainMetrics(absl::string_view jsonl) {
  std::vector<TrainWindow> windows;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(jsonl, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    train::MetricsRecord record;
    RM_RETURN_IF_ERROR(FromJson(line, &record, absl::StrCat("line ", line_number)));
    for (auto [has, key] : {std::pair{record.has_step(), "step"},
                            std::pair{record.has_samples_per_second(), "samples_per_second"},
                            std::pair{record.has_window_seconds(), "window_seconds"}}) {
      if (!has) {
        return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": no \"", key, "\""));
      }
    }
    TrainWindow w;
    w.step = record.step();
    w.samples_per_second = record.samples_per_second();
    w.window_seconds = record.window_seconds();
    if (record.has_comm_seconds()) w.comm_seconds = record.comm_seconds();
    if (record.has_exposed_comm_seconds()) w.exposed_comm_seconds = record.exposed_comm_seconds();
    windows.push_back(w);
  }
  return windows;
}

absl::StatusOr<TrainStats> SummarizeWindows(const std::vector<TrainWindow>& windows,
                                            int64_t warmup_steps) {
  std::vector<double> sps, step_seconds;
  double seconds = 0, comm = 0, exposed = 0;
  bool has_comm = true;
  TrainStats stats;
  int64_t previous = 0;
  for (const TrainWindow& w : windows) {
    const int64_t steps = w.step > previous ? w.step - previous : w.step;
    previous = w.step;
    if (w.step <= warmup_steps || steps <= 0) continue;
    ++stats.windows;
    stats.steps += steps;
    sps.push_back(w.samples_per_second);
    step_seconds.push_back(w.window_seconds / static_cast<double>(steps));
    seconds += w.window_seconds;
    has_comm = has_comm && w.comm_seconds >= 0 && w.exposed_comm_seconds >= 0;
    comm += w.comm_seconds;
    exposed += w.exposed_comm_seconds;
  }
  if (sps.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no window ends after the ", warmup_steps,
                     " warm-up steps; run more steps or fewer warm-up steps"));
  }
  stats.samples_per_second = Median(sps);
  stats.min_samples_per_second = *std::min_element(sps.begin(), sps.end());
  stats.max_samples_per_second = *std::max_element(sps.begin(), sps.end());
  stats.step_ms = 1000 * Median(step_seconds);
  if (has_comm && seconds > 0) {
    stats.comm_fraction = comm / seconds;
    stats.exposed_comm_fraction = exposed / seconds;
    stats.comm_ms = 1000 * comm / static_cast<double>(stats.steps);
    stats.exposed_comm_ms = 1000 * exposed / static_cast<double>(stats.steps);
  }
  return stats;
}

std::string DescribeMlp(const std::vector<int64_t>& hidden) {
  return absl::StrCat("784-", absl::StrJoin(hidden, "-"), "-10");
}

absl::Status FlagError(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

std::string DescribeModel(const TrainConfig& config) {
  if (config.resnet) {
    return absl::StrCat("resnet18-w", config.resnet->width,
                        config.resnet->sync_batchnorm ? "-syncbn" : "");
  }
  if (!config.gpt) return DescribeMlp(config.hidden);
  const GptShape& g = *config.gpt;
  return absl::StrCat(g.gpt2 ? "gpt2-" : "gpt-", g.layers, "x", g.width, "-", g.heads, "h-ctx",
                      g.context);
}

absl::Status CheckGptFlags(const GptShape& shape, int64_t batch_per_rank, int64_t steps,
                           int64_t warmup_steps, int64_t log_every, int max_world) {
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"gpt_layers", shape.layers},
                                    {"gpt_width", shape.width},
                                    {"gpt_heads", shape.heads},
                                    {"gpt_context", shape.context},
                                    {"gpt_batch", batch_per_rank}}) {
    if (value < 1) return FlagError(flag, absl::StrCat(value, " is less than 1"));
  }
  if (shape.width % shape.heads != 0) {
    return FlagError("gpt_heads", absl::StrCat(shape.heads, " does not divide --gpt_width ",
                                               shape.width, "; pick a divisor"));
  }
  if (steps < warmup_steps + log_every) {
    return FlagError("gpt_steps", absl::StrCat(steps, " is less than the ", warmup_steps,
                                               " warm-up steps + one window of ", log_every));
  }
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(shape.text, ec);
  if (ec || access(shape.text.c_str(), R_OK) != 0) {
    return FlagError("gpt_text", absl::StrCat(shape.text, " is not a readable file",
                                              ec ? absl::StrCat(": ", ec.message()) : ""));
  }
  const int64_t windows = bytes > 0 ? (static_cast<int64_t>(bytes) - 1) / shape.context : 0;
  const int64_t needed = batch_per_rank * std::max(1, max_world);
  if (windows < needed) {
    return FlagError("gpt_text",
                     absl::StrCat(shape.text, " holds ", windows, " windows of ", shape.context + 1,
                                  " bytes, fewer than the global batch of ", needed,
                                  " (--gpt_batch x world); use a larger file or a smaller "
                                  "--gpt_context or --gpt_batch"));
  }
  return absl::OkStatus();
}

std::string GptGoalLine(const GptGoal& goal) {
  const std::string what =
      absl::StrCat("goal: >= ", goal.target, "x PyTorch", goal.world > 1 ? " DDP" : "",
                   " at world ", goal.world, ": ");
  if (goal.ours_tokens_per_second <= 0 || goal.torch_tokens_per_second <= 0) {
    return absl::StrCat(what, "not checked (",
                        goal.ours_tokens_per_second <= 0 ? "ours" : "PyTorch",
                        " not measured at world ", goal.world, ")");
  }
  if (goal.ours_parameters != goal.torch_parameters) {
    return absl::StrCat(what,
                        absl::StrFormat("not checked (ringmaster has %.0f parameters, PyTorch "
                                        "%.0f: not the same model)",
                                        goal.ours_parameters, goal.torch_parameters));
  }
  const double ratio = goal.ours_tokens_per_second / goal.torch_tokens_per_second;
  return absl::StrCat(
      what, ratio >= goal.target ? "PASS" : "MISS",
      absl::StrFormat(" (%.2fx: %.*f vs %.*f %s)", ratio, goal.ours_tokens_per_second < 100 ? 2 : 0,
                      goal.ours_tokens_per_second, goal.torch_tokens_per_second < 100 ? 2 : 0,
                      goal.torch_tokens_per_second, goal.unit));
}

int ThreadsPerRank(int cores, int world) { return std::max(1, cores / std::max(1, world)); }

absl::StatusOr<LocalJobRun> RunLocalJob(const RingmasterOptions& options,
                                        const LocalJobOptions& job) {
  if (access(options.ringctl.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ringctl is not at ", options.ringctl,
        "; build it: bazel build //cli:ringctl //worker:ringtrainer (or pass --ringctl)"));
  }
  LocalJobRun run;
  RM_ASSIGN_OR_RETURN(run.dir, MakeRunDir(options.work_dir, job.run_name));
  const std::string spec = run.dir + "/job.yaml";
  RM_RETURN_IF_ERROR(WriteFileAtomically(spec, job.spec_yaml, {.durable = false}));
  ProcessOptions p;
  p.argv = {options.ringctl, "local", "--workers", absl::StrCat(job.world), spec};
  for (const std::string& set : job.overrides) {
    p.argv.push_back("--set");
    p.argv.push_back(set);
  }
  p.argv.insert(p.argv.end(), {"--set", absl::StrCat("metrics.jsonl=", run.dir, "/metrics.jsonl"),
                               "--summary", run.dir + "/summary.json", "--run_dir",
                               run.dir + "/run"});
  p.output_path = run.dir + "/ringctl.log";
  p.timeout = options.timeout;
  RM_ASSIGN_OR_RETURN(ProcessResult done, RunProcess(p));
  if (done.exit_code != 0) {
    return FailedRun(absl::StrCat("ringctl local --workers ", job.world), done.exit_code,
                     p.output_path);
  }
  RM_RETURN_IF_ERROR(AppendWindows(run.dir + "/metrics.jsonl", &run.windows));
  run.log_path = p.output_path;
  run.job_dir = absl::StrCat(run.dir, "/run/node/", job.job_name);
  run.max_rss_bytes = done.max_rss_bytes;
  return run;
}

LocalJobOptions RingmasterJob(const RingmasterOptions& options, const TrainConfig& config) {
  LocalJobOptions job;
  job.run_name = absl::StrCat(RunName("ringmaster", config), config.overlap ? "-overlap" : "",
                              "-bucket", config.bucket_mb);
  job.job_name = "trainbench";
  // The GPT's run is the same spec with the model, data and optimizer oneofs switched by
  // its overrides (precision stays fp32, eval off).
  job.spec_yaml = kJobSpec;
  job.world = config.world;
  job.overrides = {absl::StrCat("steps=", config.steps),
                   absl::StrCat("batch.global=", config.batch_per_rank * config.world),
                   absl::StrCat("optimizer.lr=", config.lr),
                   absl::StrCat("parallelism.threads=", config.threads),
                   absl::StrCat("parallelism.overlap=", config.overlap ? "true" : "false"),
                   absl::StrCat("parallelism.bucket_mb=", config.bucket_mb),
                   absl::StrCat("diagnostics.log_every=", config.log_every)};
  if (config.gpt) {
    const GptShape& g = *config.gpt;
    const std::string m = g.gpt2 ? "model.gpt2." : "model.gpt.";
    job.overrides.insert(
        job.overrides.end(),
        {absl::StrCat(m, "layers=", g.layers), absl::StrCat(m, "width=", g.width),
         absl::StrCat(m, "heads=", g.heads), absl::StrCat(m, "context=", g.context),
         absl::StrCat("data.text.path=", g.text), absl::StrCat("optimizer.adamw.beta1=", kGptBeta1),
         absl::StrCat("optimizer.adamw.beta2=", kGptBeta2),
         absl::StrCat("optimizer.weight_decay=", kGptWeightDecay),
         absl::StrCat("optimizer.clip_grad_norm=", kGptClipGradNorm)});
  } else if (config.resnet) {
    job.overrides.insert(job.overrides.end(),
                         {absl::StrCat("model.resnet18.width=", config.resnet->width),
                          absl::StrCat("model.resnet18.sync_batchnorm=",
                                       config.resnet->sync_batchnorm ? "true" : "false"),
                          absl::StrCat("data.fashion_mnist.dir=", options.resnet_data_dir.empty()
                                                                      ? options.data_dir
                                                                      : options.resnet_data_dir)});
  } else {
    job.overrides.insert(
        job.overrides.end(),
        {absl::StrCat("model.mlp.hidden=[", absl::StrJoin(config.hidden, ", "), "]"),
         absl::StrCat("data.fashion_mnist.dir=", options.data_dir)});
  }
  return job;
}

absl::StatusOr<std::string> MakeShortTestSplitDir(const std::string& data_dir,
                                                  const std::string& work_dir, int test_images) {
  RM_ASSIGN_OR_RETURN(std::string dir, MakeRunDir(work_dir, "short-test-split"));
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}) {
    const std::string target = absl::StrCat(data_dir, "/", name);
    if (symlink(target.c_str(), absl::StrCat(dir, "/", name).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot link ", target, " into ", dir));
    }
  }
  // IDX: magic, then the dimensions, big-endian; then the bytes.
  auto header = [](uint32_t magic, std::vector<uint32_t> dims) {
    std::string h;
    dims.insert(dims.begin(), magic);
    for (uint32_t v : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<char>(v >> shift));
    }
    return h;
  };
  const uint32_t n = static_cast<uint32_t>(test_images);
  RM_RETURN_IF_ERROR(WriteFileAtomically(
      dir + "/t10k-images-idx3-ubyte.gz",
      header(0x803, {n, 28, 28}) + std::string(static_cast<size_t>(n) * 784, '\0'),
      {.durable = false}));
  RM_RETURN_IF_ERROR(WriteFileAtomically(dir + "/t10k-labels-idx1-ubyte.gz",
                                         header(0x801, {n}) + std::string(n, '\0'),
                                         {.durable = false}));
  return dir;
}

absl::StatusOr<RingmasterRun> RunRingmaster(const RingmasterOptions& options,
                                            const TrainConfig& config) {
  RM_ASSIGN_OR_RETURN(LocalJobRun local, RunLocalJob(options, RingmasterJob(options, config)));
  RingmasterRun run;
  run.windows = std::move(local.windows);
  run.buckets = BucketsFromLog(local.log_path);
  run.parameters = SummaryParameters(local.job_dir + "/summary.json");
  return run;
}

namespace {

// The peer script of a run: the GPT's, the ResNet's or the MLP's.
const std::string& TorchScript(const TorchOptions& options, const TrainConfig& config) {
  return config.gpt ? options.gpt_script : config.resnet ? options.resnet_script : options.script;
}

}  // namespace

std::vector<std::string> TorchCommand(const TorchOptions& options, const TrainConfig& config,
                                      const std::string& dir) {
  std::vector<std::string> argv = {TorchScript(options, config)};
  if (config.resnet) argv.push_back("train");
  argv.insert(
      argv.end(),
      {absl::StrCat("--world=", config.world), absl::StrCat("--batch=", config.batch_per_rank),
       absl::StrCat("--steps=", config.steps), absl::StrCat("--log_every=", config.log_every),
       absl::StrCat("--threads=", config.threads), absl::StrCat("--lr=", config.lr)});
  if (config.resnet) {
    argv.push_back(absl::StrCat("--width=", config.resnet->width));
    argv.push_back(absl::StrCat("--mkldnn=", config.resnet->torch_onednn ? "on" : "off"));
  } else if (config.gpt) {
    const GptShape& g = *config.gpt;
    argv.insert(
        argv.end(),
        {absl::StrCat("--layers=", g.layers), absl::StrCat("--width=", g.width),
         absl::StrCat("--heads=", g.heads), absl::StrCat("--context=", g.context),
         "--text=" + g.text, absl::StrCat("--beta1=", kGptBeta1),
         absl::StrCat("--beta2=", kGptBeta2), absl::StrCat("--weight_decay=", kGptWeightDecay),
         absl::StrCat("--clip_grad_norm=", kGptClipGradNorm)});
    if (g.gpt2) argv.insert(argv.end(), {"--vocab=50257", "--tied"});
  } else {
    argv.insert(argv.end(), {absl::StrCat("--hidden=", absl::StrJoin(config.hidden, ",")),
                             "--data=" + options.data, "--data_dir=" + options.data_dir});
  }
  argv.insert(argv.end(), {"--store=" + dir + "/store", "--metrics=" + dir + "/metrics.jsonl"});
  return argv;
}

absl::StatusOr<TorchRun> RunTorch(const TorchOptions& options, const TrainConfig& config) {
  const std::string& script = TorchScript(options, config);
  if (access(script.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the PyTorch peer script is not at ", script,
                     "; build //bench:trainbench, which carries it (or pass --torch_script / "
                     "--torch_gpt_script)"));
  }
  if (access(options.python.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no Python at ", options.python, "; install PyTorch: ", kTorchInstallCommand));
  }
  RM_ASSIGN_OR_RETURN(std::string dir, MakeRunDir(options.work_dir, RunName("pytorch", config)));
  ProcessOptions p;
  p.argv = {options.python};
  for (std::string& arg : TorchCommand(options, config, dir)) p.argv.push_back(std::move(arg));
  p.extra_env = {"LD_LIBRARY_PATH=" + options.blas_dir,
                 absl::StrCat("OPENBLAS_NUM_THREADS=", config.threads),
                 absl::StrCat("OMP_NUM_THREADS=", config.threads)};
  p.output_path = dir + "/torch.log";
  p.timeout = options.timeout;
  RM_ASSIGN_OR_RETURN(ProcessResult done, RunProcess(p));
  const int exit_code = done.exit_code;
  if (exit_code == 5) {
    return absl::FailedPreconditionError(
        absl::StrCat("PyTorch is not installed; install it: ", kTorchInstallCommand));
  }
  if (exit_code == 3 || exit_code == 4) {
    return absl::FailedPreconditionError(
        absl::StrCat("the PyTorch peer cannot run as configured:\n", LogTail(p.output_path)));
  }
  if (exit_code != 0) {
    return FailedRun(absl::StrCat("the PyTorch peer (world ", config.world, ")"), exit_code,
                     p.output_path);
  }
  TorchRun run;
  RM_RETURN_IF_ERROR(AppendWindows(dir + "/metrics.jsonl", &run.windows));
  RM_ASSIGN_OR_RETURN(std::string log, ReadFile(p.output_path));
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(line, "peer ")) run.peer_line = std::string(line.substr(5));
  }
  run.parameters = PeerParameters(run.peer_line);
  return run;
}

std::string BenchRowsToCsv(const std::vector<BenchRow>& rows) {
  std::string out =
      "section,impl,model,world,threads,batch_per_rank,steps,overlap,bucket_mb,buckets,"
      "windows,samples_per_second,min_samples_per_second,max_samples_per_second,step_ms,"
      "comm_fraction,exposed_comm_fraction,ratio,scaling_efficiency,"
      "scaling_efficiency_one_thread,load_min,load_max\n";
  for (const BenchRow& r : rows) {
    const TrainConfig& c = r.config;
    const bool ours = r.impl == "ringmaster";
    absl::StrAppend(&out,
                    absl::StrJoin({r.section,
                                   r.impl,
                                   DescribeModel(c),
                                   absl::StrCat(c.world),
                                   absl::StrCat(c.threads),
                                   absl::StrCat(c.batch_per_rank),
                                   absl::StrCat(c.steps),
                                   ours ? std::string(c.overlap ? "true" : "false") : std::string(),
                                   ours ? absl::StrCat(c.bucket_mb) : std::string(),
                                   r.buckets < 0 ? std::string() : absl::StrCat(r.buckets),
                                   absl::StrCat(r.stats.windows),
                                   absl::StrFormat("%.1f", r.stats.samples_per_second),
                                   absl::StrFormat("%.1f", r.stats.min_samples_per_second),
                                   absl::StrFormat("%.1f", r.stats.max_samples_per_second),
                                   absl::StrFormat("%.3f", r.stats.step_ms),
                                   Optional(r.stats.comm_fraction, "%.4f"),
                                   Optional(r.stats.exposed_comm_fraction, "%.4f"),
                                   Optional(r.ratio, "%.4f"),
                                   Optional(r.efficiency, "%.4f"),
                                   Optional(r.efficiency_one_thread, "%.4f"),
                                   Optional(r.load_min, "%.2f"),
                                   Optional(r.load_max, "%.2f")},
                                  ","),
                    "\n");
  }
  return out;
}

std::string SelfDir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return ".";
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.find_last_of('/'));
}

absl::StatusOr<WorkDir> OpenWorkDir(const std::string& requested, const std::string& program) {
  WorkDir dir;
  if (requested.empty()) {
    std::string tmpl = absl::StrCat("/tmp/", program, "-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot create a work directory ", tmpl, ": ", strerror(errno)));
    }
    dir.path = tmpl;
    dir.own = true;  // only a directory we made is removed
    return dir;
  }
  if (std::error_code ec; !std::filesystem::create_directories(requested, ec) && ec) {
    return absl::InvalidArgumentError(absl::StrCat("--work_dir: ", requested, ": ", ec.message()));
  }
  dir.path = requested;
  return dir;
}

void CloseWorkDir(const WorkDir& dir, bool keep) {
  if (!dir.own || keep) return;
  std::error_code ec;
  std::filesystem::remove_all(dir.path, ec);
}

namespace {

// Ctrl-C or SIGTERM: the run in progress dies with us.
void OnSignal(int signal_number) {
  KillRunningProcesses();
  _exit(128 + signal_number);
}

}  // namespace

void KillRunsOnSignals() {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
}

void KillRunningProcesses() {
  const pid_t group = running_group.load();
  if (group > 0) kill(-group, SIGKILL);
}

double LoadAverage() {
  auto text = ReadFile("/proc/loadavg");
  double load = -1;
  if (!text.ok() || !absl::SimpleAtod(text->substr(0, text->find(' ')), &load)) return -1;
  return load;
}

std::string Thousands(double v) {
  const std::string digits = absl::StrFormat("%.0f", v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace ringmaster::bench
