// Internal to the CUDA kernels (.cu files only): loads and stores that let one templated
// kernel serve fp32, bf16 and fp16 storage with fp32 arithmetic.
//
// A bf16 load widens exactly. A bf16 store rounds the fp32 value to nearest, ties to even,
// with the bit operations of kernels/half.h's FloatToBFloat16, so the device and the host
// (kernels/precision.h, the CPU model's bf16 emulation) give the same bits for every float,
// NaNs included (a NaN keeps its sign and top payload bits and is made quiet; the hardware
// conversion would return one canonical NaN instead). Finite values beyond bf16's largest
// round to +-inf. An fp16 load widens exactly; an fp16 store rounds to nearest even
// (__float2half_rn, as kernels/half.h's FloatToFloat16 through _Float16), values of magnitude
// 65520 or more becoming +-inf, and a NaN keeps its sign and top payload bits, made quiet, as
// the host's conversion does. fp32 loads and stores are plain, so a kernel instantiated for
// float is the fp32 kernel it replaced.
#ifndef RINGMASTER_KERNELS_CUDA_BF16_CUH_
#define RINGMASTER_KERNELS_CUDA_BF16_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

// kernels/half.h FloatToBFloat16, on the device.
__device__ __forceinline__ __nv_bfloat16 RoundToBf16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t bits = (u & 0x7fffffffu) > 0x7f800000u
                            ? ((u >> 16) | 0x40u)                     // NaN: quiet, same sign
                            : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest even
  return __ushort_as_bfloat16(static_cast<unsigned short>(bits));
}

// kernels/half.h FloatToFloat16, on the device.
__device__ __forceinline__ __half RoundToF16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: quiet, same sign, top payload bits
    return __ushort_as_half(
        static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu)));
  }
  return __float2half_rn(f);
}

__device__ __forceinline__ float LoadF32(float v) { return v; }
__device__ __forceinline__ float LoadF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float LoadF32(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void StoreF32(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreF32(__nv_bfloat16* p, float v) { *p = RoundToBf16(v); }
__device__ __forceinline__ void StoreF32(__half* p, float v) { *p = RoundToF16(v); }

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_BF16_CUH_
