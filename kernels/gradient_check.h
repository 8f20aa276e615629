// Test helpers for kernel tests: seeded random inputs and a central finite-difference check
// of an analytic gradient. Test-only (testonly library).
#ifndef RINGMASTER_KERNELS_GRADIENT_CHECK_H_
#define RINGMASTER_KERNELS_GRADIENT_CHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::kernels::testing {

// n floats uniform in [lo, hi), the same for the same seed.
std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// sum_i w[i] * y[i], accumulated in double: the scalar loss whose gradient with respect to y
// is w, so a kernel's backward called with dout = w must give the gradient of this loss.
double WeightedSum(const std::vector<float>& w, const float* y);

struct FiniteDifference {
  double step = 1e-2;  // central difference (f(x + h) - f(x - h)) / 2h
  double atol = 1e-3;  // passes when |numeric - analytic| <= atol + rtol * |numeric|
  double rtol = 1e-2;
};

// Compares `analytic` (dloss/dx) with central differences of `loss` over every element of x.
// `loss` must read x (it is perturbed in place, one element at a time, and restored). The
// failure message names `what`, the first few bad indices, and the largest error seen.
::testing::AssertionResult GradientMatches(const std::function<double()>& loss,
                                           std::vector<float>& x,
                                           const std::vector<float>& analytic,
                                           const FiniteDifference& fd, const std::string& what);

}  // namespace ringmaster::kernels::testing

#endif  // RINGMASTER_KERNELS_GRADIENT_CHECK_H_
