// Internal to kernels/cuda/attention: the kernel launchers, compiled by nvcc (no absl here).
// Callers (attention.cc) validate every argument first; the launchers assume:
//   - all pointers are device pointers, non-null, not overlapping;
//   - dimensions positive, heads * head_size == channels, grids within CUDA's limits;
//   - bf16 and fp16: head_size is one of kTensorCoreHeadSizes and qkv, out, dout, dqkv are
//     16-byte aligned.
// Each returns cudaGetLastError() after its launches (asynchronous errors show later).
#ifndef RINGMASTER_KERNELS_CUDA_ATTENTION_LAUNCH_H_
#define RINGMASTER_KERNELS_CUDA_ATTENTION_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace ringmaster::kernels::cuda::internal {

struct AttnShape {
  int batch;
  int seq_len;
  int channels;
  int heads;
  int head_size;
};

// fp32: any head size in [1, kF32MaxHeadSize].
inline constexpr int kF32MaxHeadSize = 128;
// bf16 and fp16 tensor-core kernels (one template, attention_bf16.cu): instantiated head sizes.
inline constexpr int kTensorCoreHeadSizes[] = {64, 128};

// Query rows (keys for the dK/dV pass) per block: grids have ceil(T / rows) blocks in y.
inline constexpr int kF32RowsPerBlock = 8;
inline constexpr int kTensorCoreRowsPerBlock = 64;

cudaError_t LaunchForwardF32(float* out, float* lse, const float* qkv, const AttnShape& s,
                             cudaStream_t stream);
// dsum: B * NH * T floats of scratch (D_i = dout_i . out_i).
cudaError_t LaunchBackwardF32(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, float* dsum, const AttnShape& s,
                              cudaStream_t stream);

cudaError_t LaunchForwardBf16(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                              const AttnShape& s, cudaStream_t stream);
cudaError_t LaunchBackwardBf16(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                               const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                               const float* lse, float* dsum, const AttnShape& s,
                               cudaStream_t stream);

cudaError_t LaunchForwardF16(__half* out, float* lse, const __half* qkv, const AttnShape& s,
                             cudaStream_t stream);
cudaError_t LaunchBackwardF16(__half* dqkv, const __half* dout, const __half* qkv,
                              const __half* out, const float* lse, float* dsum, const AttnShape& s,
                              cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_ATTENTION_LAUNCH_H_
