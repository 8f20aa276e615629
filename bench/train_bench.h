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
#include <string>
#include <vector>

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

// What one training run is.
struct TrainConfig {
  std::string model = "mlp";  // a label for tables and the CSV
  std::vector<int64_t> hidden = {512, 512};
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

// max(1, cores / world): the per-rank thread count both sides use.
int ThreadsPerRank(int cores, int world);

struct RingmasterOptions {
  std::string ringctl;   // path of the ringctl binary (ringtrainer next to it)
  std::string data_dir;  // Fashion-MNIST IDX files
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
};

// Runs `ringctl local --workers W` once on a job spec written for `config` (Fashion-MNIST,
// eval off, fingerprints off, metrics.jsonl on) and returns its windows.
// Errors: FAILED_PRECONDITION when ringctl is missing; INTERNAL when the run fails (with the
// tail of its log); DEADLINE_EXCEEDED when it outlives the timeout.
absl::StatusOr<RingmasterRun> RunRingmaster(const RingmasterOptions& options,
                                            const TrainConfig& config);

struct TorchOptions {
  std::string python = "/usr/bin/python3";
  std::string script;                                                   // bench/peers/torch_ddp.py
  std::string blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";  // LD_LIBRARY_PATH
  std::string data = "fashion_mnist";                                   // or "random"
  std::string data_dir;
  std::string work_dir;
  absl::Duration timeout = absl::Minutes(5);
};

struct TorchRun {
  std::vector<TrainWindow> windows;  // rank 0's records
  std::string peer_line;             // what the peer printed about itself: torch, BLAS, threads
};

// The command that installs what the PyTorch peer needs.
inline constexpr char kTorchInstallCommand[] = "apt-get install -y python3-torch";

// Runs the PyTorch peer once for `config` (world 1: plain PyTorch; more: DDP over Gloo)
// with OpenBLAS and config.threads threads per rank, and returns its windows.
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

// A fresh directory <work_dir>/<name>-XXXXXX for one run. INTERNAL when it cannot be made.
absl::StatusOr<std::string> MakeRunDir(const std::string& work_dir, const std::string& name);

// INTERNAL: `what` exited with `exit_code`; the message ends with the tail of its log.
absl::Status FailedRun(const std::string& what, int exit_code, const std::string& log_path);

// One line of the results: one configuration of one implementation.
struct BenchRow {
  std::string section;  // "throughput" or "overlap"
  std::string impl;     // "ringmaster" or "pytorch"
  TrainConfig config;
  TrainStats stats;
  int buckets = -1;
  double ratio = -1;       // throughput: ours / PyTorch at this world; overlap: step time
                           // with overlap off / this one. -1: none
  double efficiency = -1;  // samples/s at world W / (W x samples/s at world 1); -1: none
  double efficiency_one_thread = -1;  // the same against world 1 with one thread
  double load_min = -1;  // lowest and highest 1-minute load average seen before and after
  double load_max = -1;  // its runs
};

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
