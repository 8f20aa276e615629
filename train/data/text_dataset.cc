#include "train/data/text_dataset.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace ringmaster::train::data {

absl::StatusOr<std::unique_ptr<TextDataset>> TextDataset::Create(std::string name,
                                                                 std::string bytes,
                                                                 int64_t context) {
  if (context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("text data set ", name, ": context ", context, " must be at least 1"));
  }
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < context + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("text data set ", name, " has ", size, " bytes",
                     size == 0 ? " (it is empty)" : "", "; one sample of context ", context,
                     " needs ", context + 1, " bytes: use a longer file or a smaller context"));
  }
  DatasetInfo info{.name = std::move(name),
                   .size = (size - 1) / context,
                   .context = context,
                   .vocab_size = kByteVocabularySize};
  return std::unique_ptr<TextDataset>(new TextDataset(std::move(info), std::move(bytes)));
}

TextDataset::TextDataset(DatasetInfo info, std::string bytes)
    : Dataset(std::move(info)), bytes_(std::move(bytes)) {}

void TextDataset::GatherValid(absl::Span<const int64_t> indices, Batch& batch) const {
  const int64_t context = info().context;
  batch.context = context;
  batch.tokens.resize(indices.size() * (context + 1));
  int32_t* out = batch.tokens.data();
  for (int64_t index : indices) {
    const auto* window = reinterpret_cast<const uint8_t*>(bytes_.data()) + index * context;
    for (int64_t j = 0; j <= context; ++j) *out++ = window[j];
  }
}

absl::StatusOr<std::unique_ptr<TextDataset>> LoadTextDataset(const std::string& path,
                                                             int64_t context) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("text data set: ", bytes.status().message()));
  }
  return TextDataset::Create(path, *std::move(bytes), context);
}

}  // namespace ringmaster::train::data
