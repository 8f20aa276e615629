#include "cli/run_name.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"

namespace ringmaster::cli {

absl::StatusOr<std::string> NameRun(JobSpec* spec, absl::Time now,
                                    const std::string& working_dir) {
  MetricsSpec* metrics = spec->mutable_metrics();
  if (metrics->run().empty()) {
    metrics->set_run(absl::StrCat(spec->name(), "-",
                                  absl::FormatTime("%Y%m%d-%H%M%S", now, absl::UTCTimeZone())));
  }
  if (metrics->jsonl().empty()) return std::string();
  const std::string& given = metrics->jsonl();
  std::string path = absl::StrReplaceAll(given, {{"{job}", spec->name()}, {"{run}", metrics->run()}});
  // What is left of the braces after the replacement was not a placeholder (a name or a run
  // holding one does not count: look in the path as given, without the placeholders).
  const std::string rest = absl::StrReplaceAll(given, {{"{job}", ""}, {"{run}", ""}});
  if (const size_t brace = rest.find_first_of("{}"); brace != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.jsonl: \"", given, "\" has a '", rest.substr(brace, 1),
        "' that is not part of a placeholder; the placeholders are {job} (the job's name) "
        "and {run} (the run's name, metrics.run)"));
  }
  if (!working_dir.empty() && !path.empty() && path[0] != '/') path = absl::StrCat(working_dir, "/", path);
  metrics->set_jsonl(path);
  return path;
}

}  // namespace ringmaster::cli
