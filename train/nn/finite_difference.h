// Test helper: finite differences of float computations, evaluated in double.
#ifndef RINGMASTER_TRAIN_NN_FINITE_DIFFERENCE_H_
#define RINGMASTER_TRAIN_NN_FINITE_DIFFERENCE_H_

#include <cmath>

namespace ringmaster::train::nn {

// |analytic - numeric| <= tolerance · (1 + |numeric|).
inline bool GradientClose(double analytic, double numeric, double tolerance) {
  return std::abs(analytic - numeric) <= tolerance * (1 + std::abs(numeric));
}

struct Slope {
  double central;  // (f(v + step) - f(v - step)) / the step actually taken in float
  // The one-sided slopes on either side of v agree (GradientClose with the tolerance given).
  // Where they do not, a kink (a ReLU or max-pool switch) lies within the step and
  // `central` means nothing; a smooth f differs only by about step · |f''|.
  bool smooth;
};

// The slope of f() (returning double) in v at v's current value; restores v.
template <typename F>
Slope MeasureSlope(float& v, float step, double tolerance, F f) {
  const float original = v;
  const double at = f();
  v = original + step;
  const double plus = f(), up = double{v} - original;
  v = original - step;
  const double minus = f(), down = original - double{v};
  v = original;
  return {(plus - minus) / (up + down),
          GradientClose((plus - at) / up, (at - minus) / down, tolerance)};
}

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_FINITE_DIFFERENCE_H_
