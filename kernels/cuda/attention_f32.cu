// fp32 causal attention (kernels/cuda/attention.h), plain FMA arithmetic: the correctness
// baseline and the path for head sizes the bf16 kernels do not cover (any hs <= 128).
//
// One warp per query row (forward, dQ) or per key (dK/dV); a lane owns head dimensions
// lane, lane + 32, ... (R = ceil(hs / 32) registers per accumulator). The other side streams
// through shared memory in tiles of 32 rows, one per lane: lane l computes the score of row
// l of the tile with the warp's row, then the warp broadcasts the 32 probabilities with
// shuffles to accumulate. The forward keeps an online softmax (running max and sum), so no
// T x T matrix exists anywhere; backward recomputes p = exp(s - lse) and runs two passes
// (dK/dV per key, dQ per query), each gradient element summed by one thread in a fixed
// order: deterministic.
#include <cmath>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kRows = kF32RowsPerBlock;  // warps per block, one row (or key) each
constexpr int kThreads = kRows * kWarpSize;
constexpr int kTile = kWarpSize;  // streamed rows per shared-memory tile, one per lane

// Shared-memory row stride: hs + 1 floats, so that lane l reading row l, column d hits bank
// (l * (hs + 1) + d) % 32, distinct across lanes.
__host__ __device__ constexpr int Stride(int hs) { return hs + 1; }

// Copies rows [row0, row0 + rows) of a [T, hs] slice with global row stride ld into shared
// rows of stride Stride(hs); rows at or past T become zeros. All threads of the block call.
__device__ __forceinline__ void LoadRows(float* dst, const float* src, int row0, int rows,
                                         int seq_len, int ld, int hs) {
  const int stride = Stride(hs);
  for (int e = threadIdx.x; e < rows * hs; e += blockDim.x) {
    const int r = e / hs;
    const int d = e - r * hs;
    const int row = row0 + r;
    dst[r * stride + d] = row < seq_len ? src[static_cast<size_t>(row) * ld + d] : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int hs) {
  float acc = 0.0f;
  for (int d = 0; d < hs; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

// acc[r] += w * row[lane + 32 r] for the lane's dimensions.
template <int R>
__device__ __forceinline__ void Axpy(float (&acc)[R], float w, const float* row, int lane,
                                     int hs) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) acc[r] = fmaf(w, row[d], acc[r]);
  }
}

template <int R>
__device__ __forceinline__ void StoreRow(float* dst, const float (&acc)[R], float scale,
                                         int lane, int hs) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = lane + r * kWarpSize;
    if (d < hs) dst[d] = acc[r] * scale;
  }
}

// Block of query rows [row0, row0 + kRows): heavy blocks (late rows, more keys) first.
__device__ __forceinline__ int ReversedRow0() {
  return (gridDim.y - 1 - blockIdx.y) * kRows;
}

// Grid (B * NH, ceil(T / kRows)); shared: keys and values [kTile][stride], q [kRows][stride].
template <int R>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(float* out, float* lse, const float* qkv, AttnShape s, float scale) {
  extern __shared__ float smem[];
  const int hs = s.head_size;
  const int stride = Stride(hs);
  float* sk = smem;
  float* sv = sk + kTile * stride;
  float* sq = sv + kTile * stride;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row0 = ReversedRow0();
  const int i = row0 + warp;
  LoadRows(sq, q, row0, kRows, seq_len, ld, hs);
  const float* qi = sq + warp * stride;

  float m = -INFINITY;  // running max of the row's scores
  float l = 0.0f;       // running sum of exp(s - m)
  float acc[R] = {};
  const int last = min(row0 + kRows, seq_len) - 1;  // the last key any row here reads
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and sq is written)
    LoadRows(sk, k, j0, kTile, seq_len, ld, hs);
    LoadRows(sv, v, j0, kTile, seq_len, ld, hs);
    __syncthreads();
    if (i >= seq_len || j0 > i) continue;     // warp-uniform
    const int live = min(kTile, i - j0 + 1);  // keys j0 .. j0 + live - 1 are <= i
    const float score = lane < live ? Dot(qi, sk + lane * stride, hs) * scale : -INFINITY;
    const float m_new = fmaxf(m, WarpMax(score));  // finite: key 0 is in the first tile
    const float p = lane < live ? expf(score - m_new) : 0.0f;
    const float alpha = expf(m - m_new);  // 0 on the first tile
    l = l * alpha + WarpSum(p);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] *= alpha;
    for (int jj = 0; jj < live; ++jj) {
      Axpy(acc, __shfl_sync(kFullMask, p, jj), sv + jj * stride, lane, hs);
    }
    m = m_new;
  }
  if (i < seq_len) {
    StoreRow(out + head.out + static_cast<size_t>(i) * s.channels, acc, 1.0f / l, lane, hs);
    if (lane == 0) lse[head.row + i] = m + logf(l);
  }
}

