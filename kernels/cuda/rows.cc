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
                                      int64_t n, int64_t classes, int64_t row_stride,
                                      const void* loss, const void* predicted, bool backward,
                                      const void* dlogits) {
  RM_RETURN_IF_ERROR(CheckSizes(fn, "n", n, "classes", classes));
  if (row_stride != 0 && row_stride < classes) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": row_stride ", row_stride,
                                                   " is below classes ", classes,
                                                   " (0 means rows of exactly classes)"));
  }
  RM_RETURN_IF_ERROR(CheckPointers(
      fn, {{logits, "logits"}, {labels, "labels"}, {loss, "loss"}, {predicted, "predicted"}}));
  if (backward) return CheckPointers(fn, {{dlogits, "dlogits"}});
  return absl::OkStatus();
}

// One body per kernel for its fp32, bf16 and fp16 forms: `fn` names the public function in
// errors, `launch` is its launcher.
template <typename T>
absl::Status LayerNormForwardAs(const char* fn,
                                cudaError_t (*launch)(T*, float*, float*, const T*, const float*,
                                                      const float*, int64_t, int64_t, cudaStream_t),
                                T* y, float* mean, float* rstd, const T* x, const float* gain,
                                const float* bias, int64_t rows, int64_t channels,
                                cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckLayerNormForward(fn, y, mean, rstd, x, gain, bias, rows, channels));
  return CudaToStatus(launch(y, mean, rstd, x, gain, bias, rows, channels, stream),
                      absl::StrCat(fn, " launch").c_str());
}

template <typename T>
absl::Status LayerNormBackwardAs(const char* fn,
                                 cudaError_t (*launch)(T*, float*, float*, const T*, const T*,
                                                       const float*, const float*, const float*,
                                                       int64_t, int64_t, float*, cudaStream_t),
                                 T* dx, float* dgain, float* dbias, const T* dy, const T* x,
                                 const float* gain, const float* mean, const float* rstd,
                                 int64_t rows, int64_t channels, float* scratch,
                                 cudaStream_t stream) {
  RM_RETURN_IF_ERROR(CheckLayerNormBackward(fn, dx, dgain, dbias, dy, x, gain, mean, rstd, rows,
                                            channels, scratch));
  return CudaToStatus(
      launch(dx, dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch, stream),
      absl::StrCat(fn, " launch").c_str());
}

// backward false: the forward only (dlogits null, scale unused).
template <typename T>
absl::Status SoftmaxCrossEntropyAs(const char* fn,
                                   cudaError_t (*launch)(const T*, const int32_t*, int64_t, int64_t,
                                                         int64_t, float, float*, int32_t*, T*,
                                                         cudaStream_t),
                                   bool backward, const T* logits, const int32_t* labels, int64_t n,
                                   int64_t classes, float scale, float* loss, int32_t* predicted,
                                   T* dlogits, cudaStream_t stream, int64_t row_stride) {
  RM_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(fn, logits, labels, n, classes, row_stride, loss,
                                              predicted, backward, dlogits));
  const int64_t stride = row_stride == 0 ? classes : row_stride;
  return CudaToStatus(
      launch(logits, labels, n, classes, stride, scale, loss, predicted, dlogits, stream),
      absl::StrCat(fn, " launch").c_str());
}

}  // namespace

absl::Status LayerNormForward(float* y, float* mean, float* rstd, const float* x,
                              const float* gain, const float* bias, int64_t rows,
                              int64_t channels, cudaStream_t stream) {
  return LayerNormForwardAs("LayerNormForward", internal::LaunchLayerNormForward, y, mean, rstd, x,
                            gain, bias, rows, channels, stream);
}

absl::Status LayerNormForwardBf16(__nv_bfloat16* y, float* mean, float* rstd,
                                  const __nv_bfloat16* x, const float* gain, const float* bias,
                                  int64_t rows, int64_t channels, cudaStream_t stream) {
  return LayerNormForwardAs("LayerNormForwardBf16", internal::LaunchLayerNormForwardBf16, y, mean,
                            rstd, x, gain, bias, rows, channels, stream);
}

absl::Status LayerNormForwardF16(__half* y, float* mean, float* rstd, const __half* x,
                                 const float* gain, const float* bias, int64_t rows,
                                 int64_t channels, cudaStream_t stream) {
  return LayerNormForwardAs("LayerNormForwardF16", internal::LaunchLayerNormForwardF16, y, mean,
                            rstd, x, gain, bias, rows, channels, stream);
}

int64_t LayerNormBackwardScratchFloats(int64_t channels) {
  return 2 * internal::kLayerNormChunks * channels;
}

