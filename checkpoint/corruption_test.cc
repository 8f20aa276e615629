// Damage to a committed checkpoint is found and named: a flipped byte in each block of each
// shard and anywhere in MANIFEST, a truncated, extended or deleted shard, a missing
// MANIFEST, another job's manifest. VerifyCheckpoint checks everything; a load checks what
// it reads.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

// Flips every bit of byte `offset` of `path` while alive.
class FlippedByte {
 public:
  FlippedByte(std::string path, int64_t offset) : path_(std::move(path)), original_(Slurp(path_)) {
    std::string bad = original_;
    bad[offset] = static_cast<char>(~bad[offset]);
    Spit(path_, bad);
  }
  ~FlippedByte() { Spit(path_, original_); }

 private:
  const std::string path_;
  const std::string original_;
};

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::FreshDir("corruption");
    table_ = testing::TestTable(4);  // about 13k elements: several 4 KiB blocks per chunk
    testing::WorldOptions world;
    world.root = root_;
    world.table = &table_;
    world.world = 3;
    world.zero_stage = 2;
    world.base.block_bytes = 4096;
    world.base.poll_interval = absl::Milliseconds(1);
    for (const absl::Status& s : testing::SaveWorld(world, 12)) ASSERT_TRUE(s.ok()) << s;
    dir_ = JoinPath(JobDir(root_, "job"), "step-12");
    manifest_ = *ReadManifest(Env::Default(), dir_);
    elements_ = testing::PaddedElements(table_, 3);
  }

  LoadOptions Load() const {
    LoadOptions o;
    o.root = root_;
    o.job = "job";
    o.spec_hash = 0x5eed;
    return o;
  }

  // Loads `range` of `buffer`.
  absl::Status LoadRange(const std::string& buffer, state::FlatRange range) const {
    std::vector<float> out(range.size());
    return LoadCheckpoint(Load(), {{buffer, range, absl::MakeSpan(out)}}).status();
  }

  absl::Status Verify() const { return VerifyCheckpoint(Env::Default(), dir_).status(); }

  std::string root_;
  state::TensorTable table_;
  std::string dir_;
  Manifest manifest_;
  int64_t elements_ = 0;
};

TEST_F(CorruptionTest, AnIntactCheckpointVerifiesAndLoads) {
  absl::StatusOr<VerifyReport> v = VerifyCheckpoint(Env::Default(), dir_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->step, 12);
  EXPECT_EQ(v->files, 3);
  EXPECT_EQ(v->bytes, 3 * elements_ * 4);
  int64_t blocks = 0;
  for (const ChunkEntry& c : manifest_.chunks()) blocks += c.block_xxh3_size();
  EXPECT_EQ(v->blocks, blocks);
  EXPECT_GT(blocks, 3 * 3 * 3);  // more than 3 blocks in each of the 9 chunks
  EXPECT_TRUE(LoadRange("params", {0, elements_}).ok());
}

TEST_F(CorruptionTest, AFlippedByteInAnyBlockOfAnyShardIsNamed) {
  int flips = 0;
  for (const ChunkEntry& c : manifest_.chunks()) {
    const std::string path = JoinPath(dir_, c.file());
    for (int64_t b = 0; b < c.block_xxh3_size(); ++b) {
      const int64_t block_offset = c.offset() + b * c.block_bytes();
      const int64_t block_size = std::min(c.block_bytes(), c.length() - b * c.block_bytes());
      // The first byte of the first block, the last byte of the last, the middle otherwise.
      const int64_t at = b == 0                         ? block_offset
                         : b + 1 == c.block_xxh3_size() ? block_offset + block_size - 1
                                                        : block_offset + block_size / 2;
      SCOPED_TRACE(absl::StrCat(c.file(), " byte ", at, " (", c.buffer(), " block ", b, ")"));
      FlippedByte flip(path, at);
      const std::string where =
          absl::StrCat(c.file(), ": checksum mismatch in the block at offset ", block_offset);
      absl::Status v = Verify();
      EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(std::string(v.message()), HasSubstr(where));
      // A load that needs these elements fails the same way ...
      const int64_t first = c.begin() + b * c.block_bytes() / 4;
      absl::Status load = LoadRange(c.buffer(), {first, first + 1});
      EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(std::string(load.message()), HasSubstr(where));
      // ... and one that does not, reads around the damage.
      const std::string other = c.buffer() == "params" ? "exp_avg" : "params";
      EXPECT_TRUE(LoadRange(other, {0, elements_}).ok());
      ++flips;
    }
  }
  EXPECT_GT(flips, 27);
  EXPECT_TRUE(Verify().ok());  // every flip undone
}

