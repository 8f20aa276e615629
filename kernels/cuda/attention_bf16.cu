// bf16 causal attention on tensor cores (kernels/cuda/attention.h), FlashAttention-2 style:
// bf16 operands, fp32 accumulation (mma.sync.m16n8k16, sm_80+), fp32 softmax statistics.
//
// Blocks of 4 warps own 64 rows (queries in forward and dQ, keys in dK/dV), 16 per warp,
// and stream the other side through shared memory in 64-row tiles (32 for hs = 128 in
// dK/dV, to stay within registers), double-buffered with cp.async. A warp's 16 x 64 score
// tile stays in registers: the accumulator layout of S (thread holds rows g, g + 8 and
// columns 2t, 2t + 1 of each 8-wide tile, g = lane / 4, t = lane % 4) is exactly the layout
// of the A operand of the next product, so P (or dS) is packed to bf16 in registers and fed
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

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRows = kBf16RowsPerBlock;  // rows a block owns
static_assert(kRows == kWarps * 16);
constexpr int kKeyTile = 64;  // keys per tile in forward and dQ (== kRows: tile kt is diagonal
                              // for query tile kt)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- PTX wrappers ----

// d += a * b: a is 16x16 row-major (4 regs), b is 16x8 column-major (2 regs), d 16x8 fp32.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices, transposed: lanes 8m .. 8m + 7 give the row addresses of matrix m;
// r[m] holds (M[2t][g], M[2t + 1][g]).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes global -> shared, asynchronously; zero-fills when !valid (src is not read).
__device__ __forceinline__ void CpAsync16(bf16* dst, const bf16* src, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t Load32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- Tiles and fragments ----

// Shared row stride in elements: 16 extra bytes put the 8 rows an access phase touches on
// distinct banks (for 32-bit fragment loads and ldmatrix alike).
template <int HS>
constexpr int kLd = HS + 8;

// Issues cp.async for rows [row0, row0 + ROWS) of a [T, HS] slice (global row stride ld)
// into dst (stride kLd<HS>); rows at or past T are zero-filled. All threads call.
template <int ROWS, int HS>
__device__ __forceinline__ void LoadTile(bf16* dst, const bf16* src, int row0, int seq_len,
                                         int ld) {
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
template <int HS>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* tile, int r0, int c0,
                                      int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
  const bf16* p = tile + (r0 + g) * kLd<HS> + c0 + 2 * t;
  a[0] = Load32(p);
  a[1] = Load32(p + 8 * kLd<HS>);
  a[2] = Load32(p + 8);
  a[3] = Load32(p + 8 * kLd<HS> + 8);
}

// acc[n] += A(16 x HS) . tile rows n*8 .. n*8 + 7 (as the 8 columns of B = tile^T), for the
// N / 8 row groups of a tile: S = Q K^T with the tile = K, dP = dO V^T with the tile = V, and
// the transposed products of the dK/dV pass. A is read per 16-column slice by `a_at`.
template <int HS, int N, typename AFrag>
__device__ __forceinline__ void MulTransposed(float (&acc)[N / 8][4], AFrag a_at,
                                              const bf16* tile, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < HS / 16; ++ks) {
    uint32_t a[4];
    a_at(a, ks);
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      const bf16* p = tile + (n * 8 + g) * kLd<HS> + ks * 16 + 2 * t;
      Mma(acc[n], a, Load32(p), Load32(p + 8));
    }
  }
}

