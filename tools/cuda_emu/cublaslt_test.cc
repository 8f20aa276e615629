// Tests of the CPU cuBLASLt: the full call sequence matmul.cc uses (descriptor, layouts,
// preference, heuristic, matmul) against a naive double-precision reference, over all four
// transpositions, awkward shapes, padded leading dimensions, beta, the bias epilogue and the
// emulated types; and the rejection of inconsistent or unsupported calls. Device memory is
// host memory in the emulation, so buffers are plain vectors.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

// Elements of a float, bf16 or fp16 matrix, in storage of floats (so 16-byte aligned).
class Buffer {
 public:
  Buffer(cudaDataType_t type, size_t elements)
      : type_(type), storage_((elements * Bytes(type) + 3) / 4 + 4) {}
  static size_t Bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }
  void* data() { return storage_.data(); }
  // The value as stored (rounded to the type).
  float Get(size_t i) const {
    if (type_ == CUDA_R_16BF)
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(storage_.data())[i]);
    if (type_ == CUDA_R_16F)
      return __half2float(reinterpret_cast<const __half*>(storage_.data())[i]);
    return storage_[i];
  }
  void Set(size_t i, float v) {
    if (type_ == CUDA_R_16BF) {
      reinterpret_cast<__nv_bfloat16*>(storage_.data())[i] = __float2bfloat16_rn(v);
    } else if (type_ == CUDA_R_16F) {
      reinterpret_cast<__half*>(storage_.data())[i] = __float2half_rn(v);
    } else {
      storage_[i] = v;
    }
  }

 private:
  cudaDataType_t type_;
  std::vector<float> storage_;
};

struct Dims {
  uint64_t rows, cols;
  int64_t ld;
  cudaDataType_t type;
};

struct Spec {
  cudaDataType_t in = CUDA_R_32F, out = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool ta = false, tb = false;
  uint64_t m = 1, n = 1, k = 1;
  int64_t pad = 0;  // ld = rows + pad for every matrix
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  cublasLtEpilogue_t epilogue() const {
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  Dims a() const { return {ta ? k : m, ta ? m : k, static_cast<int64_t>(ta ? k : m) + pad, in}; }
  Dims b() const { return {tb ? n : k, tb ? k : n, static_cast<int64_t>(tb ? n : k) + pad, in}; }
  Dims d() const { return {m, n, static_cast<int64_t>(m) + pad, out}; }
};

size_t Elements(const Dims& d) { return d.cols * d.ld; }

// The whole call sequence of kernels/cuda/matmul.cc; the first status that is not SUCCESS.
cublasStatus_t Matmul(const Spec& s, const Dims& da, const Dims& db, const Dims& dc, const Dims& dd,
                      const void* a, const void* b, const void* c, void* d, const void* bias,
                      cublasLtEpilogue_t epilogue) {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  auto ok = [&st](cublasStatus_t x) { return (st = x) == CUBLAS_STATUS_SUCCESS; };
  const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t workspace = 1 << 20;
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const float alpha = s.alpha, beta = s.beta;
  if (ok(cublasLtCreate(&handle)) && ok(cublasLtMatmulDescCreate(&desc, s.compute, CUDA_R_32F)) &&
      ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a))) &&
      ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b))) &&
      ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                        sizeof(epilogue))) &&
      ok(cublasLtMatrixLayoutCreate(&la, da.type, da.rows, da.cols, da.ld)) &&
      ok(cublasLtMatrixLayoutCreate(&lb, db.type, db.rows, db.cols, db.ld)) &&
      ok(cublasLtMatrixLayoutCreate(&lc, dc.type, dc.rows, dc.cols, dc.ld)) &&
      ok(cublasLtMatrixLayoutCreate(&ld, dd.type, dd.rows, dd.cols, dd.ld)) &&
      ok(cublasLtMatmulPreferenceCreate(&pref)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace, sizeof(workspace))) &&
      ok(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, ld, pref, 1, &result, &found))) {
    EXPECT_EQ(found, 1);
    EXPECT_EQ(result.workspaceSize, 0u);
    EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
    // As matmul.cc does: the bias pointer is set after the heuristic.
    if (ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof(bias)))) {
      std::vector<char> ws(workspace);
      ok(cublasLtMatmul(handle, desc, &alpha, a, la, b, lb, &beta, c, lc, d, ld, &result.algo,
                        ws.data(), ws.size(), nullptr));
      cudaDeviceSynchronize();  // the product runs on the stream
    }
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {la, lb, lc, ld}) {
    if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  }
  if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  if (handle != nullptr) cublasLtDestroy(handle);
  return st;
}

