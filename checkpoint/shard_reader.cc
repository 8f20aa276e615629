#include "checkpoint/shard_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/framed_file.h"
#include "checkpoint/manifest.h"
#include "common/status_macros.h"

namespace ringmaster::checkpoint {

ShardReader::ShardReader(Env* env, std::string dir, const Manifest& manifest)
    : env_(env), dir_(std::move(dir)) {
  for (const ShardFile& f : manifest.files()) expected_bytes_[f.name()] = f.bytes();
}

absl::StatusOr<ShardReader::Open*> ShardReader::Get(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return &it->second;
  const std::string path = JoinPath(dir_, name);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = env_->NewRandomAccessFile(path);
  if (absl::IsNotFound(file.status())) {
    return absl::DataLossError(absl::StrCat(path, ": the shard file is missing"));
  }
  RM_RETURN_IF_ERROR(file.status());
  RM_ASSIGN_OR_RETURN(uint64_t size, (*file)->Size());
  const int64_t expected = expected_bytes_[name];
  if (static_cast<int64_t>(size) < expected) {
    return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", size,
                                            ": the manifest says it has ", expected, " bytes"));
  }
  Open& open = files_[name];
  open.file = *std::move(file);
  open.size = size;
  return &open;
}

absl::StatusOr<uint64_t> ShardReader::FileSize(const std::string& name) {
  RM_ASSIGN_OR_RETURN(Open * open, Get(name));
  return open->size;
}

absl::Status ShardReader::ReadBlocks(const ChunkEntry& chunk, int64_t first, int64_t end,
                                     char* dst) {
  RM_ASSIGN_OR_RETURN(Open * open, Get(chunk.file()));
  const int64_t bs = chunk.block_bytes();
  const int64_t begin_byte = first * bs;
  const int64_t end_byte = std::min(end * bs, chunk.length());
  const uint64_t offset = chunk.offset() + begin_byte;
  const size_t n = static_cast<size_t>(end_byte - begin_byte);
  RM_ASSIGN_OR_RETURN(size_t got, open->file->PRead(offset, n, dst));
  bytes_read_ += static_cast<int64_t>(got);
  const std::string& path = open->file->path();
  if (got < n) {
    return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", offset + got,
                                            ": needs bytes [", offset, ", ", offset + n, ")"));
  }
  for (int64_t b = first; b < end; ++b) {
    const int64_t at = b * bs - begin_byte;
    const int64_t size = std::min(bs, end_byte - b * bs);
    const uint64_t actual = Xxh3(absl::string_view(dst + at, size));
    ++blocks_read_;
    if (actual != chunk.block_xxh3(b)) {
      const int64_t first_element = chunk.begin() + b * bs / kElementBytes;
      return absl::DataLossError(absl::StrFormat(
          "%s: checksum mismatch in the block at offset %d (%d bytes, %s elements [%d, %d)): "
          "the manifest says %#018x, the bytes hash to %#018x",
          path, chunk.offset() + b * bs, size, chunk.buffer(), first_element,
          first_element + size / kElementBytes, chunk.block_xxh3(b), actual));
    }
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::checkpoint
