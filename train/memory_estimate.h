// Per-rank training memory by the ZeRO paper's formula (Rajbhandari et al. 2020, §3):
// Ψ parameters, N data-parallel ranks, K bytes of optimizer state per parameter.
//
//   mixed precision (bf16/fp16 compute, fp32 master weights), Adam: parameters 2Ψ,
//   gradients 2Ψ, optimizer state K = 12 (fp32 master 4 + momentum 4 + variance 4):
//   16Ψ in all. fp32 training: parameters 4Ψ, gradients 4Ψ, Adam state 8Ψ; SGD with
//   momentum keeps 4Ψ (plus the master copy under mixed precision).
//
//   ZeRO-1 divides the optimizer state by N, ZeRO-2 also the gradients, ZeRO-3 also the
//   parameters. Activations, buffers and fragmentation come on top (not estimated).
#ifndef RINGMASTER_TRAIN_MEMORY_ESTIMATE_H_
#define RINGMASTER_TRAIN_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster::train {

struct MemoryEstimateOptions {
  double parameters = 0;  // Ψ
  int world_size = 1;     // N
  int zero_stage = 0;     // 0..3
  bool mixed_precision = true;
  enum class Optimizer { kAdam, kSgdMomentum };
  Optimizer optimizer = Optimizer::kAdam;
};

struct MemoryEstimate {
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
  double bytes_per_parameter_unsharded = 0;  // 16 for mixed-precision Adam
};

// INVALID_ARGUMENT naming the field for Ψ <= 0, N < 1 or a stage outside 0..3.
absl::StatusOr<MemoryEstimate> EstimateMemory(const MemoryEstimateOptions& options);

// "7B", "13e9", "1.5M", "124000000" -> parameters. INVALID_ARGUMENT otherwise.
absl::StatusOr<double> ParseParameterCount(absl::string_view text);

// A readable report: the formula, each term and the total (GiB and GB).
std::string DescribeEstimate(const MemoryEstimateOptions& options, const MemoryEstimate& e);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MEMORY_ESTIMATE_H_
