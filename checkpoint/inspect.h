// Looking at checkpoints without loading them: `ringctl checkpoint list|inspect|verify`.
//
//   list DIR     ListCheckpoints(env, JobDir(root, job)) + DescribeCheckpoints
//   inspect DIR  ReadManifest(env, step_dir) + DescribeManifest (checkpoint/manifest.h)
//   verify DIR   VerifyCheckpoint(env, step_dir)
//
// Thread-safety: the functions may run concurrently.
#ifndef RINGMASTER_CHECKPOINT_INSPECT_H_
#define RINGMASTER_CHECKPOINT_INSPECT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace ringmaster::checkpoint {

struct VerifyReport {
  int64_t step = 0;
  int files = 0;
  int64_t bytes = 0;   // of shard data checked
  int64_t blocks = 0;  // checksums checked
};

// Checks everything in a checkpoint directory: the MANIFEST frame and structure, that
// every shard file exists with exactly the size the manifest gives, every block's
// checksum, and that manifest.json says the same as MANIFEST (JsonMirror: all but the
// block checksums).
// NOT_FOUND when `dir` does not exist; FAILED_PRECONDITION for a format this build does not
// read; DATA_LOSS listing the problems found, one per line ("<file>: ... at offset <k>"),
// at most 20 and a count of the rest. Reads every byte: takes as long as a full load.
absl::StatusOr<VerifyReport> VerifyCheckpoint(Env* env, const std::string& dir);

struct CheckpointInfo {
  int64_t step = 0;
  std::string dir;
  bool latest = false;  // the one a load of LATEST would pick
  absl::Status status;  // of reading its manifest (a corrupt one is listed, with the error)
  int world_size = 0;
  int zero_stage = 0;
  int64_t bytes = 0;  // shard bytes
  uint64_t spec_hash = 0;
  absl::Time created;
};

// The committed checkpoints in `job_dir` (<root>/<job>), ascending by step; none when the
// directory does not exist. Reads each MANIFEST, not the shards.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Env* env, const std::string& job_dir);

// A table, one line per checkpoint, LATEST marked.
std::string DescribeCheckpoints(const std::vector<CheckpointInfo>& checkpoints);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_INSPECT_H_
