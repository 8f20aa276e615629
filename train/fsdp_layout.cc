#include "train/fsdp_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringmaster::train {
namespace {

absl::Status CheckGroups(const state::TensorTable& table,
                         const std::vector<ParameterGroup>& groups) {
  int next = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].first_tensor != next || groups[g].end_tensor <= groups[g].first_tensor) {
      return absl::InternalError(absl::StrCat(
          "the model's parameter group ", g, " (", groups[g].name, ") holds tensors [",
          groups[g].first_tensor, ", ", groups[g].end_tensor, "); expected it to begin at ", next));
    }
    next = groups[g].end_tensor;
  }
  if (next != table.size()) {
    return absl::InternalError(absl::StrCat("the model's parameter groups hold ", next, " of its ",
                                            table.size(), " tensors"));
  }
  return absl::OkStatus();
}

// Units from runs of groups: `starts` holds each unit's first group, increasing, from 0.
FsdpLayout Build(const state::TensorTable& table, const std::vector<ParameterGroup>& groups,
                 const std::vector<int>& starts, const std::vector<std::string>& names,
                 int world) {
  FsdpLayout layout;
  layout.world = world;
  layout.unit_of_group.resize(groups.size());
  const int64_t quantum = static_cast<int64_t>(world) * state::kAlignElements;
  for (size_t u = 0; u < starts.size(); ++u) {
    FsdpUnit unit;
    unit.name = names[u];
    unit.first_group = starts[u];
    unit.end_group = u + 1 < starts.size() ? starts[u + 1] : static_cast<int>(groups.size());
    unit.range.begin = table.tensor(groups[unit.first_group].first_tensor).offset;
    unit.range.end = unit.end_group < static_cast<int>(groups.size())
                         ? table.tensor(groups[unit.end_group].first_tensor).offset
                         : table.total_elements();
    unit.padded = (unit.range.size() + quantum - 1) / quantum * quantum;
    unit.shard = unit.padded / world;
    unit.local = layout.local_elements;
    layout.local_elements += unit.shard;
    layout.largest_unit = std::max(layout.largest_unit, unit.padded);
    unit.backward_reads_parameters = false;
    unit.gradients_in_place = true;
    for (int g = unit.first_group; g < unit.end_group; ++g) {
      layout.unit_of_group[g] = static_cast<int>(u);
      if (groups[g].backward_reads_parameters) unit.backward_reads_parameters = true;
      if (groups[g].read_again_by_head) unit.kept_through_pass = true;
      if (!groups[g].gradients_over_parameters) unit.gradients_in_place = false;
    }
    if (unit.kept_through_pass) unit.gradients_in_place = false;
    int64_t covered = u == 0 ? 0 : unit.range.begin;
    for (int t = groups[unit.first_group].first_tensor; t < groups[unit.end_group - 1].end_tensor;
         ++t) {
      const state::TensorSpec& spec = table.tensor(t);
      if (spec.offset > covered) unit.gaps.push_back({covered, spec.offset});
      covered = spec.offset + spec.numel;
    }
    const int64_t end = (u == 0 ? 0 : unit.range.begin) + unit.padded;
    if (end > covered) unit.gaps.push_back({covered, end});
    layout.units.push_back(std::move(unit));
  }
  if (!layout.units.empty()) layout.units.front().range.begin = 0;
  return layout;
}

}  // namespace

state::FlatRange FsdpUnit::Piece(int rank) const {
  const int64_t begin = std::min(range.end, range.begin + rank * shard);
  const int64_t end = std::min(range.end, range.begin + (rank + 1) * shard);
  return {begin, end};
}

std::vector<state::PlacedRange> FsdpLayout::Placement(int rank) const {
  std::vector<state::PlacedRange> pieces;
  for (const FsdpUnit& u : units) pieces.push_back({u.Piece(rank), u.local});
  return pieces;
}

std::string FsdpLayout::Describe() const {
  return absl::StrFormat("%d unit(s), largest %.3g MiB", units.size(),
                         largest_unit * 4.0 / (1 << 20));
}

absl::StatusOr<FsdpLayout> MakeFsdpLayout(const state::TensorTable& table,
                                          const std::vector<ParameterGroup>& groups,
                                          FsdpConfig::Wrap wrap, int world) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world size ", world, " < 1"));
  if (absl::Status s = CheckGroups(table, groups); !s.ok()) return s;
  std::vector<int> starts;
  std::vector<std::string> names;
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool start = g == 0 || (wrap == FsdpConfig::Wrap::kLayer) ||
                       (wrap == FsdpConfig::Wrap::kBlock && groups[g].block != groups[g - 1].block);
    if (!start) continue;
    starts.push_back(static_cast<int>(g));
    names.push_back(wrap == FsdpConfig::Wrap::kModel   ? std::string("model")
                    : wrap == FsdpConfig::Wrap::kLayer ? groups[g].name
                                                       : groups[g].block_name);
  }
  return Build(table, groups, starts, names, world);
}

absl::StatusOr<FsdpLayout> MakeBucketLayout(const state::TensorTable& table,
                                            const std::vector<ParameterGroup>& groups,
                                            int64_t bucket_elements, int world) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world size ", world, " < 1"));
  if (absl::Status s = CheckGroups(table, groups); !s.ok()) return s;
  std::vector<int> starts;
  std::vector<std::string> names;
  int64_t in_bucket = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == 0 || in_bucket >= bucket_elements) {
      starts.push_back(static_cast<int>(g));
      names.push_back(absl::StrCat("bucket ", starts.size() - 1));
      in_bucket = 0;
    }
    const state::TensorSpec& last = table.tensor(groups[g].end_tensor - 1);
    in_bucket += last.offset + last.numel - table.tensor(groups[g].first_tensor).offset;
  }
  return Build(table, groups, starts, names, world);
}

PassTraffic Zero3PassTraffic(const FsdpLayout& layout, bool reshard_after_forward,
                             int gather_bytes, int reduce_bytes) {
  PassTraffic t;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const int64_t moved = layout.units[u].shard * (layout.world - 1);
    const bool last = u + 1 == layout.units.size();
    const bool again = reshard_after_forward && !last &&
                       layout.units[u].backward_reads_parameters &&
                       !layout.units[u].kept_through_pass;
    t.all_gather_bytes += moved * gather_bytes * (again ? 2 : 1);
    t.reduce_scatter_bytes += moved * reduce_bytes;
  }
  return t;
}

}  // namespace ringmaster::train
