// Hugging Face's safetensors format: weights in and out of ringmaster in the layout the
// Python ecosystem reads (https://github.com/huggingface/safetensors, "Format"):
//
//   8 bytes   N, the header's length, an unsigned little-endian 64-bit integer
//   N bytes   a UTF-8 JSON object: per tensor  "name": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}  (bytes of the data section, end exclusive),
//             and optionally "__metadata__": {string: string}. It begins with '{' and may be
//             padded at the end with spaces (0x20).
//   the rest  the data section: each tensor's elements, little-endian, row-major ("C").
//
// The reader checks the header before any data is read: its length against the file, every
// entry's fields, each byte range against the data section, its length against dtype and
// shape, and that no two ranges overlap (gaps are tolerated). It reads one tensor at a time,
// so a model larger than memory twice over can be loaded piece by piece.
//
// The writer writes what the reference implementation writes: tensors in name order (one
// dtype: the reference sorts by alignment, then name), offsets back to back from 0, keys of
// the JSON object sorted, the header padded with spaces so that the data starts at a multiple
// of 8 bytes. Writing the same tensors twice gives the same bytes.
//
// Errors name the file and the tensor:
//   NOT_FOUND         the file does not exist;
//   DATA_LOSS         not a safetensors file or a damaged one: a bad header (length, JSON,
//                     a missing or mistyped field), a range outside the data section (a
//                     truncated file) or overlapping another, a length that does not fit
//                     dtype and shape, an unknown dtype;
//   INVALID_ARGUMENT  a tensor of a dtype that cannot be read as float (ReadFloats), or a
//                     bad tensor given to the writer;
//   and the Env's I/O errors.
//
// Thread-safety: a SafetensorsReader may be used from several threads at once (positional
// reads; nothing in it changes after Open). The functions may run concurrently.
#ifndef RINGMASTER_CHECKPOINT_SAFETENSORS_H_
#define RINGMASTER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/env.h"

namespace ringmaster::checkpoint {

// The reference implementation refuses headers longer than this; so do we.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100 << 20;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // as the file says: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // [] is a scalar
  int64_t begin = 0;           // byte range in the data section
  int64_t end = 0;
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Opens `path` and checks its header (errors above). `env` is not owned and must outlive
  // the reader.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path,
                                                                 Env* env = Env::Default());

  const std::string& path() const { return path_; }
  // In the order of their data (their byte ranges ascending).
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Null when the file has no such tensor.
  const SafetensorsEntry* Find(absl::string_view name) const;

  // Reads `entry` (one of tensors()) into `out` (entry.numel() floats): F32 as it is, F16
  // and BF16 widened exactly. INVALID_ARGUMENT naming the file, the tensor and its dtype
  // for another dtype or a wrong `out` size; DATA_LOSS when the file was cut short since
  // Open. Blocks on the read.
  absl::Status ReadFloats(const SafetensorsEntry& entry, absl::Span<float> out) const;

 private:
  SafetensorsReader() = default;

  std::string path_;
  std::unique_ptr<RandomAccessFile> file_;
  int64_t data_start_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its name, shape and a function that fills its elements (numel
// floats, row-major), called once while the file is written (so that a large model need
// not be held in memory twice).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<absl::Status(absl::Span<float>)> fill;
};

struct SafetensorsWriteOptions {
  enum class Dtype { kF32, kBF16 };
  // kBF16 rounds each value to nearest even (NaN stays NaN).
  Dtype dtype = Dtype::kF32;
  std::map<std::string, std::string> metadata;  // "__metadata__"; none when empty
  Env* env = Env::Default();                    // not owned
};

// Writes `tensors` to `path` durably and atomically: into <path>.tmp, fsync, rename, fsync
// of the directory. INVALID_ARGUMENT naming the tensor for an empty or duplicate name, the
// name "__metadata__", a negative dimension or a missing `fill`; a fill's error is returned
// as it is (nothing is left at `path`).
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const SafetensorsWriteOptions& options);

// Half-precision conversions as the reader and writer do them (exposed for tests).
float Float16ToFloat(uint16_t h);
float Bfloat16ToFloat(uint16_t b);
uint16_t FloatToBfloat16(float f);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_SAFETENSORS_H_
