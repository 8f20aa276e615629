// The kernels of kernels/cuda/embedding.h. One thread per channel of a row; the loops over
// a row's contributions run in ascending (b, t) order, as on the CPU. The kernels are
// templates over the storage of out / dout (float, __nv_bfloat16 or __half, kernels/cuda/bf16.cuh);
// the tables are fp32 in all, and the float instantiations are the fp32 kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/embedding_launch.h"

namespace ringmaster::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

// Block (row = b T + t, channel tile): out[row, c] = wte[token, c] + wpe[t, c] (rounded
// once when T is 16-bit).
template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int64_t seq_len, int64_t channels,
                                       int64_t vocab) {
  const int64_t row = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= channels) return;
  const int32_t token = tokens[row];
  const int64_t t = row % seq_len;
  StoreF32(&out[row * channels + c],
           token >= 0 && token < vocab
               ? wte[static_cast<int64_t>(token) * channels + c] + wpe[t * channels + c]
               : NAN);
}

// Block (t, channel tile): dwpe[t, c] += dout[b, t, c] for b = 0, 1, ...
template <typename T>
__global__ void EmbeddingBackwardPositionKernel(float* dwpe, const T* dout, int64_t batch,
                                                int64_t seq_len, int64_t channels) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= channels) return;
  float acc = dwpe[t * channels + c];
  for (int64_t b = 0; b < batch; ++b) acc += LoadF32(dout[(b * seq_len + t) * channels + c]);
  dwpe[t * channels + c] = acc;
}

// Block (group g, channel tile): dwte[token_g, c] += dout[p, c] for the group's positions p
// in ascending order.
template <typename T>
__global__ void EmbeddingBackwardTokenKernel(float* dwte, const T* dout, const int32_t* index,
                                             int64_t groups, int64_t channels) {
  const int64_t g = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= channels) return;
  const int32_t* tokens = index;
  const int32_t* starts = index + groups;
  const int32_t* positions = index + 2 * groups + 1;
  float* row = dwte + static_cast<int64_t>(tokens[g]) * channels;
  float acc = row[c];
  for (int32_t i = starts[g]; i < starts[g + 1]; ++i) {
    acc += LoadF32(dout[static_cast<int64_t>(positions[i]) * channels + c]);
  }
  row[c] = acc;
}

unsigned Tiles(int64_t channels) {
  return static_cast<unsigned>((channels + kThreads - 1) / kThreads);
}

template <typename T>
cudaError_t EmbeddingForward(T* out, const int32_t* tokens, const float* wte, const float* wpe,
                             int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                             cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(batch * seq_len), Tiles(channels));
  EmbeddingForwardKernel<T><<<grid, kThreads, 0, stream>>>(out, tokens, wte, wpe, seq_len,
                                                           channels, vocab);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingBackward(float* dwte, float* dwpe, const T* dout, const int32_t* index,
                              int64_t groups, int64_t batch, int64_t seq_len, int64_t channels,
                              cudaStream_t stream) {
  EmbeddingBackwardPositionKernel<T><<<dim3(static_cast<unsigned>(seq_len), Tiles(channels)),
                                       kThreads, 0, stream>>>(dwpe, dout, batch, seq_len,
                                                              channels);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || groups == 0) return err;
  EmbeddingBackwardTokenKernel<T><<<dim3(static_cast<unsigned>(groups), Tiles(channels)),
                                    kThreads, 0, stream>>>(dwte, dout, index, groups, channels);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t batch, int64_t seq_len,
                                   int64_t channels, int64_t vocab, cudaStream_t stream) {
  return EmbeddingForward(out, tokens, wte, wpe, batch, seq_len, channels, vocab, stream);
}

cudaError_t LaunchEmbeddingForwardBf16(__nv_bfloat16* out, const int32_t* tokens,
                                       const float* wte, const float* wpe, int64_t batch,
                                       int64_t seq_len, int64_t channels, int64_t vocab,
                                       cudaStream_t stream) {
  return EmbeddingForward(out, tokens, wte, wpe, batch, seq_len, channels, vocab, stream);
}

cudaError_t LaunchEmbeddingForwardF16(__half* out, const int32_t* tokens, const float* wte,
                                      const float* wpe, int64_t batch, int64_t seq_len,
                                      int64_t channels, int64_t vocab, cudaStream_t stream) {
  return EmbeddingForward(out, tokens, wte, wpe, batch, seq_len, channels, vocab, stream);
}

cudaError_t LaunchEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* index, int64_t groups, int64_t batch,
                                    int64_t seq_len, int64_t channels, cudaStream_t stream) {
  return EmbeddingBackward(dwte, dwpe, dout, index, groups, batch, seq_len, channels, stream);
}

cudaError_t LaunchEmbeddingBackwardBf16(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                                        const int32_t* index, int64_t groups, int64_t batch,
                                        int64_t seq_len, int64_t channels,
                                        cudaStream_t stream) {
  return EmbeddingBackward(dwte, dwpe, dout, index, groups, batch, seq_len, channels, stream);
}

cudaError_t LaunchEmbeddingBackwardF16(float* dwte, float* dwpe, const __half* dout,
                                       const int32_t* index, int64_t groups, int64_t batch,
                                       int64_t seq_len, int64_t channels, cudaStream_t stream) {
  return EmbeddingBackward(dwte, dwpe, dout, index, groups, batch, seq_len, channels, stream);
}

}  // namespace ringmaster::kernels::cuda::internal
