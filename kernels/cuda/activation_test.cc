// Tests of kernels/cuda/activation.h against the CPU kernels (kernels/activation.h), bit for
// bit (both are selects, no arithmetic), on random inputs of awkward sizes (1, 7, 1000,
// 65537, and 2^24 + 3, past the 65536 x 256 threads of one grid so that the grid-stride loop
// takes a second turn) with special values mixed in every few elements: +-0, +-inf, NaNs
// with either sign and a payload, subnormals, the largest and smallest normals. Every GPU
// output is poisoned with NaN bytes first, so an element left unwritten fails; in place
// (y = x, dx = dy) gives the same bits. Without a GPU the tests that need one skip; the
// argument checks run everywhere.
#include "kernels/cuda/activation.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cuda/testing.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;
using testing::ExpectSameBits;

#define SKIP_WITHOUT_GPU() RM_SKIP_WITHOUT_GPU("the CUDA ReLU kernel tests")

constexpr int64_t kSizes[] = {1, 7, 1000, 65537, (int64_t{1} << 24) + 3};

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Random values in [-1, 1) with every 5th element (from the first) one of the special values.
std::vector<float> WithSpecials(int64_t n, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            FromBits(0xffc00000u),  // -NaN
                            FromBits(0x7fa00001u),  // a NaN with a payload
                            FromBits(0x00000001u),  // the smallest subnormal
                            FromBits(0x80000003u),  // a negative subnormal
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::min()};
  std::vector<float> v = RandomFloats(n, seed);
  for (int64_t i = 0; i < n; i += 5) v[i] = specials[(i / 5) % std::size(specials)];
  return v;
}

TEST(ActivationCuda, ReluForwardMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::string what = "n=" + std::to_string(n);
    const std::vector<float> x = WithSpecials(n, 1);
    std::vector<float> want(n);
    kernels::ReluForward(x.data(), want.data(), n);
    Device<float> dx(x), dy(n);
    ASSERT_TRUE(cuda::ReluForward(dx.get(), dy.get(), n, nullptr).ok());
    ExpectSameBits(dy.Host(), want, what);
    ASSERT_TRUE(cuda::ReluForward(dx.get(), dx.get(), n, nullptr).ok());  // in place
    ExpectSameBits(dx.Host(), want, what + " in place");
  }
}

TEST(ActivationCuda, ReluForwardKeepsNanAndMinusZero) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> x = {-0.0f, FromBits(0xffc00000u), FromBits(0x7fa00001u), -1.0f, 2.0f};
  Device<float> dx(x), dy(5);
  ASSERT_TRUE(cuda::ReluForward(dx.get(), dy.get(), 5, nullptr).ok());
  // The CPU's rule, spelled out: -0 stays -0, NaNs keep their bits, negatives become +0.
  ExpectSameBits(dy.Host(), {-0.0f, x[1], x[2], 0.0f, 2.0f}, "special values");
}

TEST(ActivationCuda, ReluBackwardMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::string what = "n=" + std::to_string(n);
    // The mask from a forward output (NaN, +-0 among them) and from raw values (negatives).
    const std::vector<float> x = WithSpecials(n, 2);
    std::vector<float> forward(n);
    kernels::ReluForward(x.data(), forward.data(), n);
    const std::vector<float>& y = forward;
    const std::vector<float> dy = WithSpecials(n, 3);  // inf and NaN gradients where off too
    for (const std::vector<float>* mask : {&y, &x}) {
      std::vector<float> want(n);
      kernels::ReluBackward(mask->data(), dy.data(), want.data(), n);
      Device<float> dmask(*mask), ddy(dy), ddx(n);
      ASSERT_TRUE(cuda::ReluBackward(dmask.get(), ddy.get(), ddx.get(), n, nullptr).ok());
      ExpectSameBits(ddx.Host(), want, what);
      ASSERT_TRUE(cuda::ReluBackward(dmask.get(), ddy.get(), ddy.get(), n, nullptr).ok());
      ExpectSameBits(ddy.Host(), want, what + " in place");
    }
  }
}

TEST(ActivationCuda, BadArgumentsAreNamed) {
  float* null = nullptr;
  float buffer[4] = {};
  absl::Status s = cuda::ReluForward(null, buffer, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ReluForward (CUDA): x is null"), std::string::npos) << s;
  s = cuda::ReluForward(buffer, buffer, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  s = cuda::ReluForward(buffer, buffer + 1, 2, nullptr);
  EXPECT_NE(s.message().find("y overlaps x partially"), std::string::npos) << s;
  s = cuda::ReluBackward(buffer, buffer, null, 1, nullptr);
  EXPECT_NE(s.message().find("ReluBackward (CUDA): dx is null"), std::string::npos) << s;
  s = cuda::ReluBackward(buffer, buffer + 2, buffer + 1, 2, nullptr);
  EXPECT_NE(s.message().find("dx overlaps dy partially"), std::string::npos) << s;
  s = cuda::ReluBackward(buffer + 1, buffer + 2, buffer, 2, nullptr);
  EXPECT_NE(s.message().find("dx overlaps y partially"), std::string::npos) << s;
  // Nothing to do: no pointer is needed and no GPU is touched.
  EXPECT_TRUE(cuda::ReluForward(null, null, 0, nullptr).ok());
  EXPECT_TRUE(cuda::ReluBackward(null, null, null, 0, nullptr).ok());
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
