// Argument checks of kernels/cuda/embedding.h; the kernels are in embedding.cu.
#include "kernels/cuda/embedding.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/embedding_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(fn, " (CUDA): ", parts...));
}

// Sizes >= 1; B T within int32 (positions are int32, rows a grid dimension).
absl::Status CheckShape(const char* fn, int64_t batch, int64_t seq_len, int64_t channels,
                        int64_t vocab) {
  for (auto [name, v] : {std::pair<const char*, int64_t>{"batch", batch},
                         {"seq_len", seq_len},
                         {"channels", channels},
                         {"vocab", vocab}}) {
    if (v < 1) return Invalid(fn, name, " must be >= 1, got ", v);
  }
  if (batch > std::numeric_limits<int32_t>::max() / seq_len) {
    return Invalid(fn, "batch x seq_len must be below 2^31, got ", batch, " x ", seq_len);
  }
  if (vocab > std::numeric_limits<int32_t>::max()) {
    return Invalid(fn, "vocab must be below 2^31, got ", vocab);
  }
  if (channels > int64_t{65535} * 256) {
    return Invalid(fn, "channels must be at most 65535 x 256, got ", channels);
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const char* fn, const void* p, const char* name) {
  if (p == nullptr) return Invalid(fn, name, " is null");
  return absl::OkStatus();
}

// The checks of EmbeddingForward and its bf16 and fp16 twins.
absl::Status CheckForward(const char* fn, const void* out, const int32_t* tokens,
                          const float* wte, const float* wpe, int64_t batch, int64_t seq_len,
                          int64_t channels, int64_t vocab) {
  RM_RETURN_IF_ERROR(CheckShape(fn, batch, seq_len, channels, vocab));
  RM_RETURN_IF_ERROR(CheckPointer(fn, out, "out"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, tokens, "tokens"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, wte, "wte"));
  return CheckPointer(fn, wpe, "wpe");
}

// The checks of EmbeddingBackward and its bf16 and fp16 twins.
absl::Status CheckBackward(const char* fn, const float* dwte, const float* dwpe,
                           const void* dout, const int32_t* index, int64_t groups,
                           int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab) {
  RM_RETURN_IF_ERROR(CheckShape(fn, batch, seq_len, channels, vocab));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dwte, "dwte"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dwpe, "dwpe"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dout, "dout"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, index, "index"));
  if (groups < 1 || groups > batch * seq_len) {
    return Invalid(fn, "groups must be in [1, batch x seq_len = ", batch * seq_len, "], got ",
                   groups);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                              const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                              int64_t vocab, cudaStream_t stream) {
  const char* fn = "EmbeddingForward";
  RM_RETURN_IF_ERROR(CheckForward(fn, out, tokens, wte, wpe, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingForward(out, tokens, wte, wpe, batch, seq_len,
                                                       channels, vocab, stream),
                      "EmbeddingForward launch");
}

absl::Status EmbeddingForwardBf16(__nv_bfloat16* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int64_t batch, int64_t seq_len,
                                  int64_t channels, int64_t vocab, cudaStream_t stream) {
  const char* fn = "EmbeddingForwardBf16";
  RM_RETURN_IF_ERROR(CheckForward(fn, out, tokens, wte, wpe, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingForwardBf16(out, tokens, wte, wpe, batch, seq_len,
                                                           channels, vocab, stream),
                      "EmbeddingForwardBf16 launch");
}

absl::Status EmbeddingForwardF16(__half* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                                 int64_t vocab, cudaStream_t stream) {
  const char* fn = "EmbeddingForwardF16";
  RM_RETURN_IF_ERROR(CheckForward(fn, out, tokens, wte, wpe, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingForwardF16(out, tokens, wte, wpe, batch, seq_len,
                                                          channels, vocab, stream),
                      "EmbeddingForwardF16 launch");
}

absl::Status EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* index,
                               int64_t groups, int64_t batch, int64_t seq_len, int64_t channels,
                               int64_t vocab, cudaStream_t stream) {
  const char* fn = "EmbeddingBackward";
  RM_RETURN_IF_ERROR(
      CheckBackward(fn, dwte, dwpe, dout, index, groups, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingBackward(dwte, dwpe, dout, index, groups, batch,
                                                        seq_len, channels, stream),
                      "EmbeddingBackward launch");
}

absl::Status EmbeddingBackwardBf16(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                                   const int32_t* index, int64_t groups, int64_t batch,
                                   int64_t seq_len, int64_t channels, int64_t vocab,
                                   cudaStream_t stream) {
  const char* fn = "EmbeddingBackwardBf16";
  RM_RETURN_IF_ERROR(
      CheckBackward(fn, dwte, dwpe, dout, index, groups, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingBackwardBf16(dwte, dwpe, dout, index, groups,
                                                            batch, seq_len, channels, stream),
                      "EmbeddingBackwardBf16 launch");
}

absl::Status EmbeddingBackwardF16(float* dwte, float* dwpe, const __half* dout,
                                  const int32_t* index, int64_t groups, int64_t batch,
                                  int64_t seq_len, int64_t channels, int64_t vocab,
                                  cudaStream_t stream) {
  const char* fn = "EmbeddingBackwardF16";
  RM_RETURN_IF_ERROR(
      CheckBackward(fn, dwte, dwpe, dout, index, groups, batch, seq_len, channels, vocab));
  return CudaToStatus(internal::LaunchEmbeddingBackwardF16(dwte, dwpe, dout, index, groups, batch,
                                                           seq_len, channels, stream),
                      "EmbeddingBackwardF16 launch");
}

}  // namespace ringmaster::kernels::cuda
