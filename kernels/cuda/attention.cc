// Argument checks of kernels/cuda/attention.h; the kernels are in attention_f32.cu and
// attention_bf16.cu (bf16 and fp16, one template).
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/attention_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

using internal::AttnShape;

constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

// kBf16 and kF16 share the tensor-core kernels and so every limit; kF32 has its own.
enum class Precision { kF32, kBf16, kF16 };

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kF32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kF16:
      return "fp16";
  }
  return "?";
}

bool SupportsHeadSize(Precision p, int64_t hs) {
  if (p == Precision::kF32) return hs >= 1 && hs <= internal::kF32MaxHeadSize;
  const auto& sizes = internal::kTensorCoreHeadSizes;
  return std::find(std::begin(sizes), std::end(sizes), hs) != std::end(sizes);
}

absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat("attention (CUDA) ", fn, ": ", parts...));
}

absl::StatusOr<AttnShape> CheckShape(const char* fn, Precision p, int64_t batch, int64_t seq_len,
                                     int64_t channels, int64_t heads) {
  if (batch <= 0) return Invalid(fn, "batch must be positive, got ", batch);
  if (seq_len <= 0) return Invalid(fn, "seq_len must be positive, got ", seq_len);
  if (channels <= 0) return Invalid(fn, "channels must be positive, got ", channels);
  if (heads <= 0) return Invalid(fn, "heads must be positive, got ", heads);
  if (channels % heads != 0) {
    return Invalid(fn, "heads ", heads, " must divide channels ", channels);
  }
  const int64_t hs = channels / heads;
  if (!SupportsHeadSize(p, hs)) {
    return Invalid(fn, "head size ", hs, " (channels ", channels, " / heads ", heads,
                   ") is not supported by the ", PrecisionName(p), " kernels (",
                   p == Precision::kF32 ? "1..128" : "64 or 128", ")");
  }
  const int64_t rows_per_block =
      p == Precision::kF32 ? internal::kF32RowsPerBlock : internal::kTensorCoreRowsPerBlock;
  const int64_t row_blocks = (seq_len + rows_per_block - 1) / rows_per_block;
  const int64_t row_dot_blocks = (seq_len + 7) / 8;
  if (std::max(row_blocks, row_dot_blocks) > kMaxGridY) {
    return Invalid(fn, "seq_len ", seq_len, " exceeds the grid's limit");
  }
  if (batch * heads > kMaxInt || batch * seq_len > kMaxInt / (3 * channels)) {
    return Invalid(fn, "batch ", batch, " x seq_len ", seq_len, " x channels ", channels,
                   " exceeds the kernels' 32-bit row indices");
  }
  return AttnShape{static_cast<int>(batch), static_cast<int>(seq_len),
                   static_cast<int>(channels), static_cast<int>(heads), static_cast<int>(hs)};
}

absl::Status CheckPointer(const char* fn, const char* name, const void* ptr, Precision p) {
  if (ptr == nullptr) return Invalid(fn, name, " is null");
  if (p != Precision::kF32 && reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
    return Invalid(fn, name, " must be 16-byte aligned for the ", PrecisionName(p), " kernels");
  }
  return absl::OkStatus();
}

absl::Status LaunchStatus(const char* fn, cudaError_t err) {
  return CudaToStatus(err, fn);
}

template <typename T>
constexpr Precision PrecisionOf() {
  if constexpr (std::is_same_v<T, float>) {
    return Precision::kF32;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return Precision::kBf16;
  } else {
    static_assert(std::is_same_v<T, __half>, "attention (CUDA): float, bf16 or fp16 only");
    return Precision::kF16;
  }
}

