// Argument checks of kernels/cuda/rows.h; the kernels are in rows.cu.
#include "kernels/cuda/rows.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/rows_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max();

absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(fn, " (CUDA): ", parts...));
}

absl::Status CheckSizes(const char* fn, const char* rows_name, int64_t rows,
                        const char* columns_name, int64_t columns) {
  if (rows <= 0) return Invalid(fn, rows_name, " must be positive, got ", rows);
  if (rows > kMaxBlocks) return Invalid(fn, rows_name, " ", rows, " exceeds ", kMaxBlocks);
  if (columns <= 0) return Invalid(fn, columns_name, " must be positive, got ", columns);
  if (columns > kMaxBlocks) {
    return Invalid(fn, columns_name, " ", columns, " exceeds ", kMaxBlocks);
  }
  return absl::OkStatus();
}

absl::Status CheckPointers(const char* fn,
                           std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  for (const auto& [p, name] : ptrs) {
    if (p == nullptr) return Invalid(fn, name, " is null");
  }
  return absl::OkStatus();
}

// The checks of LayerNormForward and its bf16 and fp16 twins.
absl::Status CheckLayerNormForward(const char* fn, const void* y, const void* mean,
                                   const void* rstd, const void* x, const void* gain,
                                   const void* bias, int64_t rows, int64_t channels) {
  RM_RETURN_IF_ERROR(CheckSizes(fn, "rows", rows, "channels", channels));
  RM_RETURN_IF_ERROR(CheckPointers(
      fn, {{y, "y"}, {mean, "mean"}, {rstd, "rstd"}, {x, "x"}, {gain, "gain"}, {bias, "bias"}}));
  if (y == x) return Invalid(fn, "y must not overlap x");
  return absl::OkStatus();
}

// The checks of LayerNormBackward and its bf16 and fp16 twins.
absl::Status CheckLayerNormBackward(const char* fn, const void* dx, const void* dgain,
                                    const void* dbias, const void* dy, const void* x,
                                    const void* gain, const void* mean, const void* rstd,
                                    int64_t rows, int64_t channels, const void* scratch) {
  RM_RETURN_IF_ERROR(CheckSizes(fn, "rows", rows, "channels", channels));
  return CheckPointers(fn, {{dx, "dx"},
                            {dgain, "dgain"},
                            {dbias, "dbias"},
                            {dy, "dy"},
                            {x, "x"},
                            {gain, "gain"},
                            {mean, "mean"},
                            {rstd, "rstd"},
                            {scratch, "scratch"}});
}

// The checks of the softmax cross-entropy functions; dlogits is checked only when `backward`.
absl::Status CheckSoftmaxCrossEntropy(const char* fn, const void* logits, const void* labels,
                                      int64_t n, int64_t classes, const void* loss,
                                      const void* predicted, bool backward,
                                      const void* dlogits) {
  RM_RETURN_IF_ERROR(CheckSizes(fn, "n", n, "classes", classes));
  RM_RETURN_IF_ERROR(CheckPointers(
      fn, {{logits, "logits"}, {labels, "labels"}, {loss, "loss"}, {predicted, "predicted"}}));
  if (backward) return CheckPointers(fn, {{dlogits, "dlogits"}});
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormForward(float* y, float* mean, float* rstd, const float* x,
                              const float* gain, const float* bias, int64_t rows,
                              int64_t channels, cudaStream_t stream) {
  const char* fn = "LayerNormForward";
  RM_RETURN_IF_ERROR(CheckLayerNormForward(fn, y, mean, rstd, x, gain, bias, rows, channels));
  return CudaToStatus(
      internal::LaunchLayerNormForward(y, mean, rstd, x, gain, bias, rows, channels, stream),
      "LayerNormForward launch");
}

absl::Status LayerNormForwardBf16(__nv_bfloat16* y, float* mean, float* rstd,
                                  const __nv_bfloat16* x, const float* gain, const float* bias,
                                  int64_t rows, int64_t channels, cudaStream_t stream) {
  const char* fn = "LayerNormForwardBf16";
  RM_RETURN_IF_ERROR(CheckLayerNormForward(fn, y, mean, rstd, x, gain, bias, rows, channels));
  return CudaToStatus(
      internal::LaunchLayerNormForwardBf16(y, mean, rstd, x, gain, bias, rows, channels, stream),
      "LayerNormForwardBf16 launch");
}

absl::Status LayerNormForwardF16(__half* y, float* mean, float* rstd, const __half* x,
                                 const float* gain, const float* bias, int64_t rows,
                                 int64_t channels, cudaStream_t stream) {
  const char* fn = "LayerNormForwardF16";
  RM_RETURN_IF_ERROR(CheckLayerNormForward(fn, y, mean, rstd, x, gain, bias, rows, channels));
  return CudaToStatus(
      internal::LaunchLayerNormForwardF16(y, mean, rstd, x, gain, bias, rows, channels, stream),
      "LayerNormForwardF16 launch");
}

int64_t LayerNormBackwardScratchFloats(int64_t channels) {
  return 2 * internal::kLayerNormChunks * channels;
}

absl::Status LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                               const float* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t channels,
                               float* scratch, cudaStream_t stream) {
  const char* fn = "LayerNormBackward";
  RM_RETURN_IF_ERROR(CheckLayerNormBackward(fn, dx, dgain, dbias, dy, x, gain, mean, rstd, rows,
                                            channels, scratch));
  return CudaToStatus(internal::LaunchLayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd,
                                                        rows, channels, scratch, stream),
                      "LayerNormBackward launch");
}

