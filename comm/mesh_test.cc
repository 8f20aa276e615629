#include "comm/mesh.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using Dims = std::vector<std::pair<std::string, int>>;

Mesh MakeMesh(int world, const Dims& dims) {
  auto mesh = Mesh::Create(world, dims);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *mesh;
}

TEST(Mesh, TpIsInnermostThenDpThenPp) {
  const Mesh mesh = MakeMesh(8, {{"tp", 2}, {"pp", 2}, {"dp", 2}});  // any order given
  EXPECT_EQ(mesh.ToString(), "pp=2 x dp=2 x tp=2");
  // Written out by hand: rank = (pp * 2 + dp) * 2 + tp.
  const std::vector<MeshCoordinates> expected = {
      {0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.Coordinates(r), expected[r]) << "rank " << r;
    EXPECT_EQ(mesh.Rank(expected[r]), r);
  }
  EXPECT_EQ(mesh.GroupRanks(MeshDim::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.GroupRanks(MeshDim::kDp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh.GroupRanks(MeshDim::kPp, 5), (std::vector<int>{1, 5}));
}

TEST(Mesh, GroupsAlongADimensionPartitionTheRanks) {
  const Mesh mesh = MakeMesh(24, {{"pp", 2}, {"dp", 3}, {"tp", 4}});
  for (MeshDim dim : kMeshDims) {
    std::set<int> seen;
    for (int r = 0; r < 24; ++r) {
      const std::vector<int> group = mesh.GroupRanks(dim, r);
      ASSERT_EQ(static_cast<int>(group.size()), mesh.size(dim));
      // r sits at its own coordinate; every member differs from r only along dim.
      EXPECT_EQ(group[mesh.Coordinates(r)[static_cast<int>(dim)]], r);
      for (int member : group) {
        MeshCoordinates a = mesh.Coordinates(member), b = mesh.Coordinates(r);
        a[static_cast<int>(dim)] = b[static_cast<int>(dim)] = 0;
        EXPECT_EQ(a, b) << MeshDimName(dim) << " group of " << r << " holds " << member;
      }
      if (group.front() == r) seen.insert(group.begin(), group.end());
    }
    EXPECT_EQ(seen.size(), 24u) << MeshDimName(dim);
  }
}

TEST(Mesh, MissingDimensionsHaveSizeOne) {
  const Mesh mesh = MakeMesh(4, {{"dp", 4}});
  EXPECT_EQ(mesh.size(MeshDim::kPp), 1);
  EXPECT_EQ(mesh.size(MeshDim::kTp), 1);
  EXPECT_EQ(mesh.Coordinates(3), (MeshCoordinates{0, 3, 0}));
  EXPECT_EQ(mesh.GroupRanks(MeshDim::kTp, 2), (std::vector<int>{2}));
  EXPECT_EQ(MakeMesh(1, {}).ToString(), "pp=1 x dp=1 x tp=1");
}

TEST(Mesh, OneSizeMayBeInferred) {
  const Mesh mesh = MakeMesh(12, {{"tp", 2}, {"dp", -1}, {"pp", 3}});
  EXPECT_EQ(mesh.size(MeshDim::kDp), 2);
}

TEST(Mesh, BadShapesAreInvalidAndNameTheDimension) {
  struct Case {
    int world;
    Dims dims;
    std::string message;
  };
  const std::vector<Case> cases = {
      {8, {{"dp", 2}, {"ep", 4}}, "unknown dimension \"ep\""},
      {4, {{"dp", 2}, {"dp", 2}}, "dimension dp is given twice"},
      {4, {{"tp", 0}, {"dp", 4}}, "dimension tp has size 0"},
      {8, {{"tp", -1}, {"dp", -1}}, "dimensions tp and dp are both -1"},
      {8, {{"tp", 3}, {"dp", -1}}, "dimension dp cannot be inferred: world size 8 is not a "
                                   "multiple of 3 (dp=-1 x tp=3)"},
      {8, {{"tp", 2}, {"dp", 2}}, "sizes (dp=2 x tp=2) multiply to 4, not the world size 8"},
      {0, {}, "world size must be >= 1"},
  };
  for (const Case& c : cases) {
    auto mesh = Mesh::Create(c.world, c.dims);
    ASSERT_FALSE(mesh.ok()) << c.message;
    EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(mesh.status().message().find(c.message), std::string::npos) << mesh.status();
  }
}

}  // namespace
}  // namespace ringmaster::comm
