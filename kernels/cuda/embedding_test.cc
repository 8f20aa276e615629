// Tests of kernels/cuda/embedding.h against the CPU kernels (kernels/embedding.h): bit for
// bit, forward and backward (the same additions in the same order), on GPT-2's shapes and
// awkward ones, with repeated tokens, accumulating into non-zero gradients. The bf16 and fp16
// twins too (typed tests over both formats, EmbeddingCudaHalf/Bf16 and EmbeddingCudaHalf/F16),
// bit for bit, no tolerance: forward's 16-bit out against kernels/half.h's FloatToBFloat16 or
// FloatToFloat16 of the CPU's fp32 out (one float addition, one rounding to nearest even;
// tables in [-1, 1), so sums in [-2, 2), well inside fp16's range), backward's fp32 tables
// against the CPU backward run on the 16-bit dout widened to fp32 (exact; the same additions
// in the same order). An id outside the vocabulary gives a NaN row in either format. Without
// a GPU the tests that need one skip; the bf16 and fp16 argument checks run everywhere.
#include "kernels/cuda/embedding.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/embedding.h"
#include "kernels/embedding_index.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::AsElements;
using testing::Bf16Format;
using testing::Device;
using testing::ExpectSameBits;
using testing::F16Format;
using testing::HalfFormatName;
using testing::HalfFormats;
using testing::RoundToBits;
using testing::WidenBits;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the CUDA embedding tests")

struct Shape {
  int64_t batch, seq_len, channels, vocab;
};
// GPT-2 small's (B 4, T 1024, C 768, V 50257), awkward ones, and a tiny vocabulary where
// every token repeats many times.
constexpr Shape kShapes[] = {
    {4, 1024, 768, 50257}, {1, 1, 1, 1}, {3, 17, 300, 1000}, {5, 64, 257, 3}};

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> v(n);
  for (int32_t& t : v) t = dist(gen);
  return v;
}

TEST(EmbeddingCuda, ForwardAndBackwardEqualTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const int64_t n = s.batch * s.seq_len;
    const std::vector<int32_t> tokens = RandomTokens(n, s.vocab, seed++);
    const std::vector<float> wte = RandomFloats(s.vocab * s.channels, seed++);
    const std::vector<float> wpe = RandomFloats(s.seq_len * s.channels, seed++);
    const std::vector<float> dout = RandomFloats(n * s.channels, seed++);
    const std::vector<float> dwte0 = RandomFloats(s.vocab * s.channels, seed++);
    const std::vector<float> dwpe0 = RandomFloats(s.seq_len * s.channels, seed++);

    std::vector<float> out(n * s.channels);
    kernels::EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), s.batch, s.seq_len,
                     s.channels, s.vocab);
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    kernels::EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.batch,
                               s.seq_len, s.channels, s.vocab);

    Device<int32_t> dtokens(tokens);
    Device<float> dwte_table(wte), dwpe_table(wpe), ddout(dout), dout_out(n * s.channels);
    ASSERT_TRUE(cuda::EmbeddingForward(dout_out.get(), dtokens.get(), dwte_table.get(),
                                       dwpe_table.get(), s.batch, s.seq_len, s.channels, s.vocab,
                                       nullptr)
                    .ok());
    ExpectSameBits(dout_out.Host(), out, "forward");

    absl::StatusOr<EmbeddingIndex> index = IndexTokens(tokens.data(), s.batch, s.seq_len, s.vocab);
    ASSERT_TRUE(index.ok()) << index.status();
    Device<int32_t> dindex(index->ints);
    Device<float> ddwte(dwte0), ddwpe(dwpe0);
    ASSERT_TRUE(cuda::EmbeddingBackward(ddwte.get(), ddwpe.get(), ddout.get(), dindex.get(),
                                        index->groups, s.batch, s.seq_len, s.channels, s.vocab,
                                        nullptr)
                    .ok());
    ExpectSameBits(ddwte.Host(), dwte, "backward dwte");
    ExpectSameBits(ddwpe.Host(), dwpe, "backward dwpe");
  }
}

