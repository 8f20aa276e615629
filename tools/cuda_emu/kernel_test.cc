// Tests of the emulated grid (kernel.cc) and runtime (cudart.cc). The kernels here are plain
// C++ functions launched through rm_emu::Launcher, as a rewritten .cu file does. The
// tensor-core emulations (MmaM16N8K16, LdMatrixX4Trans) are checked by
// //kernels:attention_cuda_test under --config=cudaemu: its bf16 kernels passed on an H100,
// and they give the CPU's results here only if the fragment layouts are the hardware's.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tools/cuda_emu/cuda_emu.h"

namespace {

constexpr int kThreads = 256;

// Each block sums its 256 inputs by a shared-memory tree, as the project's BlockSum does.
__global__ void BlockSums(const float* x, float* sums) {
  __shared__ float shared[kThreads];
  shared[threadIdx.x] = x[blockIdx.x * kThreads + threadIdx.x];
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = shared[0];
}

TEST(CudaEmu, SharedMemoryReductionAcrossBlocks) {
  constexpr int kBlocks = 5;
  std::vector<float> x(kBlocks * kThreads);
  std::iota(x.begin(), x.end(), 0.0f);
  std::vector<float> sums(kBlocks);
  rm_emu::Launcher(kBlocks, kThreads).Run(BlockSums, x.data(), sums.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int b = 0; b < kBlocks; ++b) {
    // sum of b*256 .. b*256+255
    EXPECT_EQ(sums[b], 256.0f * b * 256 + 255.0f * 256 / 2) << b;
  }
}

__global__ void WarpOps(int* out) {
  const int lane = threadIdx.x % 32;
  int v = lane;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x * 4 + 0] = v;                                       // 0 + ... + 31
  out[threadIdx.x * 4 + 1] = __shfl_sync(0xffffffffu, lane * 10, 3);  // lane 3's value
  out[threadIdx.x * 4 + 2] = __shfl_down_sync(0xffffffffu, lane, 1);  // lane + 1, 31 keeps
  out[threadIdx.x * 4 + 3] = __any_sync(0xffffffffu, threadIdx.x == 40);
}

TEST(CudaEmu, WarpShufflesAndVotes) {
  std::vector<int> out(64 * 4);
  rm_emu::Launcher(1, 64).Run(WarpOps, out.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(out[t * 4 + 0], 496) << t;
    EXPECT_EQ(out[t * 4 + 1], 30) << t;
    EXPECT_EQ(out[t * 4 + 2], lane == 31 ? 31 : lane + 1) << t;
    EXPECT_EQ(out[t * 4 + 3], t >= 32 ? 1 : 0) << t;  // only the second warp has thread 40
  }
}

__global__ void Coordinates(uint32_t* out) {
  const uint32_t block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const uint32_t thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}

TEST(CudaEmu, EveryThreadOfEveryBlockRunsOnce) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  std::vector<uint32_t> out(12 * 24, 0xffffffffu);
  rm_emu::Launcher(grid, block).Run(Coordinates, out.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint32_t b = 0; b < 12; ++b) {
    for (uint32_t t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 1000 + t);
  }
}

__global__ void DynamicSharedIsPoisoned(float* out, int n) {
  float* smem = reinterpret_cast<float*>(::rm_emu::DynamicShared());
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i) out[i] = smem[i];
    smem[0] = 1.0f;  // the next block must not see it
  }
}

