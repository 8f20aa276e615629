// `ringctl local JOB.yaml [--workers N] [--set key=value ...] [--summary FILE] [--run_dir DIR]
// [--keep_run_dir] [--rank_memory_limit SIZE]`, or `ringctl local --workers N [--set ...] --
// PROGRAM ARGS...` (a command job: the program on every rank, with torchrun's environment,
// worker/command_runner.h; relative paths from where ringctl runs): the embedded default. Starts a coordinator (ringmaster, its database in
// the run directory) and one node agent (ringworker) with N slots on this machine, prints
// where the coordinator listens (so that `ringctl top JOB --coordinator ADDRESS` works on
// it), submits the job to them (elastic: min 1, max N ranks, unless the spec says
// otherwise), prints rank 0's progress lines, and exits with the job's status: 0 succeeded,
// 1 failed, 2 bad usage or spec, 130 cancelled (Ctrl-C / SIGTERM: the trainers drain first,
// saving a checkpoint when the job has them).
//
// The run directory holds the effective spec, the logs, and the checkpoints when the spec
// names no checkpoint.dir. Without --run_dir it is a new temporary directory, removed when
// the job ends unless --keep_run_dir is given or the job failed (its logs say why); what
// was kept, and where, is printed at the end.
//
// --rank_memory_limit gives each trainer process a memory limit (the agent's
// --trainer_memory_limit_mib: its RLIMIT_DATA), as if each rank had a device of that size: a
// rank whose training state does not fit fails at once with RESOURCE_EXHAUSTED, saying what
// it needs (examples/larger_than_a_rank.yaml). The coordinator and the agent are not limited.
// The limit counts mappings never touched too, such as OpenBLAS's workspace of 128 MiB per
// thread of its pool: so that the pool is no larger than a rank uses, ringctl sets
// OPENBLAS_NUM_THREADS to cores / N for its agent unless the environment has it.
//
// The summary (--summary, one line of JSON, cli/local_summary.proto) has the job's result
// (steps, loss, accuracy, throughput, world size, checkpoints), its status, how many
// memberships it went through (`rendezvous_count`), and `recoveries`: one entry per
// membership change with its cause, the old and new world size, and the seconds of each
// phase; `run_dir` and whether it was kept (`run_dir_kept`).
#ifndef RINGMASTER_CLI_LOCAL_H_
#define RINGMASTER_CLI_LOCAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/local_summary.pb.h"
#include "proto/coordinator.pb.h"
#include "train/result.pb.h"

namespace ringmaster::cli {

struct LocalOptions {
  std::string spec_file;
  // `ringctl local ... -- PROGRAM ARGS...` (instead of spec_file): a command job running
  // this argv on every rank, named after its script (CommandJobName), --set applying to it.
  std::vector<std::string> command;
  std::vector<std::string> overrides;  // --set, in order
  int workers = 1;
  std::string summary;   // --summary: write the summary JSON here
  std::string run_dir;   // --run_dir: use (and keep) this directory
  bool keep_run_dir = false;
  // --rank_memory_limit, MiB: each trainer's RLIMIT_DATA; 0: none.
  int64_t rank_memory_limit_mib = 0;
  // --metrics_listen: the coordinator's HTTP port (/metrics, /healthz), a loopback
  // host:port (port 0 picks one; the URL is printed); empty: none.
  std::string metrics_listen;
  // Where the temporary run directory is made when run_dir is empty ($TMPDIR, or /tmp).
  std::string temp_dir = "/tmp";
};

// The name of `ringctl local -- ARGV...`'s job: the stem of its script (the first argument
// after the program that is not a flag: "python3 -u examples/train.py" → "train"; "python3 -m
// pkg.train" → "pkg.train"), else of the program ("sh -c CODE" → "sh"); at most 64
// characters, those other than [A-Za-z0-9._-] made '_'.
std::string CommandJobName(const std::vector<std::string>& argv);

// The command job of `ringctl local|submit ... -- ARGV...`: named CommandJobName(argv), running
// argv on every rank, with `overrides` (--set) applied, defaults filled and validated.
// INVALID_ARGUMENT naming the field when an override or the result is not valid.
absl::StatusOr<JobSpec> CommandJobSpec(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& overrides);

// Runs the job; returns the exit status above. Blocks until the job ends.
int LocalCommand(const LocalOptions& options);

// What ended the run, for the summary.
struct LocalOutcome {
  std::string status;  // "succeeded", "failed" or "cancelled"
  int workers = 0;
  Job job;             // the job as the coordinator last showed it
  std::string run_dir;
  bool run_dir_kept = true;
};

// The summary document (cli/local_summary.proto): the outcome, with the fields of rank 0's
// result (`trainer`; null when the trainer wrote none) that LocalSummary shares by name
// copied; error only when it did not succeed and the job has a reason.
LocalSummary MakeLocalSummary(const LocalOutcome& outcome, const train::TrainResult* trainer);

// What the final line says of the job's last evaluation: a language model's validation
// perplexity, a classifier's test accuracy, or that there was none and why (a language
// model without data.tokens.validation is not evaluated: no "test accuracy none").
std::string EvaluationText(const LocalSummary& summary, const JobSpec& spec);

// Every rank's figures from rank 0's summary (TrainResult.ranks), one line each after a
// header: its mesh coordinates, memory, bytes sent per step through its pipeline and
// tensor-parallel groups and the rest, its bubble. Printed after a job with a mesh, whose
// ranks hold different parts of the model. Empty when the summary lists no ranks.
std::string RanksTable(const train::TrainResult& result);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_LOCAL_H_
