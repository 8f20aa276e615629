#include "train/rank_report.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "common/status_macros.h"

namespace ringmaster::train {
namespace {

// RankResult as a fixed row of doubles (exact for the int32 fields and any byte count below
// 2^53).
constexpr int kFields = 15;
using Row = std::array<double, kFields>;

Row ToRow(const RankResult& r) {
  return {static_cast<double>(r.rank()),
          static_cast<double>(r.pp_rank()),
          static_cast<double>(r.dp_rank()),
          static_cast<double>(r.tp_rank()),
          r.parameter_bytes(),
          r.gradient_bytes(),
          r.optimizer_state_bytes(),
          r.activation_bytes_peak(),
          r.peak_rss_bytes(),
          r.comm_bytes_per_step(),
          r.pipeline_bytes_per_step(),
          r.tensor_parallel_bytes_per_step(),
          r.block_parameters(),
          r.pipeline_bubble(),
          static_cast<double>(r.pipeline_peak_in_flight())};
}

RankResult FromRow(const double* v) {
  RankResult r;
  r.set_rank(static_cast<int32_t>(v[0]));
  r.set_pp_rank(static_cast<int32_t>(v[1]));
  r.set_dp_rank(static_cast<int32_t>(v[2]));
  r.set_tp_rank(static_cast<int32_t>(v[3]));
  r.set_parameter_bytes(v[4]);
  r.set_gradient_bytes(v[5]);
  r.set_optimizer_state_bytes(v[6]);
  r.set_activation_bytes_peak(v[7]);
  r.set_peak_rss_bytes(v[8]);
  r.set_comm_bytes_per_step(v[9]);
  r.set_pipeline_bytes_per_step(v[10]);
  r.set_tensor_parallel_bytes_per_step(v[11]);
  r.set_block_parameters(v[12]);
  r.set_pipeline_bubble(v[13]);
  r.set_pipeline_peak_in_flight(static_cast<int32_t>(v[14]));
  return r;
}

}  // namespace

absl::StatusOr<std::vector<RankResult>> GatherRankResults(const RankResult& mine,
                                                          comm::Communicator& comm,
                                                          absl::Time deadline) {
  const Row row = ToRow(mine);
  std::vector<double> all(static_cast<size_t>(kFields) * comm.size());
  RM_RETURN_IF_ERROR(comm.AllGather(row.data(), all.data(), kFields, DataType::kFloat64, deadline));
  std::vector<RankResult> out;
  out.reserve(comm.size());
  for (int r = 0; r < comm.size(); ++r) out.push_back(FromRow(all.data() + r * kFields));
  return out;
}

bool IsBlockTensor(const state::TensorSpec& tensor) {
  const std::string& n = tensor.name;
  if (n.size() < 3 || n[0] != 'h' || !std::isdigit(static_cast<unsigned char>(n[1]))) {
    return false;
  }
  size_t i = 1;
  while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) ++i;
  return i < n.size() && n[i] == '.';
}

int64_t BlockElements(const state::TensorTable& table,
                      absl::Span<const state::PlacedRange> pieces) {
  int64_t total = 0;
  for (int t = 0; t < table.size(); ++t) {
    const state::TensorSpec& spec = table.tensor(t);
    if (!IsBlockTensor(spec)) continue;
    const int64_t begin = spec.offset, end = spec.offset + spec.numel;
    for (const state::PlacedRange& p : pieces) {
      total += std::max<int64_t>(0, std::min(end, p.range.end) - std::max(begin, p.range.begin));
    }
  }
  return total;
}

int64_t BlockElements(const state::TensorTable& table) {
  int64_t total = 0;
  for (int t = 0; t < table.size(); ++t) {
    if (IsBlockTensor(table.tensor(t))) total += table.tensor(t).numel;
  }
  return total;
}

}  // namespace ringmaster::train
