// The measurement behind `trainbench`: training throughput of ringmaster (through
// `ringctl local`) and of PyTorch (bench/peers/torch_ddp.py, DDP over Gloo) on this
// machine, from the per-window records both write in metrics.jsonl form.
//
// A run trains a fixed number of steps and logs a window every `log_every` steps (and
// after step 1). Windows that end at or before `warmup_steps` are dropped; the result is
// the median over the remaining windows (samples per second over all ranks, step time)
// and, where the trainer reports them, the communication and exposed-communication time
// as fractions of the summed window time.
//
// Every Run* function blocks until its processes exit or the timeout passes (then the
// whole process group is killed). Not thread-safe: run one at a time (they share the
// machine's cores, and that is what they measure).
#ifndef RINGMASTER_BENCH_TRAIN_BENCH_H_
#define RINGMASTER_BENCH_TRAIN_BENCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ringmaster::bench {

// One logged window: a line of metrics.jsonl.
struct TrainWindow {
  int64_t step = 0;               // the last step in the window
  double samples_per_second = 0;  // all ranks together
  double window_seconds = 0;
  double comm_seconds = -1;          // -1: not reported (the PyTorch peer)
  double exposed_comm_seconds = -1;  // -1: not reported
};

// Parses metrics.jsonl text: one flat JSON object per line with at least "step",
// "samples_per_second" and "window_seconds". Blank lines are skipped.
// (train/result.proto MetricsRecord, read with protobuf's JSON mapping). Errors:
// INVALID_ARGUMENT naming the line and the field that is missing or not a number.
absl::StatusOr<std::vector<TrainWindow>> ParseTrainMetrics(absl::string_view jsonl);

struct TrainStats {
  int windows = 0;                    // windows counted (after warm-up)
  int64_t steps = 0;                  // steps in them
  double samples_per_second = 0;      // median over the windows
  double min_samples_per_second = 0;  // the spread over the windows
  double max_samples_per_second = 0;
  double step_ms = 0;                 // median over the windows of window time / steps
  double comm_fraction = -1;          // sum of comm / sum of window time; -1: not reported
  double exposed_comm_fraction = -1;  // sum of exposed comm / sum of window time
  double comm_ms = -1;                // sum of comm / steps; -1: not reported
  double exposed_comm_ms = -1;        // sum of exposed comm / steps
};

// Summarises the windows of one or more runs of the same configuration (`windows` may be
// several runs' records one after the other: a window's step count is its step minus the
// previous record's, or its step when that is not smaller). Windows ending at or before
// `warmup_steps` are left out.
// Errors: FAILED_PRECONDITION when no window is left (too few steps for the warm-up).
absl::StatusOr<TrainStats> SummarizeWindows(const std::vector<TrainWindow>& windows,
                                            int64_t warmup_steps);

// The GPT of train/nn/gpt.h (byte vocabulary) over the bytes of a text file: the model of
// the gpt section, on both sides (bench/peers/torch_gpt.py mirrors it).
struct GptShape {
  int64_t layers = 6;
  int64_t width = 256;
  int64_t heads = 4;  // must divide width
  int64_t context = 256;
  std::string text = "/usr/share/common-licenses/GPL-3";
  // GPT-2's shape instead (model.gpt2: vocabulary 50,257, the LM head tied to wte; the peer
  // with --vocab 50257 --tied): the text's bytes are its token ids on both sides.
  bool gpt2 = false;
};

// ResNet-18 of train/nn/resnet.h on 28x28 images (the resnet section; bench/peers/
// torch_resnet.py mirrors it, on random images of the same shape).
struct ResnetShape {
  int64_t width = 64;
  bool sync_batchnorm = false;  // ringmaster's model.resnet18.sync_batchnorm (PyTorch: off)
  // PyTorch's convolutions through oneDNN (its default on the CPU); false: its own im2col
  // over the BLAS (OpenBLAS, as ours).
  bool torch_onednn = true;
};

