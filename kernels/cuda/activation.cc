// Argument checks of kernels/cuda/activation.h; the kernels are in activation.cu.
#include "kernels/cuda/activation.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/activation_launch.h"
#include "kernels/cuda/checks.h"

namespace ringmaster::kernels::cuda {
namespace {

using internal::CheckCount;
using internal::CheckPointer;
using internal::Invalid;
using internal::CheckSameOrApart;

}  // namespace

absl::Status ReluForward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  const char* fn = "ReluForward";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, y, "y", n));
  RM_RETURN_IF_ERROR(CheckSameOrApart(fn, y, "y", x, "x", n));
  return CudaToStatus(internal::LaunchReluForward(x, y, n, stream), "ReluForward launch");
}

absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                          cudaStream_t stream) {
  const char* fn = "ReluBackward";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, y, "y", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dy, "dy", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dx, "dx", n));
  RM_RETURN_IF_ERROR(CheckSameOrApart(fn, dx, "dx", dy, "dy", n));
  RM_RETURN_IF_ERROR(CheckSameOrApart(fn, dx, "dx", y, "y", n));
  return CudaToStatus(internal::LaunchReluBackward(y, dy, dx, n, stream), "ReluBackward launch");
}

}  // namespace ringmaster::kernels::cuda
