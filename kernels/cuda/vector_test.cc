// Tests of kernels/cuda/vector.h against the CPU kernels (kernels/elementwise.h), bit for bit
// (each element sees the same float additions or multiply in the same order on both), on
// random values of awkward sizes (1, 7, 1000, 65537, and 2^24 + 3, past the 65536 x 256
// threads of one grid so that the grid-stride loop takes a second turn), with +-0, +-inf and
// NaN mixed in every few elements, and scale factors 0.37, -3, +-0 and inf. The one
// exception to "the same bits" is a NaN result: NaN on both sides, but the GPU's arithmetic
// returns its canonical NaN where x86 returns its default NaN or the input's payload, so
// NaN matches any NaN. ResidualBackward is also checked with da == db (each element
// (da + dout) + dout, as the CPU computes it). The outputs are accumulated into, so both
// sides start from the same random values. Without a GPU the tests that need one skip; the
// argument checks run everywhere.
#include "kernels/cuda/vector.h"

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
#include "kernels/cuda/testing.h"
#include "kernels/elementwise.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels::cuda {
namespace {

using testing::Device;

#define SKIP_WITHOUT_GPU() \
  RM_SKIP_WITHOUT_GPU("the CUDA residual backward, Accumulate and Scale tests")

constexpr int64_t kSizes[] = {1, 7, 1000, 65537, (int64_t{1} << 24) + 3};

// Random values in [-4, 4) with every 7th element (from `first`) +-0, +-inf or NaN.
std::vector<float> WithSpecials(int64_t n, uint32_t seed, int64_t first) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> v = RandomFloats(n, seed, -4.0f, 4.0f);
  for (int64_t i = first; i < n; i += 7) v[i] = specials[(i / 7) % std::size(specials)];
  return v;
}

// got and want hold the same bits (the sign of zero included), or are both NaN.
void ExpectSameValues(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ, first ["
                    << first << "] gpu " << (first >= 0 ? got[first] : 0) << " cpu "
                    << (first >= 0 ? want[first] : 0);
}

TEST(VectorCuda, ResidualBackwardAccumulatesBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::string what = "n=" + std::to_string(n);
    const std::vector<float> da0 = WithSpecials(n, 1, 3), db0 = WithSpecials(n, 2, 5),
                             dout = WithSpecials(n, 3, 0);
    std::vector<float> da = da0, db = db0;
    kernels::ResidualBackward(da.data(), db.data(), dout.data(), n);
    Device<float> dda(da0), ddb(db0), ddout(dout);
    ASSERT_TRUE(cuda::ResidualBackward(dda.get(), ddb.get(), ddout.get(), n, nullptr).ok());
    ExpectSameValues(dda.Host(), da, what + " da");
    ExpectSameValues(ddb.Host(), db, what + " db");

    // da == db: the gradient of a + a.
    std::vector<float> both = da0;
    kernels::ResidualBackward(both.data(), both.data(), dout.data(), n);
    Device<float> dboth(da0);
    ASSERT_TRUE(cuda::ResidualBackward(dboth.get(), dboth.get(), ddout.get(), n, nullptr).ok());
    ExpectSameValues(dboth.Host(), both, what + " da == db");
  }
}

TEST(VectorCuda, AccumulateAddsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<float> acc0 = WithSpecials(n, 4, 2), x = WithSpecials(n, 5, 0);
    std::vector<float> want = acc0;
    kernels::Accumulate(want.data(), x.data(), n);
    Device<float> dacc(acc0), dx(x);
    ASSERT_TRUE(cuda::Accumulate(dacc.get(), dx.get(), n, nullptr).ok());
    ExpectSameValues(dacc.Host(), want, "n=" + std::to_string(n));
  }
}

TEST(VectorCuda, ScaleMultipliesBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    for (float s : {0.37f, -3.0f, 0.0f, -0.0f, std::numeric_limits<float>::infinity()}) {
      const std::vector<float> x0 = WithSpecials(n, 6, 1);
      std::vector<float> want = x0;
      kernels::Scale(want.data(), s, n);
      Device<float> dx(x0);
      ASSERT_TRUE(cuda::Scale(dx.get(), s, n, nullptr).ok());
      ExpectSameValues(dx.Host(), want, "n=" + std::to_string(n) + " s=" + std::to_string(s));
    }
  }
}

TEST(VectorCuda, BadArgumentsAreNamed) {
  float* null = nullptr;
  float buffer[4] = {};
  absl::Status s = cuda::ResidualBackward(buffer, null, buffer + 2, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ResidualBackward (CUDA): db is null"), std::string::npos) << s;
  s = cuda::ResidualBackward(buffer, buffer, buffer, -1, nullptr);
  EXPECT_NE(s.message().find("n must be >= 0"), std::string::npos) << s;
  s = cuda::ResidualBackward(buffer, buffer + 1, buffer + 3, 2, nullptr);
  EXPECT_NE(s.message().find("da overlaps db partially"), std::string::npos) << s;
  s = cuda::ResidualBackward(buffer, buffer, buffer + 1, 2, nullptr);
  EXPECT_NE(s.message().find("da must not overlap dout"), std::string::npos) << s;
  s = cuda::Accumulate(buffer, buffer, 2, nullptr);
  EXPECT_NE(s.message().find("Accumulate (CUDA): acc must not overlap x"), std::string::npos) << s;
  s = cuda::Scale(null, 2.0f, 3, nullptr);
  EXPECT_NE(s.message().find("Scale (CUDA): x is null"), std::string::npos) << s;
  // Nothing to do: no pointer is needed and no GPU is touched.
  EXPECT_TRUE(cuda::ResidualBackward(null, null, null, 0, nullptr).ok());
  EXPECT_TRUE(cuda::Accumulate(null, null, 0, nullptr).ok());
  EXPECT_TRUE(cuda::Scale(null, 2.0f, 0, nullptr).ok());
}

}  // namespace
}  // namespace ringmaster::kernels::cuda
