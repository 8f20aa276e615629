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
#include <string>

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

// OpenBLAS picks its kernels by the CPU's model when it loads. A release older than the CPU
// (Debian 12's 0.3.21 on a Sapphire or Emerald Rapids Xeon) does not know the model and falls
// back to its oldest x86-64 kernels (Prescott: SSE3), measured 5.8x slower for the GPT's
// products on this project's machines. The environment variable OPENBLAS_CORETYPE, read as
// the library loads, names the kernels instead.
struct BlasKernels {
  std::string chosen;  // the kernels the loaded library runs (openblas_get_corename())
  // What this CPU can run better: "SkylakeX" (AVX-512 F, CD, BW, DQ and VL) or "Haswell"
  // (AVX2 and FMA); empty when `chosen` is as good, or OPENBLAS_CORETYPE is set (the user's
  // choice is kept), or `chosen` is a name this check does not know.
  std::string suggested;
};
BlasKernels CheckBlasKernels();

// For a program's main(), before it starts threads: when CheckBlasKernels() suggests kernels,
// sets OPENBLAS_CORETYPE to them and re-executes the program (/proc/self/exe with the same
// arguments: the same process, so a launcher's pid stays right), so that OpenBLAS loads with
// them; the new image sees the variable and goes on. Returns when there is nothing to do,
// or what the re-execution was (for the log: "OpenBLAS chose SkylakeX kernels (set by
// OPENBLAS_CORETYPE=SkylakeX)"), or the error of execv (the program goes on with the slow
// kernels).
std::string UseBestBlasKernels(char** argv);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_MATMUL_H_
