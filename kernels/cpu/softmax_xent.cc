#include "kernels/softmax_xent.h"

#include <cmath>

namespace ringmaster::kernels {
namespace {

struct RowMax {
  float value;
  int32_t index;
};

RowMax Max(const float* row, int64_t classes) {
  RowMax best{row[0], 0};
  for (int64_t j = 1; j < classes; ++j) {
    // A NaN in the row is kept once found (NaN > x and x > NaN are both false).
    if (row[j] > best.value || (row[j] != row[j] && best.value == best.value)) {
      best = {row[j], static_cast<int32_t>(j)};
    }
  }
  return best;
}

// One row: returns its loss; with `grad` non-null also writes the row's gradient there (scaled
// by `scale`). Shared by both entry points so that their losses agree exactly.
float Row(const float* row, int32_t label, int64_t classes, float scale, int32_t* predicted,
          float* grad) {
  const RowMax max = Max(row, classes);
  *predicted = max.index;
  float sum = 0.0f;
  if (grad == nullptr) {
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - max.value);
  } else {
    for (int64_t j = 0; j < classes; ++j) {
      grad[j] = std::exp(row[j] - max.value);
      sum += grad[j];
    }
    const float factor = scale / sum;
    for (int64_t j = 0; j < classes; ++j) grad[j] *= factor;
    grad[label] -= scale;
  }
  return std::log(sum) - (row[label] - max.value);
}

}  // namespace

void SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                int64_t classes, float* loss, int32_t* predicted) {
  for (int64_t i = 0; i < n; ++i) {
    loss[i] = Row(logits + i * classes, labels[i], classes, 0.0f, predicted + i, nullptr);
  }
}

void SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float scale, float* loss,
                                        int32_t* predicted, float* dlogits) {
  for (int64_t i = 0; i < n; ++i) {
    loss[i] =
        Row(logits + i * classes, labels[i], classes, scale, predicted + i, dlogits + i * classes);
  }
}

}  // namespace ringmaster::kernels
