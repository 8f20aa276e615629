// Emulated reduced precision: round fp32 values to the nearest bf16 or fp16 value, keeping
// them in fp32 storage. The models use this to run "bf16/fp16 compute" on CPU with the
// numerics of the GPU formats (train/model.h).
//
// Rounding is to nearest, ties to even. bf16 has fp32's range. fp16 has subnormals down to
// 2^-24, and values of magnitude 65520 or more (beyond the largest finite 65504 by half an
// ulp) become ±inf, as on a GPU. NaN stays NaN (quiet). The results equal
// kernels/half.h's conversions to and back from the 16-bit type. Vectorised loops;
// allocate nothing; thread-compatible.
#ifndef RINGMASTER_KERNELS_PRECISION_H_
#define RINGMASTER_KERNELS_PRECISION_H_

#include <cstdint>

namespace ringmaster::kernels {

enum class HalfFormat { kBFloat16, kFloat16 };

// y[i] = x[i] rounded to `format`. y may be x (in place); otherwise they do not overlap.
void RoundTo(HalfFormat format, const float* x, float* y, int64_t n);

// sum[i] += x[i] rounded to `format`: accumulating, in fp32, a gradient that was produced
// in half precision. x and sum do not overlap.
void AddRounded(HalfFormat format, const float* x, float* sum, int64_t n);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_PRECISION_H_
