// Token embedding plus learned positional embedding (GPT-2's wte and wpe):
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
//
// Layout: tokens is [B, T] int32 row-major; wte is [V, C]; wpe is [T_max, C] with
// T <= T_max (only its first T rows are read or written); out and dout are [B, T, C]. No
// allocation, no threads, thread-compatible. The CUDA twins take the same arguments as
// device pointers.
#ifndef RINGMASTER_KERNELS_EMBEDDING_H_
#define RINGMASTER_KERNELS_EMBEDDING_H_

#include <cstdint>

namespace ringmaster::kernels {

// Overwrites out. CHECK-fails on a token id outside [0, vocab) (the data pipeline guarantees
// the range; an id outside it would read outside wte). Save for backward: tokens.
void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab);

// Scatter-add, ACCUMULATED into both tables: dwte[tokens[b, t], :] += dout[b, t, :] and
// dwpe[t, :] += dout[b, t, :]. A token id that occurs several times receives the sum of its
// positions' gradients. Deterministic: contributions are added in ascending (b, t) order, so
// equal inputs give bit-identical tables. Same token-id CHECK as forward.
void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_EMBEDDING_H_