TEST_F(CorruptionTest, AFlippedByteAnywhereInTheManifestIsDataLoss) {
  const std::string path = JoinPath(dir_, kManifestName);
  const int64_t size = static_cast<int64_t>(Slurp(path).size());
  ASSERT_GT(size, 500);
  for (int64_t at = 0; at < size; ++at) {
    FlippedByte flip(path, at);
    absl::Status load = LoadRange("params", {0, 16});
    ASSERT_EQ(load.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << load;
    ASSERT_THAT(std::string(load.message()), HasSubstr("MANIFEST")) << at;
    ASSERT_THAT(std::string(load.message()), HasSubstr("offset")) << at;
    ASSERT_EQ(Verify().code(), absl::StatusCode::kDataLoss) << at;
  }
}

TEST_F(CorruptionTest, ManifestHeaderDamageNamesThePart) {
  const std::string path = JoinPath(dir_, kManifestName);
  struct Case {
    int64_t at;
    const char* says;
  };
  for (const Case& c : {Case{0, "bad magic at offset 0"}, Case{9, "the length at offset 8"},
                        Case{17, "the header (offset 16)"}, Case{30, "checksum mismatch"}}) {
    FlippedByte flip(path, c.at);
    EXPECT_THAT(std::string(Verify().message()), HasSubstr(c.says)) << c.at;
  }
  const std::string whole = Slurp(path);
  Spit(path, whole.substr(0, whole.size() - 1));
  EXPECT_THAT(std::string(Verify().message()), HasSubstr("truncated or extended"));
  Spit(path, whole.substr(0, 10));
  EXPECT_THAT(std::string(Verify().message()), HasSubstr("shorter than the 24-byte header"));
  Spit(path, whole);
}

TEST_F(CorruptionTest, ManifestJsonIsCheckedByVerifyAndNotNeededToLoad) {
  const std::string path = JoinPath(dir_, kManifestJsonName);
  const int64_t size = static_cast<int64_t>(Slurp(path).size());
  for (int64_t at = 0; at < size; at += 97) {
    FlippedByte flip(path, at);
    absl::Status v = Verify();
    EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << at;
    EXPECT_THAT(std::string(v.message()), HasSubstr("manifest.json")) << at;
    EXPECT_TRUE(LoadRange("params", {0, elements_}).ok());
  }
  ASSERT_TRUE(Env::Default()->DeleteFile(path).ok());
  EXPECT_THAT(std::string(Verify().message()), HasSubstr("manifest.json"));
}

TEST_F(CorruptionTest, ATruncatedShardIsNamedWithTheOffset) {
  const std::string path = JoinPath(dir_, "shard-1-of-3.bin");
  const std::string whole = Slurp(path);
  Spit(path, whole.substr(0, whole.size() / 2));
  const std::string where =
      absl::StrCat("shard-1-of-3.bin: truncated at offset ", whole.size() / 2);
  absl::Status v = Verify();
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(v.message()), HasSubstr(where));
  const int64_t shard = elements_ / 3;
  absl::Status load = LoadRange("exp_avg_sq", {shard, 2 * shard});  // rank 1's
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(load.message()), HasSubstr(where));
  EXPECT_TRUE(LoadRange("exp_avg_sq", {0, shard}).ok());  // rank 0's
}

TEST_F(CorruptionTest, TrailingBytesAreFoundByVerify) {
  const std::string path = JoinPath(dir_, "shard-0-of-3.bin");
  Spit(path, Slurp(path) + "junk");
  absl::Status v = Verify();
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(v.message()), HasSubstr("shard-0-of-3.bin: 4 bytes after offset"));
}

TEST_F(CorruptionTest, AMissingShardIsNamed) {
  ASSERT_TRUE(Env::Default()->DeleteFile(JoinPath(dir_, "shard-2-of-3.bin")).ok());
  absl::Status v = Verify();
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(v.message()), HasSubstr("shard-2-of-3.bin: the shard file is missing"));
  absl::Status load = LoadRange("params", {0, elements_});
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(load.message()),
              HasSubstr("shard-2-of-3.bin: the shard file is missing"));
}

