#include "common/status_macros.h"

#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

constexpr char kPermanentUrl[] = "type.ringmaster.dev/ringmaster.Permanent";
constexpr char kNodeLocalUrl[] = "type.ringmaster.dev/ringmaster.NodeLocal";

}  // namespace

absl::Status MarkPermanent(absl::Status status) {
  if (!status.ok()) status.SetPayload(kPermanentUrl, absl::Cord("no restart can fix this"));
  return status;
}

bool IsPermanent(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kPermanentUrl).has_value();
}

absl::Status MarkNodeLocal(absl::Status status) {
  if (!status.ok()) status.SetPayload(kNodeLocalUrl, absl::Cord("no restart on this node"));
  return status;
}

bool IsNodeLocal(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kNodeLocalUrl).has_value();
}

absl::Status ErrnoToStatus(int err, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EAGAIN:
    case EINTR:
      return absl::UnavailableError(message);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace ringmaster
