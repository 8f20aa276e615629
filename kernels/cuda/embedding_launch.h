// Internal to kernels/cuda/embedding: the kernel launchers, compiled by nvcc (no absl here).
// Callers (embedding.cc) validate every argument first. Each returns cudaGetLastError()
// after its launches (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_EMBEDDING_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_EMBEDDING_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringmaster::kernels::cuda::internal {

cudaError_t LaunchEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t batch, int64_t seq_len,
                                   int64_t channels, int64_t vocab, cudaStream_t stream);
cudaError_t LaunchEmbeddingBackward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* index, int64_t groups, int64_t batch,
                                    int64_t seq_len, int64_t channels, cudaStream_t stream);

// bf16 out (rounded to nearest even) and dout; fp32 tables.
cudaError_t LaunchEmbeddingForwardBf16(__nv_bfloat16* out, const int32_t* tokens,
                                       const float* wte, const float* wpe, int64_t batch,
                                       int64_t seq_len, int64_t channels, int64_t vocab,
                                       cudaStream_t stream);
cudaError_t LaunchEmbeddingForwardF16(__half* out, const int32_t* tokens, const float* wte,
                                      const float* wpe, int64_t batch, int64_t seq_len,
                                      int64_t channels, int64_t vocab, cudaStream_t stream);
cudaError_t LaunchEmbeddingBackwardBf16(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                                        const int32_t* index, int64_t groups, int64_t batch,
                                        int64_t seq_len, int64_t channels,
                                        cudaStream_t stream);
cudaError_t LaunchEmbeddingBackwardF16(float* dwte, float* dwpe, const __half* dout,
                                       const int32_t* index, int64_t groups, int64_t batch,
                                       int64_t seq_len, int64_t channels, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_EMBEDDING_LAUNCH_H_
