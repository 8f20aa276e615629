// cuBLASLt emulated on the CPU for cuda_emu: the subset of the API that kernels/cuda/matmul.cc
// uses. A product is checked at the call and computed on the stream's worker thread, in the
// stream's order (tools/cuda_emu/cudart.cc; device memory is host memory here).
//
// The point is to catch misuse of the API in tests, so this follows cuBLASLt's documented
// semantics, not what a caller assumes: D = alpha * op(A) * op(B) + beta * C (+ bias[row]),
// column-major, layouts giving the stored (untransposed) rows, cols and ld. Shapes that do not
// fit together, ld < rows, aliasing of the output with an input, and pointers less aligned than
// the heuristic's algorithm may assume are errors with a message on stderr. What is not
// emulated (other compute types, type combinations, epilogues, attributes) is
// CUBLAS_STATUS_NOT_SUPPORTED, never silently computed some other way; API functions not
// defined here (layout attributes such as batching, transforms) fail to link.
//
// Numerics: fp32 accumulation; 16-bit inputs widened to float; 16-bit outputs rounded to
// nearest even; CUBLAS_COMPUTE_32F_FAST_TF32 rounds A and B to TF32 (10-bit mantissa, to
// nearest, ties away from zero as cvt.rna.tf32.f32 does) before multiplying.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/cuda_emu/internal.h"

struct cublasLtContext {};  // The handle holds no state: the products run on their streams.

