#include "train/data/gpt2_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster::train::data {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// GPT-2's files from tools/setup.sh, loaded once; the tests fail (not skip) without them.
class Gpt2TokenizerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (loaded_ == nullptr) {
      loaded_ = new absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>>(Gpt2Tokenizer::Create());
    }
  }
  void SetUp() override { ASSERT_TRUE(loaded_->ok()) << loaded_->status(); }

  static const Gpt2Tokenizer& Gpt2() { return ***loaded_; }

 private:
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>>* loaded_;
};
absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>>* Gpt2TokenizerTest::loaded_ = nullptr;

std::vector<std::string> Pieces(absl::string_view text) {
  std::vector<std::string> pieces;
  for (absl::string_view p : Gpt2PreTokenize(text)) pieces.emplace_back(p);
  return pieces;
}

TEST(Gpt2PreTokenizeTest, SplitsAsGpt2sPattern) {
  EXPECT_THAT(Pieces("Hello world"), ElementsAre("Hello", " world"));
  // Contractions: lower case only, and only at the start of a piece.
  EXPECT_THAT(Pieces("I'm sure it's"), ElementsAre("I", "'m", " sure", " it", "'s"));
  EXPECT_THAT(Pieces("we'll they've you're he'd don't"),
              ElementsAre("we", "'ll", " they", "'ve", " you", "'re", " he", "'d", " don", "'t"));
  EXPECT_THAT(Pieces("I'M"), ElementsAre("I", "'", "M"));
  EXPECT_THAT(Pieces("?'s"), ElementsAre("?'", "s"));
  EXPECT_THAT(Pieces(" 's"), ElementsAre(" '", "s"));
  // Letters, numbers and the rest are separate runs, each with one optional leading space.
  EXPECT_THAT(Pieces("abc123 456!? x"), ElementsAre("abc", "123", " 456", "!?", " x"));
  // A run of white space leaves its last character to the word after it.
  EXPECT_THAT(Pieces("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Pieces("x  \ty"), ElementsAre("x", "  ", "\t", "y"));
  EXPECT_THAT(Pieces("end   "), ElementsAre("end", "   "));
  EXPECT_THAT(Pieces("line\n\nnext\n"), ElementsAre("line", "\n", "\n", "next", "\n"));
  EXPECT_THAT(Pieces(" "), ElementsAre(" "));
  EXPECT_THAT(Pieces(""), ElementsAre());
  // Non-ASCII: letters (é, CJK), numbers (½, Arabic-Indic digits), white space (U+3000,
  // no-break space), symbols (emoji).
  EXPECT_THAT(Pieces(" café 日本語"), ElementsAre(" café", " 日本語"));
  EXPECT_THAT(Pieces("½٣x"), ElementsAre("½٣", "x"));
  EXPECT_THAT(Pieces("a\u3000\u00a0b"), ElementsAre("a", "\u3000", "\u00a0", "b"));
  EXPECT_THAT(Pieces("ok 👍🎉!"), ElementsAre("ok", " 👍🎉!"));
}

TEST(Gpt2PreTokenizeTest, InvalidUtf8BytesAreCharactersOfClassOther) {
  EXPECT_THAT(Pieces("a\xff"
                     "b"),
              ElementsAre("a", "\xff", "b"));
  EXPECT_THAT(Pieces("!\x80?"), ElementsAre("!\x80?"));
  EXPECT_THAT(Pieces("x\xe6\x97"), ElementsAre("x", "\xe6\x97"));          // truncated 日
  EXPECT_THAT(Pieces("\xed\xa0\x80z"), ElementsAre("\xed\xa0\x80", "z"));  // a surrogate
  EXPECT_THAT(Pieces("\xc0\xaf"
                     "a"),
              ElementsAre("\xc0\xaf", "a"));  // overlong '/'
}

TEST(Gpt2PreTokenizeTest, PiecesConcatenateToTheText) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(random() % 64, '\0');
    for (char& c : text) c = static_cast<char>(random());
    std::string joined;
    for (absl::string_view p : Gpt2PreTokenize(text)) {
      ASSERT_FALSE(p.empty());
      absl::StrAppend(&joined, p);
    }
    EXPECT_EQ(joined, text);
  }
}

