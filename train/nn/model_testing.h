// Test helpers of the CUDA models' tests (gpt_cuda_test, sequential_cuda_test): per-tensor
// comparisons of flat gradient buffers laid out by a TensorTable.
#ifndef RINGMASTER_TRAIN_NN_MODEL_TESTING_H_
#define RINGMASTER_TRAIN_NN_MODEL_TESTING_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "state/tensor.h"

namespace ringmaster::train::nn::testing {

// The Euclidean norm of x[0, n), summed in double.
inline double Norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double{x[i]} * x[i];
  return std::sqrt(s);
}

// For each tensor of `table`: ||got - scale·want|| <= tol·||want|| + slack over the tensor's
// elements (each difference in float, the norms summed in double). A failure names the
// tensor after `what` and gives want's norm.
inline void ExpectTensorsClose(const state::TensorTable& table, const float* got, const float* want,
                               double scale, double tol, double slack, const std::string& what) {
  for (const state::TensorSpec& t : table.tensors()) {
    double sum = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double d = got[i] - static_cast<float>(scale) * want[i];  // in float
      sum += d * d;
    }
    const double ref = Norm(want + t.offset, t.numel);
    EXPECT_LE(std::sqrt(sum), tol * ref + slack)
        << what << " of " << t.name << " (norm " << ref << ")";
  }
}

}  // namespace ringmaster::train::nn::testing

#endif  // RINGMASTER_TRAIN_NN_MODEL_TESTING_H_