std::string Name(const Spec& s) {
  auto type = [](cudaDataType_t t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : "fp32";
  };
  return std::string(type(s.in)) + "->" + type(s.out) +
         (s.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? " tf32" : "") + (s.ta ? " T" : " N") +
         (s.tb ? "T" : "N") + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
         " k=" + std::to_string(s.k) + " pad=" + std::to_string(s.pad) +
         " beta=" + std::to_string(s.beta) + (s.bias ? " bias" : "");
}

// Runs `s` on random inputs (C = D in place, as matmul.cc does) and compares with a double
// reference computed from the stored inputs. Padding is filled with NaN: it must not be read.
void CheckAgainstReference(const Spec& s, std::mt19937& rng) {
  SCOPED_TRACE(Name(s));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const Dims da = s.a(), db = s.b(), dd = s.d();
  Buffer a(s.in, Elements(da)), b(s.in, Elements(db)), d(s.out, Elements(dd)), bias(s.out, s.m);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto fill = [&](Buffer& x, const Dims& dims) {
    for (uint64_t j = 0; j < dims.cols; ++j) {
      for (int64_t i = 0; i < dims.ld; ++i) {
        x.Set(i + j * dims.ld, i < static_cast<int64_t>(dims.rows) ? dist(rng) : nan);
      }
    }
  };
  fill(a, da);
  fill(b, db);
  fill(d, dd);
  if (s.beta == 0.0f) {  // C is not read when beta is 0: NaN must not leak through.
    for (uint64_t j = 0; j < s.n; ++j) {
      for (uint64_t i = 0; i < s.m; ++i) d.Set(i + j * dd.ld, nan);
    }
  }
  for (uint64_t i = 0; i < s.m; ++i) bias.Set(i, dist(rng));
  const Buffer c = d;

  ASSERT_EQ(Matmul(s, da, db, dd, dd, a.data(), b.data(), d.data(), d.data(),
                   s.bias ? bias.data() : nullptr, s.epilogue()),
            CUBLAS_STATUS_SUCCESS);

  // Relative error allowed for inputs (TF32: 10-bit mantissa) and for the output's rounding.
  const double input_eps = s.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? std::ldexp(1.0, -10) : 0;
  const double out_eps = s.out == CUDA_R_16BF  ? std::ldexp(1.0, -8)
                         : s.out == CUDA_R_16F ? std::ldexp(1.0, -11)
                                               : 0;
  for (uint64_t j = 0; j < s.n; ++j) {
    for (uint64_t i = 0; i < s.m; ++i) {
      double want = 0, magnitude = 0;
      for (uint64_t q = 0; q < s.k; ++q) {
        const double x = a.Get(s.ta ? q + i * da.ld : i + q * da.ld);
        const double y = b.Get(s.tb ? j + q * db.ld : q + j * db.ld);
        want += x * y;
        magnitude += std::fabs(x * y);
      }
      want *= s.alpha;
      magnitude *= std::fabs(s.alpha);
      if (s.beta != 0.0f) {
        want += s.beta * c.Get(i + j * dd.ld);
        magnitude += std::fabs(s.beta * c.Get(i + j * dd.ld));
      }
      if (s.bias) {
        want += bias.Get(i);
        magnitude += std::fabs(bias.Get(i));
      }
      const double tol = out_eps * std::fabs(want) + (input_eps + 1e-6) * magnitude + 1e-7;
      ASSERT_NEAR(d.Get(i + j * dd.ld), want, tol) << "at row " << i << ", column " << j;
    }
    for (int64_t i = s.m; i < dd.ld; ++i) {  // D's padding is not written
      ASSERT_TRUE(std::isnan(d.Get(i + j * dd.ld))) << "padding row " << i << " was written";
    }
  }
}