// Token ids published for GPT-2 (the same from OpenAI's encoder.py and gpt-3-encoder).
TEST_F(Gpt2TokenizerTest, EncodesKnownStrings) {
  const Gpt2Tokenizer& t = Gpt2();
  EXPECT_EQ(t.vocabulary_size(), kGpt2VocabularySize);
  EXPECT_THAT(t.Encode("Hello world"), ElementsAre(15496, 995));
  EXPECT_THAT(t.Encode("I'm sure it's what they've said, we'll see"),
              ElementsAre(40, 1101, 1654, 340, 338, 644, 484, 1053, 531, 11, 356, 1183, 766));
  EXPECT_THAT(t.Encode("In 2024, 12345 people"), ElementsAre(818, 48609, 11, 17031, 2231, 661));
  EXPECT_THAT(t.Encode("a   b"), ElementsAre(64, 220, 220, 275));
  EXPECT_THAT(t.Encode("end   "), ElementsAre(437, 220, 220, 220));
  EXPECT_THAT(t.Encode("line\n\nnext\n"), ElementsAre(1370, 198, 198, 19545, 198));
  EXPECT_THAT(t.Encode("\tx"), ElementsAre(197, 87));
  EXPECT_THAT(t.Encode(" Héllo café"), ElementsAre(367, 2634, 18798, 40304));
  EXPECT_THAT(t.Encode("日本語"), ElementsAre(33768, 98, 17312, 105, 45739, 252));
  EXPECT_THAT(t.Encode("👍🎉"), ElementsAre(41840, 235, 8582, 236, 231));
  EXPECT_THAT(t.Encode("don'T"), ElementsAre(9099, 6, 51));
  EXPECT_THAT(t.Encode(""), ElementsAre());
  EXPECT_EQ(t.TokenBytes(15496), "Hello");
  EXPECT_EQ(t.TokenBytes(995), " world");
}

