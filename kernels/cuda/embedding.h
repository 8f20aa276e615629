// CUDA twins of kernels/embedding.h (GPT-2's token plus positional embedding), fp32, with
// the CPU kernels' layouts and results bit for bit: the forward is one addition per element,
// and the backward adds each token's (and each position's) contributions one by one in
// ascending (b, t) order, starting from the table's value, exactly as the CPU does.
//
// The backward needs, per distinct token, its positions in ascending order. The tokens come
// from the host (the data loader), so the host builds that index (IndexTokens, which also
// checks every id) and copies it to the device with the tokens:
//
//   // kernels/embedding_index.h:
//   absl::StatusOr<EmbeddingIndex> index = IndexTokens(host_tokens, B, T, V);
//   cudaMemcpyAsync(device_index, index->ints.data(), index->ints.size() * 4, ..., stream);
//   EmbeddingBackward(dwte, dwpe, dout, device_index, index->groups, B, T, C, V, stream);
//
// Every function enqueues on `stream` and returns: OK means the launches were accepted.
// INVALID_ARGUMENT names the bad argument (a size below 1, B T of 2^31 or more, a null
// pointer, a group count outside [1, B T]); INTERNAL carries a CUDA launch error. No
// function allocates device memory. Thread-compatible.
//
// The *Bf16 twins serve bf16 activations with fp32 master tables (llm.c-style mixed
// precision): forward reads the fp32 wte and wpe and writes out in bf16, the fp32 sum
// rounded once to nearest even (kernels/half.h's FloatToBFloat16, bit for bit); backward
// reads dout in bf16 (widened exactly) and accumulates into the fp32 dwte and dwpe exactly as
// EmbeddingBackward does: the same host-built index, the same order, the same fp32 additions.
//
// The *F16 twins are the same kernels with fp16 (__half) storage: widened exactly, rounded
// once per output to nearest even as kernels/half.h's FloatToFloat16 does (IEEE: values of
// magnitude 65520 or more become +-inf, which the loss scaler's overflow check then finds).
#ifndef RINGMASTER_KERNELS_CUDA_EMBEDDING_H_
#define RINGMASTER_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/embedding_index.h"

namespace ringmaster::kernels::cuda {

// out [B, T, C] = wte[tokens[b, t], :] + wpe[t, :] (tokens on the device). The device cannot
// fail the call for an id outside [0, vocab): that row of out becomes NaN instead (never a
// read outside wte), which the trainer's non-finite check catches.
absl::Status EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                              const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                              int64_t vocab, cudaStream_t stream);
// bf16 out = round(wte[tokens[b, t], :] + wpe[t, :]); fp32 wte and wpe. An id outside
// [0, vocab) gives a NaN row, as above.
absl::Status EmbeddingForwardBf16(__nv_bfloat16* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int64_t batch, int64_t seq_len,
                                  int64_t channels, int64_t vocab, cudaStream_t stream);
absl::Status EmbeddingForwardF16(__half* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                                 int64_t vocab, cudaStream_t stream);

// ACCUMULATES: dwte[tokens[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :], in
// ascending (b, t) order per row. `index` is an EmbeddingIndex's ints on the device and
// `groups` its group count.
absl::Status EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* index,
                               int64_t groups, int64_t batch, int64_t seq_len, int64_t channels,
                               int64_t vocab, cudaStream_t stream);
// bf16 dout; fp32 dwte and dwpe, accumulated as by EmbeddingBackward.
absl::Status EmbeddingBackwardBf16(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                                   const int32_t* index, int64_t groups, int64_t batch,
                                   int64_t seq_len, int64_t channels, int64_t vocab,
                                   cudaStream_t stream);
absl::Status EmbeddingBackwardF16(float* dwte, float* dwpe, const __half* dout,
                                  const int32_t* index, int64_t groups, int64_t batch,
                                  int64_t seq_len, int64_t channels, int64_t vocab,
                                  cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_EMBEDDING_H_
