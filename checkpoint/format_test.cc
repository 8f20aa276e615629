#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/framed_file.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(Frame, RoundTripsAndNamesEveryKindOfDamage) {
  const std::string framed = Frame(kReportMagic, "payload bytes");
  ASSERT_EQ(framed.size(), kFrameHeaderBytes + 13);
  EXPECT_EQ(*Unframe(kReportMagic, framed, "f"), "payload bytes");
  EXPECT_EQ(*Unframe(kReportMagic, Frame(kReportMagic, ""), "f"), "");

  auto error = [](absl::string_view magic, const std::string& bytes) {
    absl::StatusOr<absl::string_view> r = Unframe(magic, bytes, "dir/F");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    return std::string(r.status().message());
  };
  EXPECT_THAT(error(kManifestMagic, framed), HasSubstr("dir/F: bad magic at offset 0"));
  EXPECT_THAT(error(kReportMagic, framed.substr(0, 20)), HasSubstr("truncated"));
  EXPECT_THAT(error(kReportMagic, framed + "x"), HasSubstr("the length at offset 8"));
  for (size_t at = 16; at < framed.size(); ++at) {
    std::string bad = framed;
    bad[at] ^= 0x20;
    EXPECT_THAT(error(kReportMagic, bad), HasSubstr("checksum mismatch")) << at;
  }
}

TEST(Layout, NamesParseBack) {
  EXPECT_EQ(StepDirName(120), "step-120");
  EXPECT_EQ(ParseStepDirName("step-120"), 120);
  EXPECT_EQ(ParseStepDirName("step-0"), 0);
  for (const char* bad : {"step-", "step-01", "step--1", "step-1x", "tmp-step-1", "step-1 "}) {
    EXPECT_EQ(ParseStepDirName(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(SaveDirName(7, 3), "tmp-step-7-save-3");
  EXPECT_EQ(ParseSaveDirNumber("tmp-step-7-save-3"), 3);
  EXPECT_EQ(ParseSaveDirNumber("tmp-deleting-step-7"), std::nullopt);
  EXPECT_EQ(ParseSaveDirNumber("step-7"), std::nullopt);
  EXPECT_EQ(ShardFileName(2, 8), "shard-2-of-8.bin");
  EXPECT_EQ(ReportFileName(2, 8), "report-2-of-8.pb");
  EXPECT_EQ(ParseFailedMarker(FailedMarkerName(2, 8, 8), 2, 8), 8);
  EXPECT_EQ(ParseFailedMarker(FailedMarkerName(2, 8, 8), 3, 8), std::nullopt);
  EXPECT_EQ(JobDir("/ckpt/", "mnist"), "/ckpt/mnist");
}

TEST(TrainingState, RoundTripsThroughTheProto) {
  TrainingState with = testing::PatternState(1234);
  ASSERT_TRUE(with.loss_scaler.has_value());
  EXPECT_EQ(FromProto(ToProto(with)), with);
  TrainingState without = with;
  without.loss_scaler.reset();
  EXPECT_EQ(FromProto(ToProto(without)), without);
  EXPECT_FALSE(ToProto(without).has_loss_scaler());
}

// A sound two-rank manifest of one 100-element buffer, blocks of 40 bytes.
Manifest TwoRanks() {
  Manifest m;
  m.set_format_version(kFormatVersion);
  BufferEntry* b = m.add_buffers();
  b->set_name("params");
  b->set_dtype("f32");
  b->set_elements(100);
  for (int r = 0; r < 2; ++r) {
    ShardFile* f = m.add_files();
    f->set_name(ShardFileName(r, 2));
    f->set_bytes(200);
    ChunkEntry* c = m.add_chunks();
    c->set_buffer("params");
    c->set_begin(50 * r);
    c->set_end(50 * r + 50);
    c->set_file(ShardFileName(r, 2));
    c->set_length(200);
    c->set_block_bytes(40);
    for (int k = 0; k < 5; ++k) c->add_block_xxh3(k);
  }
  return m;
}

TEST(ManifestProblems, SoundManifestHasNone) {
  EXPECT_THAT(ManifestProblems(TwoRanks()), IsEmpty());
}

TEST(ManifestProblems, GapsOverlapsAndBadChunksAreNamed) {
  Manifest gap = TwoRanks();
  gap.mutable_chunks(1)->set_begin(60);
  gap.mutable_chunks(1)->set_length(160);
  gap.mutable_chunks(1)->mutable_block_xxh3()->RemoveLast();
  EXPECT_THAT(ManifestProblems(gap),
              ElementsAre("buffer params: elements [50, 60) are in no chunk"));

  Manifest overlap = TwoRanks();
  overlap.mutable_chunks(1)->set_begin(40);
  overlap.mutable_chunks(1)->set_length(240);
  overlap.mutable_files(1)->set_bytes(240);
  overlap.mutable_chunks(1)->add_block_xxh3(9);
  EXPECT_THAT(ManifestProblems(overlap),
              ElementsAre("buffer params: elements [40, 50) are in more than one chunk"));

  Manifest blocks = TwoRanks();
  blocks.mutable_chunks(0)->add_block_xxh3(5);
  EXPECT_THAT(ManifestProblems(blocks)[0], HasSubstr("6 checksums for 200 bytes"));

  Manifest beyond = TwoRanks();
  beyond.mutable_chunks(0)->set_offset(8);
  EXPECT_THAT(ManifestProblems(beyond)[0], HasSubstr("the file's 200 bytes"));

  Manifest unknown = TwoRanks();
  unknown.mutable_chunks(0)->set_buffer("exp_avg");
  std::vector<std::string> p = ManifestProblems(unknown);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_THAT(p[0], HasSubstr("no such buffer"));
  EXPECT_EQ(p[1], "buffer params: elements [0, 50) are in no chunk");

  Manifest file = TwoRanks();
  file.mutable_chunks(1)->set_file("../escape");
  EXPECT_THAT(ManifestProblems(file)[0], HasSubstr("no such file"));
}

TEST(Manifest, JsonRoundTrips) {
  Manifest m = TwoRanks();
  *m.mutable_training() = ToProto(testing::PatternState(5));
  m.set_spec_hash(0xffffffffffffffffull);
  absl::StatusOr<Manifest> back = ManifestFromJson(ManifestToJson(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), JsonMirror(m).SerializeAsString());
  EXPECT_EQ(back->chunks(1).block_bytes(), 40);
  EXPECT_EQ(back->chunks(1).block_xxh3_size(), 0);  // only in MANIFEST
  EXPECT_THAT(ManifestToJson(m), HasSubstr("\"spec_hash\": \"18446744073709551615\""));
  EXPECT_EQ(ManifestFromJson("{nope").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Manifest, TensorTableMustMatch) {
  const state::TensorTable table = testing::TestTable(1);
  Manifest m;
  EXPECT_TRUE(CheckTensorTable(m, table).ok());  // written without a table
  for (const TensorEntry& t : TensorEntries(table)) *m.add_tensors() = t;
  EXPECT_TRUE(CheckTensorTable(m, table).ok());
  absl::Status s = CheckTensorTable(m, testing::TestTable(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 0: the checkpoint has embed [97, 13] at 0, the model has embed "
                        "[194, 13] at 0"));
  m.mutable_tensors()->RemoveLast();
  EXPECT_THAT(std::string(CheckTensorTable(m, table).message()), HasSubstr("has none"));
}

}  // namespace
}  // namespace ringmaster::checkpoint