absl::Status LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                               const float* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t channels,
                               float* scratch, cudaStream_t stream) {
  return LayerNormBackwardAs("LayerNormBackward", internal::LaunchLayerNormBackward, dx, dgain,
                             dbias, dy, x, gain, mean, rstd, rows, channels, scratch, stream);
}

absl::Status LayerNormBackwardBf16(__nv_bfloat16* dx, float* dgain, float* dbias,
                                   const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                   const float* gain, const float* mean, const float* rstd,
                                   int64_t rows, int64_t channels, float* scratch,
                                   cudaStream_t stream) {
  return LayerNormBackwardAs("LayerNormBackwardBf16", internal::LaunchLayerNormBackwardBf16, dx,
                             dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch,
                             stream);
}

absl::Status LayerNormBackwardF16(__half* dx, float* dgain, float* dbias, const __half* dy,
                                  const __half* x, const float* gain, const float* mean,
                                  const float* rstd, int64_t rows, int64_t channels, float* scratch,
                                  cudaStream_t stream) {
  return LayerNormBackwardAs("LayerNormBackwardF16", internal::LaunchLayerNormBackwardF16, dx,
                             dgain, dbias, dy, x, gain, mean, rstd, rows, channels, scratch,
                             stream);
}

absl::Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float* loss, int32_t* predicted,
                                        cudaStream_t stream, int64_t row_stride) {
  return SoftmaxCrossEntropyAs<float>(
      "SoftmaxCrossEntropyForward", internal::LaunchSoftmaxCrossEntropy, /*backward=*/false, logits,
      labels, n, classes, 0.0f, loss, predicted, nullptr, stream, row_stride);
}

absl::Status SoftmaxCrossEntropyForwardBf16(const __nv_bfloat16* logits, const int32_t* labels,
                                            int64_t n, int64_t classes, float* loss,
                                            int32_t* predicted, cudaStream_t stream,
                                            int64_t row_stride) {
  return SoftmaxCrossEntropyAs<__nv_bfloat16>(
      "SoftmaxCrossEntropyForwardBf16", internal::LaunchSoftmaxCrossEntropyBf16, /*backward=*/false,
      logits, labels, n, classes, 0.0f, loss, predicted, nullptr, stream, row_stride);
}

absl::Status SoftmaxCrossEntropyForwardF16(const __half* logits, const int32_t* labels, int64_t n,
                                           int64_t classes, float* loss, int32_t* predicted,
                                           cudaStream_t stream, int64_t row_stride) {
  return SoftmaxCrossEntropyAs<__half>(
      "SoftmaxCrossEntropyForwardF16", internal::LaunchSoftmaxCrossEntropyF16, /*backward=*/false,
      logits, labels, n, classes, 0.0f, loss, predicted, nullptr, stream, row_stride);
}

absl::Status SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels,
                                                int64_t n, int64_t classes, float scale,
                                                float* loss, int32_t* predicted, float* dlogits,
                                                cudaStream_t stream, int64_t row_stride) {
  return SoftmaxCrossEntropyAs(
      "SoftmaxCrossEntropyForwardBackward", internal::LaunchSoftmaxCrossEntropy, /*backward=*/true,
      logits, labels, n, classes, scale, loss, predicted, dlogits, stream, row_stride);
}

absl::Status SoftmaxCrossEntropyForwardBackwardBf16(const __nv_bfloat16* logits,
                                                    const int32_t* labels, int64_t n,
                                                    int64_t classes, float scale, float* loss,
                                                    int32_t* predicted, __nv_bfloat16* dlogits,
                                                    cudaStream_t stream, int64_t row_stride) {
  return SoftmaxCrossEntropyAs("SoftmaxCrossEntropyForwardBackwardBf16",
                               internal::LaunchSoftmaxCrossEntropyBf16, /*backward=*/true, logits,
                               labels, n, classes, scale, loss, predicted, dlogits, stream,
                               row_stride);
}

absl::Status SoftmaxCrossEntropyForwardBackwardF16(const __half* logits, const int32_t* labels,
                                                   int64_t n, int64_t classes, float scale,
                                                   float* loss, int32_t* predicted, __half* dlogits,
                                                   cudaStream_t stream, int64_t row_stride) {
  return SoftmaxCrossEntropyAs("SoftmaxCrossEntropyForwardBackwardF16",
                               internal::LaunchSoftmaxCrossEntropyF16, /*backward=*/true, logits,
                               labels, n, classes, scale, loss, predicted, dlogits, stream,
                               row_stride);
}

}  // namespace ringmaster::kernels::cuda
