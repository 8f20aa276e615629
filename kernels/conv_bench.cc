// Times the strided convolution's three passes (forward, weight gradient, input gradient) on
// ResNet-18's 3x3 stride-1 shapes for 32x32 images (batch 32, width 64), with Winograd (the
// forward preparing the weights, the input gradient reusing them, as a layer runs them) and
// with the unfolded product (im2col + sgemm), on --threads BLAS threads (default 1). Prints
// the median wall-clock milliseconds of each and the ratio. --tile 2|4 runs Winograd's
// F(2x2, 3x3) or F(4x4, 3x3) on every stage (default: chosen by the map), --stage 0..3 one
// stage only, --reps N timed repetitions (default 5).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv.h"

namespace ringmaster::kernels {
namespace {

constexpr int kWarmup = 1;
int kReps = 5;

template <typename F>
double MedianMs(F f) {
  std::vector<double> ms;
  for (int r = 0; r < kWarmup + kReps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    if (r >= kWarmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

void Run(int only_stage, int tile) {
  std::printf("%-26s %9s %9s %9s | %9s %9s %9s | %6s\n", "shape (N,C,O,HxW)", "fwd ms", "dW ms",
              "dX ms", "im2col", "dW", "dX", "ratio");
  double total_w = 0, total_i = 0;
  for (int64_t stage = 0; stage < 4; ++stage) {
    if (only_stage >= 0 && stage != only_stage) continue;
    StridedConv2dShape s{32, 64 << stage, 64 << stage, 32 >> stage, 32 >> stage, 3, 1, 1};
    const int64_t in = s.batch * s.in_channels * s.height * s.width;
    const int64_t out = s.batch * s.out_channels * s.height * s.width;
    const std::vector<float> x = Random(in, 1), dy = Random(out, 2);
    const std::vector<float> w = Random(s.out_channels * s.in_channels * 9, 3);
    std::vector<float> y(out), dx(in), dw(w.size());
    double ms[2][3];
    for (int algo = 0; algo < 2; ++algo) {
      s.winograd = algo == 0;
      s.winograd_tile = tile;
      std::vector<float> scratch(StridedConv2dScratchElements(s));
      // As a layer runs them: the forward prepares the weights, the input gradient reuses them.
      std::vector<float> prepared(StridedConv2dPreparedWeightElements(s));
      ms[algo][0] = MedianMs([&] {
        StridedConv2dPrepareWeights(s, w.data(), prepared.data());
        StridedConv2dForward(s, x.data(), w.data(), y.data(), scratch.data(), prepared.data());
      });
      ms[algo][1] = MedianMs([&] {
        StridedConv2dBackwardWeights(s, x.data(), dy.data(), dw.data(), OutputMode::kOverwrite,
                                     scratch.data());
      });
      ms[algo][2] = MedianMs([&] {
        StridedConv2dBackwardInput(s, w.data(), dy.data(), dx.data(), scratch.data(),
                                   prepared.data());
      });
    }
    const double wsum = ms[0][0] + ms[0][1] + ms[0][2], isum = ms[1][0] + ms[1][1] + ms[1][2];
    total_w += wsum;
    total_i += isum;
    char name[64];
    std::snprintf(name, sizeof(name), "%ld,%ld,%ld,%ldx%ld", s.batch, s.in_channels,
                  s.out_channels, s.height, s.width);
    std::printf("%-26s %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f | %6.2f\n", name, ms[0][0], ms[0][1],
                ms[0][2], ms[1][0], ms[1][1], ms[1][2], isum / wsum);
  }
  std::printf("all stages: winograd %.1f ms, im2col %.1f ms: %.2fx\n", total_w, total_i,
              total_i / total_w);
}

}  // namespace
}  // namespace ringmaster::kernels

int main(int argc, char** argv) {
  int threads = 1, stage = -1, tile = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--threads") threads = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--stage") stage = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--tile") tile = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--reps") ringmaster::kernels::kReps = std::atoi(argv[i + 1]);
  }
  if (tile != 0 && tile != 2 && tile != 4) {
    std::fprintf(stderr, "conv_bench: --tile is %d; want 2 (F(2x2, 3x3)), 4 (F(4x4, 3x3)) or 0 "
                 "(chosen by the map)\n", tile);
    return 2;
  }
  if (ringmaster::kernels::kReps < 1) {
    std::fprintf(stderr, "conv_bench: --reps is %d; want 1 or more\n",
                 ringmaster::kernels::kReps);
    return 2;
  }
  if (stage < -1 || stage > 3) {
    std::fprintf(stderr, "conv_bench: --stage is %d; want 0..3 (or leave it out: all four)\n",
                 stage);
    return 2;
  }
  ringmaster::kernels::SetBlasThreads(threads);
  ringmaster::kernels::Run(stage, tile);
  return 0;
}
