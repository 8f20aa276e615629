#include "kernels/optimizer.h"

#include <cstddef>

#include "glog/logging.h"
#include "kernels/cpu/optimizer_isa.h"

namespace ringmaster::kernels {
namespace {

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

// The Adam-family kernels take a step count and four spans of one length.
void CheckAdamArgs(const AdamMomentArgs& moments, size_t n, size_t grads, size_t exp_avg,
                   size_t exp_avg_sq) {
  CHECK_GE(moments.step, 1);
  CHECK(grads == n && exp_avg == n && exp_avg_sq == n)
      << "spans of " << n << ", " << grads << ", " << exp_avg << ", " << exp_avg_sq;
}

}  // namespace

void SgdStep(const SgdStepArgs& args, absl::Span<float> params, absl::Span<const float> grads,
             absl::Span<float> momentum_buffer) {
  CHECK_EQ(params.size(), grads.size());
  float* buffer = nullptr;
  if (args.momentum != 0) {
    CHECK_EQ(momentum_buffer.size(), params.size());
    buffer = momentum_buffer.data();
  } else {
    CHECK(momentum_buffer.empty()) << "momentum 0 keeps no buffer";
  }
  if (HasAvx2()) return avx2::SgdStep(args, params.data(), grads.data(), buffer, params.size());
  generic::SgdStep(args, params.data(), grads.data(), buffer, params.size());
}

void AdamWStep(const AdamMomentArgs& moments, float lr, float weight_decay,
               absl::Span<float> params, absl::Span<const float> grads, absl::Span<float> exp_avg,
               absl::Span<float> exp_avg_sq) {
  const size_t n = params.size();
  CheckAdamArgs(moments, n, grads.size(), exp_avg.size(), exp_avg_sq.size());
  auto* step = HasAvx2() ? avx2::AdamWStep : generic::AdamWStep;
  step(moments, lr, weight_decay, params.data(), grads.data(), exp_avg.data(), exp_avg_sq.data(),
       n);
}

LambSquareSums LambSquares(const AdamMomentArgs& moments, float weight_decay,
                           absl::Span<const float> params, absl::Span<const float> grads,
                           absl::Span<const float> exp_avg, absl::Span<const float> exp_avg_sq) {
  const size_t n = params.size();
  CheckAdamArgs(moments, n, grads.size(), exp_avg.size(), exp_avg_sq.size());
  auto* squares = HasAvx2() ? avx2::LambSquares : generic::LambSquares;
  return squares(moments, weight_decay, params.data(), grads.data(), exp_avg.data(),
                 exp_avg_sq.data(), n);
}

void LambStep(const AdamMomentArgs& moments, float weight_decay, float scaled_lr,
              absl::Span<float> params, absl::Span<const float> grads, absl::Span<float> exp_avg,
              absl::Span<float> exp_avg_sq) {
  const size_t n = params.size();
  CheckAdamArgs(moments, n, grads.size(), exp_avg.size(), exp_avg_sq.size());
  auto* step = HasAvx2() ? avx2::LambStep : generic::LambStep;
  step(moments, weight_decay, scaled_lr, params.data(), grads.data(), exp_avg.data(),
       exp_avg_sq.data(), n);
}

double SumOfSquares(absl::Span<const float> x) {
  if (HasAvx2()) return avx2::SumOfSquares(x.data(), x.size());
  return generic::SumOfSquares(x.data(), x.size());
}

bool ScaleAndFindNonFinite(absl::Span<float> x, float factor) {
  if (HasAvx2()) return avx2::ScaleAndFindNonFinite(x.data(), x.size(), factor);
  return generic::ScaleAndFindNonFinite(x.data(), x.size(), factor);
}

const char* OptimizerImplementation() { return HasAvx2() ? "avx2" : "generic"; }

}  // namespace ringmaster::kernels
