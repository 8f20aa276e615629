// Internal to kernels/cuda/conv: the kernel launchers, compiled by nvcc (no absl here).
// Callers (conv.cc) validate every argument first; the launchers assume device pointers,
// non-null where they are read or written, positive sizes within the limits conv.h states,
// and no overlaps between what a kernel reads and what it writes. Each returns
// cudaGetLastError() after its launches (asynchronous errors show later).
//
// Layouts: "images" are NCHW, [batch, channels, height, width]. "Channel-major" is the same
// data as [channels, batch * height * width]: element (n, c, p) of the images, p = y * width
// + x, at c * (batch * hw) + n * hw + p. The unfolded images ("columns") are
// [in_channels * k * k, batch * hw]: row (c * k + ky) * k + kx, column n * hw + y * width + x
// holds image n's input at (c, y + ky - k / 2, x + kx - k / 2), 0 where that is padding.
#ifndef RINGMASTER_KERNELS_CUDA_CONV_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_CONV_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// The per-channel sum splits each channel's row into this many interleaved lanes (lane l
// sums elements l, l + kChannelSumLanes, ... in order), then adds the lanes in order.
inline constexpr int kChannelSumLanes = 256;

// columns = the unfolded images x (stride 1, padding kernel_size / 2).
cudaError_t LaunchIm2Col(const float* x, float* columns, int64_t batch, int64_t channels,
                         int64_t height, int64_t width, int64_t kernel_size, cudaStream_t stream);

// dx = the columns folded back: each input element sums the column entries it was copied to,
// over ky then kx ascending (a gather: no atomics).
cudaError_t LaunchCol2Im(const float* columns, float* dx, int64_t batch, int64_t channels,
                         int64_t height, int64_t width, int64_t kernel_size, cudaStream_t stream);

// out (channel-major) = in (images).
cudaError_t LaunchImagesToChannelMajor(const float* in, float* out, int64_t batch, int64_t channels,
                                       int64_t hw, cudaStream_t stream);

// out (images) = in (channel-major) + bias[channel]; bias may be null (a copy).
cudaError_t LaunchChannelMajorToImages(const float* in, const float* bias, float* out,
                                       int64_t batch, int64_t channels, int64_t hw,
                                       cudaStream_t stream);

// sums[c] (+)= the sum of row c of rows [channels, length], in a fixed order through
// `partial` (kChannelSumLanes * channels floats).
cudaError_t LaunchChannelSums(const float* rows, int64_t channels, int64_t length, float* sums,
                              bool accumulate, float* partial, cudaStream_t stream);

// kernels/conv.h's MaxPool2x2Forward and MaxPool2x2Backward; y, argmax and dy have
// planes * (height / 2) * (width / 2) elements (possibly none).
cudaError_t LaunchMaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes,
                                    int64_t height, int64_t width, cudaStream_t stream);
cudaError_t LaunchMaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx,
                                     int64_t planes, int64_t height, int64_t width,
                                     cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_CONV_LAUNCH_H_
