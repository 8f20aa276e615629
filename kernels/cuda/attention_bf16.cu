// 16-bit causal attention on tensor cores (kernels/cuda/attention.h), FlashAttention-2 style:
// bf16 or fp16 operands, fp32 accumulation (mma.sync.m16n8k16, sm_80+), fp32 softmax
// statistics. One implementation, templated on the element type Elt (__nv_bfloat16 or
// __half); EltOps<Elt> holds all that differs between the two: the mma instruction's operand
// type and the rounding of fp32 pairs to Elt. ldmatrix and cp.async move 16-bit elements
// whatever they encode. (T below is the sequence length.)
//
// Blocks of 4 warps own 64 rows (queries in forward and dQ, keys in dK/dV), 16 per warp,
// and stream the other side through shared memory in 64-row tiles (32 for hs = 128 in
// dK/dV, to stay within registers), double-buffered with cp.async. A warp's 16 x 64 score
// tile stays in registers: the accumulator layout of S (thread holds rows g, g + 8 and
// columns 2t, 2t + 1 of each 8-wide tile, g = lane / 4, t = lane % 4) is exactly the layout
// of the A operand of the next product, so P (or dS) is packed to Elt in registers and fed
// straight back. B operands that are row-major in shared memory ([key][dim] for P.V, dS.K,
// P^T.dO, dS^T.Q) are read transposed with ldmatrix.trans; the others with 32-bit loads.
//
//   Forward, per query tile:  online softmax over key tiles 0 .. diagonal; writes out and
//                             lse = m + log(sum) (natural log, fp32).
//   Backward: D_i = dout_i . out_i (RowDotKernel), then two passes, each gradient element
//   owned by one thread and summed in a fixed order (deterministic, no atomics):
//     per key tile:   S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T,
//                     dS^T = P^T (dP^T - D),  dV += P^T dO,  dK += scale dS^T Q;
//     per query tile: S = Q K^T, P, dP = dO V^T, dS = P (dP - D),  dQ += scale dS K.
//   The second pass recomputes S and dP (7 products in all against FlashAttention-2's 5 with
//   atomic dQ); that is the price of determinism.
// Rows past T are zero-filled in shared memory and never written; the diagonal tile masks
// j > i by setting p to exactly 0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRows = kTensorCoreRowsPerBlock;  // rows a block owns
static_assert(kRows == kWarps * 16);
constexpr int kKeyTile = 64;  // keys per tile in forward and dQ (== kRows: tile kt is diagonal
                              // for query tile kt)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- Element types ----

// What the kernels need of a 16-bit element type Elt: Mma(d, a, b0, b1) does d += a * b on
// tensor cores (a is 16x16 row-major in 4 registers, b is 16x8 column-major in 2, d is 16x8
// fp32; every operand register holds a pair of Elt), and Pack(lo, hi) rounds two floats to
// the nearest Elt (ties to even) and packs them as one register, lo in the low half.
template <typename Elt>
struct EltOps;