namespace {

struct MatmulDesc {
  cublasComputeType_t compute;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: the type of D (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

// Alignment in bytes that the heuristic may assume: pointers are 256-byte aligned unless the
// preference says otherwise (cublasLt.h). Real kernels need at most 16 (vector loads).
constexpr uint32_t kMaxKernelAlign = 16;
enum Operand { kA, kB, kC, kD, kBias, kOperands };

struct Preference {
  uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D
};

// What cublasLtMatmulAlgoGetHeuristic puts in its cublasLtMatmulAlgo_t: a tag, then the
// alignment each operand must have for "its" algorithm.
constexpr uint64_t kAlgoTag = 0x63756461656d7531;  // "cudaemu1"

template <typename... Args>
std::string Str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
cublasStatus_t Fail(cublasStatus_t status, const Args&... args) {
  std::fprintf(stderr, "cuda_emu cuBLASLt: %s (%s)\n", Str(args...).c_str(),
               cublasLtGetStatusName(status));
  return status;
}

const char* TypeName(int32_t type) {
  return type == CUDA_R_32F    ? "CUDA_R_32F"
         : type == CUDA_R_16BF ? "CUDA_R_16BF"
         : type == CUDA_R_16F  ? "CUDA_R_16F"
         : type == -1          ? "default (D's type)"
                               : "an unemulated cudaDataType";
}

size_t TypeBytes(cudaDataType_t type) {
  return type == CUDA_R_32F ? 4 : type == CUDA_R_16BF || type == CUDA_R_16F ? 2 : 0;
}

float Load(const void* p, cudaDataType_t type, size_t i) {
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (type == CUDA_R_16F) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void Store(void* p, cudaDataType_t type, size_t i, float v) {
  if (type == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else if (type == CUDA_R_16F) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// Rounds to TF32's 10-bit mantissa, to nearest with ties away from zero (cvt.rna.tf32.f32).
float RoundToTf32(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf and NaN unchanged
  u = (u + 0x1000u) & ~0x1fffu;
  return std::bit_cast<float>(u);
}

struct StatusText {
  cublasStatus_t status;
  const char* name;
  const char* text;
};

const StatusText* FindStatus(cublasStatus_t status) {
  static constexpr StatusText kTexts[] = {
      {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
      {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
       "the library was not initialized"},
      {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
      {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
       "an invalid numeric value was used as an argument (cuda_emu: see stderr)"},
      {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
       "an absent device architectural feature is required"},
      {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
       "an access to GPU memory space failed"},
      {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
       "the GPU program failed to execute"},
      {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR",
       "an internal operation failed"},
      {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
       "the functionality requested is not supported (cuda_emu: see stderr)"},
      {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
       "error detected trying to check the license"},
  };
  for (const StatusText& t : kTexts) {
    if (t.status == status) return &t;
  }
  return nullptr;
}

struct Problem {
  uint64_t m, n, k;
  bool ta, tb;
};

// Checks that the descriptors describe one product cuBLASLt (and this emulation) supports.
cublasStatus_t CheckProblem(const char* fn, const MatmulDesc* desc, const Layout* a,
                            const Layout* b, const Layout* c, const Layout* d, Problem* p) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": a descriptor or layout is null");
  }
  const bool all32 = a->type == CUDA_R_32F && b->type == CUDA_R_32F && d->type == CUDA_R_32F;
  const bool half_in = (a->type == CUDA_R_16BF || a->type == CUDA_R_16F) && b->type == a->type &&
                       (d->type == a->type || d->type == CUDA_R_32F);
  const bool tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (c->type != d->type || !(all32 || (half_in && !tf32))) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": A ", TypeName(a->type), ", B ",
                TypeName(b->type), ", C ", TypeName(c->type), ", D ", TypeName(d->type), " under ",
                tf32 ? "CUBLAS_COMPUTE_32F_FAST_TF32" : "CUBLAS_COMPUTE_32F",
                " is not supported (emulated: all CUDA_R_32F; or A and B both CUDA_R_16BF or "
                "both CUDA_R_16F, C = D of that type or CUDA_R_32F, not with FAST_TF32)");
  }
  const std::pair<const char*, const Layout*> layouts[] = {{"A", a}, {"B", b}, {"C", c}, {"D", d}};
  for (const auto& [name, l] : layouts) {
    if (l->ld < std::max<int64_t>(1, static_cast<int64_t>(l->rows))) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": ", name, " layout (", l->rows, "x", l->cols,
                  ") has ld ", l->ld, " < its ", l->rows, " rows (layouts are column-major)");
    }
  }
  p->ta = desc->trans_a != CUBLAS_OP_N;
  p->tb = desc->trans_b != CUBLAS_OP_N;
  p->m = d->rows;
  p->n = d->cols;
  const uint64_t a_rows = p->ta ? a->cols : a->rows, a_cols = p->ta ? a->rows : a->cols;
  const uint64_t b_rows = p->tb ? b->cols : b->rows, b_cols = p->tb ? b->rows : b->cols;
  p->k = a_cols;
  const char* mismatch = a_rows != p->m   ? "op(A) and D differ in rows"
                         : b_cols != p->n ? "op(B) and D differ in columns"
                         : b_rows != p->k ? "op(A)'s columns are not op(B)'s rows"
                         : c->rows != d->rows || c->cols != d->cols ? "C and D differ in shape"
                                                                    : nullptr;
  if (mismatch != nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": ", mismatch, ": op(A) is ", a_rows, "x", a_cols,
                " (A ", a->rows, "x", a->cols, ", TRANSA=", p->ta ? "T" : "N", "), op(B) is ",
                b_rows, "x", b_cols, " (B ", b->rows, "x", b->cols, ", TRANSB=", p->tb ? "T" : "N",
                "), C is ", c->rows, "x", c->cols, ", D is ", d->rows, "x", d->cols);
  }
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && desc->bias_type != -1 &&
      desc->bias_type != d->type) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": a bias of ", TypeName(desc->bias_type),
                " with D of ", TypeName(d->type), " is not emulated (only D's type)");
  }
  return CUBLAS_STATUS_SUCCESS;
}

uint32_t PointerAlign(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? kMaxKernelAlign : std::min<uint32_t>(kMaxKernelAlign, v & (~v + 1));
}

// Bytes a column-major matrix spans from its pointer.
size_t Span(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * TypeBytes(l.type);
}

