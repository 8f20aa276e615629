#include "comm/communicator.h"

#include "absl/strings/str_cat.h"

namespace ringmaster::comm {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProd:
      return "prod";
  }
  return "unknown";
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

absl::Status ValidateBuffers(absl::string_view op, const void* send, const void* recv,
                             size_t count) {
  if (count == 0) return absl::OkStatus();
  if (send == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": send buffer is null but count is ", count));
  }
  if (recv == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": recv buffer is null but count is ", count));
  }
  return absl::OkStatus();
}

absl::Status ValidateBuffer(absl::string_view op, absl::string_view what, const void* buf,
                            size_t count) {
  if (count > 0 && buf == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " is null but count is ", count));
  }
  return absl::OkStatus();
}

absl::Status ValidatePeer(absl::string_view op, absl::string_view what, int peer, int rank,
                          int size, bool allow_self) {
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " ", peer, " is outside [0, ", size, ")"));
  }
  if (!allow_self && peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " ", peer, " is this rank itself"));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::comm
