// kernels/cuda/matmul.h: row-major products through cuBLASLt's column-major API.
//
// A row-major matrix X [r, c] is the column-major matrix Xᵀ [c, r] with leading dimension c.
// So c [m, n] = op(a) · op(b) is computed as the column-major cᵀ [n, m] = op(b)ᵀ · op(a)ᵀ:
// cuBLASLt's "A" is b and its "B" is a, with the same transposition flags, and the bias
// epilogue (a vector over the rows of the column-major result) adds bias[j] to column j of
// the row-major c.
#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/matmul_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(fn, " (CUDA): ", parts...));
}

absl::Status CublasToStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS error ", cublasLtGetStatusName(status),
                                          ": ", cublasLtGetStatusString(status)));
}

#define RM_RETURN_IF_CUBLAS_ERROR(call) RM_RETURN_IF_ERROR(CublasToStatus((call), #call))

absl::Status CheckSize(const char* fn, const char* name, int64_t v) {
  if (v < 1 || v > std::numeric_limits<int32_t>::max()) {
    return Invalid(fn, name, " must be in [1, 2^31 - 1], got ", v);
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const char* fn, const void* p, const char* name) {
  if (p == nullptr) return Invalid(fn, name, " is null");
  return absl::OkStatus();
}

cudaDataType_t DataType(MatMulType type) {
  switch (type) {
    case MatMulType::kBFloat16:
      return CUDA_R_16BF;
    case MatMulType::kFloat16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

cublasComputeType_t ComputeType(MatMulType type) {
  return type == MatMulType::kTensorFloat32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasOperation_t Op(Transpose t) { return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The alignment a pointer has, in bytes, up to 256 (what cuBLASLt's heuristic assumes unless
// told less). Parameters and activations sit at arbitrary element offsets of flat buffers, so
// an algorithm chosen for 256-byte pointers could fault on them ("misaligned address").
int Alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? 256 : static_cast<int>(std::min<uintptr_t>(256, v & (~v + 1)));
}

}  // namespace

int64_t ElementBytes(MatMulType type) {
  return type == MatMulType::kBFloat16 || type == MatMulType::kFloat16 ? 2 : 4;
}

const char* MatMulTypeName(MatMulType type) {
  switch (type) {
    case MatMulType::kFloat32:
      return "fp32";
    case MatMulType::kTensorFloat32:
      return "tf32";
    case MatMulType::kBFloat16:
      return "bf16";
    case MatMulType::kFloat16:
      return "fp16";
  }
  return "?";
}

struct MatMulEngine::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (= D)
  cublasLtMatmulAlgo_t algo;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<MatMulEngine>> MatMulEngine::Create(int64_t workspace_bytes) {
  if (workspace_bytes < 0) {
    return Invalid("MatMulEngine::Create", "workspace_bytes must be >= 0, got ", workspace_bytes);
  }
  std::unique_ptr<MatMulEngine> engine(new MatMulEngine());
  RM_RETURN_IF_CUBLAS_ERROR(cublasLtCreate(&engine->handle_));
  if (workspace_bytes > 0) {
    RM_RETURN_IF_ERROR(CudaToStatus(cudaMalloc(&engine->workspace_, workspace_bytes),
                                    "cudaMalloc of the cuBLASLt workspace"));
  }
  engine->workspace_bytes_ = workspace_bytes;
  return engine;
}

MatMulEngine::~MatMulEngine() {
  plans_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::StatusOr<MatMulEngine::Plan*> MatMulEngine::GetPlan(
    MatMulType type, Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
    bool accumulate, const void* a, const void* b, const void* c, const void* bias, bool float_c,
    const std::array<int64_t, 3>& lds) {
  const int align_a = Alignment(a), align_b = Alignment(b), align_c = Alignment(c);
  const PlanKey key{static_cast<int>(type),
                    static_cast<int>(transpose_a),
                    static_cast<int>(transpose_b),
                    m,
                    n,
                    k,
                    accumulate,
                    bias != nullptr,
                    float_c,
                    {align_a, align_b, align_c, Alignment(bias)},
                    lds};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  auto plan = std::make_unique<Plan>();
  const cudaDataType_t data = DataType(type);
  RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&plan->desc, ComputeType(type), CUDA_R_32F));
  // cuBLASLt's A is b, its B is a (see the top of this file).
  const cublasOperation_t op_a = Op(transpose_b), op_b = Op(transpose_a);
  RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &data, sizeof(data)));
    // The heuristic reads the bias pointer's alignment (each call sets its own pointer, of
    // the same alignment: it is in the key).
    RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Column-major shapes as stored: b is [k, n] row-major = [n, k] column-major (ld n, or its
  // row stride), or [n, k] row-major = [k, n] column-major (ld k) when transposed; likewise a.
  const bool tb = transpose_b == Transpose::kYes, ta = transpose_a == Transpose::kYes;
  const auto [ld_a, ld_b, ld_c] = lds;
  RM_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a, data, tb ? k : n, tb ? n : k, ld_b));
  RM_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatrixLayoutCreate(&plan->b, data, ta ? m : k, ta ? k : m, ld_a));
  RM_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatrixLayoutCreate(&plan->c, float_c ? CUDA_R_32F : data, n, m, ld_c));

  cublasLtMatmulPreference_t preference = nullptr;
  RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = static_cast<uint64_t>(workspace_bytes_);
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  // cuBLASLt's A is b and its B is a; C and D are c.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_b)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_a)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_c)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_c)}};
  for (const auto& [attribute, bytes] : alignments) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes));
    }
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c,
                                            plan->c, preference, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  RM_RETURN_IF_ERROR(CublasToStatus(status, "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for a ", MatMulTypeName(type),
        float_c ? " product (fp32 output)" : " product", " m=", m, " n=", n,
        " k=", k, accumulate ? " (accumulating)" : "", bias ? " with a bias" : "",
        " on this GPU"));
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status MatMulEngine::MatMul(MatMulType type, Transpose transpose_a, Transpose transpose_b,
                                  int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                                  void* c, OutputMode mode, cudaStream_t stream, const void* bias,
                                  RowStrides strides) {
  return Product(type, /*float_c=*/false, transpose_a, transpose_b, m, n, k, a, b, c, mode, stream,
                 bias, strides);
}

