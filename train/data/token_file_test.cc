#include "train/data/token_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/test_files.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

void AppendLe32(int32_t v, std::string& out) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(static_cast<uint32_t>(v) >> (8 * i)));
}

// A file in llm.c's layout built byte by byte (write_datafile: np.int32 header of 256, then
// np.uint16 tokens), independently of WriteTokenFile.
std::string LlmcFile(int32_t magic, int32_t version, int32_t count,
                     const std::vector<uint16_t>& tokens) {
  std::string out;
  AppendLe32(magic, out);
  AppendLe32(version, out);
  AppendLe32(count, out);
  out.append(253 * 4, '\0');
  for (uint16_t t : tokens) {
    out.push_back(static_cast<char>(t & 0xFF));
    out.push_back(static_cast<char>(t >> 8));
  }
  return out;
}

TEST(TokenFileTest, ReadsFilesInLlmcLayout) {
  const std::vector<uint16_t> tokens = {50256, 464, 0, 65535, 13, 198};
  const std::string path =
      WriteTestFile("llmc.bin", LlmcFile(20240520, 1, 6, tokens), Compression::kNone);
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, tokens);
}

TEST(TokenFileTest, WritesLlmcLayoutAndRoundTrips) {
  const std::vector<int32_t> ids = {50256, 15496, 11, 995, 0, 65535};
  const std::string path = TmpPath("round_trip.bin");
  ASSERT_TRUE(WriteTokenFile(path, ids).ok());
  // Byte for byte what llm.c's write_datafile writes.
  const std::string expected =
      LlmcFile(20240520, 1, 6, std::vector<uint16_t>(ids.begin(), ids.end()));
  std::string bytes;
  {
    FILE* f = fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
    fclose(f);
  }
  EXPECT_EQ(bytes, expected);
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::vector<int32_t>(read->begin(), read->end()), ids);
}

TEST(TokenFileTest, EmptyFileRoundTrips) {
  const std::string path = TmpPath("empty.bin");
  ASSERT_TRUE(WriteTokenFile(path, {}).ok());
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->empty());
}

// Every refusal names the file and says what is wrong.
void ExpectRefused(const std::string& name, const std::string& contents, absl::StatusCode code,
                   const std::string& what) {
  const std::string path = WriteTestFile(name, contents, Compression::kNone);
  auto read = ReadTokenFile(path);
  EXPECT_EQ(read.status().code(), code) << name << ": " << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr(path)) << name;
  EXPECT_THAT(read.status().message(), HasSubstr(what)) << name;
}

TEST(TokenFileTest, RefusesCorruptFilesNamingThem) {
  const std::vector<uint16_t> three = {1, 2, 3};
  ExpectRefused("bad_magic.bin", LlmcFile(20240521, 1, 3, three), absl::StatusCode::kDataLoss,
                "bad magic 20240521");
  // llm.c's LLaMA-3 files have another magic (and uint32 tokens).
  ExpectRefused("llama.bin", LlmcFile(20240801, 7, 3, three), absl::StatusCode::kDataLoss,
                "bad magic 20240801");
  ExpectRefused("version.bin", LlmcFile(20240520, 2, 3, three), absl::StatusCode::kDataLoss,
                "version 2");
  ExpectRefused("short_header.bin", LlmcFile(20240520, 1, 0, {}).substr(0, 1000),
                absl::StatusCode::kDataLoss, "truncated: 1000 bytes");
  ExpectRefused("empty_file.bin", "", absl::StatusCode::kDataLoss, "truncated: 0 bytes");
  ExpectRefused("truncated.bin", LlmcFile(20240520, 1, 4, three), absl::StatusCode::kDataLoss,
                "truncated: the header says 4 tokens (8 bytes) but 6 bytes");
  ExpectRefused("odd.bin", LlmcFile(20240520, 1, 3, three) + "x", absl::StatusCode::kDataLoss,
                "1 bytes after the 3 tokens");
  ExpectRefused("negative.bin", LlmcFile(20240520, 1, -5, three), absl::StatusCode::kDataLoss,
                "negative token count -5");
}

TEST(TokenFileTest, MissingFileAndDirectory) {
  const std::string missing = TmpPath("no-such.bin");
  EXPECT_EQ(ReadTokenFile(missing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ReadTokenFile(missing).status().message(), HasSubstr(missing));
  const std::string dir = TmpPath("a_dir.bin");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  EXPECT_EQ(ReadTokenFile(dir).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ReadTokenFile(dir).status().message(), HasSubstr(dir));
}

TEST(TokenFileTest, WriterRefusesIdsOutsideSixteenBits) {
  const std::string path = TmpPath("wide.bin");
  for (int32_t bad : {65536, -1}) {
    absl::Status s = WriteTokenFile(path, std::vector<int32_t>{1, 2, bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(path));
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("token ", bad, " at position 2")));
  }
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0) << "nothing is written for a refused file";
}

TEST(TokenFileTest, VocabularyCheckNamesFilePositionAndId) {
  const std::vector<uint16_t> tokens = {10, 255, 256, 300};
  EXPECT_TRUE(CheckTokenVocabulary("f.bin", tokens, 301).ok());
  absl::Status s = CheckTokenVocabulary("f.bin", tokens, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("f.bin"));
  EXPECT_THAT(s.message(), HasSubstr("token 256 at position 2"));
  EXPECT_THAT(s.message(), HasSubstr("vocabulary of 256"));
}

}  // namespace
}  // namespace ringmaster::train::data
