// CUDA twins of kernels/matmul.h through cuBLASLt: the general product and the three a fully
// connected layer needs, row-major, with the CPU kernels' shapes (nn.Linear: x [n, in],
// weight [out, in], bias [out], y [n, out]) and OutputMode.
//
// Element types (a, b and c, x, weight, bias and y all of one type), accumulation in fp32:
//   kFloat32        fp32, fp32 products (CUBLAS_COMPUTE_32F)
//   kTensorFloat32  fp32 storage, products on tensor cores in TF32 (10-bit mantissa inputs,
//                   CUBLAS_COMPUTE_32F_FAST_TF32)
//   kBFloat16       __nv_bfloat16 storage, tensor cores, fp32 accumulation
//   kFloat16        __half storage, tensor cores, fp32 accumulation
// The bias gradient is always fp32 (it is summed over the n rows), accumulated in a fixed
// order without atomics: the same bits for the same input on the same GPU.
//
//   auto engine = MatMulEngine::Create();  // a cuBLASLt handle and a workspace
//   engine->LinearForward(MatMulType::kBFloat16, x, w, b, y, n, in, out, stream);
//
// Every call enqueues on `stream` and returns: OK means cuBLASLt accepted the work; errors of
// its execution surface at the next synchronising call. INVALID_ARGUMENT names the bad
// argument (a size below 1 or above 2^31 - 1, a null pointer where one is needed);
// UNIMPLEMENTED when cuBLASLt has no algorithm for a shape and type on this GPU; INTERNAL
// carries a CUDA or cuBLAS error. Plans (descriptors and the chosen algorithm) are cached
// per shape, so the first call of a shape costs a heuristic query. Thread-compatible: one
// engine per thread or stream, or external locking; calls on one engine must not overlap.
#ifndef RINGMASTER_KERNELS_CUDA_MATMUL_H_
#define RINGMASTER_KERNELS_CUDA_MATMUL_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/matmul.h"

namespace ringmaster::kernels::cuda {

enum class MatMulType { kFloat32, kTensorFloat32, kBFloat16, kFloat16 };

// Bytes of one element of `type` in memory (4 or 2).
int64_t ElementBytes(MatMulType type);
const char* MatMulTypeName(MatMulType type);

// Row strides (elements from one row to the next) of a product's row-major operands, for
// arrays that are blocks of wider ones (GptCuda's logits, whose rows are padded to an aligned
// width so that 16-bit rows start on 16-byte boundaries). 0: the operand's own width.
struct RowStrides {
  int64_t a = 0, b = 0, c = 0;
};

class MatMulEngine {
 public:
  // workspace_bytes of device memory for cuBLASLt (32 MiB lets it pick split-K and
  // stream-K algorithms on Hopper; 0 is allowed).
  static absl::StatusOr<std::unique_ptr<MatMulEngine>> Create(int64_t workspace_bytes = 32 << 20);
  ~MatMulEngine();
  MatMulEngine(const MatMulEngine&) = delete;
  MatMulEngine& operator=(const MatMulEngine&) = delete;

  // c [m, n] (+)= op(a) · op(b), as kernels::MatMul. `bias`, when not null, is [n], added
  // to every row of the product (cuBLASLt's bias epilogue); only with kOverwrite.
  // `strides` (each 0 or at least the operand's stored width) lets a, b or c be blocks of
  // wider row-major arrays.
  absl::Status MatMul(MatMulType type, Transpose transpose_a, Transpose transpose_b, int64_t m,
                      int64_t n, int64_t k, const void* a, const void* b, void* c, OutputMode mode,
                      cudaStream_t stream, const void* bias = nullptr, RowStrides strides = {});

  // y = x · weightᵀ + bias; bias may be null. y's rows are y_stride elements apart (0: out).
  absl::Status LinearForward(MatMulType type, const void* x, const void* weight, const void* bias,
                             void* y, int64_t n, int64_t in, int64_t out, cudaStream_t stream,
                             int64_t y_stride = 0);
  // dx = dy · weight, overwriting dx [n, in]. dy's rows are dy_stride apart (0: out).
  absl::Status LinearBackwardInput(MatMulType type, const void* dy, const void* weight, void* dx,
                                   int64_t n, int64_t in, int64_t out, cudaStream_t stream,
                                   int64_t dy_stride = 0);
  // dweight (+)= dyᵀ · x; dbias (fp32, may be null) (+)= the sum of dy's rows, through
  // `scratch` (BiasGradientScratchFloats(out) floats of device memory; null when dbias is).
  // dy's rows are dy_stride apart (0: out; only dense with a dbias).
  absl::Status LinearBackwardWeights(MatMulType type, const void* x, const void* dy, void* dweight,
                                     float* dbias, int64_t n, int64_t in, int64_t out,
                                     OutputMode mode, float* scratch, cudaStream_t stream,
                                     int64_t dy_stride = 0);

  // Mixed precision's weight gradient: as LinearBackwardWeights with x and dy of `type` (16-bit
  // activations) but dweight in fp32 whatever the type, so the products accumulate in fp32
  // straight into the fp32 master gradient (cuBLASLt's 16-bit A and B with an fp32 C): no
  // 16-bit copy of the weight gradient, no rounding of it. dbias is fp32 as always.
  absl::Status LinearBackwardWeightsFloatOutput(MatMulType type, const void* x, const void* dy,
                                                float* dweight, float* dbias, int64_t n, int64_t in,
                                                int64_t out, OutputMode mode, float* scratch,
                                                cudaStream_t stream, int64_t dy_stride = 0);

  // Plans cached so far (one per distinct shape, type, transposition and pointer alignment).
  int64_t cached_plans() const { return static_cast<int64_t>(plans_.size()); }

 private:
  struct Plan;
  // Type, transpositions, m, n, k, accumulate, bias, float_c, the alignments (bytes, up to
  // 256) of a, b, c and the bias (the algorithm is chosen for pointers that aligned), and the
  // leading dimensions of a, b and c.
  using PlanKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, bool, bool, bool,
                             std::array<int, 4>, std::array<int64_t, 3>>;
  MatMulEngine() = default;
  // `float_c`: c is fp32 whatever `type` is (a and b are of `type`). `bias` is the bias
  // pointer, or null without the bias epilogue.
  absl::StatusOr<Plan*> GetPlan(MatMulType type, Transpose transpose_a, Transpose transpose_b,
                                int64_t m, int64_t n, int64_t k, bool accumulate, const void* a,
                                const void* b, const void* c, const void* bias, bool float_c,
                                const std::array<int64_t, 3>& lds);
  absl::Status Product(MatMulType type, bool float_c, Transpose transpose_a, Transpose transpose_b,
                       int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c,
                       OutputMode mode, cudaStream_t stream, const void* bias, RowStrides strides);
  absl::Status WeightGradient(MatMulType type, bool float_c, const void* x, const void* dy,
                              void* dweight, float* dbias, int64_t n, int64_t in, int64_t out,
                              OutputMode mode, float* scratch, cudaStream_t stream,
                              int64_t dy_stride);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

// Scratch of the bias gradient: this many floats of device memory.
int64_t BiasGradientScratchFloats(int64_t columns);
// dbias[j] (+)= sum over the rows i of dy[i, j] (dy [rows, columns] of `type`), in a fixed
// order: partial sums of fixed chunks of rows into scratch, then the chunks in order.
absl::Status BiasGradient(MatMulType type, const void* dy, int64_t rows, int64_t columns,
                          float* dbias, OutputMode mode, float* scratch, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_MATMUL_H_