// INVALID_ARGUMENT "--<flag>: <problem>".
absl::Status FlagError(absl::string_view flag, absl::string_view problem);

// What the section's model and data need, with the flag each comes from: INVALID_ARGUMENT
// naming --gpt_layers, --gpt_width, --gpt_heads (at least 1, dividing the width),
// --gpt_context, --gpt_batch (at least 1), --gpt_steps (at least warm-up + one window) or
// --gpt_text (a readable file holding at least batch_per_rank x max_world windows of
// context + 1 bytes, as train/data/text_dataset.h cuts them).
absl::Status CheckGptFlags(const GptShape& shape, int64_t batch_per_rank, int64_t steps,
                           int64_t warmup_steps, int64_t log_every, int max_world);

// What one training run is.
struct TrainConfig {
  std::string model = "mlp";  // a label for tables and the CSV
  std::vector<int64_t> hidden = {512, 512};
  // Set: the run trains this GPT with AdamW (betas 0.9, 0.95, weight decay 0.1, gradients
  // clipped to norm 1, constant `lr`) on batch_per_rank sequences of `context` tokens per
  // rank, instead of the MLP (`hidden` unused).
  std::optional<GptShape> gpt;
  // Set: the run trains this ResNet-18 with SGD (momentum 0.9, constant `lr`) on
  // batch_per_rank images per rank, instead of the MLP.
  std::optional<ResnetShape> resnet;
  int world = 1;                 // local ranks (processes)
  int threads = 1;               // BLAS (and torch) threads per rank
  int64_t batch_per_rank = 128;  // global batch = batch_per_rank x world
  int64_t steps = 200;
  int64_t log_every = 10;
  int64_t warmup_steps = 20;
  double lr = 0.01;       // SGD, momentum 0.9, constant lr, no weight decay
  bool overlap = true;    // ringmaster only: parallelism.overlap
  double bucket_mb = 25;  // ringmaster only: parallelism.bucket_mb
};

// "784-512-512-10".
std::string DescribeMlp(const std::vector<int64_t>& hidden);

// The model of a run (no commas: a CSV field): DescribeMlp(config.hidden), for the GPT
// "gpt-6x256-4h-ctx256" (layers x width, heads, context; "gpt2-..." for GptShape::gpt2), for
// ResNet-18 "resnet18-w64" ("-syncbn" added with synchronized BatchNorm).
std::string DescribeModel(const TrainConfig& config);

// max(1, cores / world): the per-rank thread count both sides use.
int ThreadsPerRank(int cores, int world);

struct RingmasterOptions {
  std::string ringctl;   // path of the ringctl binary (ringtrainer next to it)
  std::string data_dir;  // Fashion-MNIST IDX files
  // The resnet section's images (MakeShortTestSplitDir); empty: data_dir.
  std::string resnet_data_dir;
  std::string work_dir;  // each run gets a fresh subdirectory here
  absl::Duration timeout = absl::Minutes(5);
};

// One `ringctl local` run of a job spec of the caller's.
struct LocalJobOptions {
  std::string run_name;   // its directory: <work_dir>/<run_name>-XXXXXX
  std::string job_name;   // the spec's `name` (where ringctl puts the ranks' logs)
  std::string spec_yaml;  // the job spec
  std::vector<std::string> overrides;  // --set assignments ("path=value")
  int world = 1;                       // --workers
};

struct LocalJobRun {
  std::string dir;       // the run's directory: job.yaml, ringctl.log, metrics.jsonl, run/
  std::string job_dir;   // dir/run/node/<job>: slot-<r>.log per rank, summary.json (rank 0's
                         // TrainResult)
  std::string log_path;  // ringctl's output
  std::vector<TrainWindow> windows;  // rank 0's metrics.jsonl
  // The largest peak resident set of any process of the run (ringctl, the coordinator, the
  // agent and the ranks, which each reaps), from wait4(2) of ringctl.
  double max_rss_bytes = 0;
};

