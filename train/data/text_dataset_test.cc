#include "train/data/text_dataset.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/test_files.h"
#include "train/data/token_file.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> Codes(absl::string_view text) {
  std::vector<int32_t> out;
  for (char c : text) out.push_back(static_cast<uint8_t>(c));
  return out;
}

TEST(TextDatasetTest, WindowsOverlapByOneByte) {
  // 11 bytes, context 3: (11 - 1) / 3 = 3 samples "abcd", "defg", "ghij"; "k" is unused.
  const std::string path = WriteTestFile("abc.txt", "abcdefghijk", Compression::kNone);
  auto data = LoadTextDataset(path, 3);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->size(), 3);
  EXPECT_EQ((*data)->info().context, 3);
  EXPECT_EQ((*data)->info().vocab_size, 256);
  EXPECT_EQ((*data)->info().name, path);

  Batch batch;
  batch.features = {1.0f};  // stale fields of another kind are cleared
  batch.labels = {1};
  batch.feature_dim = 1;
  ASSERT_TRUE((*data)->Gather(std::vector<int64_t>{2, 0, 1}, &batch).ok());
  EXPECT_EQ(batch.size, 3);
  EXPECT_EQ(batch.context, 3);
  EXPECT_EQ(batch.tokens, Codes("ghijabcddefg"));
  EXPECT_TRUE(batch.features.empty());
  EXPECT_TRUE(batch.labels.empty());
  EXPECT_EQ(batch.feature_dim, 0);

  EXPECT_EQ((*data)->Gather(std::vector<int64_t>{3}, &batch).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TextDatasetTest, SampleCountIsSizeMinusOneOverContext) {
  // Independent count: windows [i*c, i*c + c + 1) that fit in n bytes.
  for (int64_t n = 2; n <= 40; ++n) {
    for (int64_t context = 1; context < n; ++context) {
      auto data = TextDataset::Create("synthetic", std::string(n, 'x'), context);
      ASSERT_TRUE(data.ok()) << data.status();
      int64_t fitting = 0;
      while (fitting * context + context + 1 <= n) ++fitting;
      EXPECT_EQ((*data)->size(), fitting) << "n " << n << " context " << context;
    }
  }
}

TEST(TextDatasetTest, BytesAboveAsciiAreTokensUpTo255) {
  auto data = TextDataset::Create("binary", std::string("\xff\x00\x80", 3), 2);
  ASSERT_TRUE(data.ok()) << data.status();
  Batch batch;
  ASSERT_TRUE((*data)->Gather(std::vector<int64_t>{0}, &batch).ok());
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{255, 0, 128}));
}

TEST(TextDatasetTest, TooShortFileNamesFileSizeAndContext) {
  const std::string path = WriteTestFile("short.txt", "abcd", Compression::kNone);
  auto data = LoadTextDataset(path, 4);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
  EXPECT_THAT(data.status().message(), HasSubstr("has 4 bytes"));
  EXPECT_THAT(data.status().message(), HasSubstr("context 4 needs 5 bytes"));
  EXPECT_TRUE(LoadTextDataset(path, 3).ok());
}

TEST(TextDatasetTest, EmptyFileSaysItIsEmpty) {
  const std::string path = WriteTestFile("empty.txt", "", Compression::kNone);
  auto data = LoadTextDataset(path, 8);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
  EXPECT_THAT(data.status().message(), HasSubstr("is empty"));
}

TEST(TextDatasetTest, MissingFileIsNotFound) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/no-such.txt");
  auto data = LoadTextDataset(path, 8);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
}

TEST(TextDatasetTest, ContextMustBePositive) {
  auto data = TextDataset::Create("synthetic", "abc", 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr("context 0"));
}

// Token files are cut exactly as text: the same windows over the same sequence.
TEST(TokenDatasetTest, WindowsMatchTheTextPath) {
  const std::string text = "the quick brown fox jumps";
  std::vector<int32_t> ids(text.begin(), text.end());
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/fox.bin");
  ASSERT_TRUE(WriteTokenFile(path, ids).ok());
  auto tokens = LoadTokenDataset(path, 4, 256);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto bytes = TextDataset::Create("fox", text, 4);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*tokens)->size(), (*bytes)->size());
  EXPECT_EQ((*tokens)->info().context, 4);
  EXPECT_EQ((*tokens)->info().vocab_size, 256);
  EXPECT_EQ((*tokens)->info().name, path);
  std::vector<int64_t> all;
  for (int64_t i = (*bytes)->size() - 1; i >= 0; --i) all.push_back(i);
  Batch a, b;
  ASSERT_TRUE((*tokens)->Gather(all, &a).ok());
  ASSERT_TRUE((*bytes)->Gather(all, &b).ok());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.context, 4);
}

TEST(TokenDatasetTest, IdsAboveTheBytesReachTheBatch) {
  auto data = TokenDataset::Create("gpt2", {50256, 464, 2068, 7586}, 3, 50257);
  ASSERT_TRUE(data.ok()) << data.status();
  Batch batch;
  ASSERT_TRUE((*data)->Gather(std::vector<int64_t>{0}, &batch).ok());
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{50256, 464, 2068, 7586}));
}

TEST(TokenDatasetTest, VocabularyMismatchNamesTheFile) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/gpt2.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<int32_t>{50256, 464, 2068, 7586, 11}).ok());
  auto data = LoadTokenDataset(path, 2, 256);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
  EXPECT_THAT(data.status().message(), HasSubstr("token 50256 at position 0"));
  EXPECT_TRUE(LoadTokenDataset(path, 2, 50257).ok());
}

TEST(TokenDatasetTest, TooFewTokensAndBadFilesNameTheFile) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/few.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<int32_t>{1, 2, 3}).ok());
  auto data = LoadTokenDataset(path, 3, 256);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
  EXPECT_THAT(data.status().message(), HasSubstr("has 3 tokens"));
  const std::string text = WriteTestFile("not_tokens.bin", "plain text", Compression::kNone);
  EXPECT_EQ(LoadTokenDataset(text, 3, 256).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(TokenDataset::Create("x", {1, 2}, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringmaster::train::data
