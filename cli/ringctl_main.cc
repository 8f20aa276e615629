// ringctl: the user's command line (cli/command_line.h has the commands and flags).
//
//   ringctl local JOB.yaml --workers N ...          a job on this machine (cli/local.h)
//   ringctl submit|list|status|cancel|top|checkpoints ...
//                                                   talk to a coordinator (cli/jobs.h)
//   ringctl checkpoint list|inspect|verify DIR      checkpoints on disk
//   ringctl export CHECKPOINT_DIR -o FILE.safetensors
//                                                   a GPT checkpoint's weights for PyTorch
//   ringctl estimate memory --params 7B --world 8   per-rank memory by the ZeRO formula
//   ringctl estimate memory --spec job.yaml --world 4
//                                                   a job's buffers per rank, every ZeRO stage
//   ringctl estimate cost --params 7B --tokens 1.4T --gpu a100 --gpus 256 --mfu 0.45
//                                                   GPU-hours, wall time, dollars (on spot too)
//   ringctl data prepare --corpus sotu -o sotu.bin --validation_fraction 0.1
//                                                   text into token files (train/data/prepare.h)
//   ringctl plot a.jsonl b.jsonl -o curves.svg      training curves of runs (cli/plot.h)
//
// Exit status: 0 done, 1 failed (the message says why), 2 bad usage, 130 a cancelled
// `ringctl local`.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/weights.h"
#include "cli/command_line.h"
#include "cli/config.h"
#include "cli/estimate.h"
#include "cli/estimate_cost.h"
#include "cli/estimate_pipeline.h"
#include "cli/jobs.h"
#include "cli/local.h"
#include "cli/plot.h"
#include "common/env.h"
#include "train/data/prepare.h"
#include "train/memory_estimate.h"