// acc(16 x HS) += P(16 x K) . tile (K x HS, row-major in shared memory), with P given as the
// fp32 accumulator fragments of a 16 x K product: O += P V, dQ += dS K, dV += P^T dO,
// dK += dS^T Q.
template <int HS, int K>
__device__ __forceinline__ void MulAccumulated(float (&acc)[HS / 8][4], const float (&p)[K / 8][4],
                                               const bf16* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t a[4] = {Pack(p[2 * kk][0], p[2 * kk][1]), Pack(p[2 * kk][2], p[2 * kk][3]),
                           Pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           Pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const bf16* row = tile + (kk * 16 + (lane & 15)) * kLd<HS> + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < HS / 8; n += 2) {
      uint32_t b[4];
      LdMatrixX4Trans(b, row + n * 8);
      Mma(acc[n], a, b[0], b[1]);
      Mma(acc[n + 1], a, b[2], b[3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// Writes a warp's 16 x HS accumulator (rows row0 + g, row0 + g + 8) times scale as bf16 into
// a [T, HS] slice with row stride ld; rows at or past T are skipped.
template <int HS>
__device__ __forceinline__ void StoreRows(bf16* dst, const float (&acc)[HS / 8][4],
                                          const float (&scale)[2], int row0, int seq_len,
                                          int ld, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= seq_len) continue;
    bf16* out = dst + static_cast<size_t>(row) * ld + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8) =
          Pack(acc[n][2 * half] * scale[half], acc[n][2 * half + 1] * scale[half]);
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
template <int HS>
__device__ __forceinline__ void AwaitKeyTile(bf16* sk, bf16* sv, const bf16* k, const bf16* v,
                                             int kt, int last, int seq_len, int ld) {
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
template <int HS>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(bf16* out, float* lse, const bf16* qkv, AttnShape s, float scale_log2) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kTileElems = kRows * kLdT;
  extern __shared__ uint4 smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + kTileElems;
  bf16* sv = sk + 2 * kTileElems;

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
    const bf16* k_tile = sk + (kt & 1) * kTileElems;
    const bf16* v_tile = sv + (kt & 1) * kTileElems;

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
template <int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardKeyKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                      const float* dsum, AttnShape s, float scale_log2, float scale) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kQT = kQueryTile<HS>;
  constexpr int kQElems = kQT * kLdT;
  extern __shared__ uint4 smem_raw[];
  bf16* sk = reinterpret_cast<bf16*>(smem_raw);
  bf16* sv = sk + kRows * kLdT;
  bf16* sq = sv + kRows * kLdT;
  bf16* sdo = sq + 2 * kQElems;
  float* slse = reinterpret_cast<float*>(sdo + 2 * kQElems);
  float* sdsum = slse + 2 * kQT;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const bf16* dout_h = dout + head.out;
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
    const bf16* q_tile = sq + buf * kQElems;
    const bf16* do_tile = sdo + buf * kQElems;
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
  bf16* dk_out = dqkv + head.qkv + s.channels;
  StoreRows<HS>(dk_out, dk, dk_scale, key0 + warp * 16, seq_len, ld, lane);
  StoreRows<HS>(dk_out + s.channels, dv, dv_scale, key0 + warp * 16, seq_len, ld, lane);
}

// Grid (B * NH, ceil(T / 64)). Shared: Q, dO [64][ld]; K, V [2][64][ld].
template <int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardQueryKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* dsum, AttnShape s, float scale_log2, float scale) {
  constexpr int kLdT = kLd<HS>;
  constexpr int kTileElems = kRows * kLdT;
  extern __shared__ uint4 smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdo = sq + kTileElems;
  bf16* sk = sdo + kTileElems;
  bf16* sv = sk + 2 * kTileElems;

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
    const bf16* k_tile = sk + (kt & 1) * kTileElems;
    const bf16* v_tile = sv + (kt & 1) * kTileElems;

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

template <int HS>
constexpr size_t kForwardSmem = 5 * kRows * kLd<HS> * sizeof(bf16);
template <int HS>
constexpr size_t kKeySmem = (2 * kRows + 4 * kQueryTile<HS>) * kLd<HS> * sizeof(bf16) +
                            4 * kQueryTile<HS> * sizeof(float);
template <int HS>
constexpr size_t kQuerySmem = 6 * kRows * kLd<HS> * sizeof(bf16);

dim3 Grid(const AttnShape& s) { return dim3(s.batch * s.heads, (s.seq_len + kRows - 1) / kRows); }

template <int HS>
cudaError_t Forward(bf16* out, float* lse, const bf16* qkv, const AttnShape& s,
                    cudaStream_t stream) {
  if (cudaError_t err = AllowSmem(ForwardKernel<HS>, kForwardSmem<HS>); err != cudaSuccess) {
    return err;
  }
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  ForwardKernel<HS><<<Grid(s), kThreads, kForwardSmem<HS>, stream>>>(out, lse, qkv, s,
                                                                      scale_log2);
  return cudaGetLastError();
}

template <int HS>
cudaError_t Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                     const float* lse, float* dsum, const AttnShape& s, cudaStream_t stream) {
  if (cudaError_t err = LaunchRowDot(dsum, dout, out, s, stream); err != cudaSuccess) return err;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float scale_log2 = kLog2e * scale;
  if (cudaError_t err = AllowSmem(BackwardKeyKernel<HS>, kKeySmem<HS>); err != cudaSuccess) {
    return err;
  }
  BackwardKeyKernel<HS><<<Grid(s), kThreads, kKeySmem<HS>, stream>>>(dqkv, dout, qkv, lse, dsum,
                                                                      s, scale_log2, scale);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (cudaError_t err = AllowSmem(BackwardQueryKernel<HS>, kQuerySmem<HS>); err != cudaSuccess) {
    return err;
  }
  BackwardQueryKernel<HS><<<Grid(s), kThreads, kQuerySmem<HS>, stream>>>(
      dqkv, dout, qkv, lse, dsum, s, scale_log2, scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchForwardBf16(bf16* out, float* lse, const bf16* qkv, const AttnShape& s,
                              cudaStream_t stream) {
  // attention.cc admits head sizes 64 and 128 only.
  return (s.head_size == 64 ? Forward<64> : Forward<128>)(out, lse, qkv, s, stream);
}

cudaError_t LaunchBackwardBf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                               const float* lse, float* dsum, const AttnShape& s,
                               cudaStream_t stream) {
  return (s.head_size == 64 ? Backward<64> : Backward<128>)(dqkv, dout, qkv, out, lse, dsum, s,
                                                            stream);
}

}  // namespace ringmaster::kernels::cuda::internal
