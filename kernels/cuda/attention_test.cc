// Tests of kernels/cuda/attention.h against the CPU kernels (kernels/attention.h).
//
// Each case draws fresh random qkv and dout, runs the CPU AttentionForwardLse /
// AttentionBackwardLse (on inputs rounded to bf16 or fp16 first for the 16-bit kernels),
// poisons every GPU output with NaN bytes, runs the CUDA kernels, and compares out, lse, dq,
// dk and dv one by one in relative norm error ||gpu - cpu|| / ||cpu||:
//   fp32: <= 1e-5 (same arithmetic up to summation order and exp rounding);
//   bf16: <= 2e-2 (bf16 operands of every product, p rounded to bf16 before P.V, outputs
//         rounded to bf16); lse (fp32) <= 1e-3.
//   fp16: <= 2.5e-3: the same kernels and roundings with fp16's unit roundoff 2^-11 instead
//         of bf16's 2^-8, so bf16's bound scaled by 1/8 (both are 5 units). A host emulation
//         of the kernels' roundings on these shapes gives <= 3e-3 for bf16 and <= 4e-4 for
//         fp16 (not yet measured on a GPU). lse (fp32, from the same fp16 inputs on both
//         sides) <= 1e-4. The values stay far from fp16's limits (|qkv| <= 2, |dout| <= 1).
// A NaN left anywhere in an output fails the comparison (the output was not fully written).
// Without a GPU the tests that need one skip; the argument checks run everywhere.
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/half.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using half = __half;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU()                                                                 \
  if (!HaveGpu()) {                                                                        \
    GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA attention tests need one (build " \
                    "with --config=cuda and run where a GPU is present)";                  \
  }

#define ASSERT_CUDA_OK(call)                                                            \
  do {                                                                                  \
    const cudaError_t err_ = (call);                                                    \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorName(err_) << ": "     \
                                 << cudaGetErrorString(err_);                           \
  } while (0)

struct Shape {
  int64_t batch;
  int64_t seq_len;
  int64_t channels;
  int64_t heads;

  int64_t head_size() const { return channels / heads; }
  int64_t qkv_size() const { return batch * seq_len * 3 * channels; }
  int64_t out_size() const { return batch * seq_len * channels; }
  int64_t lse_size() const { return batch * heads * seq_len; }
};

std::string Name(const Shape& s) {
  return absl::StrCat("B=", s.batch, " T=", s.seq_len, " C=", s.channels, " NH=", s.heads,
                      " hs=", s.head_size());
}

// Host images of a device tensor: float for fp32, the 16 bits for bf16 and fp16.
template <typename T>
struct HostOf {
  using type = float;
  static float ToHost(float f) { return f; }
  static float FromHost(float f) { return f; }
};
template <>
struct HostOf<bf16> {
  using type = uint16_t;
  static uint16_t ToHost(float f) { return FloatToBFloat16(f); }
  static float FromHost(uint16_t b) { return BFloat16ToFloat(b); }
};
template <>
struct HostOf<half> {
  using type = uint16_t;
  static uint16_t ToHost(float f) { return FloatToFloat16(f); }
  static float FromHost(uint16_t b) { return Float16ToFloat(b); }
};

template <typename T>
std::vector<typename HostOf<T>::type> Encode(const std::vector<float>& v) {
  std::vector<typename HostOf<T>::type> host(v.size());
  for (size_t i = 0; i < v.size(); ++i) host[i] = HostOf<T>::ToHost(v[i]);
  return host;
}

template <typename T>
std::vector<float> Decode(const std::vector<typename HostOf<T>::type>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = HostOf<T>::FromHost(v[i]);
  return f;
}

// The values a tensor has after a trip through T (rounded to bf16 or fp16 for those).
template <typename T>
std::vector<float> RoundTo(const std::vector<float>& v) {
  return Decode<T>(Encode<T>(v));
}

// Device buffer of n elements of T, filled with NaN bytes (0xff: NaN in fp32, bf16, fp16).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes());
    EXPECT_EQ(err, cudaSuccess) << "cudaMalloc " << bytes() << " bytes: " << cudaGetErrorString(err);
    Poison();
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }

  void Poison() { EXPECT_EQ(cudaMemset(ptr_, 0xff, bytes()), cudaSuccess); }

  void Upload(const std::vector<float>& v) {
    const auto host = Encode<T>(v);
    ASSERT_EQ(static_cast<int64_t>(host.size()), n_);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }

  std::vector<float> Download() const {
    std::vector<typename HostOf<T>::type> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return Decode<T>(host);
  }

 private:
  int64_t n_;
  T* ptr_ = nullptr;
};

