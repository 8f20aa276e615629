// Small files whose corruption is detected (MANIFEST and the ranks' reports):
//
//   bytes  0..7   magic, 8 ASCII bytes naming the kind of file
//   bytes  8..15  payload length, little-endian uint64
//   bytes 16..23  xxh3-64 of the payload, little-endian
//   bytes 24..    payload (a serialized proto)
//
// A flipped byte anywhere, a truncation or trailing bytes are DATA_LOSS naming the file and
// the offset of the part that is wrong.
//
// Thread-safety: pure functions, except those taking an Env (as safe as the Env).
#ifndef RINGMASTER_CHECKPOINT_FRAMED_FILE_H_
#define RINGMASTER_CHECKPOINT_FRAMED_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "google/protobuf/message_lite.h"

namespace ringmaster::checkpoint {

inline constexpr absl::string_view kManifestMagic = "RMCKPTM1";
inline constexpr absl::string_view kReportMagic = "RMCKPTR1";
inline constexpr size_t kFrameHeaderBytes = 24;

// xxh3-64 (Debian's libxxhash), the checksum of frames and of shard blocks.
uint64_t Xxh3(absl::string_view bytes);

// The framed file's bytes. `magic` has 8 bytes (CHECK).
std::string Frame(absl::string_view magic, absl::string_view payload);
// The payload; DATA_LOSS "<name>: ... at offset <k>" when `contents` is not a valid frame
// with this magic.
absl::StatusOr<absl::string_view> Unframe(absl::string_view magic, absl::string_view contents,
                                          absl::string_view name);

// Writes `message` framed to `path` and syncs it (no rename: for files in a directory not
// yet visible). Errors: the Env's (RESOURCE_EXHAUSTED for a full disk).
absl::Status WriteFramedProto(Env* env, const std::string& path, absl::string_view magic,
                              const google::protobuf::MessageLite& message);
// Reads a framed proto. NOT_FOUND when the file is absent; DATA_LOSS when it is corrupt.
absl::Status ReadFramedProto(Env* env, const std::string& path, absl::string_view magic,
                             google::protobuf::MessageLite* message);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_FRAMED_FILE_H_
