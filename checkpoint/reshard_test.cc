// N -> M resharding: a checkpoint saved by N ranks (ZeRO off: plain slices; ZeRO 1, 2:
// shards) loads into M ranks at any ZeRO stage, bit for bit, reading at most 5 % more than
// each rank needs.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
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

// Loads LATEST of `world.root` into `world` (its size, stage or units) and expects the
// pattern of `step`, bit for bit, each rank reading every byte it needs; each rank's read
// stats (none when the load failed).
std::vector<ReadStats> ExpectLoadsBitForBit(const WorldOptions& world, int64_t step) {
  LoadOptions load;
  load.root = world.root;
  load.job = world.job;
  load.spec_hash = world.spec_hash;
  absl::StatusOr<testing::LoadCheck> check = LoadWorld(world, load);
  EXPECT_TRUE(check.ok()) << check.status();
  if (!check.ok()) return {};
  EXPECT_EQ(check->step, step);
  EXPECT_TRUE(check->mismatches.empty()) << absl::StrJoin(check->mismatches, "\n");
  for (int r = 0; r < world.world; ++r) {
    EXPECT_GE(check->stats[r].bytes_read, check->stats[r].bytes_needed) << "rank " << r;
  }
  return check->stats;
}

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
      const std::vector<ReadStats> stats = ExpectLoadsBitForBit(load_world, step);
      ASSERT_EQ(stats.size(), static_cast<size_t>(m));
      for (int r = 0; r < m; ++r) {
        const ReadStats& s = stats[r];
        EXPECT_GT(s.bytes_needed, 0);
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

// Saved under ZeRO-2/3 (each rank a piece of every unit, units {1, 3, 7}) or by contiguous
// ranges, loaded under any of them at another world size: bit for bit, each rank reading
// every byte it needs; in the layout it was saved in (the same units and world), exactly
// those bytes.
TEST(Reshard, UnitPiecesAndContiguousRangesLoadIntoEachOtherAtAnyWorldSize) {
  const state::TensorTable table = testing::TestTable(8);  // about 40k elements per buffer
  struct Layout {
    int zero_stage;
    int units;  // 0: the ranges of zero_stage
  };
  const std::vector<Layout> layouts = {{0, 0}, {2, 0}, {3, 1}, {3, 3}, {3, 7}};
  int checked = 0;
  for (const Layout& saved_as : layouts) {
    for (int n : {1, 2, 3, 4}) {
      WorldOptions save;
      save.root = FreshDir("reshard-units");
      save.table = &table;
      save.world = n;
      save.zero_stage = saved_as.zero_stage;
      save.units = saved_as.units;
      save.base.poll_interval = absl::Milliseconds(1);
      const int64_t step = 10 * n + saved_as.units;
      std::vector<absl::Status> saved = SaveWorld(save, step);
      for (int r = 0; r < n; ++r) ASSERT_TRUE(saved[r].ok()) << "rank " << r << ": " << saved[r];
      for (const Layout& load_as : layouts) {
        if (saved_as.units == 0 && load_as.units == 0) continue;  // ReshardTest does those
        for (int m : {1, 2, 3, 5}) {
          SCOPED_TRACE(absl::StrCat(n, " ranks in ", saved_as.units, " units (ZeRO ",
                                    saved_as.zero_stage, ") -> ", m, " ranks in ", load_as.units,
                                    " units (ZeRO ", load_as.zero_stage, ")"));
          WorldOptions load_world = save;
          load_world.world = m;
          load_world.zero_stage = load_as.zero_stage;
          load_world.units = load_as.units;
          const std::vector<ReadStats> stats = ExpectLoadsBitForBit(load_world, step);
          ASSERT_EQ(stats.size(), static_cast<size_t>(m));
          if (m == n && load_as.units == saved_as.units) {
            for (int r = 0; r < m; ++r) {
              EXPECT_EQ(stats[r].bytes_read, stats[r].bytes_needed) << "rank " << r;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 4 * 3 * 4 + 3 * 4 * 5 * 4);
}

// The example: rank 0 of 2 holds [0, 16) and [32, 48) of "params" and of a moment,
// rank 1 [16, 32) and [48, 64), each back to back in a local buffer of 32. Their checkpoint
// has a chunk per piece and loads into 3 ranks holding contiguous ranges; a checkpoint of
// those 3 ranks loads back into the pieces.
TEST(Reshard, InterleavedPiecesOfTwoRanksAndContiguousRangesOfThreeLoadIntoEachOther) {
  constexpr int64_t kN = 64;
  const std::vector<std::string> names = {"params", "exp_avg"};
  const std::vector<std::vector<state::PlacedRange>> pieces = {
      {{{0, 16}, 0}, {{32, 48}, 16}}, {{{16, 32}, 0}, {{48, 64}, 16}}};
  const std::vector<state::FlatRange> contiguous = {{0, 21}, {21, 42}, {42, 64}};
  // Saves with one writer per rank; rank r's request holds pieces(r) of each buffer.
  auto save_world = [&](const std::string& root, int world, int64_t step,
                        const std::function<std::vector<state::PlacedRange>(int)>& pieces_of,
                        const std::function<absl::Span<const float>(int, size_t)>& local) {
    CheckpointWriterOptions o;
    o.root = root;
    o.job = "job";
    o.block_bytes = 16;  // blocks of 4 elements: pieces cut blocks of the other layout
    o.poll_interval = absl::Milliseconds(1);
    absl::StatusOr<std::vector<std::unique_ptr<CheckpointWriter>>> made =
        testing::CreateWriters(o, world);
    ASSERT_TRUE(made.ok()) << made.status();
    std::vector<std::unique_ptr<CheckpointWriter>>& writers = *made;
    std::vector<absl::Status> statuses(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        SaveRequest request;
        request.step = step;
        for (const state::PlacedRange& p : pieces_of(r)) {
          for (size_t b = 0; b < names.size(); ++b) {
            request.buffers.push_back(
                {names[b], kN, p.range, local(r, b).subspan(p.at, p.range.size())});
          }
        }
        statuses[r] = writers[r]->SaveSync(request, absl::InfiniteFuture());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << statuses[r];
  };
  auto want = [&](size_t b, int64_t step, int64_t i) {
    return testing::PatternValue(names[b], step, i, kN);
  };

  // 2 ranks in pieces -> 3 contiguous ranks.
  const std::string pieces_root = FreshDir("reshard-interleaved");
  std::vector<std::vector<std::vector<float>>> locals(2);  // [rank][buffer]
  for (int r = 0; r < 2; ++r) {
    for (size_t b = 0; b < names.size(); ++b) {
      std::vector<float>& local = locals[r].emplace_back(32);
      for (const state::PlacedRange& p : pieces[r]) {
        for (int64_t i = p.range.begin; i < p.range.end; ++i) {
          local[p.at + i - p.range.begin] = want(b, 1, i);
        }
      }
    }
  }
  save_world(
      pieces_root, 2, 1, [&](int r) { return pieces[r]; },
      [&](int r, size_t b) { return absl::MakeConstSpan(locals[r][b]); });
  absl::StatusOr<Manifest> m = ReadManifest(Env::Default(), JoinPath(JobDir(pieces_root, "job"),
                                                                     "step-1"));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->chunks_size(), 8);  // a chunk per piece, each buffer's in flat order
  for (int c = 0; c < 8; ++c) {
    const ChunkEntry& chunk = m->chunks(c);
    EXPECT_EQ(chunk.buffer(), names[c / 4]) << c;
    EXPECT_EQ(chunk.begin(), 16 * (c % 4)) << c;
    EXPECT_EQ(chunk.end(), 16 * (c % 4 + 1)) << c;
    EXPECT_EQ(chunk.rank(), c % 2) << c;
    EXPECT_EQ(chunk.file(), absl::StrCat("shard-", c % 2, "-of-2.bin")) << c;
  }
  LoadOptions load;
  load.root = pieces_root;
  load.job = "job";
  for (int r = 0; r < 3; ++r) {
    const state::FlatRange range = contiguous[r];
    std::vector<std::vector<float>> outs(names.size(), std::vector<float>(range.size(), -1));
    std::vector<LoadTarget> targets;
    for (size_t b = 0; b < names.size(); ++b) {
      targets.push_back({names[b], range, absl::MakeSpan(outs[b])});
    }
    absl::StatusOr<LoadResult> loaded = LoadCheckpoint(load, targets);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    for (size_t b = 0; b < names.size(); ++b) {
      for (int64_t i = range.begin; i < range.end; ++i) {
        const float w = want(b, 1, i);
        ASSERT_EQ(std::memcmp(&outs[b][i - range.begin], &w, 4), 0)
            << "rank " << r << " of 3: " << names[b] << "[" << i << "]";
      }
    }
  }

  // 3 contiguous ranks -> 2 ranks in pieces, read into their local buffers.
  const std::string contiguous_root = FreshDir("reshard-contiguous");
  std::vector<std::vector<float>> full;
  for (size_t b = 0; b < names.size(); ++b) {
    std::vector<float>& v = full.emplace_back(kN);
    for (int64_t i = 0; i < kN; ++i) v[i] = want(b, 2, i);
  }
  save_world(
      contiguous_root, 3, 2, [&](int r) { return std::vector{state::InPlace(contiguous[r])}; },
      [&](int, size_t b) { return absl::MakeConstSpan(full[b]); });
  load.root = contiguous_root;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::vector<float>> local(names.size(), std::vector<float>(32, -1));
    std::vector<LoadTarget> targets;
    for (const state::PlacedRange& p : pieces[r]) {
      for (size_t b = 0; b < names.size(); ++b) {
        targets.push_back(
            {names[b], p.range, absl::MakeSpan(local[b]).subspan(p.at, p.range.size())});
      }
    }
    absl::StatusOr<LoadResult> loaded = LoadCheckpoint(load, targets);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->stats.bytes_needed, 2 * 32 * 4);
    for (const state::PlacedRange& p : pieces[r]) {
      for (size_t b = 0; b < names.size(); ++b) {
        for (int64_t i = p.range.begin; i < p.range.end; ++i) {
          const float w = want(b, 2, i);
          ASSERT_EQ(std::memcmp(&local[b][p.at + i - p.range.begin], &w, 4), 0)
              << "rank " << r << " of 2: " << names[b] << "[" << i << "]";
        }
      }
    }
  }
}

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