// Runs `ringctl local --workers W` on the spec with its overrides, metrics.jsonl and a kept
// run directory, and returns what it left. Errors as RunRingmaster's.
absl::StatusOr<LocalJobRun> RunLocalJob(const RingmasterOptions& options,
                                        const LocalJobOptions& job);

struct RingmasterRun {
  std::vector<TrainWindow> windows;  // rank 0's metrics.jsonl
  int buckets = -1;  // gradient buckets the trainer reported; -1: not found in its log
  double parameters = -1;  // the trainer's summary `parameters`; -1: no summary
};

// The `ringctl local` run of `config`: a job spec (Fashion-MNIST and the MLP, or with
// config.gpt the GPT on its text; eval off, fingerprints off, fp32) and the overrides that
// set what the configuration varies.
LocalJobOptions RingmasterJob(const RingmasterOptions& options, const TrainConfig& config);

// Runs `ringctl local --workers W` once on RingmasterJob(options, config), with metrics.jsonl
// on, and returns its windows and the trainer's parameter count.
// Errors: FAILED_PRECONDITION when ringctl is missing; INTERNAL when the run fails (with the
// tail of its log); DEADLINE_EXCEEDED when it outlives the timeout.
absl::StatusOr<RingmasterRun> RunRingmaster(const RingmasterOptions& options,
                                            const TrainConfig& config);

struct TorchOptions {
  std::string python = "/usr/bin/python3";
  std::string script;      // bench/peers/torch_ddp.py (the MLP)
  std::string gpt_script;  // bench/peers/torch_gpt.py (TrainConfig::gpt)
  std::string resnet_script;  // bench/peers/torch_resnet.py (TrainConfig::resnet)
  std::string blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";  // LD_LIBRARY_PATH
  std::string data = "fashion_mnist";                                   // or "random"
  std::string data_dir;
  std::string work_dir;
  absl::Duration timeout = absl::Minutes(5);
};

struct TorchRun {
  std::vector<TrainWindow> windows;  // rank 0's records
  std::string peer_line;             // what the peer printed about itself: torch, BLAS, threads
  double parameters = -1;            // the GPT's or ResNet's peer's "parameters=N"; -1: not printed
};

// The peer's command line for `config` (its script, then its flags), writing into `dir`.
std::vector<std::string> TorchCommand(const TorchOptions& options, const TrainConfig& config,
                                      const std::string& dir);

// The command that installs what the PyTorch peer needs.
inline constexpr char kTorchInstallCommand[] = "apt-get install -y python3-torch";

// Runs the PyTorch peer once for `config` (world 1: plain PyTorch; more: DDP over Gloo; the
// GPT's script when config.gpt is set) with OpenBLAS and config.threads threads per rank,
// and returns its windows.
// Errors: FAILED_PRECONDITION when PyTorch is not installed (naming kTorchInstallCommand),
// when torch loaded another BLAS than OpenBLAS, or when the data is missing; INTERNAL when
// a rank fails; DEADLINE_EXCEEDED on timeout.
absl::StatusOr<TorchRun> RunTorch(const TorchOptions& options, const TrainConfig& config);

struct ProcessOptions {
  std::vector<std::string> argv;       // argv[0] is the program's path
  std::vector<std::string> extra_env;  // "NAME=value", set in the child only
  std::string output_path;             // the child's stdout and stderr
  absl::Duration timeout;
};

struct ProcessResult {
  int exit_code = 0;
  // ru_maxrss of the program as wait4(2) gives it: the largest of its own peak resident set
  // and those of the descendants it (or they) waited for.
  double max_rss_bytes = 0;
};

// Runs a program in its own process group with stdout and stderr to a file, and waits.
// DEADLINE_EXCEEDED after the timeout (the group is killed); INTERNAL when it cannot start
// or dies by a signal.
absl::StatusOr<ProcessResult> RunProcess(const ProcessOptions& options);

