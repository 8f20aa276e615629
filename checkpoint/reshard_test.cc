// N -> M resharding: a checkpoint saved by N ranks (ZeRO off: plain slices; ZeRO 1, 2:
// shards) loads into M ranks at any ZeRO stage, bit for bit, reading at most 5 % more than
// each rank needs.
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/reader.h"
#include "checkpoint/testing.h"
#include "checkpoint/writer.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

using testing::FreshDir;
using testing::LoadWorld;
using testing::SaveWorld;
using testing::WorldOptions;

std::vector<std::pair<int, int>> WorldPairs() {
  std::vector<std::pair<int, int>> pairs;
  for (int n = 1; n <= 6; ++n) {
    for (int m = 1; m <= 6; ++m) pairs.emplace_back(n, m);
  }
  pairs.emplace_back(8, 5);
  pairs.emplace_back(7, 3);
  return pairs;
}

class ReshardTest : public ::testing::TestWithParam<int> {};  // ZeRO stage at save

TEST_P(ReshardTest, EveryWorldSizeAndStageLoadsBitForBit) {
  const int save_stage = GetParam();
  // Scale 64: about 330k elements (1.3 MB) per buffer, so that M = 6 ranks need ranges of
  // 50 blocks and more.
  const state::TensorTable table = testing::TestTable(64);
  int checked = 0;
  for (const auto& [n, m] : WorldPairs()) {
    SCOPED_TRACE(absl::StrCat(n, " -> ", m, " ranks, ZeRO ", save_stage, " at save"));
    WorldOptions save;
    save.root = FreshDir(absl::StrCat("reshard-", save_stage));
    save.table = &table;
    save.world = n;
    save.zero_stage = save_stage;
    save.base.poll_interval = absl::Milliseconds(1);
    const int64_t step = 100 * n + m;
    std::vector<absl::Status> saved = SaveWorld(save, step);
    for (int r = 0; r < n; ++r) ASSERT_TRUE(saved[r].ok()) << "rank " << r << ": " << saved[r];

    for (int load_stage = 0; load_stage <= 2; ++load_stage) {
      SCOPED_TRACE(absl::StrCat("ZeRO ", load_stage, " at load"));
      WorldOptions load_world = save;
      load_world.world = m;
      load_world.zero_stage = load_stage;
      LoadOptions load;
      load.root = save.root;
      load.job = save.job;
      load.spec_hash = save.spec_hash;
      absl::StatusOr<testing::LoadCheck> check = LoadWorld(load_world, load);
      ASSERT_TRUE(check.ok()) << check.status();
      EXPECT_EQ(check->step, step);
      EXPECT_TRUE(check->mismatches.empty()) << absl::StrJoin(check->mismatches, "\n");
      for (int r = 0; r < m; ++r) {
        const ReadStats& s = check->stats[r];
        EXPECT_GT(s.bytes_needed, 0);
        EXPECT_GE(s.bytes_read, s.bytes_needed) << "rank " << r;
        EXPECT_LE(s.bytes_read, s.bytes_needed * 1.05)
            << "rank " << r << " read " << s.bytes_read << " for " << s.bytes_needed;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 38 * 3);
}

INSTANTIATE_TEST_SUITE_P(SaveStage, ReshardTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Zero", info.param);
                         });

// A rank that needs one tensor in the middle of another rank's chunk reads only the blocks
// under it: the independent bound is the blocks the range touches.
TEST(Reshard, ReadsOnlyTheBlocksUnderTheWantedRange) {
  const state::TensorTable table = testing::TestTable(64);
  WorldOptions save;
  save.root = FreshDir("reshard-narrow");
  save.table = &table;
  save.world = 2;
  save.base.block_bytes = 4096;
  save.base.poll_interval = absl::Milliseconds(1);
  std::vector<absl::Status> saved = SaveWorld(save, 7);
  ASSERT_TRUE(saved[0].ok() && saved[1].ok()) << saved[0] << saved[1];

  const state::TensorSpec& t = table.tensor(*table.Find("fc1.weight"));
  std::vector<float> out(t.numel);
  LoadOptions load;
  load.root = save.root;
  load.job = save.job;
  absl::StatusOr<LoadResult> r =
      LoadCheckpoint(load, {{"exp_avg", {t.offset, t.offset + t.numel}, absl::MakeSpan(out)}});
  ASSERT_TRUE(r.ok()) << r.status();
  // Blocks of 1024 elements; rank 1's chunk starts at a multiple of 16 elements, so the
  // range touches at most ceil(numel / 1024) + 2 blocks (a boundary may cut one more).
  const int64_t max_blocks = (t.numel + 1023) / 1024 + 2;
  EXPECT_EQ(r->stats.bytes_needed, t.numel * 4);
  EXPECT_LE(r->stats.blocks_read, max_blocks);
  EXPECT_LE(r->stats.bytes_read, max_blocks * 4096);
  for (int64_t i = 0; i < t.numel; ++i) {
    ASSERT_EQ(out[i], testing::PatternValue("exp_avg", 7, t.offset + i, table.total_elements()))
        << i;
  }
}

// With the writer's automatic block size, a buffer of 4 MiB or more loads into as many as
// 100 ranks reading within 5 % of what each needs.
TEST(Reshard, AHundredRanksReadWithinFivePercent) {
  const int64_t elements = (16 << 20) / 4 + 12345;  // 16 MiB and a bit: ranges cut blocks
  const std::vector<float> data = testing::PatternBuffer("exp_avg", 1, elements, elements);
  const std::string root = FreshDir("reshard-hundred");
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < 3; ++r) {
    CheckpointWriterOptions o;
    o.root = root;
    o.job = "job";
    o.rank = r;
    o.world_size = 3;
    o.poll_interval = absl::Milliseconds(1);
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> w = CheckpointWriter::Create(o);
    ASSERT_TRUE(w.ok()) << w.status();
    writers.push_back(*std::move(w));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const state::FlatRange range = SaveSlice(elements, r, 3);
      SaveRequest request;
      request.step = 1;
      request.buffers.push_back({"exp_avg", elements, range,
                                 absl::MakeConstSpan(data).subspan(range.begin, range.size())});
      EXPECT_TRUE(writers[r]->SaveSync(request, absl::InfiniteFuture()).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  LoadOptions load;
  load.root = root;
  load.job = "job";
  for (int r = 0; r < 100; ++r) {
    const state::FlatRange range = SaveSlice(elements, r, 100);
    std::vector<float> out(range.size());
    absl::StatusOr<LoadResult> loaded =
        LoadCheckpoint(load, {{"exp_avg", range, absl::MakeSpan(out)}});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_LE(loaded->stats.bytes_read, loaded->stats.bytes_needed * 1.05) << "rank " << r;
    ASSERT_EQ(std::memcmp(out.data(), data.data() + range.begin, out.size() * 4), 0) << r;
  }
}

// A range past the saved buffer's end (a larger world pads the flat space further) reads
// zeros there; a range of the padding only reads nothing.
TEST(Reshard, PaddingPastTheSavedBufferIsZero) {
  const state::TensorTable table = testing::TestTable(1);
  WorldOptions save;
  save.root = FreshDir("reshard-padding");
  save.table = &table;
  save.base.poll_interval = absl::Milliseconds(1);
  ASSERT_TRUE(SaveWorld(save, 3)[0].ok());
  const int64_t elements = testing::PaddedElements(table, 1);
  std::vector<float> out(100, -1.0f);
  LoadOptions load;
  load.root = save.root;
  load.job = save.job;
  absl::StatusOr<LoadResult> r =
      LoadCheckpoint(load, {{"params", {elements + 10, elements + 110}, absl::MakeSpan(out)}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.bytes_read, 0);
  EXPECT_EQ(r->stats.bytes_needed, 0);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
}

}  // namespace
}  // namespace ringmaster::checkpoint