absl::Status LayerNormBackwardBf16(__nv_bfloat16* dx, float* dgain, float* dbias,
                                   const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                   const float* gain, const float* mean, const float* rstd,
                                   int64_t rows, int64_t channels, float* scratch,
                                   cudaStream_t stream) {
  const char* fn = "LayerNormBackwardBf16";
  RM_RETURN_IF_ERROR(CheckLayerNormBackward(fn, dx, dgain, dbias, dy, x, gain, mean, rstd, rows,
                                            channels, scratch));
  return CudaToStatus(
      internal::LaunchLayerNormBackwardBf16(dx, dgain, dbias, dy, x, gain, mean, rstd, rows,
                                            channels, scratch, stream),
      "LayerNormBackwardBf16 launch");
}

absl::Status LayerNormBackwardF16(__half* dx, float* dgain, float* dbias, const __half* dy,
                                  const __half* x, const float* gain, const float* mean,
                                  const float* rstd, int64_t rows, int64_t channels, float* scratch,
                                  cudaStream_t stream) {
  const char* fn = "LayerNormBackwardF16";
  RM_RETURN_IF_ERROR(CheckLayerNormBackward(fn, dx, dgain, dbias, dy, x, gain, mean, rstd, rows,
                                            channels, scratch));
  return CudaToStatus(internal::LaunchLayerNormBackwardF16(dx, dgain, dbias, dy, x, gain, mean,
                                                           rstd, rows, channels, scratch, stream),
                      "LayerNormBackwardF16 launch");
}

absl::Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float* loss, int32_t* predicted,
                                        cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForward";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/false, nullptr));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropy(logits, labels, n, classes, 0.0f, loss,
                                                          predicted, nullptr, stream),
                      "SoftmaxCrossEntropyForward launch");
}

absl::Status SoftmaxCrossEntropyForwardBf16(const __nv_bfloat16* logits, const int32_t* labels,
                                            int64_t n, int64_t classes, float* loss,
                                            int32_t* predicted, cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardBf16";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/false, nullptr));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropyBf16(logits, labels, n, classes, 0.0f,
                                                              loss, predicted, nullptr, stream),
                      "SoftmaxCrossEntropyForwardBf16 launch");
}

absl::Status SoftmaxCrossEntropyForwardF16(const __half* logits, const int32_t* labels, int64_t n,
                                           int64_t classes, float* loss, int32_t* predicted,
                                           cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardF16";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/false, nullptr));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropyF16(logits, labels, n, classes, 0.0f, loss,
                                                             predicted, nullptr, stream),
                      "SoftmaxCrossEntropyForwardF16 launch");
}

absl::Status SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels,
                                                int64_t n, int64_t classes, float scale,
                                                float* loss, int32_t* predicted, float* dlogits,
                                                cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardBackward";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/true, dlogits));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropy(logits, labels, n, classes, scale, loss,
                                                          predicted, dlogits, stream),
                      "SoftmaxCrossEntropyForwardBackward launch");
}

absl::Status SoftmaxCrossEntropyForwardBackwardBf16(const __nv_bfloat16* logits,
                                                    const int32_t* labels, int64_t n,
                                                    int64_t classes, float scale, float* loss,
                                                    int32_t* predicted,
                                                    __nv_bfloat16* dlogits,
                                                    cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardBackwardBf16";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/true, dlogits));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropyBf16(logits, labels, n, classes, scale,
                                                              loss, predicted, dlogits, stream),
                      "SoftmaxCrossEntropyForwardBackwardBf16 launch");
}

absl::Status SoftmaxCrossEntropyForwardBackwardF16(const __half* logits, const int32_t* labels,
                                                   int64_t n, int64_t classes, float scale,
                                                   float* loss, int32_t* predicted, __half* dlogits,
                                                   cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardBackwardF16";
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, loss, predicted,
                                              /*backward=*/true, dlogits));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropyF16(logits, labels, n, classes, scale,
                                                             loss, predicted, dlogits, stream),
                      "SoftmaxCrossEntropyForwardBackwardF16 launch");
}

}  // namespace ringmaster::kernels::cuda
