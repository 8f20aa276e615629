// ringctl: the user's command line.
//
//   ringctl local --workers N JOB.yaml [--set key=value ...] [--summary FILE] [--run_dir DIR]
//       Runs the job on this machine under an embedded coordinator and agent (cli/local.h).
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
#include "cli/local.h"
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
  if (command == "local") return LocalCommand(argc - 1, argv + 1);
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
