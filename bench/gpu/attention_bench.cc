// Times the CUDA causal attention kernels (kernels/cuda/attention.h) at GPT-2 small shapes:
// bf16 and fp16 (the training paths: one set of kernels, so expect the same times) and fp32
// (the baseline), forward and backward, with CUDA events on one stream: warm-up, then the
// median of many single-call timings. Prints TFLOP/s of causal attention, counting forward as
// 2 products of B * NH * T^2 * hs / 2 multiply-adds (4 * B * NH * T^2 * hs / 2 FLOPs) and
// backward as 2.5x forward (FlashAttention's convention; our deterministic backward does 7
// products instead of 5, so its own work is 1.4x that). bench/gpu/attention_torch.py prints
// the same lines for PyTorch's scaled_dot_product_attention, to run in the same call and
// compare.
//
// Usage: attention_bench [iterations]   (default 50)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"

namespace ringmaster::kernels::cuda {
namespace {

#define BENCH_CHECK_CUDA(call)                                                          \
  do {                                                                                  \
    const cudaError_t err_ = (call);                                                    \
    if (err_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorString(err_));                                           \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

void CheckOk(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T* DeviceAlloc(int64_t n) {
  void* dev = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&dev, n * sizeof(T)));
  return static_cast<T*>(dev);
}

template <typename T>
T* DeviceRandom(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> host(n);
  for (T& x : host) x = static_cast<T>(dist(gen));
  T* dev = DeviceAlloc<T>(n);
  BENCH_CHECK_CUDA(cudaMemcpy(dev, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

// Median milliseconds of `iters` timed calls of fn after `warmup` untimed ones.
double MedianMs(const std::function<void()>& fn, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    fn();
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float elapsed = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&elapsed, start, stop));
    ms[i] = elapsed;
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

template <typename T>
void Bench(const char* precision, int64_t batch, int64_t seq_len, int64_t heads, int64_t hs,
           int iters, cudaStream_t stream) {
  const int64_t channels = heads * hs;
  T* qkv = DeviceRandom<T>(batch * seq_len * 3 * channels, 1);
  T* dout = DeviceRandom<T>(batch * seq_len * channels, 2);
  T* out = DeviceAlloc<T>(batch * seq_len * channels);
  T* dqkv = DeviceAlloc<T>(batch * seq_len * 3 * channels);
  float* lse = DeviceAlloc<float>(batch * heads * seq_len);
  float* scratch = DeviceAlloc<float>(AttentionCudaScratchFloats(batch, seq_len, heads));

  auto forward = [&] {
    CheckOk(AttentionForwardLse(out, lse, qkv, batch, seq_len, channels, heads, stream));
  };
  auto backward = [&] {
    CheckOk(AttentionBackwardLse(dqkv, dout, qkv, out, lse, scratch, batch, seq_len, channels,
                                 heads, stream));
  };
  const int warmup = 5;
  const double fwd_ms = MedianMs(forward, warmup, iters, stream);
  const double bwd_ms = MedianMs(backward, warmup, iters, stream);
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));

  const double fwd_flops = 4.0 * batch * heads * seq_len * seq_len * hs / 2;
  const double bwd_flops = 2.5 * fwd_flops;
  std::printf(
      "ours  %s B=%ld T=%ld NH=%ld hs=%ld  forward %.3f ms %.1f TFLOP/s  backward %.3f ms %.1f "
      "TFLOP/s\n",
      precision, static_cast<long>(batch), static_cast<long>(seq_len), static_cast<long>(heads),
      static_cast<long>(hs), fwd_ms, fwd_flops / fwd_ms * 1e-9, bwd_ms,
      bwd_flops / bwd_ms * 1e-9);
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(dout), static_cast<void*>(out),
                  static_cast<void*>(dqkv), static_cast<void*>(lse), static_cast<void*>(scratch)}) {
    BENCH_CHECK_CUDA(cudaFree(p));
  }
}

int Main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  if (iters < 1) {
    std::fprintf(stderr, "usage: %s [iterations >= 1]\n", argv[0]);
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d iterations, median\n", prop.name, iters);
  cudaStream_t stream;
  BENCH_CHECK_CUDA(cudaStreamCreate(&stream));
  // GPT-2 small: T = 1024, 12 heads of 64; then hs = 128 (6 heads, same C); fp16 at both;
  // fp32 baseline.
  for (int64_t batch : {8, 16}) Bench<__nv_bfloat16>("bf16", batch, 1024, 12, 64, iters, stream);
  Bench<__nv_bfloat16>("bf16", 8, 1024, 6, 128, iters, stream);
  Bench<__half>("fp16", 8, 1024, 12, 64, iters, stream);
  Bench<__half>("fp16", 8, 1024, 6, 128, iters, stream);
  Bench<float>("fp32", 8, 1024, 12, 64, std::min(iters, 10), stream);
  BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace ringmaster::kernels::cuda

int main(int argc, char** argv) { return ringmaster::kernels::cuda::Main(argc, argv); }