// A directory under `work_dir` with data_dir's training split (symbolic links) and a test
// split of `test_images` blank images (plain IDX under the .gz names, which the loader
// reads): the trainer evaluates once at the end, which on Fashion-MNIST's 10,000 test
// images would take a ResNet-18 on two cores minutes that the throughput does not count.
// INTERNAL when it cannot be made.
absl::StatusOr<std::string> MakeShortTestSplitDir(const std::string& data_dir,
                                                  const std::string& work_dir, int test_images);

// A fresh directory <work_dir>/<name>-XXXXXX for one run. INTERNAL when it cannot be made.
absl::StatusOr<std::string> MakeRunDir(const std::string& work_dir, const std::string& name);

// INTERNAL: `what` exited with `exit_code`; the message ends with the tail of its log.
absl::Status FailedRun(const std::string& what, int exit_code, const std::string& log_path);

// One line of the results: one configuration of one implementation.
struct BenchRow {
  std::string section;  // "throughput", "gpt" or "overlap"
  std::string impl;     // "ringmaster" or "pytorch"
  TrainConfig config;
  TrainStats stats;
  int buckets = -1;
  double ratio = -1;       // throughput and gpt: ours / PyTorch at this world (gpt: only when
                           // both have the same parameter count); overlap: step time
                           // with overlap off / this one. -1: none
  double efficiency = -1;  // samples/s at world W / (W x samples/s at world 1); -1: none
  double efficiency_one_thread = -1;  // the same against world 1 with one thread
  double load_min = -1;  // lowest and highest 1-minute load average seen before and after
  double load_max = -1;  // its runs
};

// The gpt (issue 20) and resnet (issue 21) sections' goal at one world size: ours at least
// `target` x PyTorch in `unit`, e.g. "goal: >= 2x PyTorch DDP at world 2: PASS (2.31x: 4,100
// vs 1,775 tokens/s)".
// "PyTorch" at world 1, "PyTorch DDP" above. Not checked, and says why, when a side was not
// measured (tokens/s <= 0) or the two sides' parameter counts differ (not the same model).
struct GptGoal {
  int world = 1;
  double target = 2;
  double ours_tokens_per_second = -1;
  double torch_tokens_per_second = -1;
  double ours_parameters = -1;
  double torch_parameters = -1;
  std::string unit = "tokens/s";
};
std::string GptGoalLine(const GptGoal& goal);

// "1,234,567" (rounded to a whole number).
std::string Thousands(double v);

// CSV with a header line; -1 values are left empty.
std::string BenchRowsToCsv(const std::vector<BenchRow>& rows);

// The 1-minute load average (/proc/loadavg), or -1 when it cannot be read.
double LoadAverage();

// The directory of the running program (/proc/self/exe), or "." when it cannot be read.
std::string SelfDir();

// Where a benchmark keeps its runs: `requested` (created with its parents when missing), or
// when empty a new /tmp/<program>-XXXXXX, which the benchmark owns (and may remove).
struct WorkDir {
  std::string path;
  bool own = false;
};
// INVALID_ARGUMENT naming --work_dir when `requested` cannot be created; INTERNAL when /tmp
// has no room for a new one.
absl::StatusOr<WorkDir> OpenWorkDir(const std::string& requested, const std::string& program);

// Removes the directory when the benchmark owns it and `keep` is false; a --work_dir the user
// named is always kept.
void CloseWorkDir(const WorkDir& dir, bool keep);

// SIGINT and SIGTERM kill the run in progress (KillRunningProcesses) and exit 128 + signal.
void KillRunsOnSignals();

// Kills the process group of the run in progress, if any (its processes are in a group of
// their own, which a terminal's Ctrl-C does not reach). Async-signal-safe: for a SIGINT or
// SIGTERM handler, which should then exit.
void KillRunningProcesses();

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_TRAIN_BENCH_H_
