#include "checkpoint/layout.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace ringmaster::checkpoint {
namespace {

constexpr absl::string_view kStepPrefix = "step-";

// A non-negative decimal without sign or leading zeros.
std::optional<int64_t> ParseCount(absl::string_view text) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

}  // namespace

std::string JobDir(absl::string_view root, absl::string_view job) { return JoinPath(root, job); }

std::string StepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix)) return std::nullopt;
  return ParseCount(name);
}

std::string SaveDirName(int64_t step, int64_t save) {
  return absl::StrCat(kTempPrefix, kStepPrefix, step, "-save-", save);
}

std::optional<int64_t> ParseSaveDirNumber(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kTempPrefix) || !absl::ConsumePrefix(&name, kStepPrefix)) {
    return std::nullopt;
  }
  size_t at = name.find("-save-");
  if (at == absl::string_view::npos || !ParseCount(name.substr(0, at))) return std::nullopt;
  return ParseCount(name.substr(at + 6));
}

std::string DeletingDirName(int64_t step) {
  return absl::StrCat(kDeletingPrefix, StepDirName(step));
}

std::string ShardFileName(int rank, int world_size) {
  return absl::StrCat("shard-", rank, "-of-", world_size, ".bin");
}

std::string ReportFileName(int rank, int world_size) {
  return absl::StrCat("report-", rank, "-of-", world_size, ".pb");
}

std::string FailedMarkerName(int rank, int world_size, int code) {
  return absl::StrCat("report-", rank, "-of-", world_size, ".failed-", code);
}

std::optional<int> ParseFailedMarker(absl::string_view name, int rank, int world_size) {
  if (!absl::ConsumePrefix(&name, absl::StrCat("report-", rank, "-of-", world_size, ".failed-"))) {
    return std::nullopt;
  }
  std::optional<int64_t> code = ParseCount(name);
  if (!code || *code > 100) return std::nullopt;
  return static_cast<int>(*code);
}

absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(Env* env, const std::string& job_dir) {
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(job_dir);
  if (absl::IsNotFound(names.status())) return std::vector<int64_t>{};
  RM_RETURN_IF_ERROR(names.status());
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    if (std::optional<int64_t> step = ParseStepDirName(name)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<int64_t> ReadLatest(Env* env, const std::string& job_dir) {
  const std::string path = JoinPath(job_dir, kLatestName);
  RM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  std::optional<int64_t> step = ParseStepDirName(absl::StripTrailingAsciiWhitespace(text));
  if (!step) {
    return absl::DataLossError(
        absl::StrCat(path, ": expected \"step-<N>\", got \"", absl::CEscape(text), "\""));
  }
  return *step;
}

absl::StatusOr<std::string> ResolveCheckpointDir(Env* env, const std::string& job_dir,
                                                 std::optional<int64_t> step) {
  RM_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(env, job_dir));
  auto has = [&](int64_t s) { return std::binary_search(steps.begin(), steps.end(), s); };
  if (step) {
    if (has(*step)) return JoinPath(job_dir, StepDirName(*step));
    std::string have = steps.empty() ? "it has no checkpoint"
                                     : absl::StrCat("it has steps ", absl::StrJoin(steps, ", "));
    return absl::NotFoundError(
        absl::StrCat("step ", *step, " is not in ", job_dir, " (", have, ")"));
  }
  absl::StatusOr<int64_t> latest = ReadLatest(env, job_dir);
  if (absl::IsNotFound(latest.status())) {
    if (steps.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", job_dir));
    return JoinPath(job_dir, StepDirName(steps.back()));
  }
  RM_RETURN_IF_ERROR(latest.status());
  if (!has(*latest)) {
    return absl::DataLossError(absl::StrCat(JoinPath(job_dir, kLatestName), " names ",
                                            StepDirName(*latest), ", which does not exist"));
  }
  return JoinPath(job_dir, StepDirName(*latest));
}

}  // namespace ringmaster::checkpoint
