#include "comm/mesh.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace ringmaster::comm {

absl::string_view MeshDimName(MeshDim dim) {
  switch (dim) {
    case MeshDim::kPp:
      return "pp";
    case MeshDim::kDp:
      return "dp";
    case MeshDim::kTp:
      return "tp";
  }
  return "unknown";
}

absl::StatusOr<Mesh> Mesh::Create(int world_size,
                                  absl::Span<const std::pair<std::string, int>> dims) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: world size must be >= 1, got ", world_size));
  }
  MeshCoordinates sizes = {1, 1, 1};
  std::array<bool, kNumMeshDims> named = {false, false, false};
  int inferred = -1;  // the dimension sized -1
  for (const auto& [name, size] : dims) {
    int d = -1;
    for (MeshDim dim : kMeshDims) {
      if (name == MeshDimName(dim)) d = static_cast<int>(dim);
    }
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh: unknown dimension \"", name, "\"; the dimensions are pp, dp and tp"));
    }
    if (named[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh: dimension ", name, " is given twice"));
    }
    named[d] = true;
    if (size == -1) {
      if (inferred >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh: dimensions ", MeshDimName(static_cast<MeshDim>(inferred)),
                         " and ", name, " are both -1; at most one size may be inferred"));
      }
      inferred = d;
      continue;
    }
    if (size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh: dimension ", name, " has size ", size, "; sizes are >= 1 (or -1: inferred)"));
    }
    sizes[d] = size;
  }
  double product = 1;  // exact while it matters (<= world_size); no overflow beyond
  for (int s : sizes) product *= s;
  auto listing = [&] {
    std::vector<std::string> parts;
    for (MeshDim dim : kMeshDims) {
      const int d = static_cast<int>(dim);
      if (named[d]) {
        parts.push_back(absl::StrCat(MeshDimName(dim), "=", d == inferred ? -1 : sizes[d]));
      }
    }
    return absl::StrJoin(parts, " x ");
  };
  if (inferred >= 0) {
    if (product > world_size || world_size % static_cast<int>(product) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh: dimension ", MeshDimName(static_cast<MeshDim>(inferred)),
          " cannot be inferred: world size ", world_size, " is not a multiple of ", product,
          " (", listing(), ")"));
    }
    sizes[inferred] = world_size / static_cast<int>(product);
    product = world_size;
  }
  if (product != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("mesh: the dimensions' sizes (", listing(),
                                                   ") multiply to ", product,
                                                   ", not the world size ", world_size));
  }
  return Mesh(world_size, sizes);
}

MeshCoordinates Mesh::Coordinates(int rank) const {
  CHECK(rank >= 0 && rank < world_size_) << "rank " << rank << " outside the mesh " << ToString();
  MeshCoordinates c;
  for (int d = kNumMeshDims - 1; d >= 0; --d) {
    c[d] = rank % sizes_[d];
    rank /= sizes_[d];
  }
  return c;
}

int Mesh::Rank(const MeshCoordinates& coordinates) const {
  int rank = 0;
  for (int d = 0; d < kNumMeshDims; ++d) {
    CHECK(coordinates[d] >= 0 && coordinates[d] < sizes_[d])
        << MeshDimName(static_cast<MeshDim>(d)) << " coordinate " << coordinates[d]
        << " outside the mesh " << ToString();
    rank = rank * sizes_[d] + coordinates[d];
  }
  return rank;
}

std::vector<int> Mesh::GroupRanks(MeshDim dim, int rank) const {
  MeshCoordinates c = Coordinates(rank);
  const int d = static_cast<int>(dim);
  std::vector<int> ranks;
  for (c[d] = 0; c[d] < sizes_[d]; ++c[d]) ranks.push_back(Rank(c));
  return ranks;
}

absl::StatusOr<std::unique_ptr<Communicator>> Mesh::Group(Communicator& world, MeshDim dim,
                                                          absl::Time deadline) const {
  if (world.size() != world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("mesh ", ToString(), " has ", world_size_,
                                                   " ranks but the communicator has ",
                                                   world.size()));
  }
  const int rank = world.rank();
  const int first = GroupRanks(dim, rank).front();
  return world.Split(first, Coordinates(rank)[static_cast<int>(dim)], deadline);
}

std::string Mesh::ToString() const {
  std::vector<std::string> parts;
  for (MeshDim dim : kMeshDims) {
    parts.push_back(absl::StrCat(MeshDimName(dim), "=", size(dim)));
  }
  return absl::StrJoin(parts, " x ");
}

}  // namespace ringmaster::comm