double Norm(const std::vector<float>& v) {
  double norm = 0;
  for (float x : v) norm += double{x} * x;
  return std::sqrt(norm);
}

// ||got - want|| / max(||want||, floor); infinity when got has a NaN or inf (an unwritten
// element). `floor` is the scale below which `want` counts as zero: at T = 1 the softmax is
// 1 and dq, dk are exactly 0 in exact arithmetic, and only rounding is left on either side.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want,
                     double floor) {
  double diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
  }
  return std::sqrt(diff) / std::max({Norm(want), floor, 1e-300});
}

// Columns [part * C, (part + 1) * C) of each row of a [B*T, 3C] tensor: q, k or v.
std::vector<float> Part(const std::vector<float>& qkv, const Shape& s, int part) {
  std::vector<float> out;
  out.reserve(s.out_size());
  for (int64_t row = 0; row < s.batch * s.seq_len; ++row) {
    const float* begin = qkv.data() + row * 3 * s.channels + part * s.channels;
    out.insert(out.end(), begin, begin + s.channels);
  }
  return out;
}

// First NaN/inf of a tensor, for the failure message.
std::string FirstNonFinite(const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return absl::StrCat(" (first non-finite at element ", i, ")");
  }
  return "";
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const std::string& what, double floor = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = RelativeError(got, want, floor);
  EXPECT_LE(err, tol) << what << ": relative norm error " << err << " > " << tol
                      << FirstNonFinite(got);
}

struct Tolerances {
  double values;  // out, dq, dk, dv
  double lse;
};

template <typename T>
Tolerances TolerancesFor() {
  if constexpr (std::is_same_v<T, float>) return {1e-5, 1e-5};
  if constexpr (std::is_same_v<T, half>) return {2.5e-3, 1e-4};
  return {2e-2, 1e-3};
}

template <typename T>
const char* PrecisionName() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, half>) return "fp16";
  return "bf16";
}

// One forward + backward on the GPU with device buffers of the shape.
template <typename T>
struct GpuRun {
  explicit GpuRun(const Shape& s)
      : s(s),
        qkv(s.qkv_size()),
        out(s.out_size()),
        dout(s.out_size()),
        dqkv(s.qkv_size()),
        lse(s.lse_size()),
        scratch(AttentionCudaScratchFloats(s.batch, s.seq_len, s.heads)) {}

  absl::Status Forward() {
    out.Poison();
    lse.Poison();
    return AttentionForwardLse(out.get(), lse.get(), qkv.get(), s.batch, s.seq_len, s.channels,
                               s.heads, /*stream=*/nullptr);
  }

  absl::Status Backward() {
    dqkv.Poison();
    scratch.Poison();
    return AttentionBackwardLse(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get(),
                                scratch.get(), s.batch, s.seq_len, s.channels, s.heads,
                                /*stream=*/nullptr);
  }

  Shape s;
  DeviceBuffer<T> qkv, out, dout, dqkv;
  DeviceBuffer<float> lse, scratch;
};