TEST_F(CorruptionTest, AMissingManifestIsDataLoss) {
  ASSERT_TRUE(Env::Default()->DeleteFile(JoinPath(dir_, kManifestName)).ok());
  absl::Status load = LoadRange("params", {0, 16});
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(load.message()), HasSubstr("MANIFEST is missing"));
}

TEST_F(CorruptionTest, AnotherJobsCheckpointIsFailedPreconditionWithBothHashes) {
  LoadOptions o = Load();
  o.spec_hash = 0xabcdef;
  std::vector<float> out(16);
  absl::Status s = LoadCheckpoint(o, {{"params", {0, 16}, absl::MakeSpan(out)}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x0000000000005eed"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x0000000000abcdef"));
  o.spec_hash = 0x5eed;
  const state::TensorTable bigger = testing::TestTable(5);
  o.table = &bigger;
  s = LoadCheckpoint(o, {{"params", {0, 16}, absl::MakeSpan(out)}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the checkpoint's tensors differ"));
  o.table = &table_;
  EXPECT_TRUE(LoadCheckpoint(o, {{"params", {0, 16}, absl::MakeSpan(out)}}).ok());
  s = LoadRange("momentum", {0, 16});  // an SGD trainer asking an AdamW checkpoint
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no buffer \"momentum\""));
}

// A checkpoint records its spec's fields: a resume with another spec is refused naming each
// field that differs (and what to do, where the caller knows), or loaded across the changes
// the caller allows (a job trained longer).
TEST(SpecChanges, ARefusalNamesTheFieldsThatDifferAndAllowedOnesLoad) {
  const std::string root = testing::FreshDir("spec-changes");
  const state::TensorTable table = testing::TestTable(2);
  testing::WorldOptions world;
  world.root = root;
  world.table = &table;
  world.base.poll_interval = absl::Milliseconds(1);
  world.base.training_spec = "seed: 1\nsteps: 10\noptimizer.lr: 0.1\n";
  for (const absl::Status& s : testing::SaveWorld(world, 10)) ASSERT_TRUE(s.ok()) << s;
  LoadOptions o;
  o.root = root;
  o.job = "job";
  o.spec_hash = 0x1234;
  o.training_spec = "seed: 1\nsteps: 20\noptimizer.lr: 0.2\nbatch.global: 8\n";
  o.spec_change_hints["steps"] = "submit it with --extend to train it longer";
  absl::Status s = OpenCheckpoint(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the fields that differ: batch.global: (unset) in the checkpoint, 8 "
                        "here; optimizer.lr: 0.1 in the checkpoint, 0.2 here; steps: 10 in the "
                        "checkpoint, 20 here (submit it with --extend to train it longer)"));
  // Allowed: steps. The rest still refuses.
  o.spec_changes_allowed = {"steps"};
  s = OpenCheckpoint(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("steps")));
  // Only the length differs, and that is allowed: loaded, the change said.
  o.training_spec = "seed: 1\nsteps: 20\noptimizer.lr: 0.1\n";
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->state.step, 10);
  EXPECT_THAT(opened->spec_changes, ::testing::ElementsAre("steps: 10 -> 20"));
  // Without this job's text (or the checkpoint's), the hashes only.
  o.training_spec.clear();
  s = OpenCheckpoint(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x0000000000001234"));
}

