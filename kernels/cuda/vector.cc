// Argument checks of kernels/cuda/vector.h; the kernels are in vector.cu.
#include "kernels/cuda/vector.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/checks.h"
#include "kernels/cuda/vector_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

using internal::CheckCount;
using internal::CheckPointer;
using internal::Invalid;

// Whether two arrays of n floats share a byte.
bool Overlap(const float* a, const float* b, int64_t n) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  const auto bytes = static_cast<uintptr_t>(n) * sizeof(float);
  return pa < pb + bytes && pb < pa + bytes;
}

absl::Status CheckApart(const char* fn, const float* a, const char* a_name, const float* b,
                        const char* b_name, int64_t n) {
  if (Overlap(a, b, n)) return Invalid(fn, a_name, " must not overlap ", b_name);
  return absl::OkStatus();
}

}  // namespace

absl::Status ResidualBackward(float* da, float* db, const float* dout, int64_t n,
                              cudaStream_t stream) {
  const char* fn = "ResidualBackward";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, da, "da", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, db, "db", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, dout, "dout", n));
  if (n == 0) return absl::OkStatus();
  if (da != db && Overlap(da, db, n)) {
    return Invalid(fn, "da overlaps db partially (only da == db is allowed)");
  }
  RM_RETURN_IF_ERROR(CheckApart(fn, da, "da", dout, "dout", n));
  RM_RETURN_IF_ERROR(CheckApart(fn, db, "db", dout, "dout", n));
  return CudaToStatus(internal::LaunchResidualBackward(da, db, dout, n, stream),
                      "ResidualBackward launch");
}

absl::Status Accumulate(float* acc, const float* x, int64_t n, cudaStream_t stream) {
  const char* fn = "Accumulate";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, acc, "acc", n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  if (n == 0) return absl::OkStatus();
  RM_RETURN_IF_ERROR(CheckApart(fn, acc, "acc", x, "x", n));
  return CudaToStatus(internal::LaunchAccumulate(acc, x, n, stream), "Accumulate launch");
}

absl::Status Scale(float* x, float s, int64_t n, cudaStream_t stream) {
  const char* fn = "Scale";
  RM_RETURN_IF_ERROR(CheckCount(fn, n));
  RM_RETURN_IF_ERROR(CheckPointer(fn, x, "x", n));
  return CudaToStatus(internal::LaunchScale(x, s, n, stream), "Scale launch");
}

}  // namespace ringmaster::kernels::cuda
