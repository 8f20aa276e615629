#include "train/data/idx.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/test_files.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// 2 images of 3x4 pixels with values 0..23.
std::string SmallImages() {
  std::string out = IdxHeader(kImagesMagic, {2, 3, 4});
  for (int i = 0; i < 24; ++i) out.push_back(static_cast<char>(i * 10));
  return out;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Expects DATA_LOSS naming `path` and containing each of `parts`.
void ExpectDataLoss(const std::string& path, int rank, const std::vector<std::string>& parts) {
  auto result = ReadIdxFile(path, rank);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(path));
  for (const std::string& part : parts) EXPECT_THAT(result.status().message(), HasSubstr(part));
}

class IdxTest : public ::testing::TestWithParam<Compression> {
 protected:
  // Writes `contents` with the test's compression under a name unique to the test.
  std::string Write(const std::string& contents) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = absl::StrCat(info->name(), ".idx");
    for (char& c : name) c = (c == '/') ? '_' : c;
    return WriteTestFile(name, contents, GetParam());
  }
};

TEST_P(IdxTest, ReadsImages) {
  auto array = ReadIdxFile(Write(SmallImages()), 3);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(array->data.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(array->data[i], i * 10) << i;
}

TEST_P(IdxTest, ReadsLabels) {
  auto array = ReadIdxFile(Write(IdxHeader(kLabelsMagic, {3}) + std::string("\x07\x00\x09", 3)), 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(array->data, (std::vector<uint8_t>{7, 0, 9}));
}

TEST_P(IdxTest, EmptyArrayIsValid) {
  auto array = ReadIdxFile(Write(IdxHeader(kLabelsMagic, {0})), 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{0}));
  EXPECT_TRUE(array->data.empty());
}

TEST_P(IdxTest, WrongMagic) {
  std::string bytes = SmallImages();
  bytes[0] = 0x1f;
  ExpectDataLoss(Write(bytes), 3, {"not an IDX file", "0x1f000803", "0x00000803"});
}

TEST_P(IdxTest, UnsupportedType) {
  std::string bytes = SmallImages();
  bytes[2] = 0x0D;  // float
  ExpectDataLoss(Write(bytes), 3, {"element type 0x0d"});
}

TEST_P(IdxTest, WrongRank) { ExpectDataLoss(Write(SmallImages()), 1, {"rank 3, expected 1"}); }

TEST_P(IdxTest, TruncatedData) {
  ExpectDataLoss(Write(SmallImages().substr(0, 16 + 20)), 3, {"truncated", "need 24", "only 20"});
}

TEST_P(IdxTest, TruncatedHeader) {
  ExpectDataLoss(Write(SmallImages().substr(0, 10)), 3, {"dimensions", "6 of 12"});
  ExpectDataLoss(Write(""), 3, {"magic number", "0 of 4"});
}

TEST_P(IdxTest, DimensionsDisagreeWithData) {
  // The header says 3 labels, the file holds 5.
  ExpectDataLoss(Write(IdxHeader(kLabelsMagic, {3}) + "abcde"), 1, {"trailing bytes", "3 data"});
}

TEST_P(IdxTest, TrailingByte) {
  ExpectDataLoss(Write(SmallImages() + "x"), 3, {"trailing bytes", "24 data bytes"});
}

TEST_P(IdxTest, HugeDimensionsAreRefusedNotAllocated) {
  ExpectDataLoss(Write(IdxHeader(kImagesMagic, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF})), 3,
                 {"exceed"});
  // Large but representable: fails as truncated after reading what is there.
  ExpectDataLoss(Write(IdxHeader(kImagesMagic, {1000000, 28, 28}) + "abc"), 3,
                 {"need 784000000", "only 3"});
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxTest,
                         ::testing::Values(Compression::kNone, Compression::kGzip),
                         [](const auto& info) {
                           return info.param == Compression::kGzip ? "gzip" : "plain";
                         });

TEST(IdxFileTest, MissingFileIsNotFound) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/no-such-file.gz");
  auto result = ReadIdxFile(path, 1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(path));
}

TEST(IdxFileTest, DirectoryIsRefused) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/a-directory");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  auto result = ReadIdxFile(path, 1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(path));
}

// Rewrites byte `offset` from the end of a file.
void FlipByteFromEnd(const std::string& path, size_t offset) {
  std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), offset);
  bytes[bytes.size() - offset] ^= 0x5A;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(IdxGzipTest, BadTrailerIsDataLoss) {
  // The gzip trailer is the CRC32 (4 bytes) then the uncompressed length (4 bytes).
  for (auto [offset, what] : {std::pair<size_t, std::string>{8, "incorrect data check"},
                              std::pair<size_t, std::string>{4, "incorrect length check"}}) {
    const std::string path =
        WriteTestFile(absl::StrCat("trailer-", offset, ".gz"), SmallImages(), Compression::kGzip);
    FlipByteFromEnd(path, offset);
    ExpectDataLoss(path, 3, {absl::StrCat("corrupt gzip data: ", what)});
  }
}

TEST(IdxGzipTest, TruncatedStreamIsDataLoss) {
  // Enough data that a cut in the middle of the compressed stream loses data bytes.
  std::string contents = IdxHeader(kImagesMagic, {100, 28, 28});
  uint32_t x = 12345;
  for (int i = 0; i < 100 * 28 * 28; ++i) {
    x = x * 1664525u + 1013904223u;
    contents.push_back(static_cast<char>(x >> 24));
  }
  // Cut in the middle: data bytes are lost.
  const std::string cut = WriteTestFile("cut.gz", contents, Compression::kGzip);
  const std::string compressed = ReadBytes(cut);
  std::ofstream(cut, std::ios::binary | std::ios::trunc)
      << compressed.substr(0, compressed.size() / 2);
  ExpectDataLoss(cut, 3, {"need 78400", "the gzip stream ends early"});

  // Only the 8-byte trailer missing: every data byte is there but the CRC is not.
  const std::string no_trailer = WriteTestFile("no-trailer.gz", contents, Compression::kGzip);
  std::ofstream(no_trailer, std::ios::binary | std::ios::trunc)
      << compressed.substr(0, compressed.size() - 8);
  ExpectDataLoss(no_trailer, 3, {"ends before its trailer"});
}

}  // namespace
}  // namespace ringmaster::train::data