TEST(CublasLtTest, MatchesReferenceOverTypesShapesAndTranspositions) {
  std::mt19937 rng(7);
  const struct {
    cudaDataType_t in, out;
    cublasComputeType_t compute;
  } types[] = {{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
               {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
               {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F}};
  const uint64_t shapes[][3] = {{7, 5, 3}, {33, 17, 65}, {1, 1, 1}, {1, 9, 4}, {6, 1, 2}};
  for (const auto& t : types) {
    for (const auto& [m, n, k] : shapes) {
      for (int trans = 0; trans < 4; ++trans) {
        for (int64_t pad : {0, 3}) {
          for (float beta : {0.0f, 0.5f}) {
            for (bool bias : {false, true}) {
              Spec s{t.in, t.out, t.compute, (trans & 1) != 0, (trans & 2) != 0, m, n, k, pad,
                     1.5f, beta,  bias};
              CheckAgainstReference(s, rng);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(CublasLtTest, LargeProductUsesThreadsAndStaysCorrect) {
  std::mt19937 rng(11);
  for (int trans = 0; trans < 4; ++trans) {
    CheckAgainstReference({CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, (trans & 1) != 0,
                           (trans & 2) != 0, 130, 67, 300, 1, 1.0f, 1.0f, true},
                          rng);
    CheckAgainstReference({CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, (trans & 1) != 0,
                           (trans & 2) != 0, 3, 1000, 700, 0, 1.0f, 0.0f, false},
                          rng);
  }
}

// One 1x1 output from k = 2 products of exact values: sum = x0 * y0 + x1 * y1.
float TinyProduct(cudaDataType_t in, cudaDataType_t out, cublasComputeType_t compute,
                  const float (&x)[2], const float (&y)[2]) {
  Spec s{in, out, compute, false, false, 1, 1, 2};
  Buffer a(in, 2), b(in, 2), d(out, 1);
  for (int i = 0; i < 2; ++i) {
    a.Set(i, x[i]);
    b.Set(i, y[i]);
  }
  EXPECT_EQ(Matmul(s, s.a(), s.b(), s.d(), s.d(), a.data(), b.data(), d.data(), d.data(), nullptr,
                   CUBLASLT_EPILOGUE_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  return d.Get(0);
}

TEST(CublasLtTest, SixteenBitOutputRoundsToNearestEven) {
  const float h = std::ldexp(1.0f, -8);  // half a bf16 ulp at 1
  // 1 + h is halfway between 1 and 1 + 2h: even is 1. 1 + 3h: even is 1 + 4h.
  EXPECT_EQ(TinyProduct(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, {1, 1}, {1, h}), 1.0f);
  EXPECT_EQ(TinyProduct(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, {1, 1}, {1 + 2 * h, h}),
            1 + 4 * h);
  const float hh = std::ldexp(1.0f, -11);  // half an fp16 ulp at 1
  EXPECT_EQ(TinyProduct(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, {1, 1}, {1, hh}), 1.0f);
  // With an fp32 output nothing is rounded.
  EXPECT_EQ(TinyProduct(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, {1, 1}, {1, hh}), 1 + hh);
}

TEST(CublasLtTest, FastTf32RoundsInputsToTenBitMantissas) {
  const float small = std::ldexp(1.0f, -12);  // below half a TF32 ulp at 1
  EXPECT_EQ(TinyProduct(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, {1 + small, 0}, {1, 0}),
            1 + small);
  EXPECT_EQ(
      TinyProduct(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, {1 + small, 0}, {1, 0}),
      1.0f);
  // Above half an ulp rounds up to the next TF32 value.
  const float big = std::ldexp(1.0f, -11) + std::ldexp(1.0f, -13);
  EXPECT_EQ(TinyProduct(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, {1 + big, 0}, {1, 0}),
            1 + std::ldexp(1.0f, -10));
  // A tie rounds away from zero (cvt.rna.tf32.f32).
  EXPECT_EQ(TinyProduct(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32,
                        {-1 - std::ldexp(1.0f, -11), 0}, {1, 0}),
            -1 - std::ldexp(1.0f, -10));
}

// A 4x3 = (4x2)(2x3) fp32 problem whose layouts the tests below break one at a time.
struct Rejection : ::testing::Test {
  Spec s{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, false, false, 4, 3, 2};
  Dims da = s.a(), db = s.b(), dc = s.d(), dd = s.d();
  Buffer a{CUDA_R_32F, 64}, b{CUDA_R_32F, 64}, c{CUDA_R_32F, 64}, d{CUDA_R_32F, 64};
  Buffer bias{CUDA_R_32F, 64};
  cublasStatus_t Run(cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT) {
    return Matmul(s, da, db, dc, dd, a.data(), b.data(), c.data(), d.data(), bias.data(), epilogue);
  }
};

TEST_F(Rejection, ConsistentBaselineSucceeds) { EXPECT_EQ(Run(), CUBLAS_STATUS_SUCCESS); }

TEST_F(Rejection, InnerDimensionMismatch) {
  db.rows = 3;  // op(A) is 4x2, op(B) 3x3
  db.ld = 3;
  EXPECT_EQ(Run(), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(Rejection, TransposeNotReflectedInLayout) {
  s.ta = true;  // A stored 4x2 with TRANSA=T is op(A) 2x4: not D's 4 rows
  EXPECT_EQ(Run(), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(Rejection, OutputShapeMismatch) {
  dd.cols = 4;
  dc.cols = 4;
  EXPECT_EQ(Run(), CUBLAS_STATUS_INVALID_VALUE);
  dc = s.d();
  dd = s.d();
  dc.rows = 3;
  EXPECT_EQ(Run(), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(Rejection, LeadingDimensionBelowRows) {
  da.ld = 3;  // A has 4 rows
  EXPECT_EQ(Run(), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(Rejection, UnsupportedTypesAndEpilogues) {
  da.type = CUDA_R_16BF;  // A bf16, B fp32
  EXPECT_EQ(Run(), CUBLAS_STATUS_NOT_SUPPORTED);
  da.type = db.type = CUDA_R_16BF;
  dd.type = CUDA_R_16F;  // C fp32, D fp16
  EXPECT_EQ(Run(), CUBLAS_STATUS_NOT_SUPPORTED);
  dc.type = CUDA_R_16F;  // bf16 inputs, fp16 output
  EXPECT_EQ(Run(), CUBLAS_STATUS_NOT_SUPPORTED);
  dc.type = dd.type = CUDA_R_16BF;
  s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;  // TF32 needs fp32 inputs
  EXPECT_EQ(Run(), CUBLAS_STATUS_NOT_SUPPORTED);
  s = Spec{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, false, false, 4, 3, 2};
  da = s.a(), db = s.b(), dc = s.d(), dd = s.d();
  EXPECT_EQ(Run(CUBLASLT_EPILOGUE_GELU_BIAS), CUBLAS_STATUS_NOT_SUPPORTED);
  s.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  EXPECT_EQ(Run(), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(Rejection, BiasOfAnotherTypeThanD) {
  cublasLtMatmulDesc_t desc;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cudaDataType_t bf16 = CUDA_R_16BF;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf16,
                                           sizeof(bf16)),
            CUBLAS_STATUS_SUCCESS);
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  // An attribute of the wrong size is rejected, as cuBLASLt does.
  const int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtHandle_t handle;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, desc, l, l, l, l, pref, 1, &result, &found),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
}

TEST_F(Rejection, MisalignedPointers) {
  // The heuristic assumes 256-byte alignment unless told otherwise; kernels need 16.
  auto* base = static_cast<char*>(a.data());
  EXPECT_EQ(Matmul(s, da, db, dc, dd, base + 4, b.data(), c.data(), d.data(), nullptr,
                   CUBLASLT_EPILOGUE_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // The bias pointer was null at the heuristic, which assumed it fully aligned.
  EXPECT_EQ(Matmul(s, da, db, dc, dd, a.data(), b.data(), c.data(), d.data(),
                   static_cast<char*>(bias.data()) + 8, CUBLASLT_EPILOGUE_BIAS),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // A null bias with the bias epilogue.
  EXPECT_EQ(Matmul(s, da, db, dc, dd, a.data(), b.data(), c.data(), d.data(), nullptr,
                   CUBLASLT_EPILOGUE_BIAS),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(Rejection, OutputAliasingAnInput) {
  EXPECT_EQ(Matmul(s, da, db, dc, dd, a.data(), b.data(), c.data(), a.data(), nullptr,
                   CUBLASLT_EPILOGUE_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  // In place with C and D of different leading dimensions.
  s.beta = 1.0f;
  dd.ld = 5;
  EXPECT_EQ(Matmul(s, da, db, dc, dd, a.data(), b.data(), d.data(), d.data(), nullptr,
                   CUBLASLT_EPILOGUE_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtStatusTest, NamesAndStrings) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_NE(std::string(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)), "");
}

}  // namespace
