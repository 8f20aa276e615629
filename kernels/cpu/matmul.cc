#include "kernels/matmul.h"

#include <cblas.h>

#include <cstring>

namespace ringmaster::kernels {
namespace {

CBLAS_TRANSPOSE Blas(Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; }

float Beta(OutputMode mode) { return mode == OutputMode::kAccumulate ? 1.0f : 0.0f; }

}  // namespace

void MatMul(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
            const float* a, const float* b, float* c, OutputMode mode) {
  const int64_t lda = transpose_a == Transpose::kYes ? m : k;
  const int64_t ldb = transpose_b == Transpose::kYes ? k : n;
  cblas_sgemm(CblasRowMajor, Blas(transpose_a), Blas(transpose_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), Beta(mode), c, static_cast<blasint>(n));
}

void LinearForward(const float* x, const float* weight, const float* bias, float* y, int64_t n,
                   int64_t in, int64_t out) {
  OutputMode mode = OutputMode::kOverwrite;
  if (bias != nullptr) {
    // Broadcast the bias into y and let sgemm add x·Wᵀ to it (beta = 1): one pass over y.
    for (int64_t r = 0; r < n; ++r) std::memcpy(y + r * out, bias, out * sizeof(float));
    mode = OutputMode::kAccumulate;
  }
  MatMul(Transpose::kNo, Transpose::kYes, n, out, in, x, weight, y, mode);
}

void LinearBackwardInput(const float* dy, const float* weight, float* dx, int64_t n, int64_t in,
                         int64_t out) {
  MatMul(Transpose::kNo, Transpose::kNo, n, in, out, dy, weight, dx, OutputMode::kOverwrite);
}

void LinearBackwardWeights(const float* x, const float* dy, float* dweight, float* dbias, int64_t n,
                           int64_t in, int64_t out, OutputMode mode) {
  MatMul(Transpose::kYes, Transpose::kNo, out, in, n, dy, x, dweight, mode);
  if (dbias == nullptr) return;
  if (mode == OutputMode::kOverwrite) std::memset(dbias, 0, out * sizeof(float));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = dy + r * out;
    for (int64_t j = 0; j < out; ++j) dbias[j] += row[j];
  }
}

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace ringmaster::kernels