// dK, dV for keys [key0, key0 + kRows), one per warp, streaming queries i >= key0:
//   dv_j = sum_i p_ij do_i,  dk_j = scale sum_i ds_ij q_i,  ds_ij = p_ij (do_i . v_j - D_i).
// Grid (B * NH, ceil(T / kRows)); shared: q and dout [kTile][stride], lse and D [kTile],
// k and v [kRows][stride].
template <int R>
__global__ void __launch_bounds__(kThreads)
    BackwardKeyKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                      const float* dsum, AttnShape s, float scale) {
  extern __shared__ float smem[];
  const int hs = s.head_size;
  const int stride = Stride(hs);
  float* sq = smem;
  float* sdo = sq + kTile * stride;
  float* sk = sdo + kTile * stride;
  float* sv = sk + kRows * stride;
  float* slse = sv + kRows * stride;
  float* sdsum = slse + kTile;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const float* dout_h = dout + head.out;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int key0 = blockIdx.y * kRows;
  const int j = key0 + warp;
  LoadRows(sk, k, key0, kRows, seq_len, ld, hs);
  LoadRows(sv, v, key0, kRows, seq_len, ld, hs);
  const float* kj = sk + warp * stride;
  const float* vj = sv + warp * stride;

  float dk[R] = {};
  float dv[R] = {};
  for (int i0 = key0; i0 < seq_len; i0 += kTile) {
    __syncthreads();
    LoadRows(sq, q, i0, kTile, seq_len, ld, hs);
    LoadRows(sdo, dout_h, i0, kTile, seq_len, s.channels, hs);
    if (threadIdx.x < kTile) {
      const int row = i0 + threadIdx.x;
      slse[threadIdx.x] = row < seq_len ? lse[head.row + row] : 0.0f;
      sdsum[threadIdx.x] = row < seq_len ? dsum[head.row + row] : 0.0f;
    }
    __syncthreads();
    if (j >= seq_len) continue;  // warp-uniform
    const int i = i0 + lane;
    float p = 0.0f;
    float ds = 0.0f;
    if (i < seq_len && i >= j) {
      p = expf(Dot(sq + lane * stride, kj, hs) * scale - slse[lane]);
      ds = p * (Dot(sdo + lane * stride, vj, hs) - sdsum[lane]);
    }
    const int rows = min(kTile, seq_len - i0);
    for (int ii = max(0, j - i0); ii < rows; ++ii) {
      Axpy(dv, __shfl_sync(kFullMask, p, ii), sdo + ii * stride, lane, hs);
      Axpy(dk, __shfl_sync(kFullMask, ds, ii), sq + ii * stride, lane, hs);
    }
  }
  if (j < seq_len) {
    float* dq_row = dqkv + head.qkv + static_cast<size_t>(j) * ld;
    StoreRow(dq_row + s.channels, dk, scale, lane, hs);
    StoreRow(dq_row + 2 * s.channels, dv, 1.0f, lane, hs);
  }
}

