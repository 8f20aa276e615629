// Internal to tools/cuda_emu: the arithmetic of the emulated NCCL's reductions, on the host,
// element by element in the element type (fp16 and bf16 through float, rounding to nearest
// even after every operation, as NCCL's kernels reduce pairwise in the element type).
#ifndef RINGMASTER_TOOLS_CUDA_EMU_NCCL_REDUCE_H_
#define RINGMASTER_TOOLS_CUDA_EMU_NCCL_REDUCE_H_

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rm_emu::nccl {

// Bytes of one element; 0 for a type that is not one.
size_t TypeBytes(ncclDataType_t type);

// Whether Reduce() takes `type` (every type but the fp8 ones).
bool Reducible(ncclDataType_t type);

// out = inputs[0] op inputs[1] op ... op inputs[n-1], `count` elements each, in rank order.
// ncclAvg as NCCL computes it: floating-point inputs are each multiplied by 1/n (rounded to
// the type) and summed; integers are summed and divided by n (truncating). Integer sums and
// products wrap. `out` may be one of the inputs.
void Reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& inputs, void* out,
            size_t count);

// IEEE binary16 and bfloat16 from and to float, rounding to nearest even.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

}  // namespace rm_emu::nccl

#endif  // RINGMASTER_TOOLS_CUDA_EMU_NCCL_REDUCE_H_
