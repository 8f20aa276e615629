// Token files in llm.c's format (karpathy/llm.c dev/data/data_common.py write_datafile, read
// by llmc/dataloader.h), so that files made by llm.c's data scripts (tinyshakespeare.py,
// fineweb.py, ...) load here and files written here load there:
//
//   a header of 256 int32, little-endian: [0] = 20240520 (magic), [1] = 1 (version: GPT-2's
//   uint16 tokens), [2] = the token count N, the rest 0;
//   then N token ids, uint16 little-endian. Nothing after them.
//
// Documents are not marked in the file; by llm.c's convention (and `ringctl data prepare`'s)
// each document starts with a separator token (GPT-2's <|endoftext|>, 50256).
//
// Thread-safety: free functions with no shared state.
#ifndef RINGMASTER_TRAIN_DATA_TOKEN_FILE_H_
#define RINGMASTER_TRAIN_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringmaster::train::data {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;
// The most tokens a file holds: its count is an int32.
inline constexpr int64_t kTokenFileMaxTokens = INT32_MAX;

// Reads the whole file at `path` (held in memory). Errors name the file:
//   NOT_FOUND            it does not exist;
//   DATA_LOSS            shorter than the header ("truncated"), a magic other than 20240520
//                        (saying what it holds), a version other than 1 (llm.c's LLaMA-3
//                        files, magic 20240801, are refused as another magic), a negative
//                        token count, fewer token bytes than the count needs ("truncated",
//                        with both counts) or bytes after them;
//   FAILED_PRECONDITION  `path` is not a regular file;
//   other codes          I/O errors, mapped from errno.
absl::StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path);

// Writes `tokens` to `path` atomically (a temporary file renamed into place, fsynced).
// INVALID_ARGUMENT naming the file and the position when a token is outside [0, 65535], or
// when there are more than kTokenFileMaxTokens; I/O errors name the file.
absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens);

// INVALID_ARGUMENT naming `path`, the position and the id of the first token >= vocab_size
// (the model's vocabulary), and saying to prepare the file with the model's tokenizer or to
// raise the model's vocabulary; OK when every id is below it.
absl::Status CheckTokenVocabulary(const std::string& path, absl::Span<const uint16_t> tokens,
                                  int64_t vocab_size);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_TOKEN_FILE_H_
