// Softmax cross-entropy over rows of logits, fused with its gradient.
//
// logits is [n, classes] row-major; labels[i] is in [0, classes) (the caller validates it).
// For row i, with m its maximum:
//   loss[i]      = log(sum_j exp(logits[i][j] - m)) - (logits[i][labels[i]] - m)
//   predicted[i] = the index of the row's maximum (the first one on ties; a NaN wins)
//   dlogits[i][j] = (softmax(logits[i])[j] - (j == labels[i])) * scale
// computed in fp32 with the maximum subtracted, so large logits do not overflow. Every
// output array is written in full and overlaps no input. Allocates nothing;
// thread-compatible.
#ifndef RINGMASTER_KERNELS_SOFTMAX_XENT_H_
#define RINGMASTER_KERNELS_SOFTMAX_XENT_H_

#include <cstdint>

namespace ringmaster::kernels {

// Forward only: per-row loss and predicted class.
void SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                int64_t classes, float* loss, int32_t* predicted);

// Forward and backward in one sweep over each row. The losses equal
// SoftmaxCrossEntropyForward's bit for bit. `scale` is the loss's outer factor (e.g.
// loss_scale / loss_divisor).
void SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float scale, float* loss,
                                        int32_t* predicted, float* dlogits);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_SOFTMAX_XENT_H_
