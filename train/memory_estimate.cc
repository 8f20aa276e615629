#include "train/memory_estimate.h"

#include <cctype>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringmaster::train {

absl::StatusOr<MemoryEstimate> EstimateMemory(const MemoryEstimateOptions& o) {
  if (!(o.parameters > 0) || !std::isfinite(o.parameters)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--params must be a positive number of parameters, got ", o.parameters));
  }
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world must be at least 1, got ", o.world_size));
  }
  if (o.zero_stage < 0 || o.zero_stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--zero must be 0, 1, 2 or 3, got ", o.zero_stage));
  }
  const double psi = o.parameters, n = o.world_size;
  const double param_b = o.mixed_precision ? 2 : 4;
  const double grad_b = o.mixed_precision ? 2 : 4;
  // Optimizer state: the moments, plus the fp32 master copy under mixed precision.
  double k = o.optimizer == MemoryEstimateOptions::Optimizer::kAdam ? 8 : 4;
  if (o.mixed_precision) k += 4;
  MemoryEstimate e;
  e.bytes_per_parameter_unsharded = param_b + grad_b + k;
  e.parameter_bytes = param_b * psi / (o.zero_stage >= 3 ? n : 1);
  e.gradient_bytes = grad_b * psi / (o.zero_stage >= 2 ? n : 1);
  e.optimizer_bytes = k * psi / (o.zero_stage >= 1 ? n : 1);
  return e;
}

absl::StatusOr<double> ParseParameterCount(absl::string_view text) {
  std::string t(absl::StripAsciiWhitespace(text));
  double scale = 1;
  if (!t.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(t.back()))) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'B':
      case 'G':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
      default:
        break;
    }
    if (scale != 1) t.pop_back();
  }
  double value = 0;
  if (t.empty() || !absl::SimpleAtod(t, &value) || !(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--params: \"", text, "\" is not a parameter count (e.g. 7B, 13e9, 124M, 669706)"));
  }
  return value * scale;
}

std::string DescribeEstimate(const MemoryEstimateOptions& o, const MemoryEstimate& e) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  auto line = [&](absl::string_view what, double bytes, absl::string_view formula) {
    return absl::StrFormat("  %-18s %10.2f GiB  (%s)\n", what, bytes / kGiB, formula);
  };
  const double psi = o.parameters;
  const std::string n = absl::StrCat(o.world_size);
  std::string out = absl::StrFormat(
      "%.4g parameters, %s, %s, ZeRO-%d on %d ranks: %g bytes/parameter before sharding\n", psi,
      o.mixed_precision ? "mixed precision (16-bit compute, fp32 master)" : "fp32",
      o.optimizer == MemoryEstimateOptions::Optimizer::kAdam ? "Adam" : "SGD with momentum",
      o.zero_stage, o.world_size, e.bytes_per_parameter_unsharded);
  const double pb = o.mixed_precision ? 2 : 4;
  out += line("parameters", e.parameter_bytes,
              absl::StrCat(pb, " x P", o.zero_stage >= 3 ? absl::StrCat(" / ", n) : ""));
  out += line("gradients", e.gradient_bytes,
              absl::StrCat(pb, " x P", o.zero_stage >= 2 ? absl::StrCat(" / ", n) : ""));
  out += line("optimizer state", e.optimizer_bytes,
              absl::StrCat(e.bytes_per_parameter_unsharded - 2 * pb, " x P",
                           o.zero_stage >= 1 ? absl::StrCat(" / ", n) : ""));
  out += absl::StrFormat("  %-18s %10.2f GiB  (%.2f GB) per rank, activations not included\n",
                         "total", e.total_bytes() / kGiB, e.total_bytes() / 1e9);
  return out;
}

}  // namespace ringmaster::train