TEST(EmbeddingCuda, ATokenOutsideTheVocabularyGivesANanRowNotARead) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> tokens = {0, 7, -1, 2};  // 7 and -1 are outside [0, 4)
  const std::vector<float> wte = RandomFloats(4 * 3, 1), wpe = RandomFloats(4 * 3, 2);
  Device<int32_t> dtokens(tokens);
  Device<float> dwte(wte), dwpe(wpe), out(4 * 3);
  ASSERT_TRUE(
      cuda::EmbeddingForward(out.get(), dtokens.get(), dwte.get(), dwpe.get(), 1, 4, 3, 4, nullptr)
          .ok());
  const std::vector<float> got = out.Host();
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t c = 0; c < 3; ++c) {
      const bool bad = row == 1 || row == 2;
      EXPECT_EQ(std::isnan(got[row * 3 + c]), bad) << "row " << row << " channel " << c;
    }
  }
}

TEST(EmbeddingCuda, BadArgumentsAreNamed) {
  SKIP_WITHOUT_GPU();
  Device<float> f(16);
  Device<int32_t> i(std::vector<int32_t>(16, 0));
  absl::Status s = cuda::EmbeddingForward(f.get(), i.get(), f.get(), f.get(), 0, 4, 4, 4, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch must be"), std::string::npos) << s;
  s = cuda::EmbeddingBackward(f.get(), f.get(), f.get(), i.get(), 0, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find("groups must be"), std::string::npos) << s;
  s = cuda::EmbeddingBackward(f.get(), nullptr, f.get(), i.get(), 1, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find("dwpe is null"), std::string::npos) << s;
}

// ---- bf16 and fp16 twins: typed tests over the two formats ----

// The twins of one format.
template <typename F>
struct HalfKernels;
template <>
struct HalfKernels<Bf16Format> {
  static constexpr auto kForward = &cuda::EmbeddingForwardBf16;
  static constexpr auto kBackward = &cuda::EmbeddingBackwardBf16;
};
template <>
struct HalfKernels<F16Format> {
  static constexpr auto kForward = &cuda::EmbeddingForwardF16;
  static constexpr auto kBackward = &cuda::EmbeddingBackwardF16;
};

template <typename F>
class EmbeddingCudaHalf : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingCudaHalf, HalfFormats, HalfFormatName);

TYPED_TEST(EmbeddingCudaHalf, ForwardRoundsTheCpuSumAndBackwardEqualsTheCpuBitForBit) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  uint32_t seed = 101;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B " << s.batch << " T " << s.seq_len << " C "
                                      << s.channels << " V " << s.vocab);
    const int64_t n = s.batch * s.seq_len;
    const std::vector<int32_t> tokens = RandomTokens(n, s.vocab, seed++);
    const std::vector<float> wte = RandomFloats(s.vocab * s.channels, seed++);
    const std::vector<float> wpe = RandomFloats(s.seq_len * s.channels, seed++);
    const std::vector<uint16_t> dout = RoundToBits<F>(RandomFloats(n * s.channels, seed++));
    const std::vector<float> dout_f = WidenBits<F>(dout);
    const std::vector<float> dwte0 = RandomFloats(s.vocab * s.channels, seed++);
    const std::vector<float> dwpe0 = RandomFloats(s.seq_len * s.channels, seed++);

    std::vector<float> out(n * s.channels);
    kernels::EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), s.batch, s.seq_len,
                              s.channels, s.vocab);
    const std::vector<uint16_t> want_out = RoundToBits<F>(out);
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    kernels::EmbeddingBackward(dwte.data(), dwpe.data(), dout_f.data(), tokens.data(), s.batch,
                               s.seq_len, s.channels, s.vocab);

    Device<int32_t> dtokens(tokens);
    Device<float> dwte_table(wte), dwpe_table(wpe);
    Device<uint16_t> ddout(dout), dout_out(n * s.channels);
    ASSERT_TRUE(K::kForward(AsElements<F>(dout_out), dtokens.get(), dwte_table.get(),
                            dwpe_table.get(), s.batch, s.seq_len, s.channels, s.vocab, nullptr)
                    .ok());
    const std::vector<uint16_t> got_out = dout_out.Host();
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < got_out.size(); ++i) {
      if (got_out[i] != want_out[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "forward: " << bad << " " << F::kName << " elements differ, first ["
                      << first << "] gpu " << std::hex << (first >= 0 ? got_out[first] : 0)
                      << " cpu " << (first >= 0 ? want_out[first] : 0);

    absl::StatusOr<EmbeddingIndex> index = IndexTokens(tokens.data(), s.batch, s.seq_len, s.vocab);
    ASSERT_TRUE(index.ok()) << index.status();
    Device<int32_t> dindex(index->ints);
    Device<float> ddwte(dwte0), ddwpe(dwpe0);
    ASSERT_TRUE(K::kBackward(ddwte.get(), ddwpe.get(), AsElements<F>(ddout), dindex.get(),
                             index->groups, s.batch, s.seq_len, s.channels, s.vocab, nullptr)
                    .ok());
    ExpectSameBits(ddwte.Host(), dwte, "backward dwte");
    ExpectSameBits(ddwpe.Host(), dwpe, "backward dwpe");
  }
}

TYPED_TEST(EmbeddingCudaHalf, TokenOutsideTheVocabularyGivesANanRow) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> tokens = {0, 7, -1, 2};  // 7 and -1 are outside [0, 4)
  const std::vector<float> wte = RandomFloats(4 * 3, 1), wpe = RandomFloats(4 * 3, 2);
  Device<int32_t> dtokens(tokens);
  Device<float> dwte(wte), dwpe(wpe);
  Device<uint16_t> out(4 * 3);
  ASSERT_TRUE(
      K::kForward(AsElements<F>(out), dtokens.get(), dwte.get(), dwpe.get(), 1, 4, 3, 4, nullptr)
          .ok());
  const std::vector<uint16_t> got = out.Host();
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t c = 0; c < 3; ++c) {
      const bool bad = row == 1 || row == 2;
      EXPECT_EQ(std::isnan(F::Widen(got[row * 3 + c])), bad) << "row " << row << " channel " << c;
    }
  }
}

