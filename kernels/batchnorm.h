// BatchNorm2d over NCHW tensors (PyTorch's nn.BatchNorm2d, affine): per channel c,
//   y = gamma[c] · (x - mean[c]) · invstd[c] + beta[c],   invstd = 1 / sqrt(var + eps),
// over the batch and the positions of channel c. The statistics are passed in: the
// caller computes them from BatchNormChannelSums (training: the batch's, possibly summed
// over several ranks first, as SyncBatchNorm does) or takes the running ones (evaluation).
//
// Sums are accumulated in double so that E[x²] - mean² keeps its precision (float partial sums
// of a plane's values in 16 interleaved lanes first). Tensors are
// [batch, channels, positions]; outputs overlap no input except where said. Thread-compatible.
#ifndef RINGMASTER_KERNELS_BATCHNORM_H_
#define RINGMASTER_KERNELS_BATCHNORM_H_

#include <cstdint>

namespace ringmaster::kernels {

struct BatchNormShape {
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t positions = 0;  // height · width
  // Threads the channels are split over (kernels/parallel.h); 1: the calling thread.
  int64_t threads = 1;
};

// sum[c] = Σ x, sum_sq[c] = Σ x² over channel c (overwrites both, `channels` doubles each).
void BatchNormChannelSums(const BatchNormShape& shape, const float* x, double* sum,
                          double* sum_sq);

// What the forward does to the normalised values in the same pass, each part optional:
// y = relu(bn(x) + residual) (ResNet's blocks: a ReLU after the first BatchNorm, the
// shortcut added and a ReLU after the second), rounding as the separate passes would.
struct BatchNormEpilogue {
  const float* residual = nullptr;  // [batch, channels, positions], added; may be y
  bool relu = false;                // max(0, v), a NaN passing through (kernels::ReluForward)
};

// y = gamma · (x - mean) · invstd + beta, per channel, then `then`. y may be x.
void BatchNormForward(const BatchNormShape& shape, const float* x, const float* mean,
                      const float* invstd, const float* gamma, const float* beta, float* y,
                      const BatchNormEpilogue& then = {});

// Per channel, with xhat = (x - mean) · invstd: sum_dy[c] = Σ dy and sum_dy_xhat[c] = Σ dy ·
// xhat (overwrites both). They are beta's and gamma's gradients, and (summed over the ranks
// that shared the statistics) what the input gradient needs.
void BatchNormBackwardSums(const BatchNormShape& shape, const float* x, const float* dy,
                           const float* mean, const float* invstd, double* sum_dy,
                           double* sum_dy_xhat);

// The input gradient of a normalisation by batch statistics over `count` values per channel
// (the batch's, or every rank's batch together):
//   dx = gamma · invstd · (dy - sum_dy / count - xhat · sum_dy_xhat / count).
// dx may be dy.
void BatchNormBackwardInput(const BatchNormShape& shape, const float* x, const float* dy,
                            const float* mean, const float* invstd, const float* gamma,
                            const double* sum_dy, const double* sum_dy_xhat, double count,
                            float* dx);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_BATCHNORM_H_