template <typename T>
void CheckAgainstCpu(const Shape& s, uint32_t seed) {
  const std::string where = absl::StrCat(PrecisionName<T>(), " ", Name(s), " seed ", seed);
  SCOPED_TRACE(where);
  // Inputs wide enough that softmax rows are far from uniform (scores of a few units).
  const std::vector<float> qkv = RoundTo<T>(RandomFloats(s.qkv_size(), seed, -2.0f, 2.0f));
  const std::vector<float> dout = RoundTo<T>(RandomFloats(s.out_size(), seed + 1));

  std::vector<float> out_ref(s.out_size());
  std::vector<float> lse_ref(s.lse_size());
  std::vector<float> dqkv_ref(s.qkv_size());
  std::vector<float> scratch(AttentionScratchFloats(s.seq_len));
  kernels::AttentionForwardLse(out_ref.data(), lse_ref.data(), qkv.data(), scratch.data(),
                               s.batch, s.seq_len, s.channels, s.heads);
  kernels::AttentionBackwardLse(dqkv_ref.data(), dout.data(), qkv.data(), lse_ref.data(),
                                scratch.data(), s.batch, s.seq_len, s.channels, s.heads);

  GpuRun<T> gpu(s);
  gpu.qkv.Upload(qkv);
  gpu.dout.Upload(dout);
  const absl::Status fwd = gpu.Forward();
  ASSERT_TRUE(fwd.ok()) << fwd;
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const Tolerances tol = TolerancesFor<T>();
  ExpectClose(gpu.out.Download(), out_ref, tol.values, where + ": out");
  ExpectClose(gpu.lse.Download(), lse_ref, tol.lse, where + ": lse");

  const absl::Status bwd = gpu.Backward();
  ASSERT_TRUE(bwd.ok()) << bwd;
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> dqkv = gpu.dqkv.Download();
  const char* names[] = {"dq", "dk", "dv"};
  // dq and dk are measured against at least a tenth of dv's scale (see RelativeError): at
  // T = 1 they are rounding noise of dP - D (measured on an H100: 3e-6 in norm against a
  // dv of norm 16, fp32).
  const double floor = 0.1 * Norm(Part(dqkv_ref, s, 2));
  for (int part = 0; part < 3; ++part) {
    ExpectClose(Part(dqkv, s, part), Part(dqkv_ref, s, part), tol.values,
                where + ": " + names[part], part < 2 ? floor : 0);
  }
}

// Shapes: T = 1, T below, at and across tile boundaries (8 / 32 rows for fp32, 64 for bf16
// and fp16), several heads and batches.
const Shape kF32Shapes[] = {
    {2, 1, 128, 2},    // hs 64, a single position
    {2, 67, 128, 2},   // hs 64
    {1, 130, 96, 3},   // hs 32
    {2, 45, 48, 4},    // hs 12 (not a multiple of 32)
    {1, 100, 80, 1},   // hs 80
    {1, 200, 256, 2},  // hs 128
};

// bf16 and fp16 (the same tensor-core kernels).
const Shape kTensorCoreShapes[] = {
    {2, 1, 128, 2},    // hs 64, a single position
    {2, 67, 128, 2},   // hs 64, a partial second tile
    {1, 64, 64, 1},    // hs 64, exactly one tile
    {2, 130, 192, 3},  // hs 64, three tiles, the last with 2 rows
    {1, 200, 256, 2},  // hs 128
    {1, 33, 128, 1},   // hs 128, one partial tile (the dK/dV pass's 32-query tiles)
};

TEST(AttentionCudaTest, F32MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const Shape& s : kF32Shapes) CheckAgainstCpu<float>(s, seed += 7);
}

TEST(AttentionCudaTest, Bf16MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  for (const Shape& s : kTensorCoreShapes) CheckAgainstCpu<bf16>(s, seed += 7);
}

TEST(AttentionCudaTest, F16MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 300;
  for (const Shape& s : kTensorCoreShapes) CheckAgainstCpu<half>(s, seed += 7);
}

