#include "train/data/text_dataset.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "train/data/token_file.h"

namespace ringmaster::train::data {
namespace {

// The description of a language-modelling data set of `size` tokens cut into windows of
// context + 1; INVALID_ARGUMENT naming `name` when there is not one whole window. `kind` and
// `unit` say what it is in messages ("text", "bytes").
absl::StatusOr<DatasetInfo> WindowInfo(std::string name, absl::string_view kind,
                                       absl::string_view unit, int64_t size, int64_t context,
                                       int64_t vocab_size) {
  if (context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " data set ", name, ": context ", context, " must be at least 1"));
  }
  if (size < context + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, " data set ", name, " has ", size, " ", unit, size == 0 ? " (it is empty)" : "",
        "; one sample of context ", context, " needs ", context + 1, " ", unit,
        ": use a longer file or a smaller context"));
  }
  return DatasetInfo{.name = std::move(name),
                     .size = (size - 1) / context,
                     .context = context,
                     .vocab_size = vocab_size};
}

// Sample i of `tokens` is [i * context, i * context + context + 1).
template <typename Token>
void GatherWindows(const Token* tokens, absl::Span<const int64_t> indices, Batch& batch) {
  const int64_t context = batch.context;
  batch.tokens.resize(indices.size() * (context + 1));
  int32_t* out = batch.tokens.data();
  for (int64_t index : indices) {
    const Token* window = tokens + index * context;
    for (int64_t j = 0; j <= context; ++j) *out++ = window[j];
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextDataset>> TextDataset::Create(std::string name,
                                                                 std::string bytes,
                                                                 int64_t context) {
  absl::StatusOr<DatasetInfo> info =
      WindowInfo(std::move(name), "text", "bytes", static_cast<int64_t>(bytes.size()), context,
                 kByteVocabularySize);
  if (!info.ok()) return info.status();
  return std::unique_ptr<TextDataset>(new TextDataset(*std::move(info), std::move(bytes)));
}

TextDataset::TextDataset(DatasetInfo info, std::string bytes)
    : Dataset(std::move(info)), bytes_(std::move(bytes)) {}

void TextDataset::GatherValid(absl::Span<const int64_t> indices, Batch& batch) const {
  batch.context = info().context;
  GatherWindows(reinterpret_cast<const uint8_t*>(bytes_.data()), indices, batch);
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

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Create(std::string name,
                                                                   std::vector<uint16_t> tokens,
                                                                   int64_t context,
                                                                   int64_t vocab_size) {
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token data set ", name, ": vocabulary ", vocab_size, " must be at least 1"));
  }
  if (absl::Status s = CheckTokenVocabulary(name, tokens, vocab_size); !s.ok()) return s;
  absl::StatusOr<DatasetInfo> info = WindowInfo(
      std::move(name), "token", "tokens", static_cast<int64_t>(tokens.size()), context, vocab_size);
  if (!info.ok()) return info.status();
  return std::unique_ptr<TokenDataset>(new TokenDataset(*std::move(info), std::move(tokens)));
}

TokenDataset::TokenDataset(DatasetInfo info, std::vector<uint16_t> tokens)
    : Dataset(std::move(info)), tokens_(std::move(tokens)) {}

void TokenDataset::GatherValid(absl::Span<const int64_t> indices, Batch& batch) const {
  batch.context = info().context;
  GatherWindows(tokens_.data(), indices, batch);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> LoadTokenDataset(const std::string& path,
                                                               int64_t context,
                                                               int64_t vocab_size) {
  absl::StatusOr<std::vector<uint16_t>> tokens = ReadTokenFile(path);
  if (!tokens.ok()) return tokens.status();
  return TokenDataset::Create(path, *std::move(tokens), context, vocab_size);
}

}  // namespace ringmaster::train::data