template <>
struct EltOps<__nv_bfloat16> {
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#ifdef RINGMASTER_CUDA_EMU  // tools/cuda_emu: the instruction's fragment layouts on the CPU
    ::rm_emu::MmaM16N8K16<__nv_bfloat16>(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }

  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

template <>
struct EltOps<__half> {
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#ifdef RINGMASTER_CUDA_EMU  // tools/cuda_emu: the instruction's fragment layouts on the CPU
    ::rm_emu::MmaM16N8K16<__half>(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }

  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// ---- PTX wrappers (any 16-bit T) ----

// Four 8x8 b16 matrices, transposed: lanes 8m .. 8m + 7 give the row addresses of matrix m;
// r[m] holds (M[2t][g], M[2t + 1][g]).
template <typename Elt>
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const Elt* row) {
#ifdef RINGMASTER_CUDA_EMU
  ::rm_emu::LdMatrixX4Trans(r, row);
#else
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// 16 bytes global -> shared, asynchronously; zero-fills when !valid (src is not read).
template <typename Elt>
__device__ __forceinline__ void CpAsync16(Elt* dst, const Elt* src, bool valid) {
#ifdef RINGMASTER_CUDA_EMU  // a synchronous copy: the waits below have nothing to wait for
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
#else
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(bytes));
#endif
}

#ifdef RINGMASTER_CUDA_EMU
__device__ __forceinline__ void CpAsyncCommit() {}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {}
#else
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

template <typename Elt>
__device__ __forceinline__ uint32_t Load32(const Elt* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// ---- Tiles and fragments ----

// Shared row stride in elements: 16 extra bytes put the 8 rows an access phase touches on
// distinct banks (for 32-bit fragment loads and ldmatrix alike).
template <int HS>
constexpr int kLd = HS + 8;

// Issues cp.async for rows [row0, row0 + ROWS) of a [T, HS] slice (global row stride ld)
// into dst (stride kLd<HS>); rows at or past T are zero-filled. All threads call.
template <int ROWS, int HS, typename Elt>
__device__ __forceinline__ void LoadTile(Elt* dst, const Elt* src, int row0, int seq_len, int ld) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  for (int e = threadIdx.x; e < ROWS * kChunks; e += kThreads) {
    const int r = e / kChunks;
    const int c = (e % kChunks) * 8;
    const int row = row0 + r;
    const bool valid = row < seq_len;
    CpAsync16(dst + r * kLd<HS> + c, valid ? src + static_cast<size_t>(row) * ld + c : src,
              valid);
  }
}

// A fragment (16x16, row-major) of rows r0 .. r0 + 15, columns c0 .. c0 + 15 of a tile.
template <int HS, typename Elt>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const Elt* tile, int r0, int c0, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
  const Elt* p = tile + (r0 + g) * kLd<HS> + c0 + 2 * t;
  a[0] = Load32(p);
  a[1] = Load32(p + 8 * kLd<HS>);
  a[2] = Load32(p + 8);
  a[3] = Load32(p + 8 * kLd<HS> + 8);
}

// acc[n] += A(16 x HS) . tile rows n*8 .. n*8 + 7 (as the 8 columns of B = tile^T), for the
// N / 8 row groups of a tile: S = Q K^T with the tile = K, dP = dO V^T with the tile = V, and
// the transposed products of the dK/dV pass. A is read per 16-column slice by `a_at`.
template <int HS, int N, typename AFrag, typename Elt>
__device__ __forceinline__ void MulTransposed(float (&acc)[N / 8][4], AFrag a_at, const Elt* tile,
                                              int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < HS / 16; ++ks) {
    uint32_t a[4];
    a_at(a, ks);
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      const Elt* p = tile + (n * 8 + g) * kLd<HS> + ks * 16 + 2 * t;
      EltOps<Elt>::Mma(acc[n], a, Load32(p), Load32(p + 8));
    }
  }
}

