// Element-wise reductions used by collectives: dst[i] = a[i] op b[i].
//
// f16 and bf16 are computed in f32 and rounded once. Floating-point min/max propagate
// NaN. All functions are thread-compatible and allocate nothing. The CPU implementation
// picks an AVX2/F16C build at run time when the processor has it.
#ifndef RINGMASTER_KERNELS_REDUCE_H_
#define RINGMASTER_KERNELS_REDUCE_H_

#include <cstddef>

#include "common/dtype.h"

namespace ringmaster::kernels {

enum class ReduceKind { kSum, kProd, kMin, kMax };

// dst may alias a and/or b exactly (not partially).
void Reduce(DataType type, ReduceKind kind, void* dst, const void* a, const void* b, size_t count);

// dst[i] /= divisor: floating types multiply by 1/divisor (f16/bf16 through f32);
// integer types divide, truncating toward zero. Used for averages.
void DivideBy(DataType type, void* dst, size_t count, int divisor);

// Which implementation Reduce uses on this processor: "avx2" or "generic".
const char* ReduceImplementation();

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_REDUCE_H_
