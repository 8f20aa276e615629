#include "train/fsdp_layout.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/nn/gpt.h"

namespace ringmaster::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<nn::GptModel> Gpt() {
  nn::GptOptions o;
  o.layers = 2;
  o.heads = 2;
  o.width = 8;
  o.context = 4;
  o.vocab = 11;
  return *nn::GptModel::Create(o);
}

std::vector<std::string> Names(const FsdpLayout& l) {
  std::vector<std::string> names;
  for (const FsdpUnit& u : l.units) names.push_back(u.name);
  return names;
}

// The units tile the flat space; every rank's pieces, back to back, tile it too.
void ExpectTiles(const state::TensorTable& table, const FsdpLayout& l) {
  int64_t next = 0, local = 0;
  for (const FsdpUnit& u : l.units) {
    EXPECT_EQ(u.range.begin, next) << u.name;
    EXPECT_GE(u.padded, u.range.size());
    EXPECT_EQ(u.padded % (l.world * state::kAlignElements), 0) << u.name;
    EXPECT_EQ(u.shard * l.world, u.padded);
    EXPECT_EQ(u.local, local);
    next = u.range.end;
    local += u.shard;
    // The ranks' pieces of the unit tile its range.
    int64_t piece_next = u.range.begin;
    for (int r = 0; r < l.world; ++r) {
      EXPECT_EQ(u.Piece(r).begin, piece_next) << u.name << " rank " << r;
      EXPECT_LE(u.Piece(r).size(), u.shard);
      piece_next = u.Piece(r).end;
    }
    EXPECT_EQ(piece_next, u.range.end) << u.name;
  }
  EXPECT_EQ(next, table.total_elements());
  EXPECT_EQ(l.local_elements, local);
  for (int r = 0; r < l.world; ++r) {
    EXPECT_TRUE(state::CheckPlacement(table, l.Placement(r), l.local_elements).ok());
  }
}

TEST(FsdpLayout, WrapsByLayerBlockOrModel) {
  auto gpt = Gpt();
  const state::TensorTable& table = gpt->table();
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(world);
    auto layer = MakeFsdpLayout(table, gpt->parameter_groups(), FsdpConfig::Wrap::kLayer, world);
    auto block = MakeFsdpLayout(table, gpt->parameter_groups(), FsdpConfig::Wrap::kBlock, world);
    auto model = MakeFsdpLayout(table, gpt->parameter_groups(), FsdpConfig::Wrap::kModel, world);
    ASSERT_TRUE(layer.ok() && block.ok() && model.ok());
    EXPECT_EQ(layer->units.size(), 1 + 2 * 6 + 2u);
    EXPECT_EQ(layer->units[1].name, "h0.ln1");
    EXPECT_THAT(Names(*block), ElementsAre("embeddings", "h0", "h1", "head"));
    EXPECT_THAT(Names(*model), ElementsAre("model"));
    EXPECT_EQ(block->unit_of_group[1], 1);  // h0.ln1
    EXPECT_EQ(block->unit_of_group[12], 2);  // h1.mlp.proj
    EXPECT_EQ(model->largest_unit, model->units[0].padded);
    for (const FsdpLayout* l : {&*layer, &*block, &*model}) ExpectTiles(table, *l);
  }
}

TEST(FsdpLayout, BucketsReachTheirSize) {
  auto gpt = Gpt();
  const state::TensorTable& table = gpt->table();
  auto buckets = MakeBucketLayout(table, gpt->parameter_groups(), 600, 2);
  ASSERT_TRUE(buckets.ok());
  ExpectTiles(table, *buckets);
  for (size_t u = 0; u + 1 < buckets->units.size(); ++u) {
    EXPECT_GE(buckets->units[u].range.size(), 600) << u;
  }
  auto one = MakeBucketLayout(table, gpt->parameter_groups(), int64_t{1} << 40, 2);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->units.size(), 1u);
}

TEST(FsdpLayout, RefusesGroupsThatDoNotHoldTheTable) {
  auto gpt = Gpt();
  std::vector<ParameterGroup> groups = gpt->parameter_groups();
  groups.pop_back();
  auto l = MakeFsdpLayout(gpt->table(), groups, FsdpConfig::Wrap::kBlock, 2);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(l.status().message(), HasSubstr("groups hold"));
  EXPECT_EQ(MakeFsdpLayout(gpt->table(), gpt->parameter_groups(), FsdpConfig::Wrap::kBlock, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringmaster::train
