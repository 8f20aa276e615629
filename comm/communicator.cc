#include "comm/communicator.h"

#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster::comm {

Work Work::Done(absl::Status status) {
  Work work;
  work.state_ = std::make_shared<State>();
  absl::MutexLock lock(&work.state_->mu);
  work.state_->done = true;
  work.state_->status = std::move(status);
  return work;
}

absl::Status Work::Wait(absl::Time deadline) const {
  if (state_ == nullptr) {
    return absl::FailedPreconditionError("Work::Wait on a handle that names no operation");
  }
  absl::MutexLock lock(&state_->mu);
  if (!state_->mu.AwaitWithDeadline(absl::Condition(&state_->done), deadline)) {
    return absl::DeadlineExceededError(
        "Work::Wait: the operation is still running at the deadline given to Wait (its "
        "buffers are still in use; wait again, or Abort() the communicator)");
  }
  return state_->status;
}

bool Work::done() const {
  if (state_ == nullptr) return false;
  absl::MutexLock lock(&state_->mu);
  return state_->done;
}

OpQueue::~OpQueue() { Stop(); }

void OpQueue::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

Work OpQueue::Enqueue(std::function<absl::Status()> op) {
  Work work;
  work.state_ = std::make_shared<Work::State>();
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(op), work);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  return work;
}

absl::Status OpQueue::Drain(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && running_ == 0;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError(
        "the deadline passed while waiting for this communicator's non-blocking operations");
  }
  return absl::OkStatus();
}

void OpQueue::Loop() {
  while (true) {
    std::function<absl::Status()> op;
    Work work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      op = std::move(queue_.front().first);
      work = std::move(queue_.front().second);
      queue_.pop_front();
      running_ = 1;
    }
    absl::Status status = op();
    {
      absl::MutexLock lock(&work.state_->mu);
      work.state_->done = true;
      work.state_->status = std::move(status);
    }
    absl::MutexLock lock(&mu_);
    running_ = 0;
  }
}

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

uint64_t RingAllReduceBytes(uint64_t bytes, int n) {
  return n <= 1 ? 0 : 2 * static_cast<uint64_t>(n - 1) * bytes / static_cast<uint64_t>(n);
}

uint64_t RingGatherBytes(uint64_t bytes, int n) {
  return n <= 1 ? 0 : static_cast<uint64_t>(n - 1) * bytes / static_cast<uint64_t>(n);
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
    case OpKind::kSendRecv:
      return "send_recv";
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

std::string BatchOpName(size_t index) { return absl::StrCat("SendRecv ops[", index, "]"); }

absl::Status ValidateBatch(absl::Span<const PointToPoint> ops, int rank, int size) {
  using Kind = PointToPoint::Kind;
  std::vector<std::pair<const char*, size_t>> extents(ops.size());  // [op] -> (start, bytes)
  for (size_t i = 0; i < ops.size(); ++i) {
    const PointToPoint& op = ops[i];
    const std::string name = BatchOpName(i);
    if (op.kind != Kind::kSend && op.kind != Kind::kRecv) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": kind ", static_cast<int>(op.kind), " is neither kSend nor kRecv"));
    }
    if (static_cast<uint8_t>(op.type) > static_cast<uint8_t>(DataType::kUint8)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": type ", static_cast<int>(op.type), " is not a known DataType"));
    }
    RM_RETURN_IF_ERROR(ValidatePeer(name, "peer", op.peer, rank, size, /*allow_self=*/false));
    const bool sends = op.kind == Kind::kSend;
    const void* buf = sends ? op.send : op.recv;
    RM_RETURN_IF_ERROR(ValidateBuffer(name, sends ? "send" : "recv", buf, op.count));
    const size_t elem = DataTypeSize(op.type);
    if (op.count > std::numeric_limits<size_t>::max() / elem) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": count ", op.count, " overflows the buffer's length in bytes"));
    }
    extents[i] = {static_cast<const char*>(buf), op.count * elem};
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto [a, a_bytes] = extents[i];
    if (ops[i].kind != Kind::kRecv || a_bytes == 0) continue;
    for (size_t j = 0; j < ops.size(); ++j) {
      const auto [b, b_bytes] = extents[j];
      if (j == i || b_bytes == 0) continue;
      if (std::less<>()(a, b + b_bytes) && std::less<>()(b, a + a_bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            BatchOpName(i), ": recv overlaps the ", ops[j].kind == Kind::kSend ? "send" : "recv",
            " buffer of ops[", j, "]; every receive of a batch needs a buffer of its own"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::comm