// acc(16 x HS) += P(16 x K) . tile (K x HS, row-major in shared memory), with P given as the
// fp32 accumulator fragments of a 16 x K product: O += P V, dQ += dS K, dV += P^T dO,
// dK += dS^T Q.
template <int HS, int K, typename Elt>
__device__ __forceinline__ void MulAccumulated(float (&acc)[HS / 8][4], const float (&p)[K / 8][4],
                                               const Elt* tile, int lane) {
  using Ops = EltOps<Elt>;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t a[4] = {Ops::Pack(p[2 * kk][0], p[2 * kk][1]),
                           Ops::Pack(p[2 * kk][2], p[2 * kk][3]),
                           Ops::Pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           Ops::Pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const Elt* row = tile + (kk * 16 + (lane & 15)) * kLd<HS> + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < HS / 8; n += 2) {
      uint32_t b[4];
      LdMatrixX4Trans(b, row + n * 8);
      Ops::Mma(acc[n], a, b[0], b[1]);
      Ops::Mma(acc[n + 1], a, b[2], b[3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// Writes a warp's 16 x HS accumulator (rows row0 + g, row0 + g + 8) times scale, rounded to
// Elt, into a [T, HS] slice with row stride ld; rows at or past T are skipped.
template <int HS, typename Elt>
__device__ __forceinline__ void StoreRows(Elt* dst, const float (&acc)[HS / 8][4],
                                          const float (&scale)[2], int row0, int seq_len,
                                          int ld, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= seq_len) continue;
    Elt* out = dst + static_cast<size_t>(row) * ld + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8) =
          EltOps<Elt>::Pack(acc[n][2 * half] * scale[half], acc[n][2 * half + 1] * scale[half]);
    }
  }
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// Query tiles in reverse (the diagonal ones with the most keys start first).
__device__ __forceinline__ int ReversedTile() { return gridDim.y - 1 - blockIdx.y; }

// The key/value pipeline of forward and dQ: tile 0 was issued (and committed) with the
// block's own rows. Makes key tile kt (of 0 .. last) resident in buffer kt & 1 of sk and sv,
// first issuing tile kt + 1 into the other buffer when there is one. Ends with
// __syncthreads; the caller syncs again after using the tile, before its buffer is reused.
template <int HS, typename Elt>
__device__ __forceinline__ void AwaitKeyTile(Elt* sk, Elt* sv, const Elt* k, const Elt* v, int kt,
                                             int last, int seq_len, int ld) {
  constexpr int kTileElems = kKeyTile * kLd<HS>;
  if (kt < last) {
    const int next = (kt + 1) & 1;
    LoadTile<kKeyTile, HS>(sk + next * kTileElems, k, (kt + 1) * kKeyTile, seq_len, ld);
    LoadTile<kKeyTile, HS>(sv + next * kTileElems, v, (kt + 1) * kKeyTile, seq_len, ld);
    CpAsyncCommit();
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
}

// A thread's place: its warp, lane, and in the mma fragments group g = lane / 4 (rows g and
// g + 8) and t = lane % 4 (columns 2t, 2t + 1).
struct ThreadPos {
  int warp;
  int lane;
  int g;
  int t;
};

__device__ __forceinline__ ThreadPos ThisThread() {
  const int lane = threadIdx.x % kWarpSize;
  return ThreadPos{static_cast<int>(threadIdx.x / kWarpSize), lane, lane >> 2, lane & 3};
}

// ---- Forward ----

// Grid (B * NH, ceil(T / 64)). Shared: Q [64][ld], K [2][64][ld], V [2][64][ld].
template <typename Elt, int HS>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(Elt* out, float* lse, const Elt* qkv, AttnShape s, float scale_log2) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kTileElems = kRows * kLdT;
  extern __shared__ uint4 smem_raw[];
  Elt* sq = reinterpret_cast<Elt*>(smem_raw);
  Elt* sk = sq + kTileElems;
  Elt* sv = sk + 2 * kTileElems;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const auto [warp, lane, g, t] = ThisThread();
  const int q_tile = ReversedTile();
  const int i0 = q_tile * kRows;
  const int row_a = i0 + warp * 16 + g;  // the thread's rows: row_a and row_a + 8

  LoadTile<kRows, HS>(sq, q, i0, seq_len, ld);
  LoadTile<kKeyTile, HS>(sk, k, 0, seq_len, ld);
  LoadTile<kKeyTile, HS>(sv, v, 0, seq_len, ld);
  CpAsyncCommit();

  uint32_t qf[HS / 16][4];
  float o[HS / 8][4];
  Zero(o);
  float m[2] = {-INFINITY, -INFINITY};  // running max of scores * log2(e) / sqrt(hs)
  float l[2] = {0.0f, 0.0f};            // this thread's part of the running sum
  for (int kt = 0; kt <= q_tile; ++kt) {
    AwaitKeyTile<HS>(sk, sv, k, v, kt, q_tile, seq_len, ld);
    if (kt == 0) {
#pragma unroll
      for (int ks = 0; ks < HS / 16; ++ks) LoadA<HS>(qf[ks], sq, warp * 16, ks * 16, lane);
    }
    const Elt* k_tile = sk + (kt & 1) * kTileElems;
    const Elt* v_tile = sv + (kt & 1) * kTileElems;

    float sc[kKeyTile / 8][4];
    Zero(sc);
    MulTransposed<HS, kKeyTile>(
        sc, [&](uint32_t(&a)[4], int ks) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[r] = qf[ks][r];
        },
        k_tile, lane);

    // Scale, mask the diagonal tile, and fold the tile into the running max.
    const bool diagonal = kt == q_tile;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kt * kKeyTile + n * 8 + 2 * t + (e & 1);
        const int row = row_a + 8 * (e >> 1);
        float x = sc[n][e] * scale_log2;
        if (diagonal && j > row) x = -INFINITY;
        sc[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = QuadMax(mx[r]);  // finite: every row has key kt * 64 <= row in this tile
      alpha[r] = exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[n][e] = exp2f(sc[n][e] - mx[e >> 1]);
        l[e >> 1] += sc[n][e];
      }
    }
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    MulAccumulated<HS, kKeyTile>(o, sc, v_tile, lane);
    __syncthreads();  // the tile's buffer is refilled two iterations on
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = QuadSum(l[r]);
    inv[r] = 1.0f / l[r];
    const int row = row_a + 8 * r;
    if (t == 0 && row < seq_len) lse[head.row + row] = (m[r] + log2f(l[r])) * kLn2;
  }
  StoreRows<HS>(out + head.out, o, inv, i0 + warp * 16, seq_len, s.channels, lane);
}

