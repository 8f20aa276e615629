// cuda_emu: what a .cu file sees when --config=cudaemu compiles it as C++ for the CPU
// (tools/cuda.bzl force-includes this header and rewrites `k<<<grid, block, smem, stream>>>(
// args)` into `::rm_emu::Launcher(grid, block, smem, stream).Run(k, args)` and
// `extern __shared__ T name[];` into a pointer to the block's dynamic shared memory).
//
// A launch is queued on its stream, whose worker thread runs it later (tools/cuda_emu/cudart.cc:
// streams are asynchronous, as on a GPU); there each CUDA thread of a block runs as a fiber,
// and blocks run one after another. __syncthreads() parks a fiber until every live thread of its
// block arrives; warp operations (__shfl*_sync, __any_sync, __syncwarp, and the tensor-core
// mma/ldmatrix emulations below) park it until every lane of the mask arrives, and stop the program
// with a message when the mask names a lane that has exited, when lanes of one warp wait on
// different masks, or when a block can no longer make progress (a deadlock). Static
// __shared__ arrays become function statics (kernels run one at a time, process-wide); the
// dynamic shared memory is filled with 0xff bytes (NaN) before each block, so a read of a
// shared element nobody wrote shows up in the results.
//
// What this cannot tell: timing, the memory model between blocks or streams (everything runs
// in launch order), nvcc's floating-point contraction (products and sums here are separate
// IEEE operations unless the code calls fmaf) and the device math library's last-ulp
// differences (expf, tanhf, ... are glibc's here).
#ifndef RINGMASTER_TOOLS_CUDA_EMU_CUDA_EMU_H_
#define RINGMASTER_TOOLS_CUDA_EMU_CUDA_EMU_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rm_emu {

// Bytes each lane deposits at most in one warp operation.
inline constexpr size_t kSlotBytes = 32;

// The running CUDA thread's coordinates (only valid inside an emulated kernel).
const uint3& ThreadIdx();
const uint3& BlockIdx();
const dim3& BlockDim();
const dim3& GridDim();
// The block's dynamic shared memory (the launch's smem bytes).
void* DynamicShared();

void SyncThreads();
// Deposits `bytes` (<= kSlotBytes) from `value` for this lane, waits until every lane of `mask` has
// done the same, and copies all 32 lanes' deposits (kSlotBytes each) into `lanes`.
void WarpExchange(uint32_t mask, const void* value, size_t bytes,
                  unsigned char (*lanes)[kSlotBytes]);
int LaneId();

// Queues the grid on `stream`: later, `body` runs as every thread of every block. The launch
// configuration's checks are CUDA's, made now: errors set the calling thread's last error.
void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, const void* kernel,
             std::function<void()> body);

class Launcher {
 public:
  Launcher(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), shared_bytes_(shared_bytes), stream_(stream) {}

  template <typename... P, typename... A>
  void Run(void (*kernel)(P...), A&&... args) {
    // Arguments are copied at the launch, as CUDA copies them to the device; each thread then
    // gets its own copy of the parameters.
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(
        static_cast<std::decay_t<P>>(std::forward<A>(args))...);
    RunGrid(grid_, block_, shared_bytes_, stream_, reinterpret_cast<const void*>(kernel),
            [kernel, params] { std::apply(kernel, *params); });
  }

 private:
  dim3 grid_, block_;
  size_t shared_bytes_;
  cudaStream_t stream_;
};

template <typename T>
T Shuffle(uint32_t mask, T value, int src_lane_of_this_lane) {
  static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>);
  unsigned char lanes[32][kSlotBytes];
  WarpExchange(mask, &value, sizeof(T), lanes);
  T out;
  std::memcpy(&out, lanes[src_lane_of_this_lane & 31], sizeof(T));
  return out;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 with d as both C and D:
// the PTX ISA's fragment layouts (groupID = lane / 4, tig = lane % 4).
template <typename Elt>
void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Fragments {
    uint32_t a[4];
    uint32_t b[2];
  };
  const Fragments mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
  unsigned char lanes[32][kSlotBytes];
  static_assert(sizeof(Fragments) <= kSlotBytes);
  WarpExchange(0xffffffffu, &mine, sizeof(mine), lanes);
  auto element = [](uint32_t pair, int half) {
    const uint16_t bits = static_cast<uint16_t>(half == 0 ? pair & 0xffff : pair >> 16);
    Elt e;
    std::memcpy(static_cast<void*>(&e), &bits, 2);
    return static_cast<float>(e);
  };
  auto a_at = [&](int row, int col) {  // A is 16 x 16, row-major fragments
    const int lane = (row % 8) * 4 + (col % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0);
    Fragments f;
    std::memcpy(&f, lanes[lane], sizeof(f));
    return element(f.a[reg], col % 2);
  };
  auto b_at = [&](int k, int col) {  // B is 16 x 8, column-major fragments
    const int lane = col * 4 + (k % 8) / 2;
    Fragments f;
    std::memcpy(&f, lanes[lane], sizeof(f));
    return element(f.b[k >= 8 ? 1 : 0], k % 2);
  };
  const int lane = LaneId(), group = lane / 4, tig = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = group + (i >= 2 ? 8 : 0), col = tig * 2 + (i % 2);
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    d[i] = sum;
  }
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8i..8i+7 give the rows of matrix i;
// register i of each lane receives the transposed matrix's (lane / 4, 2 (lane % 4) + {0, 1}).
template <typename Elt>
void LdMatrixX4Trans(uint32_t (&r)[4], const Elt* row) {
  unsigned char lanes[32][kSlotBytes];
  WarpExchange(0xffffffffu, &row, sizeof(row), lanes);
  const int lane = LaneId();
  for (int m = 0; m < 4; ++m) {
    uint16_t halves[2];
    for (int j = 0; j < 2; ++j) {
      const int stored_row = (lane % 4) * 2 + j, stored_col = lane / 4;
      const Elt* p;
      std::memcpy(&p, lanes[m * 8 + stored_row], sizeof(p));
      std::memcpy(&halves[j], p + stored_col, 2);
    }
    r[m] = uint32_t{halves[0]} | (uint32_t{halves[1]} << 16);
  }
}

}  // namespace rm_emu

// ---- The CUDA C++ surface the kernels use ----
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

#define threadIdx (::rm_emu::ThreadIdx())
#define blockIdx (::rm_emu::BlockIdx())
#define blockDim (::rm_emu::BlockDim())
#define gridDim (::rm_emu::GridDim())

inline void __syncthreads() { ::rm_emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  unsigned char lanes[32][::rm_emu::kSlotBytes];
  const char none = 0;
  ::rm_emu::WarpExchange(mask, &none, 1, lanes);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::rm_emu::LaneId();
  return ::rm_emu::Shuffle(mask, v, (lane & ~(width - 1)) + (src % width));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::rm_emu::LaneId();
  const int src = lane ^ lane_mask;
  return ::rm_emu::Shuffle(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::rm_emu::LaneId();
  const int src = lane + static_cast<int>(delta);
  return ::rm_emu::Shuffle(mask, v, src / width == lane / width ? src : lane);
}
inline int __any_sync(unsigned mask, int predicate) {
  unsigned char lanes[32][::rm_emu::kSlotBytes];
  const int mine = predicate != 0;
  ::rm_emu::WarpExchange(mask, &mine, sizeof(mine), lanes);
  for (int i = 0; i < 32; ++i) {
    int p;
    std::memcpy(&p, lanes[i], sizeof(p));
    if ((mask >> i & 1u) && p) return 1;
  }
  return 0;
}

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }

// nvcc's cuda_runtime.h overload for a kernel's own pointer type.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// The device library's ::min and ::max (in the common type of the two, as CUDA's overloads).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
}

using std::isfinite;
using std::isinf;
using std::isnan;

#endif  // RINGMASTER_TOOLS_CUDA_EMU_CUDA_EMU_H_
