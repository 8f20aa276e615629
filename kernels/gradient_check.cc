#include "kernels/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

namespace ringmaster::kernels::testing {

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double WeightedSum(const std::vector<float>& w, const float* y) {
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) sum += static_cast<double>(w[i]) * y[i];
  return sum;
}

::testing::AssertionResult GradientMatches(const std::function<double()>& loss,
                                           std::vector<float>& x,
                                           const std::vector<float>& analytic,
                                           const FiniteDifference& fd, const std::string& what) {
  if (analytic.size() != x.size()) {
    return ::testing::AssertionFailure()
           << what << ": gradient has " << analytic.size() << " elements, input " << x.size();
  }
  std::ostringstream bad;
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    // Divide by the float perturbation actually applied, not by the nominal 2 * step.
    const float x_up = static_cast<float>(saved + fd.step);
    const float x_down = static_cast<float>(saved - fd.step);
    x[i] = x_up;
    const double up = loss();
    x[i] = x_down;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (static_cast<double>(x_up) - x_down);
    const double err = std::abs(numeric - analytic[i]);
    worst = std::max(worst, err);
    if (!(err <= fd.atol + fd.rtol * std::abs(numeric))) {
      if (++failures <= 5) {
        bad << "\n  [" << i << "] analytic " << analytic[i] << " numeric " << numeric;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << failures << " of " << x.size() << " elements off (largest error "
         << worst << ")" << bad.str();
}

}  // namespace ringmaster::kernels::testing
