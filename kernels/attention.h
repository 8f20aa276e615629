// Causal multi-head self-attention on a fused q, k, v tensor (GPT-2's attn, before c_proj).
//
// Shapes, with B = batch, T = seq_len, C = channels, NH = heads, hs = C / NH:
//   qkv  [B, T, 3C]: row (b, t) holds q in columns [0, C), k in [C, 2C), v in [2C, 3C);
//                    head h uses columns [h * hs, (h + 1) * hs) of each of the three.
//   out  [B, T, C]:  head h's output in columns [h * hs, (h + 1) * hs).
// For each (b, h) and query position i:
//   s[i, j] = q_i . k_j / sqrt(hs) for j <= i,
//   p[i, :] = softmax over j <= i of s[i, :],  out_i = sum_{j <= i} p[i, j] v_j.
// Key positions j > i are masked by never reading them: p[i, j] is exactly 0 and no -inf is
// used. Causality is exact for finite inputs; an inf or NaN at position j (an fp16 overflow)
// may reach the outputs of earlier positions in the same 64-row query block as 0 * inf = NaN;
// such a step is spoilt anyway (the fp16 loss scaler skips it).
//
// Two forms with the same outputs and gradients up to rounding (the tests hold them to 1e-6
// and 1e-5 relative):
//   - AttentionForward/AttentionBackward keep the probabilities p: B * NH * T * T floats of
//     activation memory per layer (the probability-keeping form);
//   - AttentionForwardLse/AttentionBackwardLse keep only lse[i] = log sum_{j <= i} exp(s[i, j])
//     per row, B * NH * T floats, and recompute p in backward (the memory-efficient form, what
//     activation checkpointing and the trainer's memory accounting count on). Backward costs
//     one more q.k product than the other form.
//
// The CPU implementation works on one (b, h) at a time, in blocks of 64 query rows i0..i1-1
// against keys 0..i1-1 (only the diagonal block's upper triangle is computed and discarded),
// with the products on [rows, hs] slices through cblas_sgemm (OpenBLAS, with whatever threads
// it is configured for; this code starts none). Scratch holds one block's rows of p and dp,
// never a whole T x T matrix: 2 * min(T, 64) * T floats.
// No function allocates; `scratch` must hold AttentionScratchFloats(seq_len) floats and its
// contents are undefined afterwards. Inputs and outputs must not overlap.
// Thread-compatible. The CUDA twins take the same arguments as device pointers.
//
// CHECK-fails when heads does not divide channels or a dimension is not positive.
#ifndef RINGMASTER_KERNELS_ATTENTION_H_
#define RINGMASTER_KERNELS_ATTENTION_H_

#include <cstdint>

namespace ringmaster::kernels {

// Size of the saved probabilities of AttentionForward: B * NH * T * T.
int64_t AttentionProbsFloats(int64_t batch, int64_t seq_len, int64_t heads);
// Size of the saved statistics of AttentionForwardLse: B * NH * T.
int64_t AttentionLseFloats(int64_t batch, int64_t seq_len, int64_t heads);
// Scratch for any function below that takes it; independent of batch, channels and heads.
int64_t AttentionScratchFloats(int64_t seq_len);

// Writes out [B, T, C] and probs [B, NH, T, T] (both overwritten): probs[b, h, i, j] = p[i, j]
// for j <= i and exactly 0 for j > i. Save for backward: qkv and probs.
void AttentionForward(float* out, float* probs, const float* qkv, int64_t batch, int64_t seq_len,
                      int64_t channels, int64_t heads);

// Given dout [B, T, C], OVERWRITES dqkv [B, T, 3C] with dL/dqkv (q, k and v of a GPT block
// come from one matmul, so nothing else adds into them).
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                       float* scratch, int64_t batch, int64_t seq_len, int64_t channels,
                       int64_t heads);

// Writes out [B, T, C] and lse [B, NH, T] (both overwritten). The output is the same as
// AttentionForward's up to rounding. Save for backward: qkv and lse.
void AttentionForwardLse(float* out, float* lse, const float* qkv, float* scratch, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t heads);

// Same contract as AttentionBackward, recomputing p from qkv and lse.
void AttentionBackwardLse(float* dqkv, const float* dout, const float* qkv, const float* lse,
                          float* scratch, int64_t batch, int64_t seq_len, int64_t channels,
                          int64_t heads);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_ATTENTION_H_
