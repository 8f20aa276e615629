// Language modelling data: TextDataset reads a file's bytes as the tokens (vocabulary 256);
// TokenDataset reads the token ids of a token file (train/data/token_file.h, llm.c's format).
// Both cut their token sequence into samples alike:
//
// Sample i is the context + 1 bytes [i * context, i * context + context + 1): windows that
// do not overlap except for one byte, so that the model reads columns 0..context-1 and
// predicts columns 1..context of every sample (train/batch.h). The data set has
// (tokens - 1) / context samples; the tokens after the last whole window are unused.
//
// Thread-safety: see train/data/dataset.h (immutable; Gather is safe from many threads).
#ifndef RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_
#define RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "train/data/dataset.h"

namespace ringmaster::train::data {

inline constexpr int64_t kByteVocabularySize = 256;

class TextDataset : public Dataset {
 public:
  // INVALID_ARGUMENT (naming `name`, the byte count and the context) when context < 1 or
  // `bytes` is too short for one sample (fewer than context + 1 bytes).
  static absl::StatusOr<std::unique_ptr<TextDataset>> Create(std::string name, std::string bytes,
                                                             int64_t context);

  absl::string_view bytes() const { return bytes_; }

 protected:
  void GatherValid(absl::Span<const int64_t> indices, Batch& batch) const override;

 private:
  TextDataset(DatasetInfo info, std::string bytes);

  const std::string bytes_;
};

// Token ids, e.g. GPT-2's (vocabulary 50257) from a token file; info().vocab_size is the
// vocabulary the ids were checked against.
class TokenDataset : public Dataset {
 public:
  // INVALID_ARGUMENT (naming `name`) when context < 1, `tokens` is too short for one sample
  // (fewer than context + 1 tokens), vocab_size < 1, or a token is >= vocab_size (naming its
  // position and id; see CheckTokenVocabulary in token_file.h).
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Create(std::string name,
                                                              std::vector<uint16_t> tokens,
                                                              int64_t context, int64_t vocab_size);

  absl::Span<const uint16_t> tokens() const { return tokens_; }

 protected:
  void GatherValid(absl::Span<const int64_t> indices, Batch& batch) const override;

 private:
  TokenDataset(DatasetInfo info, std::vector<uint16_t> tokens);

  const std::vector<uint16_t> tokens_;
};

// Reads the token file at `path` (held in memory) for a model of `vocab_size` tokens and
// `context`. Errors name the file: those of ReadTokenFile (token_file.h), and
// INVALID_ARGUMENT as TokenDataset::Create's (an id the model's vocabulary does not hold,
// too few tokens for one sample of the context).
absl::StatusOr<std::unique_ptr<TokenDataset>> LoadTokenDataset(const std::string& path,
                                                               int64_t context, int64_t vocab_size);

// Reads the whole file at `path` (held in memory). Errors name the file: NOT_FOUND when it
// does not exist; INVALID_ARGUMENT when it is empty or shorter than context + 1 bytes, or
// context < 1; other codes for I/O errors (from errno).
absl::StatusOr<std::unique_ptr<TextDataset>> LoadTextDataset(const std::string& path,
                                                             int64_t context);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_
