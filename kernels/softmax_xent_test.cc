#include "kernels/softmax_xent.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels {
namespace {

TEST(SoftmaxCrossEntropy, MatchesDoublePrecisionDefinition) {
  const int64_t n = 6, classes = 11;
  const std::vector<float> logits = RandomFloats(n * classes, 3, -8.0f, 8.0f);
  const std::vector<int32_t> labels = {0, 10, 3, 3, 7, 1};
  const float scale = 0.375f;

  std::vector<float> loss(n), dlogits(n * classes);
  std::vector<int32_t> predicted(n);
  SoftmaxCrossEntropyForwardBackward(logits.data(), labels.data(), n, classes, scale, loss.data(),
                                     predicted.data(), dlogits.data());
  for (int64_t i = 0; i < n; ++i) {
    const float* z = &logits[i * classes];
    // The definition, without the max subtraction (safe for |z| <= 8 in double).
    double sum = 0;
    int32_t argmax = 0;
    for (int64_t j = 0; j < classes; ++j) {
      sum += std::exp(double{z[j]});
      if (z[j] > z[argmax]) argmax = static_cast<int32_t>(j);
    }
    EXPECT_NEAR(loss[i], std::log(sum) - z[labels[i]], 1e-5) << i;
    EXPECT_EQ(predicted[i], argmax) << i;
    for (int64_t j = 0; j < classes; ++j) {
      const double want = (std::exp(double{z[j]}) / sum - (j == labels[i])) * scale;
      EXPECT_NEAR(dlogits[i * classes + j], want, 1e-6) << i << "," << j;
    }
  }

  std::vector<float> loss_only(n);
  std::vector<int32_t> predicted_only(n);
  SoftmaxCrossEntropyForward(logits.data(), labels.data(), n, classes, loss_only.data(),
                             predicted_only.data());
  EXPECT_EQ(loss_only, loss);  // bit for bit
  EXPECT_EQ(predicted_only, predicted);
}

TEST(SoftmaxCrossEntropy, HugeLogitsStayFinite) {
  const std::vector<float> logits = {1000.0f, 0.0f, -1000.0f};
  const int32_t label = 1;
  float loss;
  int32_t predicted;
  std::vector<float> dlogits(3);
  SoftmaxCrossEntropyForwardBackward(logits.data(), &label, 1, 3, 2.0f, &loss, &predicted,
                                     dlogits.data());
  EXPECT_EQ(loss, 1000.0f);  // log(e^1000 + 1 + e^-1000) - 0, rounded to float
  EXPECT_EQ(predicted, 0);
  EXPECT_EQ(dlogits, (std::vector<float>{2.0f, -2.0f, 0.0f}));
}

TEST(SoftmaxCrossEntropy, ArgmaxTakesFirstOfTiesAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {1, 3,   3, 0,  //
                                     2, nan, 5, nan};
  const std::vector<int32_t> labels = {0, 0};
  std::vector<float> loss(2);
  std::vector<int32_t> predicted(2);
  SoftmaxCrossEntropyForward(logits.data(), labels.data(), 2, 4, loss.data(), predicted.data());
  EXPECT_EQ(predicted, (std::vector<int32_t>{1, 1}));
  EXPECT_TRUE(std::isnan(loss[1]));
}

}  // namespace
}  // namespace ringmaster::kernels