// Changing k and v at position j (every head) changes no output or lse at i < j, and does
// change row j. Bitwise: masked keys contribute exactly 0.
template <typename T>
void CheckCausality(const Shape& s, int64_t j) {
  const std::string where = absl::StrCat(PrecisionName<T>(), " ", Name(s), " j=", j);
  SCOPED_TRACE(where);
  std::vector<float> qkv = RoundTo<T>(RandomFloats(s.qkv_size(), 7, -2.0f, 2.0f));
  GpuRun<T> gpu(s);
  gpu.qkv.Upload(qkv);
  ASSERT_TRUE(gpu.Forward().ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> out0 = gpu.out.Download();
  const std::vector<float> lse0 = gpu.lse.Download();
  for (int64_t b = 0; b < s.batch; ++b) {
    float* row = qkv.data() + (b * s.seq_len + j) * 3 * s.channels;
    for (int64_t c = s.channels; c < 3 * s.channels; ++c) row[c] = row[c] * -1.5f + 0.25f;
  }
  gpu.qkv.Upload(RoundTo<T>(qkv));
  ASSERT_TRUE(gpu.Forward().ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> out1 = gpu.out.Download();
  const std::vector<float> lse1 = gpu.lse.Download();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seq_len; ++i) {
      const size_t at = (b * s.seq_len + i) * s.channels;
      const bool same = std::memcmp(&out0[at], &out1[at], s.channels * sizeof(float)) == 0;
      if (i < j) {
        EXPECT_TRUE(same) << where << ": out row b=" << b << " i=" << i << " changed";
      } else if (i == j) {
        EXPECT_FALSE(same) << where << ": out row b=" << b << " i=" << i << " did not change";
      }
      for (int64_t h = 0; h < s.heads && i < j; ++h) {
        const size_t r = (b * s.heads + h) * s.seq_len + i;
        EXPECT_EQ(lse0[r], lse1[r]) << where << ": lse b=" << b << " h=" << h << " i=" << i;
      }
    }
  }
}

TEST(AttentionCudaTest, F32IsCausal) {
  SKIP_WITHOUT_GPU();
  CheckCausality<float>({2, 70, 128, 2}, 33);
  CheckCausality<float>({1, 40, 48, 4}, 5);
}

TEST(AttentionCudaTest, Bf16IsCausal) {
  SKIP_WITHOUT_GPU();
  CheckCausality<bf16>({2, 130, 128, 2}, 70);  // j inside the second 64-row tile
  CheckCausality<bf16>({1, 100, 128, 1}, 64);  // j at a tile boundary
  CheckCausality<bf16>({1, 50, 256, 2}, 3);
}

TEST(AttentionCudaTest, F16IsCausal) {
  SKIP_WITHOUT_GPU();
  CheckCausality<half>({2, 130, 128, 2}, 70);  // j inside the second 64-row tile
  CheckCausality<half>({1, 100, 128, 1}, 64);  // j at a tile boundary
  CheckCausality<half>({1, 50, 256, 2}, 3);
}

// Backward is deterministic: two runs give bitwise the same dqkv.
template <typename T>
void CheckDeterministic(const Shape& s) {
  SCOPED_TRACE(absl::StrCat(PrecisionName<T>(), " ", Name(s)));
  GpuRun<T> gpu(s);
  gpu.qkv.Upload(RoundTo<T>(RandomFloats(s.qkv_size(), 11, -2.0f, 2.0f)));
  gpu.dout.Upload(RoundTo<T>(RandomFloats(s.out_size(), 12)));
  ASSERT_TRUE(gpu.Forward().ok());
  ASSERT_TRUE(gpu.Backward().ok());
  const std::vector<float> first = gpu.dqkv.Download();
  ASSERT_TRUE(gpu.Backward().ok());
  const std::vector<float> second = gpu.dqkv.Download();
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
}

TEST(AttentionCudaTest, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  CheckDeterministic<float>({2, 150, 128, 2});
  CheckDeterministic<bf16>({2, 150, 128, 2});
  CheckDeterministic<half>({2, 150, 128, 2});
  CheckDeterministic<half>({1, 100, 256, 2});  // hs 128
}

