#include "cli/local_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace ringmaster::cli {
namespace {

// The ranks of one model replica: parallelism.mesh's tp × pp.
absl::Status CheckWorkers(const JobSpec& spec, int workers) {
  const int tp = std::max(1, spec.parallelism().mesh().tp());
  const int pp = std::max(1, spec.parallelism().mesh().pp());
  const int group = tp * pp;
  if (group == 1) return absl::OkStatus();
  const std::string mesh = absl::StrCat("parallelism.mesh.tp × pp (", tp, " × ", pp, " = ",
                                        group, ")");
  if (workers < group) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers ", workers, " is fewer than ", mesh,
                     ": one model replica needs ", group, " ranks; use --workers ", group));
  }
  if (workers % group != 0) {
    const int below = workers / group * group;
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers ", workers, " is not a multiple of ", mesh, ": the job trains on ", below,
        " ranks and ", workers - below, " worker(s) would idle; use --workers ", below, " or ",
        below + group));
  }
  const int max_ranks = spec.elastic().max_ranks();
  if (max_ranks > 0 && max_ranks < workers && max_ranks % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic.max_ranks ", max_ranks, " is not a multiple of ", mesh, ": the job trains on ",
        max_ranks / group * group, " of --workers ", workers, "; set elastic.max_ranks to a "
        "multiple of ", group));
  }
  return absl::OkStatus();
}

// Whether --summary can be written where it names: WriteFileAtomically writes a temporary
// file beside it and renames it over, so its directory must take files.
absl::Status CheckSummary(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--summary ", path, " is a directory; give a file name in it"));
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (stat(dir.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--summary ", path, ": its directory ", dir,
                                                   ": ", strerror(errno), "; create it first"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--summary ", path, ": ", dir, " is not a directory"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--summary ", path, ": cannot write in ", dir, " (", strerror(errno),
        "); give a file in a directory you can write"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLocalRun(const JobSpec& spec, const LocalChecks& checks) {
  if (absl::Status s = CheckWorkers(spec, checks.workers); !s.ok()) return s;
  if (spec.device() == JobSpec::DEVICE_CUDA && checks.cuda_devices == 0) {
    return absl::InvalidArgumentError(
        "device: cuda, but there is no CUDA GPU to train on here (this build has no CUDA -- "
        "build with --config=cuda -- or no GPU is visible); set device: cpu, or auto (a GPU "
        "where there is one)");
  }
  return CheckSummary(checks.summary);
}

}  // namespace ringmaster::cli
