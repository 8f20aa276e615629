// A run's name and its metrics file, fixed when ringctl submits the job (`ringctl submit`,
// `ringctl local`), so that every trainer of the run, restarted or not, writes the same
// file and names the same run in its records (proto/job_spec.proto MetricsSpec).
//
// Thread-safety: a pure function.
#ifndef RINGMASTER_CLI_RUN_NAME_H_
#define RINGMASTER_CLI_RUN_NAME_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job_spec.pb.h"

namespace ringmaster::cli {

// Names the run of `spec` and places its metrics file:
//  - metrics.run, when empty, becomes "<name>-<UTC time of `now`>", e.g.
//    "tiny_gpt-20261202-024500";
//  - in metrics.jsonl, `{job}` becomes the job's name and `{run}` the run's;
//  - a relative metrics.jsonl becomes absolute against `working_dir` when it is not empty
//    (ringctl local: the trainers run on this machine; ringctl submit leaves it to the agent).
// Returns the metrics file's path (empty: the job writes none).
// INVALID_ARGUMENT naming metrics.jsonl for a `{` or `}` that is not part of `{job}` or
// `{run}` (a mistyped placeholder would become a literal file name).
absl::StatusOr<std::string> NameRun(JobSpec* spec, absl::Time now,
                                    const std::string& working_dir);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_RUN_NAME_H_