// dQ for query rows [row0, row0 + kRows), one per warp, streaming keys j <= i:
//   dq_i = scale sum_j ds_ij k_j.
// Grid (B * NH, ceil(T / kRows)); shared: k and v [kTile][stride], q and dout [kRows][stride].
template <int R>
__global__ void __launch_bounds__(kThreads)
    BackwardQueryKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                        const float* dsum, AttnShape s, float scale) {
  extern __shared__ float smem[];
  const int hs = s.head_size;
  const int stride = Stride(hs);
  float* sk = smem;
  float* sv = sk + kTile * stride;
  float* sq = sv + kTile * stride;
  float* sdo = sq + kRows * stride;

  const auto [seq_len, ld, head, slices] = ContextOf(qkv, s);
  const auto [q, k, v] = slices;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row0 = ReversedRow0();
  const int i = row0 + warp;
  LoadRows(sq, q, row0, kRows, seq_len, ld, hs);
  LoadRows(sdo, dout + head.out, row0, kRows, seq_len, s.channels, hs);
  const float* qi = sq + warp * stride;
  const float* doi = sdo + warp * stride;
  const float lse_i = i < seq_len ? lse[head.row + i] : 0.0f;
  const float dsum_i = i < seq_len ? dsum[head.row + i] : 0.0f;

  float dq[R] = {};
  const int last = min(row0 + kRows, seq_len) - 1;
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    LoadRows(sk, k, j0, kTile, seq_len, ld, hs);
    LoadRows(sv, v, j0, kTile, seq_len, ld, hs);
    __syncthreads();
    if (i >= seq_len || j0 > i) continue;  // warp-uniform
    const int live = min(kTile, i - j0 + 1);
    float ds = 0.0f;
    if (lane < live) {
      const float p = expf(Dot(qi, sk + lane * stride, hs) * scale - lse_i);
      ds = p * (Dot(doi, sv + lane * stride, hs) - dsum_i);
    }
    for (int jj = 0; jj < live; ++jj) {
      Axpy(dq, __shfl_sync(kFullMask, ds, jj), sk + jj * stride, lane, hs);
    }
  }
  if (i < seq_len) {
    StoreRow(dqkv + head.qkv + static_cast<size_t>(i) * ld, dq, scale, lane, hs);
  }
}

size_t ForwardSmem(int hs) { return (2 * kTile + kRows) * Stride(hs) * sizeof(float); }
size_t KeySmem(int hs) {
  return ((2 * kTile + 2 * kRows) * Stride(hs) + 2 * kTile) * sizeof(float);
}
size_t QuerySmem(int hs) { return (2 * kTile + 2 * kRows) * Stride(hs) * sizeof(float); }

dim3 Grid(const AttnShape& s) {
  return dim3(s.batch * s.heads, (s.seq_len + kRows - 1) / kRows);
}

float Scale(const AttnShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_size)); }

template <int R>
cudaError_t Forward(float* out, float* lse, const float* qkv, const AttnShape& s,
                    cudaStream_t stream) {
  const size_t smem = ForwardSmem(s.head_size);
  if (cudaError_t err = AllowSmem(ForwardKernel<R>, smem); err != cudaSuccess) return err;
  ForwardKernel<R><<<Grid(s), kThreads, smem, stream>>>(out, lse, qkv, s, Scale(s));
  return cudaGetLastError();
}

template <int R>
cudaError_t Backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                     const float* lse, float* dsum, const AttnShape& s, cudaStream_t stream) {
  if (cudaError_t err = LaunchRowDot(dsum, dout, out, s, stream); err != cudaSuccess) return err;
  const size_t key_smem = KeySmem(s.head_size);
  if (cudaError_t err = AllowSmem(BackwardKeyKernel<R>, key_smem); err != cudaSuccess) {
    return err;
  }
  BackwardKeyKernel<R><<<Grid(s), kThreads, key_smem, stream>>>(dqkv, dout, qkv, lse, dsum, s,
                                                                 Scale(s));
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  const size_t query_smem = QuerySmem(s.head_size);
  if (cudaError_t err = AllowSmem(BackwardQueryKernel<R>, query_smem); err != cudaSuccess) {
    return err;
  }
  BackwardQueryKernel<R><<<Grid(s), kThreads, query_smem, stream>>>(dqkv, dout, qkv, lse, dsum,
                                                                     s, Scale(s));
  return cudaGetLastError();
}

}  // namespace

// Instantiations by R = ceil(hs / 32); attention.cc admits 1 <= hs <= 128.
int RegistersPerLane(const AttnShape& s) { return (s.head_size + kWarpSize - 1) / kWarpSize; }

cudaError_t LaunchForwardF32(float* out, float* lse, const float* qkv, const AttnShape& s,
                             cudaStream_t stream) {
  constexpr decltype(&Forward<1>) kForwards[] = {Forward<1>, Forward<2>, Forward<3>, Forward<4>};
  return kForwards[RegistersPerLane(s) - 1](out, lse, qkv, s, stream);
}

cudaError_t LaunchBackwardF32(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, float* dsum, const AttnShape& s,
                              cudaStream_t stream) {
  constexpr decltype(&Backward<1>) kBackwards[] = {Backward<1>, Backward<2>, Backward<3>,
                                                   Backward<4>};
  return kBackwards[RegistersPerLane(s) - 1](dqkv, dout, qkv, out, lse, dsum, s, stream);
}

}  // namespace ringmaster::kernels::cuda::internal
