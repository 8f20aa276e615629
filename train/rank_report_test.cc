#include "train/rank_report.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

TEST(RankReport, EveryRankGetsEveryRanksFiguresInRankOrder) {
  comm::testing::MultiProcOptions options;
  options.world_size = 3;
  const auto results = comm::testing::RunRanks(
      options, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        const int r = comm.rank();
        RankResult mine;
        mine.set_rank(r);
        mine.set_pp_rank(r % 2);
        mine.set_dp_rank(r / 2);
        mine.set_tp_rank(7 - r);
        // Large byte counts stay exact (below 2^53).
        mine.set_parameter_bytes(static_cast<double>((int64_t{1} << 40) + r));
        mine.set_peak_rss_bytes(1e9 + r);
        mine.set_pipeline_bytes_per_step(1000.5 * r);
        mine.set_tensor_parallel_bytes_per_step(3 * r);
        mine.set_block_parameters(12345 + r);
        mine.set_pipeline_bubble(0.125 * r);
        mine.set_pipeline_peak_in_flight(r + 1);
        auto all = GatherRankResults(mine, comm, absl::Now() + absl::Seconds(30));
        if (!all.ok()) return all.status();
        if (all->size() != 3) return absl::InternalError(absl::StrCat("got ", all->size()));
        for (int i = 0; i < 3; ++i) {
          const RankResult& g = (*all)[i];
          const bool same =
              g.rank() == i && g.pp_rank() == i % 2 && g.dp_rank() == i / 2 &&
              g.tp_rank() == 7 - i &&
              g.parameter_bytes() == static_cast<double>((int64_t{1} << 40) + i) &&
              g.peak_rss_bytes() == 1e9 + i && g.pipeline_bytes_per_step() == 1000.5 * i &&
              g.tensor_parallel_bytes_per_step() == 3 * i && g.block_parameters() == 12345 + i &&
              g.pipeline_bubble() == 0.125 * i && g.pipeline_peak_in_flight() == i + 1 &&
              g.gradient_bytes() == 0 && g.comm_bytes_per_step() == 0;
          if (!same) {
            return absl::InternalError(
                absl::StrCat("rank ", r, " got for rank ", i, ": ", g.DebugString()));
          }
        }
        return absl::OkStatus();
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

TEST(RankReport, BlockTensorsAreTheNumberedBlocksOnly) {
  for (const char* name : {"h0.ln1.weight", "h12.attn.qkv.weight", "h3.mlp.proj.bias"}) {
    EXPECT_TRUE(IsBlockTensor({name, {1}, 0, 1})) << name;
  }
  for (const char* name : {"wte", "wpe", "lnf.weight", "lm_head.weight", "h", "h.x", "hx.y", "h1",
                           "fc1.weight", "head.weight"}) {
    EXPECT_FALSE(IsBlockTensor({name, {1}, 0, 1})) << name;
  }
}

TEST(RankReport, BlockElementsCountsThePiecesInsideBlockTensors) {
  state::TensorTable table;
  table.Add("wte", {10, 4});                 // 40
  table.Add("h0.attn.qkv.weight", {12, 4});  // 48
  table.Add("h0.attn.qkv.bias", {12});       // 12
  table.Add("lm_head.weight", {10, 4});      // 40
  EXPECT_EQ(BlockElements(table), 60);
  const state::TensorSpec& qkv = table.tensor(1);
  const state::TensorSpec& bias = table.tensor(2);
  const state::TensorSpec& wte = table.tensor(0);
  // Two rows of qkv, all of wte (not a block), the bias's first half.
  const std::vector<state::PlacedRange> pieces = {
      {{wte.offset, wte.offset + wte.numel}, 0},
      {{qkv.offset + 8, qkv.offset + 16}, 40},
      {{bias.offset, bias.offset + 6}, 48},
  };
  EXPECT_EQ(BlockElements(table, pieces), 8 + 6);
  // A piece over the padding between tensors counts only the tensors' elements.
  const std::vector<state::PlacedRange> across = {{{0, table.total_elements()}, 0}};
  EXPECT_EQ(BlockElements(table, across), 60);
  EXPECT_EQ(BlockElements(table, {}), 0);
}

}  // namespace
}  // namespace ringmaster::train
