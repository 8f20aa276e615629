#include "bench/collectives.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace ringmaster::bench {
namespace {

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  uint64_t mult = 1;
  if (!t.empty() && (t.back() == 'B')) t.pop_back();
  if (!t.empty()) {
    switch (t.back()) {
      case 'K':
        mult = 1ull << 10;
        t.pop_back();
        break;
      case 'M':
        mult = 1ull << 20;
        t.pop_back();
        break;
      case 'G':
        mult = 1ull << 30;
        t.pop_back();
        break;
      default:
        break;
    }
  }
  uint64_t n = 0;
  if (t.empty() || !absl::SimpleAtoi(t, &n) || n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sizes: \"", text, "\" is not a size; use a positive number with optional K, M or G"));
  }
  if (n > UINT64_MAX / mult) {
    return absl::InvalidArgumentError(absl::StrCat("--sizes: \"", text, "\" is too large"));
  }
  return n * mult;
}

}  // namespace

absl::string_view CollectiveName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

absl::StatusOr<std::vector<CollectiveOp>> ParseOps(absl::string_view text) {
  std::vector<CollectiveOp> ops;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (part == "all") {
      return std::vector<CollectiveOp>(std::begin(kAllCollectiveOps), std::end(kAllCollectiveOps));
    }
    const CollectiveOp* found = nullptr;
    for (const CollectiveOp& op : kAllCollectiveOps) {
      if (part == CollectiveName(op)) found = &op;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ops: unknown operation \"", part,
                       "\"; use all_reduce, all_gather, reduce_scatter, broadcast or all"));
    }
    if (std::find(ops.begin(), ops.end(), *found) != ops.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--ops: \"", part, "\" is given twice"));
    }
    ops.push_back(*found);
  }
  if (ops.empty()) return absl::InvalidArgumentError("--ops is empty");
  return ops;
}

absl::StatusOr<std::vector<uint64_t>> ParseSizes(absl::string_view text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipWhitespace());
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (absl::StripAsciiWhitespace(parts[i]) == "...") {
      if (sizes.size() < 2 || i + 1 >= parts.size()) {
        return absl::InvalidArgumentError(
            "--sizes: \"...\" needs two sizes before it and one after (e.g. 1K,4K,...,1G)");
      }
      uint64_t a = sizes[sizes.size() - 2], b = sizes.back();
      RM_ASSIGN_OR_RETURN(uint64_t last, ParseSize(parts[i + 1]));
      if (b <= a || b % a != 0) {
        return absl::InvalidArgumentError(
            "--sizes: a range a,b,...,c needs b to be a multiple of a, larger than a");
      }
      for (uint64_t s = b * (b / a); s < last; s *= b / a) sizes.push_back(s);
      continue;
    }
    RM_ASSIGN_OR_RETURN(uint64_t s, ParseSize(parts[i]));
    sizes.push_back(s);
  }
  if (sizes.empty()) return absl::InvalidArgumentError("--sizes is empty");
  return sizes;
}

double BusFactor(CollectiveOp op, int n) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      return static_cast<double>(n - 1) / n;
    case CollectiveOp::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

}  // namespace ringmaster::bench