// ---- Backward ----

// Query rows per tile in the dK/dV pass: 32 for hs = 128 keeps dK, dV (64 registers each)
// and the two 16 x 32 score tiles within the register file.
template <int HS>
constexpr int kQueryTile = HS <= 64 ? 64 : 32;

// Grid (B * NH, ceil(T / 64)). Shared: K, V [64][ld]; Q, dO [2][kQueryTile][ld];
// lse * log2(e) and D [2][kQueryTile] floats.
template <typename Elt, int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardKeyKernel(Elt* dqkv, const Elt* dout, const Elt* qkv, const float* lse,
                      const float* dsum, AttnShape s, float scale_log2, float scale) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kQT = kQueryTile<HS>;
  constexpr int kQElems = kQT * kLdT;
  extern __shared__ uint4 smem_raw[];
  Elt* sk = reinterpret_cast<Elt*>(smem_raw);
  Elt* sv = sk + kRows * kLdT;
  Elt* sq = sv + kRows * kLdT;
  Elt* sdo = sq + 2 * kQElems;
  float* slse = reinterpret_cast<float*>(sdo + 2 * kQElems);
  float* sdsum = slse + 2 * kQT;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const Elt* dout_h = dout + head.out;
  const auto [warp, lane, g, t] = ThisThread();
  const int key0 = blockIdx.y * kRows;
  const int key_a = key0 + warp * 16 + g;  // the thread's keys: key_a and key_a + 8

  // Stages query tile i0 into buffer `buf`: Q and dO by cp.async, lse and D by plain stores
  // (visible after the next __syncthreads). Rows past T get lse = +inf, so p = 0 there.
  auto stage = [&](int buf, int i0) {
    LoadTile<kQT, HS>(sq + buf * kQElems, q, i0, seq_len, ld);
    LoadTile<kQT, HS>(sdo + buf * kQElems, dout_h, i0, seq_len, s.channels);
    for (int r = threadIdx.x; r < kQT; r += kThreads) {
      const int row = i0 + r;
      slse[buf * kQT + r] = row < seq_len ? lse[head.row + row] * kLog2e : INFINITY;
      sdsum[buf * kQT + r] = row < seq_len ? dsum[head.row + row] : 0.0f;
    }
  };
  LoadTile<kRows, HS>(sk, k, key0, seq_len, ld);
  LoadTile<kRows, HS>(sv, v, key0, seq_len, ld);
  stage(0, key0);
  CpAsyncCommit();

  float dk[HS / 8][4];
  float dv[HS / 8][4];
  Zero(dk);
  Zero(dv);
  const int tiles = (seq_len - key0 + kQT - 1) / kQT;
  for (int it = 0; it < tiles; ++it) {
    const int i0 = key0 + it * kQT;
    if (it + 1 < tiles) {
      stage((it + 1) & 1, i0 + kQT);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int buf = it & 1;
    const Elt* q_tile = sq + buf * kQElems;
    const Elt* do_tile = sdo + buf * kQElems;
    const float* lse_tile = slse + buf * kQT;
    const float* dsum_tile = sdsum + buf * kQT;

    float pt[kQT / 8][4];   // S^T, then P^T
    float dpt[kQT / 8][4];  // dP^T, then dS^T
    Zero(pt);
    Zero(dpt);
    MulTransposed<HS, kQT>(
        pt, [&](uint32_t(&a)[4], int ks) { LoadA<HS>(a, sk, warp * 16, ks * 16, lane); },
        q_tile, lane);
    MulTransposed<HS, kQT>(
        dpt, [&](uint32_t(&a)[4], int ks) { LoadA<HS>(a, sv, warp * 16, ks * 16, lane); },
        do_tile, lane);
#pragma unroll
    for (int n = 0; n < kQT / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * t + (e & 1);  // query i0 + c
        const int key = key_a + 8 * (e >> 1);
        float p = exp2f(pt[n][e] * scale_log2 - lse_tile[c]);
        if (i0 + c < key) p = 0.0f;
        pt[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - dsum_tile[c]);
      }
    }
    MulAccumulated<HS, kQT>(dv, pt, do_tile, lane);
    MulAccumulated<HS, kQT>(dk, dpt, q_tile, lane);
    __syncthreads();
  }

  const float dk_scale[2] = {scale, scale};
  const float dv_scale[2] = {1.0f, 1.0f};
  Elt* dk_out = dqkv + head.qkv + s.channels;
  StoreRows<HS>(dk_out, dk, dk_scale, key0 + warp * 16, seq_len, ld, lane);
  StoreRows<HS>(dk_out + s.channels, dv, dv_scale, key0 + warp * 16, seq_len, ld, lane);
}

