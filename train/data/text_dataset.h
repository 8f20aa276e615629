// Byte-level language modelling data: a file's bytes are the tokens (vocabulary 256).
//
// Sample i is the context + 1 bytes [i * context, i * context + context + 1): windows that
// do not overlap except for one byte, so that the model reads columns 0..context-1 and
// predicts columns 1..context of every sample (train/batch.h). The data set has
// (file_size - 1) / context samples; the bytes after the last whole window are unused.
//
// Thread-safety: see train/data/dataset.h (immutable; Gather is safe from many threads).
#ifndef RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_
#define RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// Reads the whole file at `path` (held in memory). Errors name the file: NOT_FOUND when it
// does not exist; INVALID_ARGUMENT when it is empty or shorter than context + 1 bytes, or
// context < 1; other codes for I/O errors (from errno).
absl::StatusOr<std::unique_ptr<TextDataset>> LoadTextDataset(const std::string& path,
                                                             int64_t context);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_TEXT_DATASET_H_
