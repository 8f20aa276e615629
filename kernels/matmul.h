// Matrix products, row-major, fp32 in and out with fp32 accumulation: a general product and
// the three a fully connected layer needs. Shapes follow PyTorch's nn.Linear: x [n, in],
// weight [out, in], bias [out], y [n, out].
//
// The CPU implementation calls OpenBLAS's cblas_sgemm. Every dimension is positive and below
// 2^31; outputs never overlap inputs. Allocates nothing (OpenBLAS keeps its own buffers).
// Thread-compatible: calls on disjoint outputs may run concurrently; one call may use
// several BLAS threads (SetBlasThreads).
#ifndef RINGMASTER_KERNELS_MATMUL_H_
#define RINGMASTER_KERNELS_MATMUL_H_

#include <cstdint>

namespace ringmaster::kernels {

// Whether a kernel overwrites its output or adds to it (gradient accumulation; beta = 1
// in BLAS terms).
enum class OutputMode { kOverwrite, kAccumulate };

enum class Transpose { kNo, kYes };

// c [m, n] (+)= op(a) · op(b), where op(a) is [m, k] (a is stored [m, k], or [k, m] with
// Transpose::kYes) and op(b) is [k, n] (b stored [k, n], or [n, k] with kYes). Rows are
// contiguous (leading dimension = row length).
void MatMul(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
            const float* a, const float* b, float* c, OutputMode mode);

// y = x · weightᵀ + bias. `bias` may be null (no bias).
void LinearForward(const float* x, const float* weight, const float* bias, float* y, int64_t n,
                   int64_t in, int64_t out);

// dx = dy · weight, overwriting dx [n, in].
void LinearBackwardInput(const float* dy, const float* weight, float* dx, int64_t n, int64_t in,
                         int64_t out);

// dweight (+)= dyᵀ · x and dbias (+)= the sum of dy's rows. `dbias` may be null.
void LinearBackwardWeights(const float* x, const float* dy, float* dweight, float* dbias, int64_t n,
                           int64_t in, int64_t out, OutputMode mode);

// The number of threads one BLAS call may use (process-wide for OpenBLAS). threads >= 1.
// Set it before the first product for predictable behaviour; trainers pass
// cores / local ranks.
void SetBlasThreads(int threads);
int BlasThreads();

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_MATMUL_H_
