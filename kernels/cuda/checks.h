// Internal to the CUDA kernels' host wrappers (kernels/cuda/*.cc): the argument checks they
// share. Each returns INVALID_ARGUMENT naming the function ("<fn> (CUDA): ...") and the bad
// argument, or OK.
#ifndef RINGMASTER_KERNELS_CUDA_CHECKS_H_
#define RINGMASTER_KERNELS_CUDA_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringmaster::kernels::cuda::internal {

inline absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(fn, " (CUDA): ", parts...));
}

// n >= 0.
inline absl::Status CheckCount(const char* fn, int64_t n) {
  if (n < 0) return Invalid(fn, "n must be >= 0, got ", n);
  return absl::OkStatus();
}

// Non-null when there is something to do (n > 0).
inline absl::Status CheckPointer(const char* fn, const void* p, const char* name, int64_t n) {
  if (n > 0 && p == nullptr) return Invalid(fn, name, " is null");
  return absl::OkStatus();
}

// `out` is `in` exactly, or lies apart from it: n floats each.
inline absl::Status CheckSameOrApart(const char* fn, const float* out, const char* out_name,
                                     const float* in, const char* in_name, int64_t n) {
  if (out == in) return absl::OkStatus();
  const auto a = reinterpret_cast<uintptr_t>(out), b = reinterpret_cast<uintptr_t>(in);
  const auto bytes = static_cast<uintptr_t>(n) * sizeof(float);
  if (a < b + bytes && b < a + bytes) {
    return Invalid(fn, out_name, " overlaps ", in_name, " partially (only ", out_name,
                   " == ", in_name, " is allowed)");
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::kernels::cuda::internal

#endif  // RINGMASTER_KERNELS_CUDA_CHECKS_H_