TEST(CudaEmu, DynamicSharedMemoryStartsAsNaNInEveryBlock) {
  std::vector<float> out(8, 0.0f);
  rm_emu::Launcher(2, 32, 8 * sizeof(float)).Run(DynamicSharedIsPoisoned, out.data(), 8);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

__global__ void Nothing() {}

TEST(CudaEmu, LaunchConfigurationErrorsAreCudas) {
  rm_emu::Launcher(1, 2048).Run(Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
  rm_emu::Launcher(0, 32).Run(Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // Above 48 KiB of dynamic shared memory needs the kernel's opt-in.
  rm_emu::Launcher(1, 32, 64 << 10).Run(Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(Nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
            cudaSuccess);
  rm_emu::Launcher(1, 32, 64 << 10).Run(Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  rm_emu::Launcher(1, 32, 0, stream).Run(Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

__global__ void ShuffleAfterExit(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void BarrierAgainstWarpOp(int* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  }
}

__global__ void DifferentMasks(int* out) {
  // The low half names the whole warp, the high half only itself.
  out[threadIdx.x] = __shfl_xor_sync(threadIdx.x < 16 ? 0xffffffffu : 0xffff0000u, 1, 1);
}

TEST(CudaEmuDeathTest, WarpMisuseStopsWithAMessage) {
  // A fresh process per death test: a forked one could not use CUDA after this one has.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(32);
  auto run = [&](void (*kernel)(int*)) {
    rm_emu::Launcher(1, 32).Run(kernel, out.data());
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(run(ShuffleAfterExit), "names a lane that has exited");
  EXPECT_DEATH(run(BarrierAgainstWarpOp), "deadlock");
  EXPECT_DEATH(run(DifferentMasks), "different, overlapping warp masks");
}

// Work on a stream runs later, in order; the host sees it after a synchronization, and a
// second stream ordered by an event sees the first one's result.
TEST(CudaEmu, StreamsAreAsynchronousAndEventsOrderThem) {
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t done;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  std::atomic<bool> release{false};
  int* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), sizeof(int)), cudaSuccess);
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)), cudaSuccess);
  *pinned = 7;
  // Stream a is held until `release`; its copy and event come after the hold.
  ASSERT_EQ(cudaLaunchHostFunc(
                a,
                [](void* r) {
                  while (!static_cast<std::atomic<bool>*>(r)->load()) std::this_thread::yield();
                },
                &release),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(device, pinned, sizeof(int), cudaMemcpyHostToDevice, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, done, 0), cudaSuccess);
  int* out = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&out), sizeof(int)), cudaSuccess);
  *out = 0;
  ASSERT_EQ(cudaMemcpyAsync(out, device, sizeof(int), cudaMemcpyDeviceToHost, b), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(a), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(*out, 0);  // b waits for a, which waits for the release
  release.store(true);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(*out, 7);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(out), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

// A pageable source is staged at the call: the caller may overwrite it at once.
TEST(CudaEmu, PageableCopiesToTheDeviceAreStagedAtTheCall) {
  int* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), sizeof(int)), cudaSuccess);
  std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(
                nullptr,
                [](void* r) {
                  while (!static_cast<std::atomic<bool>*>(r)->load()) std::this_thread::yield();
                },
                &release),
            cudaSuccess);
  int value = 3;
  ASSERT_EQ(cudaMemcpyAsync(device, &value, sizeof(int), cudaMemcpyHostToDevice, nullptr),
            cudaSuccess);
  value = 4;
  release.store(true);
  int back = 0;
  ASSERT_EQ(cudaMemcpy(&back, device, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, 3);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

// After the parent has used CUDA (even just asking for the device count), a forked child
// cannot: the real driver's rule, which multi-process code must respect.
TEST(CudaEmu, AForkedChildOfAUserCannotUseCuda) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int n = 0;
    _exit(cudaGetDeviceCount(&n) == cudaErrorInitializationError ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(CudaEmu, CopiesCheckTheDeviceSide) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 16 * sizeof(float)), cudaSuccess);
  std::vector<float> host(17, 1.0f);
  EXPECT_EQ(cudaMemcpy(device, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  // One float past the allocation, or a host pointer as the device side: CUDA's error.
  EXPECT_EQ(cudaMemcpy(device, host.data(), 17 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 1, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(device + 8, 0, 9 * sizeof(float), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, device + 3), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, host.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaFree(device + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST(CudaEmu, FreshDeviceMemoryIsNotZero) {
  uint8_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 64), cudaSuccess);
  uint8_t host[64];
  ASSERT_EQ(cudaMemcpy(host, device, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_NE(host[0], 0);  // code that forgets to clear a buffer sees garbage, as on a GPU
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST(CudaEmu, OneDeviceWithAStableUuid) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  cudaDeviceProp a, b;
  ASSERT_EQ(cudaGetDeviceProperties(&a, 0), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&b, 0), cudaSuccess);
  EXPECT_EQ(std::memcmp(a.uuid.bytes, b.uuid.bytes, 16), 0);
  EXPECT_EQ(a.major, 9);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
}

}  // namespace
