// CUDA twins of kernels/attention.h's memory-efficient form (AttentionForwardLse /
// AttentionBackwardLse): causal multi-head self-attention on a fused qkv tensor, with the
// same layouts, in device memory, never materialising the T x T matrix.
//
// Shapes (B = batch, T = seq_len, C = channels, NH = heads, hs = C / NH), all row-major:
//   qkv [B, T, 3C], out and dout [B, T, C], dqkv [B, T, 3C], lse [B, NH, T] (always fp32,
//   natural log: lse[b, h, i] = log sum_{j <= i} exp(q_i . k_j / sqrt(hs))).
//
// Three precisions:
//   - float: fp32 loads and FMA arithmetic; any head size 1 <= hs <= 128. The baseline.
//   - __nv_bfloat16: bf16 inputs and outputs, fp32 accumulation on tensor cores
//     (mma.sync m16n8k16; built for sm_90 with compute_80 PTX, so sm_80+), fp32 softmax
//     statistics; hs must be 64 or 128, and qkv, out, dout, dqkv 16-byte aligned.
//   - __half: the same algorithm and limits as bf16 (one implementation): fp32 accumulation,
//     fp32 softmax statistics, hs 64 or 128, 16-byte alignment. fp16 has 10 mantissa bits
//     against bf16's 7 but a range of only +-65504 (normal down to 6.1e-5): P and dS are
//     rounded to fp16 before the second products (P.V, dS.K, P^T.dO, dS^T.Q), and outputs
//     and gradients are stored in fp16. Forward cannot overflow (P <= 1, out is a convex
//     combination of v rows); backward's dS = P (dP - D) and dq, dk, dv scale with dout, so
//     the caller's loss scaling must keep them within range: from 65520 on they become inf,
//     which propagates into dqkv (not reported here); far below 6.1e-5 they lose bits.
//
// Differences from the CPU contract, all forced by the GPU algorithm:
//   - Backward also takes `out` (the forward's output, which the next layer's matmul keeps
//     anyway): D_i = dout_i . out_i is the row sum that softmax backward needs.
//   - Backward's scratch holds AttentionCudaScratchFloats(B, T, NH) = B * NH * T floats
//     (D above) in device memory; its contents are undefined afterwards.
// Backward OVERWRITES dqkv (every element is written). It is deterministic: two passes (per
// key tile for dK, dV; per query tile for dQ), each gradient element summed by one thread in a
// fixed order, no atomics; the result is bitwise reproducible on the same GPU and shape.
//
// Every function enqueues its kernels on `stream` and returns without waiting: OK means the
// launches were accepted; errors of the kernels' execution surface at the next synchronising
// call. INVALID_ARGUMENT names the bad argument (non-positive dimension, heads not dividing
// channels, unsupported head size, null or misaligned pointer, a size beyond the grid's
// limits); INTERNAL carries a CUDA launch error. No function allocates. Inputs and outputs
// must not overlap. Thread-compatible (distinct calls on distinct buffers may run at once).
#ifndef RINGMASTER_KERNELS_CUDA_ATTENTION_H_
#define RINGMASTER_KERNELS_CUDA_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ringmaster::kernels::cuda {

// Scratch floats of AttentionBackwardLse: B * NH * T.
int64_t AttentionCudaScratchFloats(int64_t batch, int64_t seq_len, int64_t heads);

// Whether the kernels of the given precision take head size hs.
bool AttentionCudaSupportsHeadSizeF32(int64_t head_size);
bool AttentionCudaSupportsHeadSizeBf16(int64_t head_size);
bool AttentionCudaSupportsHeadSizeF16(int64_t head_size);

// Writes out [B, T, C] and lse [B, NH, T] (both overwritten). Save for backward: qkv, out, lse.
absl::Status AttentionForwardLse(float* out, float* lse, const float* qkv, int64_t batch,
                                 int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream);
absl::Status AttentionForwardLse(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                                 int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream);
absl::Status AttentionForwardLse(__half* out, float* lse, const __half* qkv, int64_t batch,
                                 int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream);

// Given dout [B, T, C], OVERWRITES dqkv [B, T, 3C] with dL/dqkv, recomputing the
// probabilities from qkv and lse.
absl::Status AttentionBackwardLse(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, float* scratch,
                                  int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream);
absl::Status AttentionBackwardLse(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                                  const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                  const float* lse, float* scratch, int64_t batch,
                                  int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream);
absl::Status AttentionBackwardLse(__half* dqkv, const __half* dout, const __half* qkv,
                                  const __half* out, const float* lse, float* scratch,
                                  int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_ATTENTION_H_