TEST_F(Gpt2TokenizerTest, DecodeOfEncodeGivesTheBytesBack) {
  const Gpt2Tokenizer& t = Gpt2();
  for (const std::string text :
       {"Hello world", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n\n",
        "Ünïcödé, 日本語, العربية, 👍🏽 and ½",
        "x\xff\xfe invalid \xc3 bytes \xed\xa0\x80"}) {
    absl::StatusOr<std::string> decoded = t.Decode(t.Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
  std::mt19937 random(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(random() % 100, '\0');
    for (char& c : text) c = static_cast<char>(trial % 2 ? random() : "ab 'é\n1."[random() % 8]);
    absl::StatusOr<std::string> decoded = t.Decode(t.Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST_F(Gpt2TokenizerTest, InvalidUtf8BytesAreTheirOwnByteTokens) {
  const Gpt2Tokenizer& t = Gpt2();
  const std::vector<int32_t> ids = t.Encode("\xff");
  ASSERT_EQ(ids.size(), 1);
  EXPECT_EQ(t.TokenBytes(ids[0]), "\xff");
}

TEST_F(Gpt2TokenizerTest, LongPiecesAndTheCacheGiveTheSameTokens) {
  Gpt2TokenizerOptions options;
  options.cache_entries = 0;
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> uncached = Gpt2Tokenizer::Create(options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  const std::string text =
      absl::StrCat(std::string(20000, 'a'), " the the the ", std::string(5000, '='), " the");
  const std::vector<int32_t> ids = Gpt2().Encode(text);
  EXPECT_EQ(Gpt2().Encode(text), ids);  // from the cache
  EXPECT_EQ(uncached.value()->Encode(text), ids);
  EXPECT_EQ(Gpt2().Decode(ids).value(), text);
}

TEST_F(Gpt2TokenizerTest, EncodesFromManyThreads) {
  const std::string text = "Many threads share one tokenizer and its cache. 1234 ";
  const std::vector<int32_t> expected = Gpt2().Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> same(4);  // not vector<bool>: each thread writes its own element
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      bool ok = true;
      for (int j = 0; j < 200; ++j) {
        ok = ok && Gpt2().Encode(absl::StrCat(text, j)) == Gpt2().Encode(absl::StrCat(text, j));
      }
      same[i] = ok && Gpt2().Encode(text) == expected;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(same, ElementsAre(1, 1, 1, 1));
}

TEST_F(Gpt2TokenizerTest, DecodeRefusesUnknownIds) {
  const absl::StatusOr<std::string> negative = Gpt2().Decode({15496, -1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("token 1 is -1"));
  const absl::StatusOr<std::string> too_big = Gpt2().Decode({kGpt2VocabularySize});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("50257"));
}

TEST(Gpt2TokenizerOptionsTest, RefusesANegativeCacheSize) {
  Gpt2TokenizerOptions options;
  options.cache_entries = -1;
  const absl::Status status = Gpt2Tokenizer::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cache_entries is -1"));
}

TEST_F(Gpt2TokenizerTest, MissingFilesSayToRunSetup) {
  Gpt2TokenizerOptions options;
  options.directory = testing::TempDir() + "/no-such-directory";
  const absl::Status status = Gpt2Tokenizer::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no-such-directory/encoder.json"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("tools/setup.sh"));
}

// A toy vocabulary in GPT-2's formats: encoder.json has the 256 single bytes and the
// results of the merges (unless listed in `unlisted`), or is `encoder_json` when given.
// Merges are "left right" in bytes_to_unicode's symbols (for ASCII letters, the letters).
struct ToyFiles {
  std::vector<std::string> merges;
  std::vector<std::string> unlisted;
  std::string encoder_json;
  std::string header = "#version: 0.2";
};

class ToyVocabularyTest : public testing::Test {
 protected:
  std::string Write(const ToyFiles& files) {
    const std::string directory = absl::StrCat(testing::TempDir(), "/toy", ++count_);
    std::filesystem::create_directories(directory);
    nlohmann::json encoder = nlohmann::json::object();
    // GPT-2's bytes_to_unicode, written out independently of the tokenizer's.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      encoder[Utf8(printable ? b : next++)] = b;
    }
    std::string bpe = files.header + "\n";
    for (const std::string& merge : files.merges) {
      bpe += merge + "\n";
      const std::vector<std::string> sides = absl::StrSplit(merge, ' ');
      if (sides.size() != 2) continue;  // a malformed line
      const std::string merged = sides[0] + sides[1];
      if (!encoder.contains(merged) && !absl::c_linear_search(files.unlisted, merged)) {
        encoder[merged] = static_cast<int>(encoder.size());
      }
    }
    std::ofstream(directory + "/encoder.json")
        << (files.encoder_json.empty() ? encoder.dump() : files.encoder_json);
    std::ofstream(directory + "/vocab.bpe") << bpe;
    return directory;
  }

  static std::string Utf8(int code_point) {
    if (code_point < 0x80) return std::string(1, static_cast<char>(code_point));
    return {static_cast<char>(0xC0 | code_point >> 6),
            static_cast<char>(0x80 | (code_point & 0x3F))};
  }

  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Create(const std::string& directory) {
    Gpt2TokenizerOptions options;
    options.directory = directory;
    return Gpt2Tokenizer::Create(options);
  }

  // The tokens of `text` as their bytes.
  static std::vector<std::string> Tokens(const Gpt2Tokenizer& t, absl::string_view text) {
    std::vector<std::string> tokens;
    for (int32_t id : t.Encode(text)) tokens.push_back(t.TokenBytes(id));
    return tokens;
  }

  int count_ = 0;
};

TEST_F(ToyVocabularyTest, MergesLowestRankFirstAndLeftToRight) {
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t =
      Create(Write({.merges = {"a a", "b c", "a bc", "aa aa", "Ġ a"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  const Gpt2Tokenizer& toy = **t;
  EXPECT_EQ(toy.vocabulary_size(), 256 + 5);
  EXPECT_THAT(Tokens(toy, "aaa"), ElementsAre("aa", "a"));  // left to right, no overlap
  EXPECT_THAT(Tokens(toy, "aaaa"), ElementsAre("aaaa"));
  EXPECT_THAT(Tokens(toy, "aaaaa"), ElementsAre("aaaa", "a"));
  // "a a" (rank 0) takes the first two a's, so "a bc" (rank 2) never applies.
  EXPECT_THAT(Tokens(toy, "aabc"), ElementsAre("aa", "bc"));
  EXPECT_THAT(Tokens(toy, "abc"), ElementsAre("abc"));
  // "a bc" (rank 2, once "b c" made bc) before "Ġ a" (rank 4).
  EXPECT_THAT(Tokens(toy, " abc"), ElementsAre(" ", "abc"));
  EXPECT_THAT(Tokens(toy, " a"), ElementsAre(" a"));
  EXPECT_THAT(Tokens(toy, "xyz"), ElementsAre("x", "y", "z"));
}

TEST_F(ToyVocabularyTest, MalformedFilesAreNamedWithTheEntryOrLine) {
  const auto expect_error = [&](const ToyFiles& files, const std::string& what) {
    const absl::Status status = Create(Write(files)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_THAT(std::string(status.message()), HasSubstr("tools/setup.sh"));
  };
  expect_error({.encoder_json = "[1, 2]"}, "encoder.json: not GPT-2's format");
  expect_error({.encoder_json = "{\"a\": 0,"}, "encoder.json: not GPT-2's format");
  expect_error({.encoder_json = R"({"a": 0, "b": 7})"}, "the id of \"b\" is 7");
  expect_error({.encoder_json = R"({"a": 0, "b": 0})"}, "id 0 appears twice");
  expect_error({.encoder_json = R"({"a": 0, " ": 1})"}, "\" \" (id 1) is not a byte-encoded");
  expect_error({.encoder_json = R"({"a": 0})"}, "no token for the single byte 0");
  expect_error({.header = "a b"}, "vocab.bpe: not GPT-2's format: line 1");
  expect_error({.merges = {"a a", "a b c"}}, "line 3 (\"a b c\") is not two symbols");
  expect_error({.merges = {"a b", "a  "}}, "line 3 (\"a  \") is not two symbols");
  expect_error({.merges = {"a a", "q ab"}}, "line 3 (\"q ab\"): \"ab\" is not in encoder.json");
  expect_error({.merges = {"a b"}, .unlisted = {"ab"}},
               "line 2 (\"a b\"): the merged token is not in encoder.json");
  expect_error({.merges = {"a aa", "a a"}}, "merge 1 uses the token \"aa\" that a later merge");
}

}  // namespace
}  // namespace ringmaster::train::data
