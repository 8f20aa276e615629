#include "train/rank_report.h"

#include <algorithm>
#include <cctype>

#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ringmaster::train {
namespace {

using google::protobuf::FieldDescriptor;

// RankResult's fields (each a double or an int32) as a row of doubles in field order: exact
// for the int32s and any byte count below 2^53.
std::vector<double> ToRow(const RankResult& r) {
  const google::protobuf::Descriptor* d = r.GetDescriptor();
  const google::protobuf::Reflection* refl = r.GetReflection();
  std::vector<double> row;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    row.push_back(f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ? refl->GetInt32(r, f)
                                                                  : refl->GetDouble(r, f));
  }
  return row;
}

RankResult FromRow(const double* row) {
  RankResult r;
  const google::protobuf::Descriptor* d = r.GetDescriptor();
  const google::protobuf::Reflection* refl = r.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      refl->SetInt32(&r, f, static_cast<int32_t>(row[i]));
    } else {
      refl->SetDouble(&r, f, row[i]);
    }
  }
  return r;
}

}  // namespace

RankResult RankFigures(const TrainResult& result) {
  RankResult r;
  const google::protobuf::Reflection* from = result.GetReflection();
  const google::protobuf::Reflection* to = r.GetReflection();
  const google::protobuf::Descriptor* d = r.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const FieldDescriptor* g = result.GetDescriptor()->FindFieldByName(f->name());
    if (g == nullptr || g->cpp_type() != f->cpp_type() || g->is_repeated()) continue;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      to->SetInt32(&r, f, from->GetInt32(result, g));
    } else {
      to->SetDouble(&r, f, from->GetDouble(result, g));
    }
  }
  return r;
}

absl::StatusOr<std::vector<RankResult>> GatherRankResults(const RankResult& mine,
                                                          comm::Communicator& comm,
                                                          absl::Time deadline) {
  const std::vector<double> row = ToRow(mine);
  std::vector<double> all(row.size() * comm.size());
  RM_RETURN_IF_ERROR(
      comm.AllGather(row.data(), all.data(), row.size(), DataType::kFloat64, deadline));
  std::vector<RankResult> out;
  out.reserve(comm.size());
  for (int r = 0; r < comm.size(); ++r) out.push_back(FromRow(all.data() + r * row.size()));
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