bool Overlap(const void* x, size_t x_bytes, const void* y, size_t y_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(y);
  return x_bytes > 0 && y_bytes > 0 && a < b + y_bytes && b < a + x_bytes;
}

// D's columns [j0, j1) (or rows [i0, i1)) from op(A) (m x k) and op(B) (k x n) as dense
// column-major floats: the i-k-j loop runs down contiguous columns.
struct Product {
  const Problem& p;
  const float* op_a;
  const float* op_b;
  float alpha, beta;
  const void* c;
  const Layout& c_layout;
  void* d;
  const Layout& d_layout;
  const void* bias;  // of D's type, or null

  void Run(uint64_t i0, uint64_t i1, uint64_t j0, uint64_t j1) const {
    std::vector<float> acc(i1 - i0);
    for (uint64_t j = j0; j < j1; ++j) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (alpha != 0.0f) {
        for (uint64_t q = 0; q < p.k; ++q) {
          const float b = op_b[q + j * p.k];
          const float* a = op_a + q * p.m + i0;
          for (uint64_t i = 0; i < i1 - i0; ++i) acc[i] += a[i] * b;
        }
      }
      for (uint64_t i = i0; i < i1; ++i) {
        float v = alpha * acc[i - i0];
        // beta == 0: C is not read (it may hold garbage, as in BLAS).
        if (beta != 0.0f) v += beta * Load(c, c_layout.type, i + j * c_layout.ld);
        if (bias != nullptr) v += Load(bias, d_layout.type, i);
        Store(d, d_layout.type, i + j * d_layout.ld, v);
      }
    }
  }
};