namespace ringmaster::cli {
namespace {

// The variables cli/config.h reads, from this process's environment.
Environment ProcessEnvironment() {
  Environment env;
  std::vector<const char*> names(kConnectionEnvironment.begin(), kConnectionEnvironment.end());
  names.push_back("HOME");
  names.push_back("XDG_CONFIG_HOME");
  for (const char* name : names) {
    if (const char* value = getenv(name); value != nullptr && value[0] != '\0') {
      env[name] = value;
    }
  }
  return env;
}

int Verify(Env* env, const std::string& dir) {
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

// `ringctl checkpoint verify DIR`: DIR is one checkpoint (it has a MANIFEST, or is named
// step-<N>) or a job directory, whose committed checkpoints are verified one after the
// other. Exit 0 when every one is sound, 1 when one is damaged or there is none.
int CheckpointVerify(const std::string& dir) {
  Env* env = Env::Default();
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string name = trimmed.substr(trimmed.find_last_of('/') + 1);  // npos + 1 is 0
  if (env->FileExists(absl::StrCat(dir, "/", checkpoint::kManifestName)).ok() ||
      checkpoint::ParseStepDirName(name).has_value()) {
    return Verify(env, dir);
  }
  if (absl::Status exists = env->FileExists(dir); !exists.ok()) {
    fprintf(stderr, "ringctl checkpoint verify: %s: %s\n", dir.c_str(), exists.ToString().c_str());
    return 1;
  }
  auto list = checkpoint::ListCheckpoints(env, dir);
  if (!list.ok()) {
    fprintf(stderr, "ringctl checkpoint verify: %s: %s\n", dir.c_str(),
            list.status().ToString().c_str());
    return 1;
  }
  if (list->empty()) {
    fprintf(stderr,
            "ringctl checkpoint verify: %s is neither a checkpoint (no MANIFEST) nor a job "
            "directory with committed checkpoints (no step-<N> with a MANIFEST); give "
            "checkpoint.dir/<job> or one of its step-<N>\n",
            dir.c_str());
    return 1;
  }
  int damaged = 0;
  for (const checkpoint::CheckpointInfo& c : *list) {
    if (Verify(env, c.dir) != 0) ++damaged;
  }
  printf("%s: %zu checkpoints, %d sound, %d damaged\n", dir.c_str(), list->size(),
         static_cast<int>(list->size()) - damaged, damaged);
  return damaged == 0 ? 0 : 1;
}

int CheckpointList(const std::string& dir) {
  auto list = checkpoint::ListCheckpoints(Env::Default(), dir);
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

int CheckpointInspect(const std::string& dir) {
  auto manifest = checkpoint::ReadManifest(Env::Default(), dir);
  if (!manifest.ok()) {
    fprintf(stderr, "ringctl checkpoint inspect: %s\n", manifest.status().ToString().c_str());
    return 1;
  }
  printf("%s", checkpoint::DescribeManifest(*manifest).c_str());
  return 0;
}

// `ringctl export`: exit 0 with a line saying what was written, 1 with why not.
int Export(const CommandLine& line) {
  checkpoint::SafetensorsWriteOptions options;
  if (line.export_flags.dtype == "bf16")
    options.dtype = checkpoint::SafetensorsWriteOptions::Dtype::kBF16;
  auto report = checkpoint::ExportCheckpoint(line.target, line.export_flags.out, options);
  if (!report.ok()) {
    fprintf(stderr, "ringctl export: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  printf("%s: %d tensors, %ld parameters (%s, GPT-2 names) from %s (step %ld%s): %ld bytes\n",
         line.export_flags.out.c_str(), report->tensors, static_cast<long>(report->parameters),
         line.export_flags.dtype.c_str(), report->checkpoint_dir.c_str(),
         static_cast<long>(report->step),
         report->model.empty() ? "" : absl::StrCat(", model.", report->model).c_str(),
         static_cast<long>(report->bytes));
  return 0;
}

int EstimateMemoryCommand(const CommandLine& line) {
  if (!line.estimate_spec.spec_file.empty()) {
    absl::StatusOr<std::string> text = EstimateSpecMemory(line.estimate_spec, line.output);
    if (!text.ok()) {
      fprintf(stderr, "ringctl estimate memory: %s\n", std::string(text.status().message()).c_str());
      // A spec that cannot be read or run is bad usage; not fitting this machine is not.
      return absl::IsResourceExhausted(text.status()) ? 1 : 2;
    }
    fputs(text->c_str(), stdout);
    return 0;
  }
  const train::MemoryEstimateOptions& o = line.estimate;
  auto e = train::EstimateMemory(o);
  if (!e.ok()) {
    fprintf(stderr, "ringctl estimate memory: %s\n", std::string(e.status().message()).c_str());
    return 2;
  }
  printf("%s", train::DescribeEstimate(o, *e).c_str());
  return 0;
}

int DataPrepareCommand(const DataPrepareFlags& flags) {
  namespace data = train::data;
  auto fail = [](const absl::Status& s) {
    fprintf(stderr, "ringctl data prepare: %s\n", std::string(s.message()).c_str());
    return absl::IsInvalidArgument(s) ? 2 : 1;
  };
  data::PrepareOptions o;
  absl::StatusOr<data::TokenizerKind> kind = data::ParseTokenizerKind(flags.tokenizer);
  if (!kind.ok()) return fail(kind.status());
  o.tokenizer = *kind;
  if (!flags.corpus.empty()) {
    absl::StatusOr<std::string> dir = data::CorpusDirectory(flags.corpus);
    if (!dir.ok()) return fail(dir.status());
    o.inputs.push_back(*dir);
  }
  o.inputs.insert(o.inputs.end(), flags.inputs.begin(), flags.inputs.end());
  o.output = flags.output;
  o.validation_fraction = flags.validation_fraction;
  absl::StatusOr<data::PrepareResult> result = data::PrepareTokenFiles(o);
  if (!result.ok()) return fail(result.status());
  printf("wrote %s: %zu documents, %lld tokens (%s, vocabulary %d)\n", result->train.path.c_str(),
         result->train.documents.size(), static_cast<long long>(result->train.tokens),
         flags.tokenizer.c_str(), result->vocabulary);
  if (!result->validation.path.empty()) {
    printf("wrote %s: %zu documents, %lld tokens (validation)\n", result->validation.path.c_str(),
           result->validation.documents.size(), static_cast<long long>(result->validation.tokens));
    for (const std::string& d : result->validation.documents)
      printf("  validation: %s\n", d.c_str());
  }
  printf(
      "a job reads them with: model: {gpt: {vocab: %d, ...}} and data: {tokens: {train: %s%s%s}}\n",
      result->vocabulary, result->train.path.c_str(),
      result->validation.path.empty() ? "" : ", validation: ", result->validation.path.c_str());
  return 0;
}

// `ringctl plot`: exit 0 with what was written (and the panels left out on stderr), 1 with
// why not.
int PlotCommand(const PlotFlags& flags) {
  absl::StatusOr<PlotResult> result = PlotCurves(flags);
  if (!result.ok()) {
    fprintf(stderr, "ringctl plot: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  for (const std::string& note : result->notes) fprintf(stderr, "ringctl plot: %s\n", note.c_str());
  fputs(result->summary.c_str(), stdout);
  return 0;
}

int Run(const CommandLine& line) {
  switch (line.command) {
    case Command::kLocal: {
      LocalOptions options = line.local;
      if (const char* tmp = getenv("TMPDIR"); tmp != nullptr && tmp[0] != '\0') {
        options.temp_dir = tmp;
      }
      return LocalCommand(options);
    }
    case Command::kCheckpointList:
      return CheckpointList(line.target);
    case Command::kCheckpointInspect:
      return CheckpointInspect(line.target);
    case Command::kCheckpointVerify:
      return CheckpointVerify(line.target);
    case Command::kEstimateMemory:
      return EstimateMemoryCommand(line);
    case Command::kExport:
      return Export(line);
    case Command::kDataPrepare:
      return DataPrepareCommand(line.data_prepare);
    case Command::kPlot:
      return PlotCommand(line.plot);
    case Command::kEstimatePipeline: {
      absl::StatusOr<std::string> text = EstimatePipeline(line.pipeline);
      if (!text.ok()) {
        fprintf(stderr, "ringctl estimate pipeline: %s\n",
                std::string(text.status().message()).c_str());
        return absl::IsInvalidArgument(text.status()) ? 2 : 1;
      }
      fputs(text->c_str(), stdout);
      return 0;
    }
    case Command::kEstimateCost: {
      absl::StatusOr<std::string> text = EstimateCostText(line.cost, line.output);
      if (!text.ok()) {
        fprintf(stderr, "ringctl estimate cost: %s\n",
                std::string(text.status().message()).c_str());
        // Flags, or a spec that cannot be read, are bad usage; a model that does not fit is not.
        return absl::IsResourceExhausted(text.status()) ? 1 : 2;
      }
      fputs(text->c_str(), stdout);
      return 0;
    }
    default:
      break;
  }
  auto settings = ResolveConnection(line.connection, ProcessEnvironment());
  if (!settings.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(settings.status().message()).c_str());
    return 2;
  }
  auto options = ClientOptions(*settings);
  if (!options.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  return JobsCommand(line, *options);
}

}  // namespace
}  // namespace ringmaster::cli

int main(int argc, char** argv) {
  using namespace ringmaster::cli;
  const ParsedCommandLine parsed = ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.line) {
    fputs(parsed.out.c_str(), stdout);
    fputs(parsed.err.c_str(), stderr);
    return parsed.exit_status;
  }
  return Run(*parsed.line);
}
