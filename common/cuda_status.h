// CUDA and NCCL error checks, for CUDA builds only (targets behind --config=cuda).
#ifndef RINGMASTER_COMMON_CUDA_STATUS_H_
#define RINGMASTER_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {

inline absl::Status CudaToStatus(cudaError_t err, const char* expr) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(expr, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

// NCCL's codes mapped by what the caller should do: a remote or system error is
// UNAVAILABLE (the round can be retried with a new communicator), bad arguments are
// INVALID_ARGUMENT, the rest INTERNAL.
inline absl::Status NcclToStatus(ncclResult_t res, const char* expr) {
  if (res == ncclSuccess || res == ncclInProgress) return absl::OkStatus();
  std::string message = absl::StrCat(expr, ": NCCL error ", res, ": ", ncclGetErrorString(res));
  switch (res) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace ringmaster

#define RM_RETURN_IF_CUDA_ERROR(call)                                           \
  do {                                                                          \
    ::absl::Status rm_cuda_status_ = ::ringmaster::CudaToStatus((call), #call); \
    if (!rm_cuda_status_.ok()) return rm_cuda_status_;                          \
  } while (0)

#define RM_RETURN_IF_NCCL_ERROR(call)                                           \
  do {                                                                          \
    ::absl::Status rm_nccl_status_ = ::ringmaster::NcclToStatus((call), #call); \
    if (!rm_nccl_status_.ok()) return rm_nccl_status_;                          \
  } while (0)

#endif  // RINGMASTER_COMMON_CUDA_STATUS_H_
