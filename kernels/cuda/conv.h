// CUDA twins of the convolution and max-pooling kernels of kernels/conv.h: the same shapes
// (Conv2dShape: NCHW, odd kernel_size, stride 1, "same" zero padding of kernel_size / 2),
// the same layouts and OutputMode, as device pointers, fp32 storage.
//
// Convolution works on the whole batch at once, with no per-image loop:
//   forward         columns = im2col(x)                 [C·k·k, N·H·W]   (one kernel)
//                   z = weight · columns                [O, N·H·W]       (MatMulEngine)
//                   y = z rearranged to NCHW, + bias    (one kernel)
//   weights         dy rearranged to [O, N·H·W] (one kernel), columns = im2col(x),
//                   dweight (+)= dy' · columnsᵀ         (MatMulEngine, OutputMode as given)
//                   dbias (+)= the rows of dy' summed   (two kernels, fixed order)
//   input           dy' as above, columns = weightᵀ · dy' (MatMulEngine),
//                   dx = col2im(columns)                (one kernel, a gather)
// all in `scratch` (Conv2dCudaScratchFloats(shape) floats of device memory, contents
// undefined afterwards). One product per call, whatever the batch, and a few kernels; the
// price is a scratch that grows with the batch (the unfolded images of all of it: for 64
// images of 28 x 28 with 32 input channels and k = 3, 58 MB). A caller short of memory
// splits its batch. Only weight, dweight and the scratch reach cuBLASLt (x, y, dy and dx are
// read and written by this module's kernels), so no product sees a pointer into the middle
// of a batch. The products go through `engine` in fp32 storage with `type`
// kFloat32 (fp32 products) or kTensorFloat32 (TF32 tensor cores, fp32 accumulation); the
// 16-bit types are INVALID_ARGUMENT. The bias add, the bias gradient and col2im are fp32.
//
// Determinism: no atomics anywhere. col2im sums each input element's contributions over ky
// then kx ascending; dbias sums each channel in 256 interleaved lanes (each in index order)
// and then the lanes in order; the products are cuBLASLt's, whose plan the engine caches per
// shape. So a call gives the same bits on every run on the same GPU, engine type and shape.
// The sums run in another order than the CPU's, so results differ from kernels/conv.h's in
// the last bits (by the rounding of sums of products: see conv_test.cc).
//
// Max-pooling is kernels/conv.h's, bit for bit: the first maximum of each 2x2 window in
// row-major order, -0 below +0, the first NaN above everything, y the winning element's bits.
// MaxPool2x2Backward is a gather: each dx element takes dy of its window when that window's
// argmax names it, else +0 (also in a dropped last row or column), so argmax must be as
// MaxPool2x2Forward wrote it (an index inside its own window); it overwrites all of dx.
//
// Pointers: weight, dweight and scratch go to cuBLASLt and must be 16-byte aligned
// (cudaMalloc gives 256; state/tensor.h's tensor offsets give 64). Outputs and scratch
// overlap no other argument. bias and dbias may be null (no bias).
//
// Sizes: every Conv2dShape field positive, kernel_size odd (and free to exceed the image:
// taps beyond it read the zero padding), in_channels · kernel_size² and
// batch · height · width (the products' dimensions) at most 2^31 - 1, and the tensors below
// 2^60 floats; max-pooling: planes, height, width positive and height · width at most
// 2^31 - 1 (argmax is int32).
//
// Every function enqueues its work on `stream` and returns without waiting: OK means the
// launches (and cuBLASLt's) were accepted; errors of the execution surface at the next
// synchronising call. INVALID_ARGUMENT names the bad argument (a shape field, a null or
// misaligned pointer, an overlap, the type); the engine's own errors (UNIMPLEMENTED when
// cuBLASLt has no algorithm for a shape, INTERNAL) come back as it returns them, and
// INTERNAL carries a CUDA launch error. After an error past the argument checks, part of the
// work may have been enqueued and the outputs are undefined. No function allocates device
// memory (the engine builds and caches a plan, on the host, for each new product shape).
// Thread-compatible; calls sharing an engine must not overlap (kernels/cuda/matmul.h).
#ifndef RINGMASTER_KERNELS_CUDA_CONV_H_
#define RINGMASTER_KERNELS_CUDA_CONV_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/conv.h"
#include "kernels/cuda/matmul.h"
#include "kernels/matmul.h"

namespace ringmaster::kernels::cuda {

// Floats of device scratch each convolution call needs, for the whole batch: the unfolded
// images (in_channels · kernel_size² · batch · height · width), the rearranged output or
// output gradient (out_channels · batch · height · width), each rounded up to 64 floats, and
// 256 · out_channels partial sums of the bias gradient. 0 for a shape with a field below 1.
int64_t Conv2dCudaScratchFloats(const Conv2dShape& shape);

// y = conv(x, weight) + bias (overwrites y). `bias` may be null.
absl::Status Conv2dForward(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                           const float* x, const float* weight, const float* bias, float* y,
                           float* scratch, cudaStream_t stream);

// dweight (+)= the weight gradient for output gradient dy and input x; dbias (+)= dy summed
// over batch, height and width (`dbias` may be null). `mode` applies to both.
absl::Status Conv2dBackwardWeights(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                                   const float* x, const float* dy, float* dweight, float* dbias,
                                   OutputMode mode, float* scratch, cudaStream_t stream);

// dx = the input gradient for output gradient dy (overwrites dx).
absl::Status Conv2dBackwardInput(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                                 const float* weight, const float* dy, float* dx, float* scratch,
                                 cudaStream_t stream);

// y [planes, height / 2, width / 2] = the maxima of the 2x2 windows of x [planes, height,
// width], argmax their indices within their planes (row * width + column). y and argmax may
// be null when height or width is 1 (nothing to write).
absl::Status MaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes,
                               int64_t height, int64_t width, cudaStream_t stream);

// dx [planes, height, width] = dy routed back to the argmax positions, 0 elsewhere
// (overwrites all of dx). dy and argmax may be null when height or width is 1.
absl::Status MaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes,
                                int64_t height, int64_t width, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_CONV_H_