template <typename T>
absl::Status Forward(T* out, float* lse, const T* qkv, int64_t batch, int64_t seq_len,
                     int64_t channels, int64_t heads, cudaStream_t stream) {
  constexpr Precision p = PrecisionOf<T>();
  const char* fn = "AttentionForwardLse";
  absl::StatusOr<AttnShape> shape = CheckShape(fn, p, batch, seq_len, channels, heads);
  if (!shape.ok()) return shape.status();
  RM_RETURN_IF_ERROR(CheckPointer(fn, "out", out, p));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "lse", lse, Precision::kF32));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "qkv", qkv, p));
  if constexpr (p == Precision::kF32) {
    return LaunchStatus(fn, internal::LaunchForwardF32(out, lse, qkv, *shape, stream));
  } else if constexpr (p == Precision::kBf16) {
    return LaunchStatus(fn, internal::LaunchForwardBf16(out, lse, qkv, *shape, stream));
  } else {
    return LaunchStatus(fn, internal::LaunchForwardF16(out, lse, qkv, *shape, stream));
  }
}

template <typename T>
absl::Status Backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                      float* scratch, int64_t batch, int64_t seq_len, int64_t channels,
                      int64_t heads, cudaStream_t stream) {
  constexpr Precision p = PrecisionOf<T>();
  const char* fn = "AttentionBackwardLse";
  absl::StatusOr<AttnShape> shape = CheckShape(fn, p, batch, seq_len, channels, heads);
  if (!shape.ok()) return shape.status();
  RM_RETURN_IF_ERROR(CheckPointer(fn, "dqkv", dqkv, p));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "dout", dout, p));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "qkv", qkv, p));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "out", out, p));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "lse", lse, Precision::kF32));
  RM_RETURN_IF_ERROR(CheckPointer(fn, "scratch", scratch, Precision::kF32));
  if constexpr (p == Precision::kF32) {
    return LaunchStatus(fn, internal::LaunchBackwardF32(dqkv, dout, qkv, out, lse, scratch,
                                                        *shape, stream));
  } else if constexpr (p == Precision::kBf16) {
    return LaunchStatus(fn, internal::LaunchBackwardBf16(dqkv, dout, qkv, out, lse, scratch,
                                                         *shape, stream));
  } else {
    return LaunchStatus(fn, internal::LaunchBackwardF16(dqkv, dout, qkv, out, lse, scratch,
                                                        *shape, stream));
  }
}

}  // namespace

int64_t AttentionCudaScratchFloats(int64_t batch, int64_t seq_len, int64_t heads) {
  return batch * heads * seq_len;
}

bool AttentionCudaSupportsHeadSizeF32(int64_t head_size) {
  return SupportsHeadSize(Precision::kF32, head_size);
}

bool AttentionCudaSupportsHeadSizeBf16(int64_t head_size) {
  return SupportsHeadSize(Precision::kBf16, head_size);
}

bool AttentionCudaSupportsHeadSizeF16(int64_t head_size) {
  return SupportsHeadSize(Precision::kF16, head_size);
}

absl::Status AttentionForwardLse(float* out, float* lse, const float* qkv, int64_t batch,
                                 int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream) {
  return Forward(out, lse, qkv, batch, seq_len, channels, heads, stream);
}

absl::Status AttentionForwardLse(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                                 int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream) {
  return Forward(out, lse, qkv, batch, seq_len, channels, heads, stream);
}

absl::Status AttentionForwardLse(__half* out, float* lse, const __half* qkv, int64_t batch,
                                 int64_t seq_len, int64_t channels, int64_t heads,
                                 cudaStream_t stream) {
  return Forward(out, lse, qkv, batch, seq_len, channels, heads, stream);
}

absl::Status AttentionBackwardLse(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, float* scratch,
                                  int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream) {
  return Backward(dqkv, dout, qkv, out, lse, scratch, batch, seq_len, channels, heads, stream);
}

absl::Status AttentionBackwardLse(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                                  const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                  const float* lse, float* scratch, int64_t batch,
                                  int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream) {
  return Backward(dqkv, dout, qkv, out, lse, scratch, batch, seq_len, channels, heads, stream);
}

absl::Status AttentionBackwardLse(__half* dqkv, const __half* dout, const __half* qkv,
                                  const __half* out, const float* lse, float* scratch,
                                  int64_t batch, int64_t seq_len, int64_t channels, int64_t heads,
                                  cudaStream_t stream) {
  return Backward(dqkv, dout, qkv, out, lse, scratch, batch, seq_len, channels, heads, stream);
}

}  // namespace ringmaster::kernels::cuda
