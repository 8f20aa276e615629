// Reads checksummed blocks of a checkpoint's shard files (internal to checkpoint/: the
// reader and VerifyCheckpoint share it).
//
// Thread-compatible: one thread at a time.
#ifndef RINGMASTER_CHECKPOINT_SHARD_READER_H_
#define RINGMASTER_CHECKPOINT_SHARD_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "proto/checkpoint.pb.h"

namespace ringmaster::checkpoint {

class ShardReader {
 public:
  // `manifest` (already checked by ManifestProblems) must outlive the reader.
  ShardReader(Env* env, std::string dir, const Manifest& manifest);

  // Reads blocks [first, end) of `chunk` into `dst`, which receives the bytes from
  // first * block_bytes up to min(end * block_bytes, length) of the chunk, and verifies
  // each block's checksum. DATA_LOSS naming the file (and the offset) for a missing shard
  // file, one shorter than the manifest says, or a checksum mismatch; the Env's errors
  // otherwise.
  absl::Status ReadBlocks(const ChunkEntry& chunk, int64_t first, int64_t end, char* dst);

  // The size of a shard file, opening it (DATA_LOSS when missing).
  absl::StatusOr<uint64_t> FileSize(const std::string& name);

  int64_t bytes_read() const { return bytes_read_; }
  int64_t blocks_read() const { return blocks_read_; }
  int files_opened() const { return static_cast<int>(files_.size()); }

 private:
  struct Open {
    std::unique_ptr<RandomAccessFile> file;
    uint64_t size = 0;
  };
  absl::StatusOr<Open*> Get(const std::string& name);

  Env* const env_;
  const std::string dir_;
  absl::flat_hash_map<std::string, int64_t> expected_bytes_;
  absl::flat_hash_map<std::string, Open> files_;
  int64_t bytes_read_ = 0;
  int64_t blocks_read_ = 0;
};

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_SHARD_READER_H_
