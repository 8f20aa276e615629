// Names and places of a checkpoint's files (ARCHITECTURE.md "Checkpoint on disk"):
//
//   <root>/<job>/step-<N>/MANIFEST                   checksummed binary Manifest
//   <root>/<job>/step-<N>/manifest.json              the same but the block checksums,
//                                                    readable
//   <root>/<job>/step-<N>/shard-<r>-of-<W>.bin       rank r's chunks
//   <root>/<job>/LATEST                              "step-<N>\n"
//   <root>/<job>/tmp-...                             temporaries: a save in progress
//                                                    (tmp-step-<N>-save-<S>), a checkpoint
//                                                    being deleted, LATEST being replaced
//
// Everything named tmp-* is invisible to readers and removed by the next writer's start.
//
// Thread-safety: pure functions, except those taking an Env (as safe as the Env).
#ifndef RINGMASTER_CHECKPOINT_LAYOUT_H_
#define RINGMASTER_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"

namespace ringmaster::checkpoint {

inline constexpr absl::string_view kManifestName = "MANIFEST";
inline constexpr absl::string_view kManifestJsonName = "manifest.json";
inline constexpr absl::string_view kLatestName = "LATEST";
inline constexpr absl::string_view kTempPrefix = "tmp-";
inline constexpr absl::string_view kDeletingPrefix = "tmp-deleting-";
inline constexpr absl::string_view kLatestTempName = "tmp-LATEST";

// <root>/<job>.
std::string JobDir(absl::string_view root, absl::string_view job);
// "step-<N>".
std::string StepDirName(int64_t step);
// N for "step-<N>" (N decimal, >= 0, no sign, no leading zeros but "0"); nullopt otherwise.
std::optional<int64_t> ParseStepDirName(absl::string_view name);
// "tmp-step-<N>-save-<S>": the directory save number S (of this writer's life) of step N
// is assembled in.
std::string SaveDirName(int64_t step, int64_t save);
// S for a SaveDirName; nullopt for other names.
std::optional<int64_t> ParseSaveDirNumber(absl::string_view name);
// "tmp-deleting-step-<N>": a checkpoint renamed out of view before it is removed.
std::string DeletingDirName(int64_t step);
// "shard-<r>-of-<W>.bin".
std::string ShardFileName(int rank, int world_size);
// "report-<r>-of-<W>.pb": what rank r tells rank 0 about its shard (proto ShardReport).
std::string ReportFileName(int rank, int world_size);
// "report-<r>-of-<W>.failed-<code>": an empty file saying that rank r failed with status
// code <code> and could not write its report either (a full disk still takes a name).
std::string FailedMarkerName(int rank, int world_size, int code);
// <code> when `name` is FailedMarkerName(rank, world_size, <code>).
std::optional<int> ParseFailedMarker(absl::string_view name, int rank, int world_size);

// The committed steps in `job_dir` (directories named step-<N>), ascending. An absent
// job directory has none.
absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(Env* env, const std::string& job_dir);

// The step LATEST names; NOT_FOUND when there is no LATEST; DATA_LOSS when it does not
// hold "step-<N>".
absl::StatusOr<int64_t> ReadLatest(Env* env, const std::string& job_dir);

// The directory of the checkpoint to load: `step`'s, or with nullopt the one LATEST names
// (or, when LATEST is missing, the newest committed step: a writer killed between its
// first commit and its first LATEST). NOT_FOUND "no checkpoint in <job_dir>" or "step 7
// is not in <job_dir> (it has steps 5, 10)"; DATA_LOSS when LATEST names a missing step.
absl::StatusOr<std::string> ResolveCheckpointDir(Env* env, const std::string& job_dir,
                                                 std::optional<int64_t> step);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_LAYOUT_H_