// Grid (B * NH, ceil(T / 64)). Shared: Q, dO [64][ld]; K, V [2][64][ld].
template <typename Elt, int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardQueryKernel(Elt* dqkv, const Elt* dout, const Elt* qkv, const float* lse,
                        const float* dsum, AttnShape s, float scale_log2, float scale) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kTileElems = kRows * kLdT;
  extern __shared__ uint4 smem_raw[];
  Elt* sq = reinterpret_cast<Elt*>(smem_raw);
  Elt* sdo = sq + kTileElems;
  Elt* sk = sdo + kTileElems;
  Elt* sv = sk + 2 * kTileElems;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const auto [warp, lane, g, t] = ThisThread();
  const int q_tile = ReversedTile();
  const int i0 = q_tile * kRows;
  const int row_a = i0 + warp * 16 + g;

  LoadTile<kRows, HS>(sq, q, i0, seq_len, ld);
  LoadTile<kRows, HS>(sdo, dout + head.out, i0, seq_len, s.channels);
  LoadTile<kKeyTile, HS>(sk, k, 0, seq_len, ld);
  LoadTile<kKeyTile, HS>(sv, v, 0, seq_len, ld);
  CpAsyncCommit();

  float lse2[2];
  float dsum_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    lse2[r] = row < seq_len ? lse[head.row + row] * kLog2e : INFINITY;
    dsum_r[r] = row < seq_len ? dsum[head.row + row] : 0.0f;
  }

  float dq[HS / 8][4];
  Zero(dq);
  for (int kt = 0; kt <= q_tile; ++kt) {
    AwaitKeyTile<HS>(sk, sv, k, v, kt, q_tile, seq_len, ld);
    const Elt* k_tile = sk + (kt & 1) * kTileElems;
    const Elt* v_tile = sv + (kt & 1) * kTileElems;

    float ps[kKeyTile / 8][4];  // S, then P, then dS
    float dp[kKeyTile / 8][4];
    Zero(ps);
    Zero(dp);
    MulTransposed<HS, kKeyTile>(
        ps, [&](uint32_t(&a)[4], int ks) { LoadA<HS>(a, sq, warp * 16, ks * 16, lane); },
        k_tile, lane);
    MulTransposed<HS, kKeyTile>(
        dp, [&](uint32_t(&a)[4], int ks) { LoadA<HS>(a, sdo, warp * 16, ks * 16, lane); },
        v_tile, lane);
    const bool diagonal = kt == q_tile;
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kt * kKeyTile + n * 8 + 2 * t + (e & 1);
        const int r = e >> 1;
        float p = exp2f(ps[n][e] * scale_log2 - lse2[r]);
        if (diagonal && j > row_a + 8 * r) p = 0.0f;
        ps[n][e] = p * (dp[n][e] - dsum_r[r]);
      }
    }
    MulAccumulated<HS, kKeyTile>(dq, ps, k_tile, lane);
    __syncthreads();
  }

  const float dq_scale[2] = {scale, scale};
  StoreRows<HS>(dqkv + head.qkv, dq, dq_scale, i0 + warp * 16, seq_len, ld, lane);
}

