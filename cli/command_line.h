// ringctl's command line (CLI11): which command, with which flags. Parsing only; nothing
// runs and nothing is read here (the environment and config files are cli/config.h's).
//
//   ringctl local JOB.yaml [--workers N] [--set key=value ...] [--summary FILE]
//                [--run_dir DIR] [--keep_run_dir] [--rank_memory_limit 200M|1.5G|MiB]
//   ringctl submit JOB.yaml|JOB.json [--set key=value ...] [--extend] [--wait] [-o json|yaml]
//   ringctl list [--all] [-o json|yaml|wide]
//   ringctl status JOB [-o json|yaml|wide]
//   ringctl cancel JOB [-o json|yaml]
//   ringctl delete JOB [-o json|yaml]
//   ringctl logs JOB [-f] [--rank R | --slot NODE/SLOT] [--tail LINES | --tail_bytes N]
//   ringctl nodes [-o json|yaml|wide]
//   ringctl top JOB [-o json] [--rank R]
//   ringctl checkpoints JOB [-o json|yaml]
//   ringctl checkpoint list JOB_DIR | inspect STEP_DIR | verify STEP_DIR|JOB_DIR
//   ringctl export CHECKPOINT_DIR -o FILE.safetensors [--dtype f32|bf16]
//   ringctl estimate memory --params 7B [--world 8] [--zero 0..3] [--precision mixed|fp32]
//                           [--optimizer adam|sgd]
//   ringctl estimate memory --spec JOB.yaml [--world 4] [--set key=value ...] [-o json|yaml]
//   ringctl estimate cost --params 7B --tokens 1.4T | --flops 1e21 | --gpu_hours H |
//                         --spec JOB.yaml [--set ...] [--tokens T]  [--gpu a100] [--gpus N]
//                         [--mfu F] [--peak_tflops X] [--price $] [--spot_price $ |
//                         --spot_discount F] [--preemptions_per_day R | --mtbf 12h]
//                         [--checkpoint_interval 1h] [--checkpoint_save 2m] [--restart 10m]
//                         [--lost_per_preemption 30m] [--budget $] [-o json|yaml]
//   ringctl data prepare [--tokenizer gpt2|bytes] [--corpus sotu] [INPUT...] -o FILE
//                        [--validation_fraction F]
//   ringctl plot METRICS.jsonl... -o FILE.svg [--labels a,b,...] [--panels loss,lr,...]
//                [--x step|seconds]
//   ringctl --version | --help | COMMAND --help
// The commands that talk to a coordinator also take --coordinator, --token_file, --tls_ca,
// --tls_client_cert, --tls_client_key and --config (cli/config.h); --json is -o json.
// Flags may come before or after the positional arguments, as --flag value or --flag=value.
//
// Thread-safety: ParseCommandLine is pure.
#ifndef RINGMASTER_CLI_COMMAND_LINE_H_
#define RINGMASTER_CLI_COMMAND_LINE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/config.h"
#include "cli/local.h"
#include "cli/output.h"
#include "train/memory_estimate.h"

