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

// EmbeddingForward and its bf16 and fp16 twins, one body: `fn` names the public function in
// errors, `launch` is its launcher.
template <typename T>
absl::Status ForwardAs(const char* fn,
                       cudaError_t (*launch)(T*, const int32_t*, const float*, const float*,
                                             int64_t, int64_t, int64_t, int64_t, cudaStream_t),
                       T* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab,
                       cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckShape(fn, batch, seq_len, channels, vocab));
  RM_RETURN_IF_ERROR(CheckPointer(fn, out, "out"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, tokens, "tokens"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, wte, "wte"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, wpe, "wpe"));
  return CudaToStatus(launch(out, tokens, wte, wpe, batch, seq_len, channels, vocab, stream),
                      absl::StrCat(fn, " launch").c_str());
}

// EmbeddingBackward and its bf16 and fp16 twins, likewise.
template <typename T>
absl::Status BackwardAs(const char* fn,
                        cudaError_t (*launch)(float*, float*, const T*, const int32_t*, int64_t,
                                              int64_t, int64_t, int64_t, cudaStream_t),
                        float* dwte, float* dwpe, const T* dout, const int32_t* index,
                        int64_t groups, int64_t batch, int64_t seq_len, int64_t channels,
                        int64_t vocab, cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckShape(fn, batch, seq_len, channels, vocab));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dwte, "dwte"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dwpe, "dwpe"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dout, "dout"));
  RM_RETURN_IF_ERROR(CheckPointer(fn, index, "index"));
  if (groups < 1 || groups > batch * seq_len) {
    return Invalid(fn, "groups must be in [1, batch x seq_len = ", batch * seq_len, "], got ",
                   groups);
  }
  return CudaToStatus(launch(dwte, dwpe, dout, index, groups, batch, seq_len, channels, stream),
                      absl::StrCat(fn, " launch").c_str());
}

}  // namespace

absl::Status EmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                              const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                              int64_t vocab, cudaStream_t stream) {
  return ForwardAs("EmbeddingForward", internal::LaunchEmbeddingForward, out, tokens, wte, wpe,
                   batch, seq_len, channels, vocab, stream);
}

absl::Status EmbeddingForwardBf16(__nv_bfloat16* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int64_t batch, int64_t seq_len,
                                  int64_t channels, int64_t vocab, cudaStream_t stream) {
  return ForwardAs("EmbeddingForwardBf16", internal::LaunchEmbeddingForwardBf16, out, tokens, wte,
                   wpe, batch, seq_len, channels, vocab, stream);
}

absl::Status EmbeddingForwardF16(__half* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t batch, int64_t seq_len, int64_t channels,
                                 int64_t vocab, cudaStream_t stream) {
  return ForwardAs("EmbeddingForwardF16", internal::LaunchEmbeddingForwardF16, out, tokens, wte,
                   wpe, batch, seq_len, channels, vocab, stream);
}

absl::Status EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* index,
                               int64_t groups, int64_t batch, int64_t seq_len, int64_t channels,
                               int64_t vocab, cudaStream_t stream) {
  return BackwardAs("EmbeddingBackward", internal::LaunchEmbeddingBackward, dwte, dwpe, dout, index,
                    groups, batch, seq_len, channels, vocab, stream);
}

absl::Status EmbeddingBackwardBf16(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                                   const int32_t* index, int64_t groups, int64_t batch,
                                   int64_t seq_len, int64_t channels, int64_t vocab,
                                   cudaStream_t stream) {
  return BackwardAs("EmbeddingBackwardBf16", internal::LaunchEmbeddingBackwardBf16, dwte, dwpe,
                    dout, index, groups, batch, seq_len, channels, vocab, stream);
}

absl::Status EmbeddingBackwardF16(float* dwte, float* dwpe, const __half* dout,
                                  const int32_t* index, int64_t groups, int64_t batch,
                                  int64_t seq_len, int64_t channels, int64_t vocab,
                                  cudaStream_t stream) {
  return BackwardAs("EmbeddingBackwardF16", internal::LaunchEmbeddingBackwardF16, dwte, dwpe, dout,
                    index, groups, batch, seq_len, channels, vocab, stream);
}

}  // namespace ringmaster::kernels::cuda
