#include "train/tensorboard_writer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/tensorboard_event.pb.h"
#include "train/tensorboard_test_reader.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;
using tensorboard::Event;

std::string TempDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TEST(Crc32c, KnownVectorAndAgreesWithTheBitwiseDefinition) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(ReferenceCrc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  std::mt19937 rng(7);
  for (size_t n : {1, 3, 8, 15, 16, 17, 63, 64, 65, 1000, 4097}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(Crc32c(data), ReferenceCrc32c(data)) << n;
    EXPECT_EQ(MaskedCrc32c(data), ReferenceMasked(data)) << n;
  }
}

TEST(TfRecord, FramesLengthDataAndTheirMaskedCrcs) {
  const std::string record = TfRecord("abc");
  ASSERT_EQ(record.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(ReadLittleEndian(absl::string_view(record).substr(8, 4)),
            ReferenceMasked(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(ReadLittleEndian(absl::string_view(record).substr(15, 4)), ReferenceMasked("abc"));
}

TEST(TensorBoardWriter, WritesAVersionRecordThenOneEventPerCall) {
  TensorBoardWriterOptions options;
  options.dir = TempDir("runs/a/tb");  // its parents do not exist yet
  options.start = absl::FromUnixSeconds(1700000000) + absl::Milliseconds(250);
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer = TensorBoardWriter::Create(options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ((*writer)->path(), absl::StrCat(options.dir, "/events.out.tfevents.1700000000.",
                                            host, ".", getpid()));

  ASSERT_TRUE((*writer)
                  ->WriteScalars(20, absl::FromUnixSeconds(1700000010),
                                 {{"loss", 2.25}, {"lr", 0.1}, {"samples_per_second", 1234.5}})
                  .ok());
  // Readable after each call, without closing the writer.
  EXPECT_EQ(ReadEvents((*writer)->path()).size(), 2u);
  ASSERT_TRUE((*writer)->WriteScalars(40, absl::FromUnixSeconds(1700000020), {{"loss", 1.5}}).ok());

  const std::vector<Event> events = ReadEvents((*writer)->path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time(), 1700000000.25);
  EXPECT_FALSE(events[0].has_summary());

  EXPECT_EQ(events[1].step(), 20);
  EXPECT_DOUBLE_EQ(events[1].wall_time(), 1700000010);
  ASSERT_EQ(events[1].summary().value_size(), 3);
  EXPECT_EQ(events[1].summary().value(0).tag(), "loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.25f);
  EXPECT_EQ(events[1].summary().value(1).tag(), "lr");
  EXPECT_EQ(events[1].summary().value(1).simple_value(), 0.1f);
  EXPECT_EQ(events[1].summary().value(2).tag(), "samples_per_second");
  EXPECT_EQ(events[1].summary().value(2).simple_value(), 1234.5f);
  EXPECT_EQ(events[2].step(), 40);
  ASSERT_EQ(events[2].summary().value_size(), 1);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1.5f);
}

TEST(TensorBoardWriter, ASecondWriterStartsAnotherFile) {
  TensorBoardWriterOptions options;
  options.dir = TempDir("twice");
  options.start = absl::FromUnixSeconds(1700000000);
  auto first = TensorBoardWriter::Create(options);
  auto second = TensorBoardWriter::Create(options);  // same process, same second
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->path(), absl::StrCat((*first)->path(), ".1"));
  ASSERT_TRUE((*first)->WriteScalars(1, options.start, {{"loss", 3}}).ok());
  ASSERT_TRUE((*second)->WriteScalars(2, options.start, {{"loss", 2}}).ok());
  EXPECT_EQ(ReadEvents((*first)->path()).back().step(), 1);
  EXPECT_EQ(ReadEvents((*second)->path()).back().step(), 2);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.dir)) {
    EXPECT_TRUE(absl::StrContains(entry.path().filename().string(), "tfevents"));
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST(TensorBoardWriter, ErrorsNameTheDirectory) {
  const std::string file = TempDir("plain_file");
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  TensorBoardWriterOptions options;
  options.dir = file + "/tb";
  auto writer = TensorBoardWriter::Create(options);
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(writer.status().message(), HasSubstr(options.dir));
  EXPECT_THAT(writer.status().message(), HasSubstr("metrics.tensorboard"));
  options.dir = "";
  EXPECT_EQ(TensorBoardWriter::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringmaster::train
