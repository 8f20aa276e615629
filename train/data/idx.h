// Reader for IDX files (the format of MNIST and Fashion-MNIST): a big-endian header
//   u8 0, u8 0, u8 type, u8 rank, then `rank` u32 dimensions,
// followed by the row-major data. Only type 0x08 (unsigned byte) is supported, which is
// what image (magic 0x00000803) and label (magic 0x00000801) files use.
//
// Files may be gzip-compressed or plain: they are read through zlib's gz functions, which
// pass uncompressed files through unchanged. zlib ignores bytes after the end of a gzip
// stream that are not another gzip member; everything inside the stream is checked.
//
// Thread-safety: a free function with no shared state.
#ifndef RINGMASTER_TRAIN_DATA_IDX_H_
#define RINGMASTER_TRAIN_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster::train::data {

inline constexpr uint8_t kIdxTypeUnsignedByte = 0x08;

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // row-major; data.size() == product of dims
};

// Reads the whole file at `path`, which must hold an unsigned-byte array of rank
// `expected_rank` (1 for labels, 3 for images).
//
// Errors (all name the file):
//   NOT_FOUND         the file does not exist;
//   DATA_LOSS         wrong magic, a type other than 0x08, a rank other than expected_rank,
//                     fewer data bytes than the dimensions need (the message gives both
//                     counts), bytes after the data, or a corrupt gzip stream (bad CRC,
//                     truncated stream);
//   FAILED_PRECONDITION  `path` is not a regular file;
//   other codes       I/O errors, mapped from errno (see common/status_macros.h).
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_rank);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_IDX_H_