namespace ringmaster::cli {

enum class Command {
  kLocal,
  kSubmit,
  kList,
  kStatus,
  kCancel,
  kDelete,
  kLogs,
  kNodes,
  kTop,
  kCheckpoints,
  kCheckpointList,
  kCheckpointInspect,
  kCheckpointVerify,
  kEstimateMemory,
  kEstimatePipeline,
  kExport,
  kDataPrepare,
  kPlot,
  kEstimateCost,
};

// `ringctl export`: a GPT checkpoint's weights as a GPT-2 safetensors file
// (checkpoint/weights.h ExportCheckpoint).
struct ExportFlags {
  std::string out;            // -o FILE (required)
  std::string dtype = "f32";  // --dtype f32|bf16
};

// `ringctl data prepare`: text into token files (train/data/prepare.h).
struct DataPrepareFlags {
  std::string tokenizer = "gpt2";   // --tokenizer gpt2|bytes
  std::string corpus;               // --corpus sotu: its documents before the INPUTs
  std::vector<std::string> inputs;  // files and folders
  std::string output;               // -o
  double validation_fraction = 0;   // --validation_fraction
};

// `ringctl estimate memory --spec`: the job's buffers per rank for every ZeRO stage and
// wrapping (cli/estimate.h).
struct EstimateSpecFlags {
  std::string spec_file;               // --spec; empty: the --params form
  std::vector<std::string> overrides;  // --set, in order
  int world = 0;                       // --world (>= 1); 0: not given (the spec's min_ranks)
};

// `ringctl estimate pipeline`: a pipeline schedule's timeline and bubble, or with --sweep the
// bubble against the micro-batches (cli/estimate_pipeline.h).
struct EstimatePipelineFlags {
  std::vector<int> stages;    // --stages: one count, or with --sweep a list (default 4,8,16)
  int micro_batches = 0;      // --micro_batches (or --micro-batches; not with --sweep)
  std::string schedule = "1f1b";
  int virtual_stages = 0;     // --virtual_stages (or --virtual-stages); 0: 2 for
                              // interleaved_1f1b, else 1
  bool sweep = false;
  std::string svg;            // -o FILE: also draw it there
};

// `ringctl plot`: training curves from metrics files (cli/plot.h).
inline constexpr std::array<const char*, 7> kPlotPanels = {
    "loss", "accuracy", "perplexity", "lr", "throughput", "grad_norm", "loss_scale"};
// What the x axis counts: steps done, or training seconds (the sum of the records' windows:
// the time spent training, without the gaps between a run and its resumption).
inline constexpr std::array<const char*, 2> kPlotXAxes = {"step", "seconds"};

struct PlotFlags {
  std::vector<std::string> files;   // METRICS.jsonl..., at least one
  std::string out;                  // -o FILE.svg (required)
  std::vector<std::string> labels;  // --labels: one per file; empty: from the files' names
  std::vector<std::string> panels;  // --panels: names of kPlotPanels; empty: all of them
  std::string x = "step";           // --x: one of kPlotXAxes
};

// `ringctl estimate cost` (cli/estimate_cost.h): sizes and durations as given, parsed there
// so that their errors name the flag; nullopt: not given.
struct EstimateCostFlags {
  std::string params;                  // --params 7B
  std::string tokens;                  // --tokens 1.4T
  std::string flops;                   // --flops 1e21
  std::optional<double> gpu_hours;     // --gpu_hours: the work measured on --gpu at --mfu
  std::string spec_file;               // --spec
  std::vector<std::string> overrides;  // --set, in order
  std::string gpu = "a100";            // --gpu
  int gpus = 1;                        // --gpus
  double mfu = 0.4;                    // --mfu
  std::optional<double> peak_tflops, price, spot_price, spot_discount;
  std::optional<double> preemptions_per_day;  // --preemptions_per_day
  std::string mtbf;                           // --mtbf 12h
  std::string checkpoint_interval, checkpoint_save, restart, lost_per_preemption;
  std::optional<double> budget;  // --budget dollars
};

struct CommandLine {
  Command command = Command::kList;
  // The positional argument: the spec file (submit), the job (status, cancel, delete,
  // logs, top, checkpoints) or the directory (checkpoint ...). `local` keeps its own in
  // local.
  std::string target;
  std::vector<std::string> overrides;  // submit --set, in order
  // `ringctl submit [--set ...] -- PROGRAM ARGS...` (instead of the spec file): a command
  // job running this argv on every rank, named after its script (CommandJobName).
  std::vector<std::string> program;
  bool wait = false;                   // submit --wait
  bool extend = false;                 // submit --extend: resume=extend after the --set ones
  bool all = false;                    // list --all
  // logs: -f, whose log (--rank, or --slot NODE/SLOT: at most one), where it starts (--tail
  // lines before the end, or --tail_bytes: the first line that begins within that many bytes
  // of the end; at most one).
  // top: --rank, whose communication table.
  bool follow = false;
  std::optional<int> rank;
  std::optional<std::pair<std::string, int>> slot;
  int64_t tail_bytes = 0;
  std::optional<int64_t> tail_lines;
  OutputFormat output = OutputFormat::kTable;
  ConnectionFlags connection;
  LocalOptions local;  // local's flags (its temp_dir is left at the default)
  train::MemoryEstimateOptions estimate;  // estimate memory --params
  EstimateSpecFlags estimate_spec;        // estimate memory --spec
  EstimatePipelineFlags pipeline;         // estimate pipeline
  ExportFlags export_flags;               // export
  DataPrepareFlags data_prepare;          // data prepare
  PlotFlags plot;                         // plot
  EstimateCostFlags cost;                 // estimate cost
};

// What ParseCommandLine decided: a command to run, or an exit status with what to print.
struct ParsedCommandLine {
  std::optional<CommandLine> line;  // set: run it
  int exit_status = 0;              // when `line` is not set: 0 (help or version), 2 (bad usage)
  std::string out;                  // for stdout: the help or the version
  std::string err;                  // for stderr: what is wrong and how to get help
};

// `args`: the arguments after the program name. Bad usage (an unknown command or flag, a
// missing or extra argument, a value out of range) gives exit status 2 and a message that
// names the flag or argument.
ParsedCommandLine ParseCommandLine(const std::vector<std::string>& args);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_COMMAND_LINE_H_
