// Loading a checkpoint into any world size: each rank asks for the flat ranges it holds in
// the new world and reads only the blocks of the saved chunks that overlap them
// (resharding N -> M is interval intersection; ARCHITECTURE.md "Training state is flat").
//
//   LoadOptions options{.root = dir, .job = name, .spec_hash = TrainingSpecHash(spec)};
//   absl::StatusOr<LoadResult> loaded = LoadCheckpoint(options, {
//       {"params", FullRange(table), params.span()},            // ZeRO off: everything
//       {"exp_avg", opt->range(), state_buffers[0].data},       // this rank's moments
//       ...});
//   if (absl::IsNotFound(loaded.status())) { ...no checkpoint: start fresh... }
//
// A name may be asked for several times (a ZeRO-2/3 rank's pieces of a buffer, each read
// into its place of the rank's shard buffer); the saved chunks may be many per rank too
// (such a rank's pieces at save). The targets need not be disjoint or in any order.
//
// Every block read is checked against its checksum. Bytes read exceed bytes needed only by
// the partial blocks at the two ends of each wanted range inside each saved chunk (at most
// two blocks, whose size the writer chose, per target and chunk it meets: many small
// targets from other chunks than theirs read more, and ranges that are the saved chunks,
// as when a ZeRO-3 rank loads what it saved at the same world size, read nothing more).
//
// Errors, by what the caller should do:
//   NOT_FOUND            there is no such checkpoint (none at all, or not that step): start
//                        fresh or pick another step; nothing else is NOT_FOUND.
//   FAILED_PRECONDITION  written by another job (spec hash differs: both are named, and the
//                        fields that differ when both specs are known; or its
//                        tensors differ from `table`'s), in a format this build does not
//                        read, or without a wanted buffer.
//   DATA_LOSS            corrupt: a checksum mismatch, a truncated or missing shard, a bad
//                        MANIFEST — naming the file and the offset.
//   INVALID_ARGUMENT     a bad target (naming it).
// The output spans may have been partly written when an error is returned.
//
// Thread-safety: the functions may run concurrently (e.g. one per simulated rank).
#ifndef RINGMASTER_CHECKPOINT_READER_H_
#define RINGMASTER_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.h"
#include "common/env.h"
#include "proto/checkpoint.pb.h"
#include "state/range.h"

namespace ringmaster::checkpoint {

// One range of one named buffer to fill.
struct LoadTarget {
  std::string name;        // "params", "exp_avg", ...
  state::FlatRange range;  // begin >= 0. Elements at or past the saved buffer's size (the
                           // padding of a larger world's padded flat space) are set to 0.
  absl::Span<float> out;   // range.size() floats
};

struct LoadOptions {
  std::string root;  // checkpoint.dir
  std::string job;
  std::optional<int64_t> step;        // nullopt: the one LATEST names
  std::optional<uint64_t> spec_hash;  // checked when set
  // This job's spec as spec::TrainingSpecText writes it. With it (and a checkpoint that
  // records its own), a checkpoint of another spec hash is refused naming each field that
  // differs ("steps: 10 in the checkpoint, 20 here"), or loaded when every field that
  // differs is in `spec_changes_allowed` (OpenedCheckpoint::spec_changes lists them).
  std::string training_spec;
  std::set<std::string> spec_changes_allowed;
  // What to do about a field that differs, said after it in the refusal (e.g. how to train
  // a job longer when "steps" differs).
  std::map<std::string, std::string> spec_change_hints;
  // When set, the manifest's tensors must be this table's (CheckTensorTable). Not owned.
  const state::TensorTable* table = nullptr;
  int64_t read_bytes = 8 << 20;  // largest single read
  Env* env = Env::Default();     // not owned
};

struct OpenedCheckpoint {
  std::string dir;  // <root>/<job>/step-<N>
  Manifest manifest;
  TrainingState state;
  // The allowed spec changes it was loaded across, "steps: 10 -> 20" (LoadOptions).
  std::vector<std::string> spec_changes;
};

struct ReadStats {
  int64_t bytes_needed = 0;  // of the targets' elements that the checkpoint holds
  int64_t bytes_read = 0;    // from the shard files
  int64_t blocks_read = 0;
  int files_opened = 0;
};

struct LoadResult {
  OpenedCheckpoint checkpoint;
  ReadStats stats;
};

// Finds the checkpoint and reads and checks its manifest (and the spec hash).
absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(const LoadOptions& options);

// Fills the targets from an opened checkpoint.
absl::StatusOr<ReadStats> ReadBuffers(const LoadOptions& options,
                                      const OpenedCheckpoint& checkpoint,
                                      absl::Span<const LoadTarget> targets);

// OpenCheckpoint then ReadBuffers.
absl::StatusOr<LoadResult> LoadCheckpoint(const LoadOptions& options,
                                          absl::Span<const LoadTarget> targets);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_READER_H_