TEST_F(CorruptionTest, LatestAndStepsResolveOrSayWhy) {
  LoadOptions o = Load();
  o.step = 11;
  std::vector<float> out(16);
  absl::Status s = LoadCheckpoint(o, {{"params", {0, 16}, absl::MakeSpan(out)}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("it has steps 12"));
  o.job = "other";
  o.step = std::nullopt;
  s = LoadCheckpoint(o, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no checkpoint in"));

  const std::string latest = JoinPath(JobDir(root_, "job"), kLatestName);
  Spit(latest, "step-13\n");
  EXPECT_EQ(LoadRange("params", {0, 16}).code(), absl::StatusCode::kDataLoss);
  Spit(latest, "garbage");
  EXPECT_EQ(LoadRange("params", {0, 16}).code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(Env::Default()->DeleteFile(latest).ok());
  EXPECT_TRUE(LoadRange("params", {0, 16}).ok());  // the newest step without LATEST
}

TEST_F(CorruptionTest, ListAndDescribe) {
  testing::WorldOptions world;
  world.root = root_;
  world.table = &table_;
  world.base.poll_interval = absl::Milliseconds(1);
  ASSERT_TRUE(testing::SaveWorld(world, 20)[0].ok());
  FlippedByte flip(JoinPath(dir_, kManifestName), 40);
  absl::StatusOr<std::vector<CheckpointInfo>> list =
      ListCheckpoints(Env::Default(), JobDir(root_, "job"));
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 12);
  EXPECT_EQ((*list)[0].status.code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE((*list)[0].latest);
  EXPECT_EQ((*list)[1].step, 20);
  EXPECT_TRUE((*list)[1].latest);
  EXPECT_EQ((*list)[1].world_size, 1);
  EXPECT_EQ((*list)[1].bytes, 3 * testing::PaddedElements(table_, 1) * 4);
  const std::string table = DescribeCheckpoints(*list);
  EXPECT_THAT(table, HasSubstr("unreadable"));
  EXPECT_THAT(table, HasSubstr("LATEST"));

  const std::string text =
      DescribeManifest(*ReadManifest(Env::Default(), JoinPath(JobDir(root_, "job"), "step-20")));
  for (const char* part :
       {"job job at step 20", "spec hash 0x0000000000005eed", "exp_avg_sq", "shard-0-of-1.bin",
        "fc1.weight", "[124, 61]", "loss scale", "epoch 2 cursor 2560"}) {
    EXPECT_THAT(text, HasSubstr(part));
  }
}

// ZeRO-3's pieces (a chunk per piece, many per rank): a flipped byte in any piece is named
// by verify and by a load that needs it; the other rank's pieces still load.
TEST(CorruptionOfPieces, AFlippedByteInAnyPieceIsNamedAndTheOtherRanksPiecesLoad) {
  const state::TensorTable table = testing::TestTable(4);
  testing::WorldOptions world;
  world.root = testing::FreshDir("corruption-pieces");
  world.table = &table;
  world.world = 2;
  world.zero_stage = 3;
  world.units = 5;
  world.base.block_bytes = 4096;
  world.base.poll_interval = absl::Milliseconds(1);
  for (const absl::Status& s : testing::SaveWorld(world, 12)) ASSERT_TRUE(s.ok()) << s;
  const std::string dir = JoinPath(JobDir(world.root, "job"), "step-12");
  absl::StatusOr<Manifest> manifest = ReadManifest(Env::Default(), dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->chunks_size(), 3 * 5 * 2);
  const int64_t elements = testing::PaddedElements(table, 2);
  LoadOptions load;
  load.root = world.root;
  load.job = "job";
  // Loads every piece of `buffer` that rank `rank` holds.
  auto load_pieces = [&](const std::string& buffer, int rank) {
    std::vector<state::FlatRange> pieces = testing::UnitPieces(elements, 5, rank, 2);
    std::vector<std::vector<float>> outs;
    std::vector<LoadTarget> targets;
    for (const state::FlatRange& p : pieces) outs.emplace_back(p.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      targets.push_back({buffer, pieces[i], absl::MakeSpan(outs[i])});
    }
    return LoadCheckpoint(load, targets).status();
  };
  for (const ChunkEntry& c : manifest->chunks()) {
    SCOPED_TRACE(absl::StrCat(c.file(), ": ", c.buffer(), " [", c.begin(), ", ", c.end(), ")"));
    const int64_t at = c.offset() + c.length() / 2;
    const int64_t block = c.offset() + (c.length() / 2) / c.block_bytes() * c.block_bytes();
    FlippedByte flip(JoinPath(dir, c.file()), at);
    const std::string where =
        absl::StrCat(c.file(), ": checksum mismatch in the block at offset ", block);
    absl::Status v = VerifyCheckpoint(Env::Default(), dir).status();
    EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(v.message()), HasSubstr(where));
    absl::Status mine = load_pieces(c.buffer(), c.rank());
    EXPECT_EQ(mine.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(mine.message()), HasSubstr(where));
    EXPECT_TRUE(load_pieces(c.buffer(), 1 - c.rank()).ok());
  }
  EXPECT_TRUE(VerifyCheckpoint(Env::Default(), dir).ok());  // every flip undone
}

}  // namespace
}  // namespace ringmaster::checkpoint
