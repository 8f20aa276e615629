// 2-D convolution (stride 1, "same" zero padding) and 2x2 max-pooling over NCHW tensors: the
// layers of a small image classifier.
//
// Convolution: x [batch, in_channels, height, width], weight [out_channels, in_channels,
// kernel_size, kernel_size], bias [out_channels], y [batch, out_channels, height, width];
// kernel_size is odd and the padding is kernel_size / 2 on every side (PyTorch's
// Conv2d(padding="same")). The CPU implementation unfolds one image at a time into
// `scratch` (im2col, Conv2dScratchElements floats, owned by the caller so that a training
// step allocates nothing) and multiplies with sgemm (kernels/matmul.h).
//
// All counts are positive and every image-sized product is below 2^31. Outputs overlap
// neither inputs nor scratch. Thread-compatible.
#ifndef RINGMASTER_KERNELS_CONV_H_
#define RINGMASTER_KERNELS_CONV_H_

#include <cstdint>

#include "kernels/matmul.h"

namespace ringmaster::kernels {

struct Conv2dShape {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t kernel_size = 0;  // odd
};

// Floats of scratch each convolution call needs: in_channels * kernel_size² * height * width.
int64_t Conv2dScratchElements(const Conv2dShape& shape);

// y = conv(x, weight) + bias. `bias` may be null.
void Conv2dForward(const Conv2dShape& shape, const float* x, const float* weight, const float* bias,
                   float* y, float* scratch);

// dweight (+)= the weight gradient for output gradient dy and input x; dbias (+)= dy summed
// over batch, height and width (`dbias` may be null).
void Conv2dBackwardWeights(const Conv2dShape& shape, const float* x, const float* dy,
                           float* dweight, float* dbias, OutputMode mode, float* scratch);

// dx = the input gradient for output gradient dy (overwrites dx).
void Conv2dBackwardInput(const Conv2dShape& shape, const float* weight, const float* dy, float* dx,
                         float* scratch);

// Convolution with any stride and zero padding and no bias (ResNet's 3x3 and 1x1
// convolutions): x [batch, in_channels, height, width], weight [out_channels, in_channels,
// kernel_size, kernel_size], y [batch, out_channels, out_height, out_width] with
// out = (size + 2 * padding - kernel_size) / stride + 1 (PyTorch's nn.Conv2d(bias=False)).
// The CPU implementation unfolds several images at once (so that the products of small late
// feature maps stay large) into `scratch`, StridedConv2dScratchElements floats, or for the
// 3x3 stride-1 convolutions transforms them (Winograd, see `winograd` below), on
// `threads` threads.
struct StridedConv2dShape {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t kernel_size = 0;
  int64_t stride = 1;
  int64_t padding = 0;  // < kernel_size
  // 3x3 convolutions with stride 1 and padding 1, at least 16 channels in and out, on maps
  // of 4x4 or more run Winograd's minimal filtering (see winograd_tile; results differ from
  // the unfolded product's by rounding) unless this is false: the unfolded product, for
  // comparisons (kernels/conv_bench).
  bool winograd = true;
  // Threads the passes run on at once (kernels/parallel.h: OpenBLAS on one thread meanwhile),
  // each taking whole chunks of images; the scratch grows with them. 1: the calling thread
  // alone, OpenBLAS threading the products as it is set to.
  int64_t threads = 1;
  // Winograd's output tile: 0 chooses by the map, F(4x4, 3x3) (4x fewer multiplications) on
  // maps of 8x8 or more and F(2x2, 3x3) on smaller ones; 2 or 4 runs that one wherever
  // Winograd runs (kernels/conv_bench compares them).
  int64_t winograd_tile = 0;

  int64_t out_height() const { return (height + 2 * padding - kernel_size) / stride + 1; }
  int64_t out_width() const { return (width + 2 * padding - kernel_size) / stride + 1; }
};

// Floats of scratch each strided convolution call needs.
int64_t StridedConv2dScratchElements(const StridedConv2dShape& shape);

// The weights as the forward and the input gradient use them (Winograd's transformed
// filters), prepared once for both: a layer prepares them in its forward and hands them to
// both calls, so that the input gradient does not transform the same weights again.
// StridedConv2dPreparedWeightElements floats, 0 where the shape runs no Winograd (nothing to
// prepare; `prepared` is then not read).
int64_t StridedConv2dPreparedWeightElements(const StridedConv2dShape& shape);
void StridedConv2dPrepareWeights(const StridedConv2dShape& shape, const float* weight,
                                 float* prepared);

// y = conv(x, weight) (overwrites y). `prepared`: StridedConv2dPrepareWeights' result for
// these weights, or null (the call prepares them in its scratch).
void StridedConv2dForward(const StridedConv2dShape& shape, const float* x, const float* weight,
                          float* y, float* scratch, const float* prepared = nullptr);

// dweight (+)= the weight gradient for output gradient dy and input x.
void StridedConv2dBackwardWeights(const StridedConv2dShape& shape, const float* x, const float* dy,
                                  float* dweight, OutputMode mode, float* scratch);

// dx = the input gradient for output gradient dy (overwrites dx). `prepared` as for the
// forward.
void StridedConv2dBackwardInput(const StridedConv2dShape& shape, const float* weight,
                                const float* dy, float* dx, float* scratch,
                                const float* prepared = nullptr);

// Both: dweight (+)= the weight gradient and dx = the input gradient, as the two calls above
// would give them. With `prepared` weights, Winograd transforms each chunk's output gradient
// once for both.
void StridedConv2dBackward(const StridedConv2dShape& shape, const float* x, const float* weight,
                           const float* dy, float* dweight, OutputMode mode, float* dx,
                           float* scratch, const float* prepared = nullptr);

// Max over non-overlapping 2x2 windows of `planes` planes of [height, width] (floor: an odd
// last row or column is dropped, as in PyTorch): y is [planes, height / 2, width / 2], and
// argmax[k] is the index within its input plane (row * width + column) of the element
// y[k] came from: the first maximum in row-major order, where -0 counts below +0 and the
// first NaN wins over everything.
void MaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t height,
                       int64_t width);

// dx = dy routed back to the argmax positions, 0 elsewhere (overwrites all of dx,
// [planes, height, width]).
void MaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes,
                        int64_t height, int64_t width);

// Mean over each plane of `planes` planes of `positions` values: y[p] = mean of x's plane p
// (global average pooling of [batch · channels] feature maps).
void GlobalAvgPoolForward(const float* x, float* y, int64_t planes, int64_t positions);

// dx = dy[p] / positions over each plane (overwrites dx).
void GlobalAvgPoolBackward(const float* dy, float* dx, int64_t planes, int64_t positions);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_CONV_H_
