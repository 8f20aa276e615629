// Mesh: the ranks of a job laid out on named dimensions, and the communicator of a rank's
// group along each (torchtitan's `build_mesh`; ARCHITECTURE.md "one mesh").
//
// Dimensions, outermost first: pp (pipeline stages), dp (data-parallel replicas), tp
// (tensor-parallel shards). A rank's coordinates are its row-major index in that order:
//   rank = (pp * size(dp) + dp) * size(tp) + tp
// so tp is innermost: a tensor-parallel group is size(tp) consecutive ranks, which are the
// ranks of one host (the coordinator orders ranks by node, then slot). A mesh names any
// subset of the three; a dimension not named has size 1 (every rank's coordinate 0).
//
// A group along dimension d is the set of ranks whose coordinates differ only in d, ranked
// by their coordinate in d. Group() makes this rank's with Communicator::Split.
//
// Thread-safety: a Mesh is an immutable value.
#ifndef RINGMASTER_COMM_MESH_H_
#define RINGMASTER_COMM_MESH_H_

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"

namespace ringmaster::comm {

// Outermost first; the values index MeshCoordinates.
enum class MeshDim : int { kPp = 0, kDp = 1, kTp = 2 };
inline constexpr int kNumMeshDims = 3;
inline constexpr MeshDim kMeshDims[] = {MeshDim::kPp, MeshDim::kDp, MeshDim::kTp};
absl::string_view MeshDimName(MeshDim dim);  // "pp", "dp", "tp"

using MeshCoordinates = std::array<int, kNumMeshDims>;  // indexed by MeshDim

class Mesh {
 public:
  // `dims`: (name, size) pairs, any subset of pp, dp, tp in any order. Sizes are >= 1;
  // at most one may be -1, meaning what the world size leaves for it.
  // Errors: INVALID_ARGUMENT naming the dimension: unknown or repeated name, bad size, a
  // -1 that the others do not divide, or sizes whose product is not `world_size` (all
  // listed).
  static absl::StatusOr<Mesh> Create(int world_size,
                                     absl::Span<const std::pair<std::string, int>> dims);

  int world_size() const { return world_size_; }
  int size(MeshDim dim) const { return sizes_[static_cast<int>(dim)]; }

  // Requires 0 <= rank < world_size().
  MeshCoordinates Coordinates(int rank) const;
  // Requires 0 <= coordinates[d] < size(d).
  int Rank(const MeshCoordinates& coordinates) const;
  // The ranks of `rank`'s group along `dim`, by coordinate in `dim` (so `rank` is at
  // position Coordinates(rank)[dim]).
  std::vector<int> GroupRanks(MeshDim dim, int rank) const;

  // This rank's group along `dim`, made by world.Split (color: the group's first rank;
  // key: the coordinate in `dim`). Collective over `world`: every rank calls it, with the
  // same `dim`. Errors: INVALID_ARGUMENT when world.size() is not world_size(); Split's.
  absl::StatusOr<std::unique_ptr<Communicator>> Group(Communicator& world, MeshDim dim,
                                                      absl::Time deadline) const;

  // "pp=2 x dp=2 x tp=2" (every dimension, outermost first).
  std::string ToString() const;

 private:
  Mesh(int world_size, const MeshCoordinates& sizes) : world_size_(world_size), sizes_(sizes) {}

  int world_size_;
  MeshCoordinates sizes_;
};

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_MESH_H_