// Argument checks happen before any CUDA call, so these run without a GPU too.
TEST(AttentionCudaTest, RejectsBadArguments) {
  float* f = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced
  bf16* h = reinterpret_cast<bf16*>(uintptr_t{256});
  auto code = [](const absl::Status& st) { return st.code(); };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  // bf16 supports hs 64 and 128 only.
  const absl::Status hs32 = AttentionForwardLse(h, f, h, 1, 8, 64, 2, nullptr);
  EXPECT_EQ(code(hs32), kInvalid) << hs32;
  EXPECT_NE(hs32.message().find("head size 32"), std::string::npos) << hs32;
  EXPECT_EQ(code(AttentionBackwardLse(h, h, h, h, f, f, 1, 8, 96, 1, nullptr)), kInvalid);
  // fp32 supports 1..128.
  EXPECT_EQ(code(AttentionForwardLse(f, f, f, 1, 8, 256, 1, nullptr)), kInvalid);
  // heads must divide channels; dimensions positive.
  const absl::Status divide = AttentionForwardLse(f, f, f, 1, 8, 100, 3, nullptr);
  EXPECT_EQ(code(divide), kInvalid);
  EXPECT_NE(divide.message().find("heads 3 must divide channels 100"), std::string::npos)
      << divide;
  EXPECT_EQ(code(AttentionForwardLse(f, f, f, 0, 8, 64, 1, nullptr)), kInvalid);
  EXPECT_EQ(code(AttentionForwardLse(f, f, f, 1, 0, 64, 1, nullptr)), kInvalid);
  // Null and misaligned pointers.
  const absl::Status null_lse = AttentionForwardLse(f, nullptr, f, 1, 8, 64, 1, nullptr);
  EXPECT_EQ(code(null_lse), kInvalid);
  EXPECT_NE(null_lse.message().find("lse is null"), std::string::npos) << null_lse;
  EXPECT_EQ(code(AttentionBackwardLse(f, f, f, f, f, nullptr, 1, 8, 64, 1, nullptr)), kInvalid);
  EXPECT_EQ(code(AttentionForwardLse(h + 1, f, h, 1, 8, 64, 1, nullptr)), kInvalid);
  EXPECT_TRUE(AttentionCudaSupportsHeadSizeBf16(64));
  EXPECT_TRUE(AttentionCudaSupportsHeadSizeBf16(128));
  EXPECT_FALSE(AttentionCudaSupportsHeadSizeBf16(96));
  // fp16: the bf16 kernels' limits, and errors that say fp16.
  half* x = reinterpret_cast<half*>(uintptr_t{256});
  const absl::Status f16_hs32 = AttentionForwardLse(x, f, x, 1, 8, 64, 2, nullptr);
  EXPECT_EQ(code(f16_hs32), kInvalid) << f16_hs32;
  EXPECT_NE(f16_hs32.message().find("head size 32"), std::string::npos) << f16_hs32;
  EXPECT_NE(f16_hs32.message().find("fp16 kernels"), std::string::npos) << f16_hs32;
  EXPECT_EQ(code(AttentionBackwardLse(x, x, x, x, f, f, 1, 8, 96, 1, nullptr)), kInvalid);
  EXPECT_EQ(code(AttentionForwardLse(x, f, x, 1, 8, 100, 3, nullptr)), kInvalid);
  EXPECT_EQ(code(AttentionForwardLse(x, f, x, 1, 0, 64, 1, nullptr)), kInvalid);
  EXPECT_EQ(code(AttentionForwardLse(x, nullptr, x, 1, 8, 64, 1, nullptr)), kInvalid);
  const absl::Status f16_misaligned =
      AttentionBackwardLse(x, x + 1, x, x, f, f, 1, 8, 64, 1, nullptr);
  EXPECT_EQ(code(f16_misaligned), kInvalid) << f16_misaligned;
  EXPECT_NE(f16_misaligned.message().find("dout must be 16-byte aligned for the fp16 kernels"),
            std::string::npos)
      << f16_misaligned;
  EXPECT_EQ(code(AttentionBackwardLse(x, x, x, x, f, nullptr, 1, 8, 64, 1, nullptr)), kInvalid);
  EXPECT_TRUE(AttentionCudaSupportsHeadSizeF16(64));
  EXPECT_TRUE(AttentionCudaSupportsHeadSizeF16(128));
  EXPECT_FALSE(AttentionCudaSupportsHeadSizeF16(96));
  EXPECT_FALSE(AttentionCudaSupportsHeadSizeF16(32));
  EXPECT_TRUE(AttentionCudaSupportsHeadSizeF32(12));
  EXPECT_FALSE(AttentionCudaSupportsHeadSizeF32(129));
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