// D = alpha op(A) op(B) + beta C (+ bias), on the stream's worker thread.
void RunProduct(const Problem& p, const Layout& la, const Layout& lb, const Layout& lc,
                const Layout& ld, const void* a, const void* b, const void* c, void* d, float alpha,
                float beta, const void* bias, bool tf32) {
  // op(A) and op(B) as dense column-major floats, rounded to TF32 under FAST_TF32.
  std::vector<float> op_a(p.m * p.k), op_b(p.k * p.n);
  for (uint64_t q = 0; q < p.k; ++q) {
    for (uint64_t i = 0; i < p.m; ++i) {
      const float v = Load(a, la.type, p.ta ? q + i * la.ld : i + q * la.ld);
      op_a[i + q * p.m] = tf32 ? RoundToTf32(v) : v;
    }
    for (uint64_t j = 0; j < p.n; ++j) {
      const float v = Load(b, lb.type, p.tb ? j + q * lb.ld : q + j * lb.ld);
      op_b[q + j * p.k] = tf32 ? RoundToTf32(v) : v;
    }
  }
  const Product product{p, op_a.data(), op_b.data(), alpha, beta, c, lc, d, ld, bias};
  // A few threads for large products, each over a block of D's columns (or rows when D
  // has fewer columns than threads).
  const uint64_t work = p.m * p.n * std::max<uint64_t>(p.k, 1);
  const uint64_t threads =
      work < (1u << 21) ? 1 : std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, 8);
  if (threads == 1) {
    product.Run(0, p.m, 0, p.n);
    return;
  }
  const bool by_columns = p.n >= threads;
  const uint64_t extent = by_columns ? p.n : p.m;
  std::vector<std::thread> pool;
  for (uint64_t t = 0; t < threads; ++t) {
    const uint64_t lo = extent * t / threads, hi = extent * (t + 1) / threads;
    if (lo == hi) continue;
    pool.emplace_back([&product, &p, by_columns, lo, hi] {
      by_columns ? product.Run(0, p.m, lo, hi) : product.Run(lo, hi, 0, p.n);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: handle is null");
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: null handle");
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  const StatusText* t = FindStatus(status);
  return t != nullptr ? t->name : "<unknown>";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  const StatusText* t = FindStatus(status);
  return t != nullptr ? t->text : "unknown status";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: null");
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate: compute type ", compute,
                " is not emulated (CUBLAS_COMPUTE_32F and CUBLAS_COMPUTE_32F_FAST_TF32 are)");
  }
  if (scale != CUDA_R_32F) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate: scale type ",
                TypeName(scale), " with a 32F compute type (cuBLASLt needs CUDA_R_32F)");
  }
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new MatmulDesc{compute});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<MatmulDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  const char* fn = "cublasLtMatmulDescSetAttribute";
  auto* d = reinterpret_cast<MatmulDesc*>(desc);
  if (d == nullptr || buf == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": null");
  // cuBLASLt rejects a size other than the attribute's own.
  const size_t want = attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? sizeof(void*) : 4;
  if (size != want) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": attribute ", attr, " takes ", want,
                " bytes, got ", size);
  }
  int32_t v;
  std::memcpy(&v, buf, 4);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      // CUBLAS_OP_C of a real matrix is its transpose.
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T && v != CUBLAS_OP_C) {
        return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": operation ", v, " is not N, T or C");
      }
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->trans_a : d->trans_b) = v;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSC:
      if (v != CUBLAS_OP_N) return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": TRANSC must be N");
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      // Device memory is host memory here, so a device scalar reads the same way.
      if (v != CUBLASLT_POINTER_MODE_HOST && v != CUBLASLT_POINTER_MODE_DEVICE) {
        return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": pointer mode ", v, " is not emulated");
      }
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (v != CUBLASLT_EPILOGUE_DEFAULT && v != CUBLASLT_EPILOGUE_BIAS) {
        return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": epilogue ", v,
                    " is not emulated (DEFAULT and BIAS are)");
      }
      d->epilogue = static_cast<uint32_t>(v);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      d->bias_type = v;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      std::memcpy(&d->bias, buf, sizeof(void*));
      return CUBLAS_STATUS_SUCCESS;
    default:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": attribute ", attr, " is not emulated");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr)
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: null");
  if (TypeBytes(type) == 0) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutCreate: type ", type,
                " is not emulated (CUDA_R_32F, CUDA_R_16BF and CUDA_R_16F are)");
  }
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<Layout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr)
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: null");
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Preference*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  const char* fn = "cublasLtMatmulPreferenceSetAttribute";
  auto* p = reinterpret_cast<Preference*>(pref);
  if (p == nullptr || buf == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": null");
  const bool wide =
      attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || attr == CUBLASLT_MATMUL_PREF_IMPL_MASK;
  if (size != (wide ? 8u : 4u)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": attribute ", attr, " takes ", wide ? 8 : 4,
                " bytes, got ", size);
  }
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:  // the emulated algorithm needs none
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      std::memcpy(&p->min_align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    default:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": attribute ", attr, " is not emulated");
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  const char* fn = "cublasLtMatmulAlgoGetHeuristic";
  if (handle == nullptr) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, ": null handle");
  if (pref == nullptr || results == nullptr || returned == nullptr || requested < 1) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                ": null preference, results or count, or requestedAlgoCount < 1");
  }
  *returned = 0;
  const auto* md = reinterpret_cast<const MatmulDesc*>(desc);
  Problem p;
  if (cublasStatus_t s = CheckProblem(
          fn, md, reinterpret_cast<const Layout*>(a), reinterpret_cast<const Layout*>(b),
          reinterpret_cast<const Layout*>(c), reinterpret_cast<const Layout*>(d), &p);
      s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  const auto* pr = reinterpret_cast<const Preference*>(pref);
  results[0] = {};
  results[0].algo.data[0] = kAlgoTag;
  for (int i = kA; i <= kD; ++i) {
    results[0].algo.data[1 + i] = std::min(pr->min_align[i], kMaxKernelAlign);
  }
  // The bias pointer's value at this call sets the alignment the algorithm assumes for it.
  results[0].algo.data[1 + kBias] = PointerAlign(md->bias);
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha_ptr, const void* a, cublasLtMatrixLayout_t a_desc,
                              const void* b, cublasLtMatrixLayout_t b_desc, const void* beta_ptr,
                              const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* /*workspace*/, size_t /*workspace_bytes*/,
                              cudaStream_t stream) {
  const char* fn = "cublasLtMatmul";
  if (handle == nullptr) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, ": null handle");
  const auto* md = reinterpret_cast<const MatmulDesc*>(desc);
  const auto* la = reinterpret_cast<const Layout*>(a_desc);
  const auto* lb = reinterpret_cast<const Layout*>(b_desc);
  const auto* lc = reinterpret_cast<const Layout*>(c_desc);
  const auto* ld = reinterpret_cast<const Layout*>(d_desc);
  Problem p;
  if (cublasStatus_t s = CheckProblem(fn, md, la, lb, lc, ld, &p); s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  if (alpha_ptr == nullptr || beta_ptr == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": alpha or beta is null");
  }
  const float alpha = *static_cast<const float*>(alpha_ptr);
  const float beta = *static_cast<const float*>(beta_ptr);
  const bool has_bias = md->epilogue == CUBLASLT_EPILOGUE_BIAS;
  const Layout bias_layout{ld->type, p.m, 1, static_cast<int64_t>(std::max<uint64_t>(p.m, 1))};
  // An operand that is read must be there; C is not read when beta is 0.
  const struct {
    const char* name;
    const void* ptr;
    const Layout* layout;
    bool used;
  } ops[kOperands] = {{"A", a, la, p.k > 0},
                      {"B", b, lb, p.k > 0},
                      {"C", c, lc, beta != 0.0f},
                      {"D", d, ld, true},
                      {"bias", md->bias, &bias_layout, has_bias}};
  if (algo != nullptr && algo->data[0] != kAlgoTag) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": algo is not from the heuristic");
  }
  for (int i = 0; i < kOperands; ++i) {
    if (!ops[i].used || Span(*ops[i].layout) == 0) continue;
    if (ops[i].ptr == nullptr)
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": ", ops[i].name, " is null");
    const uint64_t need = std::max<uint64_t>(algo != nullptr ? algo->data[1 + i] : kMaxKernelAlign,
                                             TypeBytes(ops[i].layout->type));
    if (reinterpret_cast<uintptr_t>(ops[i].ptr) % need != 0) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, ": ", ops[i].name, " pointer ", ops[i].ptr,
                  " is not ", need,
                  "-byte aligned, as the algorithm chosen by the heuristic "
                  "assumes (a GPU faults: misaligned address)");
    }
    // On a GPU, an output that overlaps an input is a race: garbage, not an error.
    if (i != kD && i != kC && Overlap(d, Span(*ld), ops[i].ptr, Span(*ops[i].layout))) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, ": D overlaps ", ops[i].name,
                  " (undefined on a GPU)");
    }
  }
  // In place needs C and D with one layout; out of place, C and D must not overlap.
  if (beta != 0.0f && (c == d ? lc->ld != ld->ld : Overlap(c, Span(*lc), d, Span(*ld)))) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                ": C and D must be the same matrix with one layout (in place) or not overlap");
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;

  // The product runs on the stream, after the work queued there before it (the operands
  // may not exist yet): everything it needs is copied now, as the GPU library would.
  const bool tf32 = md->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const void* bias = has_bias ? md->bias : nullptr;
  const cudaError_t queued = rm_emu::Enqueue(
      stream, [p, la = *la, lb = *lb, lc = *lc, ld = *ld, a, b, c, d, alpha, beta, bias, tf32] {
        RunProduct(p, la, lb, lc, ld, a, b, c, d, alpha, beta, bias, tf32);
      });
  if (queued != cudaSuccess) {
    return Fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, ": the stream cannot take work (",
                cudaGetErrorName(queued), ")");
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