absl::Status MatMulEngine::Product(MatMulType type, bool float_c, Transpose transpose_a,
                                   Transpose transpose_b, int64_t m, int64_t n, int64_t k,
                                   const void* a, const void* b, void* c, OutputMode mode,
                                   cudaStream_t stream, const void* bias, RowStrides strides) {
  const char* fn = "MatMul";
  RM_RETURN_IF_ERROR(CheckSize(fn, "m", m));
  RM_RETURN_IF_ERROR(CheckSize(fn, "n", n));
  RM_RETURN_IF_ERROR(CheckSize(fn, "k", k));
  RM_RETURN_IF_ERROR(CheckPointer(fn, a, "a"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, b, "b"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, c, "c"));
  const bool accumulate = mode == OutputMode::kAccumulate;
  if (bias != nullptr && accumulate) {
    return Invalid(fn, "a bias is added only with OutputMode::kOverwrite");
  }
  // Leading dimensions: each operand's row stride, at least its stored width.
  const bool ta = transpose_a == Transpose::kYes, tb = transpose_b == Transpose::kYes;
  std::array<int64_t, 3> lds = {ta ? m : k, tb ? k : n, n};
  const char* names[] = {"strides.a", "strides.b", "strides.c"};
  const int64_t given[] = {strides.a, strides.b, strides.c};
  for (int i = 0; i < 3; ++i) {
    if (given[i] == 0) continue;
    if (given[i] < lds[i]) {
      return Invalid(fn, names[i], " = ", given[i], " is below the operand's width ", lds[i],
                     " (0 means dense)");
    }
    lds[i] = given[i];
  }
  RM_ASSIGN_OR_RETURN(Plan * plan, GetPlan(type, transpose_a, transpose_b, m, n, k, accumulate, a,
                                           b, c, bias, float_c, lds));
  if (bias != nullptr) {
    RM_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return CublasToStatus(
      cublasLtMatmul(handle_, plan->desc, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c,
                     plan->c, &plan->algo, workspace_, static_cast<size_t>(workspace_bytes_),
                     stream),
      "cublasLtMatmul");
}

absl::Status MatMulEngine::LinearForward(MatMulType type, const void* x, const void* weight,
                                         const void* bias, void* y, int64_t n, int64_t in,
                                         int64_t out, cudaStream_t stream, int64_t y_stride) {
  // y [n, out] = x [n, in] · weightᵀ (weight stored [out, in]).
  return MatMul(type, Transpose::kNo, Transpose::kYes, n, out, in, x, weight, y,
                OutputMode::kOverwrite, stream, bias, {.c = y_stride});
}

absl::Status MatMulEngine::LinearBackwardInput(MatMulType type, const void* dy, const void* weight,
                                               void* dx, int64_t n, int64_t in, int64_t out,
                                               cudaStream_t stream, int64_t dy_stride) {
  // dx [n, in] = dy [n, out] · weight [out, in].
  return MatMul(type, Transpose::kNo, Transpose::kNo, n, in, out, dy, weight, dx,
                OutputMode::kOverwrite, stream, nullptr, {.a = dy_stride});
}

absl::Status MatMulEngine::LinearBackwardWeights(MatMulType type, const void* x, const void* dy,
                                                 void* dweight, float* dbias, int64_t n, int64_t in,
                                                 int64_t out, OutputMode mode, float* scratch,
                                                 cudaStream_t stream, int64_t dy_stride) {
  return WeightGradient(type, /*float_c=*/false, x, dy, dweight, dbias, n, in, out, mode, scratch,
                        stream, dy_stride);
}

absl::Status MatMulEngine::LinearBackwardWeightsFloatOutput(MatMulType type, const void* x,
                                                            const void* dy, float* dweight,
                                                            float* dbias, int64_t n, int64_t in,
                                                            int64_t out, OutputMode mode,
                                                            float* scratch, cudaStream_t stream,
                                                            int64_t dy_stride) {
  return WeightGradient(type, /*float_c=*/ElementBytes(type) == 2, x, dy, dweight, dbias, n, in,
                        out, mode, scratch, stream, dy_stride);
}

absl::Status MatMulEngine::WeightGradient(MatMulType type, bool float_c, const void* x,
                                          const void* dy, void* dweight, float* dbias, int64_t n,
                                          int64_t in, int64_t out, OutputMode mode, float* scratch,
                                          cudaStream_t stream, int64_t dy_stride) {
  if (dbias != nullptr) {
    RM_RETURN_IF_ERROR(CheckPointer("LinearBackwardWeights", scratch, "scratch"));
    if (dy_stride != 0 && dy_stride != out) {
      return Invalid("LinearBackwardWeights", "dy_stride = ", dy_stride,
                     " with a dbias: the bias gradient reads a dense dy (pass 0)");
    }
  }
  // dweight [out, in] (+)= dyᵀ (dy stored [n, out]) · x [n, in].
  RM_RETURN_IF_ERROR(Product(type, float_c, Transpose::kYes, Transpose::kNo, out, in, n, dy, x,
                             dweight, mode, stream, nullptr, {.a = dy_stride}));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradient(type, dy, n, out, dbias, mode, scratch, stream);
}

int64_t BiasGradientScratchFloats(int64_t columns) {
  return internal::kBiasGradientChunks * (columns > 0 ? columns : 0);
}

absl::Status BiasGradient(MatMulType type, const void* dy, int64_t rows, int64_t columns,
                          float* dbias, OutputMode mode, float* scratch, cudaStream_t stream) {
  const char* fn = "BiasGradient";
  RM_RETURN_IF_ERROR(CheckSize(fn, "rows", rows));
  RM_RETURN_IF_ERROR(CheckSize(fn, "columns", columns));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dy, "dy"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dbias, "dbias"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, scratch, "scratch"));
  const int element = type == MatMulType::kBFloat16 ? 1 : type == MatMulType::kFloat16 ? 2 : 0;
  return CudaToStatus(
      internal::LaunchBiasGradient(element, dy, rows, columns, dbias,
                                   mode == OutputMode::kAccumulate, scratch, stream),
      "BiasGradient launch");
}

}  // namespace ringmaster::kernels::cuda
