// kernels/cuda/sgd.h against the CPU kernel (kernels/optimizer.h) over 3 steps, plain,
// with momentum and Nesterov, on awkward sizes: bit for bit (the kernel rounds each float
// operation on its own, as the CPU does). The argument checks run without a GPU.
#include "kernels/cuda/sgd.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "kernels/optimizer.h"
#include "kernels/test_random.h"

namespace ringmaster::kernels {
namespace {

using cuda::testing::Device;

TEST(SgdCuda, MatchesTheCpuBitForBit) {
  RM_SKIP_WITHOUT_GPU("the SGD kernel tests");
  for (const SgdStepArgs& args : {SgdStepArgs{.lr = 0.1f, .momentum = 0, .weight_decay = 0.01f},
                                  SgdStepArgs{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0},
                                  SgdStepArgs{.lr = 0.05f,
                                              .momentum = 0.9f,
                                              .weight_decay = 1e-3f,
                                              .nesterov = true}}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65537}}) {
      std::vector<float> p = RandomFloats(n, 5), buf(n, 0.0f);
      Device<float> dp(p), dbuf(buf);
      const bool momentum = args.momentum != 0;
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> g = RandomFloats(n, 40 + step);
        SgdStep(args, absl::MakeSpan(p), g, momentum ? absl::MakeSpan(buf) : absl::Span<float>());
        Device<float> dg(g);
        ASSERT_TRUE(
            cuda::SgdStep(args, dp.get(), dg.get(), momentum ? dbuf.get() : nullptr, n, nullptr)
                .ok());
      }
      EXPECT_EQ(dp.Host(), p) << "params, n " << n << ", momentum " << args.momentum;
      if (momentum) {
        EXPECT_EQ(dbuf.Host(), buf) << "momentum buffer, n " << n;
      }
    }
  }
}

TEST(SgdCuda, BadArgumentsAreNamed) {
  float x = 0;
  const SgdStepArgs plain{.lr = 0.1f};
  const SgdStepArgs heavy{.lr = 0.1f, .momentum = 0.9f};
  EXPECT_EQ(cuda::SgdStep(plain, &x, &x, nullptr, -1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cuda::SgdStep(plain, nullptr, &x, nullptr, 4, nullptr).message().find("params"),
            absl::string_view::npos);
  EXPECT_NE(cuda::SgdStep(plain, &x, nullptr, nullptr, 4, nullptr).message().find("grads"),
            absl::string_view::npos);
  EXPECT_NE(cuda::SgdStep(heavy, &x, &x, nullptr, 4, nullptr).message().find("momentum_buffer"),
            absl::string_view::npos);
  EXPECT_NE(cuda::SgdStep(plain, &x, &x, &x, 4, nullptr).message().find("momentum 0"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace ringmaster::kernels
