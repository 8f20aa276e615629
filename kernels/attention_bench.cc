// Times causal attention forward and backward, both forms (probability-keeping and
// log-sum-exp recompute), at B = 4, T = 256, C = 384, NH = 6 in fp32 on the CPU.
// OpenBLAS's thread count comes from its own OPENBLAS_NUM_THREADS (default: all cores).
// Prints wall-clock median and minimum, and the median process CPU time; GFLOP/s from the
// minimum.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <random>
#include <vector>

#include "kernels/attention.h"

namespace ringmaster::kernels {
namespace {

constexpr int64_t kBatch = 4, kSeq = 256, kChannels = 384, kHeads = 6;
constexpr int kWarmup = 2, kReps = 15;

// CPU time of the whole process (all OpenBLAS threads) in milliseconds.
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct Timing {
  double median_ms;
  double min_ms;  // the least disturbed run, on a shared machine
  double cpu_ms;  // median process CPU time: with one thread, the time had we the core alone
};

Timing Time(const std::function<void()>& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<double> ms, cpu;
  for (int i = 0; i < kReps; ++i) {
    const double cpu_start = ProcessCpuMs();
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    cpu.push_back(ProcessCpuMs() - cpu_start);
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  return Timing{ms[ms.size() / 2], ms.front(), cpu[cpu.size() / 2]};
}

void Run() {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> qkv(kBatch * kSeq * 3 * kChannels), dout(kBatch * kSeq * kChannels);
  for (float& x : qkv) x = dist(rng);
  for (float& x : dout) x = dist(rng);
  std::vector<float> out(dout.size()), dqkv(qkv.size());
  std::vector<float> probs(AttentionProbsFloats(kBatch, kSeq, kHeads));
  std::vector<float> lse(AttentionLseFloats(kBatch, kSeq, kHeads));
  std::vector<float> scratch(AttentionScratchFloats(kSeq));

  // Flops of one [T, T] x [T, hs] product restricted to key positions j <= i, over all heads.
  // Forward does two (q.k, p.v); backward four (p^T.do, do.v^T, ds.k, ds^T.q), plus q.k
  // again in the lse form.
  const double hs = static_cast<double>(kChannels / kHeads);
  const double product = 2.0 * kBatch * kHeads * (kSeq * (kSeq + 1) / 2.0) * hs;

  std::printf("attention B=%lld T=%lld C=%lld NH=%lld fp32, OpenBLAS threads %d, %d runs\n",
              static_cast<long long>(kBatch), static_cast<long long>(kSeq),
              static_cast<long long>(kChannels), static_cast<long long>(kHeads),
              openblas_get_num_threads(), kReps);
  std::printf("%-6s %24s %24s %11s %9s %9s %10s\n", "form", "fwd ms median/min/cpu",
              "bwd ms median/min/cpu", "fwd+bwd ms", "fwd GF/s", "bwd GF/s", "saved MiB");
  auto report = [&](const char* name, const Timing& fwd, const Timing& bwd, int bwd_products,
                    size_t saved_floats) {
    std::printf("%-6s %8.2f/%7.2f/%7.2f %8.2f/%7.2f/%7.2f %11.2f %9.1f %9.1f %10.2f\n", name,
                fwd.median_ms, fwd.min_ms, fwd.cpu_ms, bwd.median_ms, bwd.min_ms, bwd.cpu_ms,
                fwd.median_ms + bwd.median_ms, 2 * product / fwd.min_ms / 1e6,
                bwd_products * product / bwd.min_ms / 1e6, saved_floats * 4.0 / (1 << 20));
  };

  const Timing probs_fwd = Time([&] {
    AttentionForward(out.data(), probs.data(), qkv.data(), kBatch, kSeq, kChannels, kHeads);
  });
  const Timing probs_bwd = Time([&] {
    AttentionBackward(dqkv.data(), dout.data(), qkv.data(), probs.data(), scratch.data(), kBatch,
                      kSeq, kChannels, kHeads);
  });
  report("probs", probs_fwd, probs_bwd, 4, probs.size());

  const Timing lse_fwd = Time([&] {
    AttentionForwardLse(out.data(), lse.data(), qkv.data(), scratch.data(), kBatch, kSeq, kChannels,
                        kHeads);
  });
  const Timing lse_bwd = Time([&] {
    AttentionBackwardLse(dqkv.data(), dout.data(), qkv.data(), lse.data(), scratch.data(), kBatch,
                         kSeq, kChannels, kHeads);
  });
  report("lse", lse_fwd, lse_bwd, 5, lse.size());
}

}  // namespace
}  // namespace ringmaster::kernels

int main() {
  ringmaster::kernels::Run();
  return 0;
}