// ---- Launchers ----

template <typename Elt, int HS>
constexpr size_t kForwardSmem = 5 * kRows * kLd<HS> * sizeof(Elt);
template <typename Elt, int HS>
constexpr size_t kKeySmem = (2 * kRows + 4 * kQueryTile<HS>) * kLd<HS> * sizeof(Elt) +
                            4 * kQueryTile<HS> * sizeof(float);
template <typename Elt, int HS>
constexpr size_t kQuerySmem = 6 * kRows * kLd<HS> * sizeof(Elt);

dim3 Grid(const AttnShape& s) { return dim3(s.batch * s.heads, (s.seq_len + kRows - 1) / kRows); }

template <typename Elt, int HS>
cudaError_t Forward(Elt* out, float* lse, const Elt* qkv, const AttnShape& s, cudaStream_t stream) {
  constexpr size_t smem = kForwardSmem<Elt, HS>;
  if (cudaError_t err = AllowSmem(ForwardKernel<Elt, HS>, smem); err != cudaSuccess) return err;
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  ForwardKernel<Elt, HS><<<Grid(s), kThreads, smem, stream>>>(out, lse, qkv, s, scale_log2);
  return cudaGetLastError();
}

template <typename Elt, int HS>
cudaError_t Backward(Elt* dqkv, const Elt* dout, const Elt* qkv, const Elt* out, const float* lse,
                     float* dsum, const AttnShape& s, cudaStream_t stream) {
  if (cudaError_t err = LaunchRowDot(dsum, dout, out, s, stream); err != cudaSuccess) return err;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float scale_log2 = kLog2e * scale;
  constexpr size_t key_smem = kKeySmem<Elt, HS>;
  if (cudaError_t err = AllowSmem(BackwardKeyKernel<Elt, HS>, key_smem); err != cudaSuccess) {
    return err;
  }
  BackwardKeyKernel<Elt, HS><<<Grid(s), kThreads, key_smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, s, scale_log2, scale);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  constexpr size_t query_smem = kQuerySmem<Elt, HS>;
  if (cudaError_t err = AllowSmem(BackwardQueryKernel<Elt, HS>, query_smem); err != cudaSuccess) {
    return err;
  }
  BackwardQueryKernel<Elt, HS><<<Grid(s), kThreads, query_smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, s, scale_log2, scale);
  return cudaGetLastError();
}

// attention.cc admits head sizes 64 and 128 only.
template <typename Elt>
cudaError_t ForwardAnyHeadSize(Elt* out, float* lse, const Elt* qkv, const AttnShape& s,
                               cudaStream_t stream) {
  return (s.head_size == 64 ? Forward<Elt, 64> : Forward<Elt, 128>)(out, lse, qkv, s, stream);
}

template <typename Elt>
cudaError_t BackwardAnyHeadSize(Elt* dqkv, const Elt* dout, const Elt* qkv, const Elt* out,
                                const float* lse, float* dsum, const AttnShape& s,
                                cudaStream_t stream) {
  return (s.head_size == 64 ? Backward<Elt, 64> : Backward<Elt, 128>)(dqkv, dout, qkv, out, lse,
                                                                      dsum, s, stream);
}

}  // namespace

cudaError_t LaunchForwardBf16(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                              const AttnShape& s, cudaStream_t stream) {
  return ForwardAnyHeadSize(out, lse, qkv, s, stream);
}

cudaError_t LaunchBackwardBf16(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                               const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                               float* dsum, const AttnShape& s, cudaStream_t stream) {
  return BackwardAnyHeadSize(dqkv, dout, qkv, out, lse, dsum, s, stream);
}

cudaError_t LaunchForwardF16(__half* out, float* lse, const __half* qkv, const AttnShape& s,
                             cudaStream_t stream) {
  return ForwardAnyHeadSize(out, lse, qkv, s, stream);
}

cudaError_t LaunchBackwardF16(__half* dqkv, const __half* dout, const __half* qkv,
                              const __half* out, const float* lse, float* dsum, const AttnShape& s,
                              cudaStream_t stream) {
  return BackwardAnyHeadSize(dqkv, dout, qkv, out, lse, dsum, s, stream);
}

}  // namespace ringmaster::kernels::cuda::internal