// The checks run before anything touches the device: host addresses serve.
TYPED_TEST(EmbeddingCudaHalf, BadArgumentsAreNamed) {
  using F = TypeParam;
  using K = HalfKernels<F>;
  using E = typename F::Element;
  float f = 0;
  int32_t i = 0;
  uint16_t h = 0;
  E* b = reinterpret_cast<E*>(&h);
  const std::string forward = absl::StrCat("EmbeddingForward", F::kName, " (CUDA): ");
  absl::Status s = K::kForward(b, &i, &f, &f, 0, 4, 4, 4, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(forward + "batch must be >= 1, got 0"), std::string::npos) << s;
  s = K::kForward(b, &i, &f, &f, 1, -4, 4, 4, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(forward + "seq_len must be >= 1, got -4"), std::string::npos) << s;
  s = K::kForward(b, &i, &f, &f, 1, 1, 1, 0, nullptr);
  EXPECT_NE(s.message().find(forward + "vocab must be >= 1, got 0"), std::string::npos) << s;
  s = K::kForward(b, &i, &f, &f, int64_t{1} << 20, int64_t{1} << 12, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + "batch x seq_len must be below 2^31"), std::string::npos)
      << s;
  s = K::kForward(nullptr, &i, &f, &f, 1, 1, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + "out is null"), std::string::npos) << s;
  s = K::kForward(b, nullptr, &f, &f, 1, 1, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + "tokens is null"), std::string::npos) << s;
  s = K::kForward(b, &i, nullptr, &f, 1, 1, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + "wte is null"), std::string::npos) << s;
  s = K::kForward(b, &i, &f, nullptr, 1, 1, 1, 1, nullptr);
  EXPECT_NE(s.message().find(forward + "wpe is null"), std::string::npos) << s;
  const std::string backward = absl::StrCat("EmbeddingBackward", F::kName, " (CUDA): ");
  s = K::kBackward(&f, &f, b, &i, 0, 1, 4, 4, 4, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(backward + "groups must be in [1, batch x seq_len = 4], got 0"),
            std::string::npos)
      << s;
  s = K::kBackward(&f, &f, b, &i, 5, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "groups must be"), std::string::npos) << s;
  s = K::kBackward(&f, &f, nullptr, &i, 1, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "dout is null"), std::string::npos) << s;
  s = K::kBackward(&f, nullptr, b, &i, 1, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "dwpe is null"), std::string::npos) << s;
  s = K::kBackward(nullptr, &f, b, &i, 1, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "dwte is null"), std::string::npos) << s;
  s = K::kBackward(&f, &f, b, nullptr, 1, 1, 4, 4, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "index is null"), std::string::npos) << s;
  s = K::kBackward(&f, &f, b, &i, 1, 1, 4, -1, 4, nullptr);
  EXPECT_NE(s.message().find(backward + "channels must be >= 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
