// Status helpers shared by every module.
//
//   RM_RETURN_IF_ERROR(expr)          returns the status of `expr` when it is not OK.
//   RM_ASSIGN_OR_RETURN(lhs, expr)    evaluates an absl::StatusOr<T>; returns its status on
//                                     error, otherwise moves the value into `lhs` (which
//                                     may be a declaration: `auto x`, `int y`).
//   RM_RETURN_IF_SYSCALL_ERROR(call, what)
//                                     for POSIX calls returning -1 + errno: returns the
//                                     errno mapped to a status code, with `what` in front.
//   RM_RETURN_IF_CUDA_ERROR(call) / RM_RETURN_IF_NCCL_ERROR(call)
//                                     in common/cuda_status.h (CUDA builds only).
//   MarkPermanent(status) / IsPermanent(status)
//                                     an error that no restart can fix (the job's spec and
//                                     its checkpoint disagree, say): the elastic trainer
//                                     reports it as such and the coordinator fails the job
//                                     at once instead of spending its restart budget.
//   MarkNodeLocal(status) / IsNodeLocal(status)
//                                     an error that no restart on this node can fix but
//                                     another node may not have (the data set is missing
//                                     here): the coordinator places the job elsewhere once,
//                                     then fails it.
#ifndef RINGMASTER_COMMON_STATUS_MACROS_H_
#define RINGMASTER_COMMON_STATUS_MACROS_H_

#include <cerrno>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

// Maps an errno value to the status code that tells the caller what to do:
// ECONNREFUSED/ECONNRESET/EPIPE/... are UNAVAILABLE (retry), ETIMEDOUT is
// DEADLINE_EXCEEDED, ENOENT is NOT_FOUND, EINVAL is INVALID_ARGUMENT, EACCES/EPERM are
// PERMISSION_DENIED, ENOSPC is RESOURCE_EXHAUSTED, the rest INTERNAL.
absl::Status ErrnoToStatus(int err, absl::string_view what);

// `status` marked as an error that no restart can fix (a payload: the code and message
// stay). OK stays OK. A status rebuilt from the code and message alone loses the mark.
absl::Status MarkPermanent(absl::Status status);
bool IsPermanent(const absl::Status& status);

// `status` marked as one no restart on this node can fix (a payload, as MarkPermanent).
absl::Status MarkNodeLocal(absl::Status status);
bool IsNodeLocal(const absl::Status& status);

}  // namespace ringmaster

#define RM_STATUS_CONCAT_INNER_(a, b) a##b
#define RM_STATUS_CONCAT_(a, b) RM_STATUS_CONCAT_INNER_(a, b)

#define RM_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status rm_status_ = (expr);      \
    if (!rm_status_.ok()) return rm_status_; \
  } while (0)

#define RM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

#define RM_ASSIGN_OR_RETURN(lhs, expr) \
  RM_ASSIGN_OR_RETURN_IMPL_(RM_STATUS_CONCAT_(rm_statusor_, __LINE__), lhs, expr)

#define RM_RETURN_IF_SYSCALL_ERROR(call, what)                         \
  do {                                                                 \
    if ((call) == -1) return ::ringmaster::ErrnoToStatus(errno, what); \
  } while (0)

#endif  // RINGMASTER_COMMON_STATUS_MACROS_H_
