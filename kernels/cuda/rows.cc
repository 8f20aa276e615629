// Argument checks of kernels/cuda/rows.h; the kernels are in rows.cu.
#include "kernels/cuda/rows.h"

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

}  // namespace

absl::Status LayerNormForward(float* y, float* mean, float* rstd, const float* x,
                              const float* gain, const float* bias, int64_t rows,
                              int64_t channels, cudaStream_t stream) {
  const char* fn = "LayerNormForward";
  RM_RETURN_IF_ERROR(CheckSizes(fn, "rows", rows, "channels", channels));
  RM_RETURN_IF_ERROR(CheckPointers(
      fn, {{y, "y"}, {mean, "mean"}, {rstd, "rstd"}, {x, "x"}, {gain, "gain"}, {bias, "bias"}}));
  if (static_cast<const void*>(y) == static_cast<const void*>(x)) {
    return Invalid(fn, "y must not overlap x");
  }
  return CudaToStatus(
      internal::LaunchLayerNormForward(y, mean, rstd, x, gain, bias, rows, channels, stream),
      "LayerNormForward launch");
}

int64_t LayerNormBackwardScratchFloats(int64_t channels) {
  return 2 * internal::kLayerNormChunks * channels;
}

absl::Status LayerNormBackward(float* dx, float* dgain, float* dbias, const float* dy,
                               const float* x, const float* gain, const float* mean,
                               const float* rstd, int64_t rows, int64_t channels,
                               float* scratch, cudaStream_t stream) {
  const char* fn = "LayerNormBackward";
  RM_RETURN_IF_ERROR(CheckSizes(fn, "rows", rows, "channels", channels));
  RM_RETURN_IF_ERROR(CheckPointers(fn, {{dx, "dx"},
                                        {dgain, "dgain"},
                                        {dbias, "dbias"},
                                        {dy, "dy"},
                                        {x, "x"},
                                        {gain, "gain"},
                                        {mean, "mean"},
                                        {rstd, "rstd"},
                                        {scratch, "scratch"}}));
  return CudaToStatus(internal::LaunchLayerNormBackward(dx, dgain, dbias, dy, x, gain, mean, rstd,
                                                        rows, channels, scratch, stream),
                      "LayerNormBackward launch");
}

absl::Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels, int64_t n,
                                        int64_t classes, float* loss, int32_t* predicted,
                                        cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForward";
  RM_RETURN_IF_ERROR(CheckSizes(fn, "n", n, "classes", classes));
  RM_RETURN_IF_ERROR(CheckPointers(
      fn, {{logits, "logits"}, {labels, "labels"}, {loss, "loss"}, {predicted, "predicted"}}));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropy(logits, labels, n, classes, 0.0f, loss,
                                                          predicted, nullptr, stream),
                      "SoftmaxCrossEntropyForward launch");
}

absl::Status SoftmaxCrossEntropyForwardBackward(const float* logits, const int32_t* labels,
                                                int64_t n, int64_t classes, float scale,
                                                float* loss, int32_t* predicted, float* dlogits,
                                                cudaStream_t stream) {
  const char* fn = "SoftmaxCrossEntropyForwardBackward";
  RM_RETURN_IF_ERROR(CheckSizes(fn, "n", n, "classes", classes));
  RM_RETURN_IF_ERROR(CheckPointers(fn, {{logits, "logits"},
                                        {labels, "labels"},
                                        {loss, "loss"},
                                        {predicted, "predicted"},
                                        {dlogits, "dlogits"}}));
  return CudaToStatus(internal::LaunchSoftmaxCrossEntropy(logits, labels, n, classes, scale, loss,
                                                          predicted, dlogits, stream),
                      "SoftmaxCrossEntropyForwardBackward launch");
}

}  // namespace ringmaster::kernels::cuda
