// What ringctl prints about jobs: tables for people (kubectl's manners: headers, an AGE
// column, `-o wide` for more columns) and JSON or YAML for programs. Pure functions of
// their arguments (the time "now" included), so that tests can check them.
//
// JSON and YAML (FormatMessage) follow protobuf's JSON mapping with the .proto field names
// and every field shown, defaults included, except that 64-bit integers are numbers (not
// strings) and that inside a JobSpec enum values are spelt as the job spec's YAML spells
// them ("cosine", not "DECAY_COSINE"; an unset enum is left out), so that the spec of a
// job printed as JSON or YAML can be submitted again:
//   ringctl status JOB -o json | jq .spec > job.json && ringctl submit job.json --set name=j2
// Enums outside the spec keep their proto names ("phase": "JOB_PHASE_RUNNING").
//
// Thread-safety: the functions are pure.
#ifndef RINGMASTER_CLI_OUTPUT_H_
#define RINGMASTER_CLI_OUTPUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "proto/coordinator.pb.h"

namespace ringmaster::cli {

enum class OutputFormat {
  kTable,  // for people (the default)
  kWide,   // for people, more columns
  kJson,
  kYaml,
};

// "table", "wide", "json", "yaml" (as -o spells them; "" is the table).
// Errors: INVALID_ARGUMENT naming the accepted values.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// `message` as the JSON document described above.
// Errors: INTERNAL when protobuf cannot print it (a string field that is not UTF-8).
absl::StatusOr<nlohmann::ordered_json> MessageToJsonValue(const google::protobuf::Message& message);

// `value` as a YAML document (block style; strings that YAML would read as another type,
// "123", "true", "", are quoted), ending in a newline.
std::string JsonValueToYaml(const nlohmann::ordered_json& value);

// `value` as kJson (indented, newline-terminated) or, for any other format, kYaml.
std::string FormatJsonValue(const nlohmann::ordered_json& value, OutputFormat format);

// `message` as kJson (indented, newline-terminated) or kYaml; the table formats are not
// for this function.
// Errors: as MessageToJsonValue; INVALID_ARGUMENT for a table format.
absl::StatusOr<std::string> FormatMessage(const google::protobuf::Message& message,
                                          OutputFormat format);

// `message` as JSON on one line (for streams: `ringctl top -o json`), newline-terminated.
absl::StatusOr<std::string> MessageToJsonLine(const google::protobuf::Message& message);

// A duration as kubectl prints ages: "45s", "3m20s", "42m", "5h10m", "30h", "6d2h", "40d",
// "2y3d". Negative durations are "0s".
std::string HumanDuration(absl::Duration d);

// Columns separated by three spaces, each as wide as its widest cell; rows[0] is the
// header. The last column is not padded.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

// `ringctl list`: NAME PHASE STEP LOSS RANKS AGE; wide adds MIN-MAX (ranks)
// MEMBERSHIP-EPOCH (the rendezvous round, not a data epoch) RESTARTS (of the budget)
// STEPS/S ETA (common/progress_rate.h: over the last 30 s of steps) MEMBERS REASON. AGE is
// since submission. A message instead of a table when `jobs` is empty (`all`: whether
// finished jobs were asked for).
std::string JobsTable(const std::vector<Job>& jobs, absl::Time now, bool wide, bool all);

// `ringctl nodes`: a row per slot, the node's columns on its first: NODE STATUS (ready,
// draining, lease expired, awaiting agent) HEARTBEAT (its age) SLOT JOB RANK NOTE (a
// trainer still exiting, a backoff); wide adds GPU ADDRESS LOGS (the agent's log service).
// A message instead of a table when there is no node.
std::string NodesTable(const ListNodesResponse& nodes, bool wide);

// `ringctl status JOB`: phase and how long, reason, membership epoch, progress with its
// rate (and its window) and ETA, a table of the members, the recoveries (each with where it
// resumed from, the steps lost and why). Wide adds the members' flags, the recoveries'
// detection times, the checkpoints and the effective spec (YAML).
std::string JobDescription(const Job& job, absl::Time now, bool wide);

// One line of progress (`ringctl submit --wait`, `top`): name, phase, membership epoch,
// ranks, step, loss, restarts, the time since submission and, while it runs, the ETA
// (common/progress_rate.h's EtaSeconds of step, total_steps and steps_per_s); the reason
// last.
std::string ProgressLine(const Job& job, absl::Time now);

// The time left at the job's current rate (EtaSeconds): "" when not running or not known.
std::string Eta(const Job& job);

// `ringctl top`: the progress line and a table of the ranks' live figures, then the
// communication table (CommTable) of every rank, or of `comm_rank` only.
std::string TopFrame(const JobEvent& event, absl::Time now,
                     std::optional<int> comm_rank = std::nullopt);

// The ranks' communication per step since their trainer processes started
// (RankStats.comm_ops over process_steps), one row per rank, group and operation: calls,
// MB sent measured and by the algorithm's formula, their ratio, time. With `rank`, that
// rank's only, and its gradient buckets' table below. "" when no rank reported any.
std::string CommTable(const JobEvent& event, std::optional<int> rank = std::nullopt);

// The phase as people read it: "running".
std::string PhaseName(JobPhase phase);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_OUTPUT_H_
