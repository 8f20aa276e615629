// Communicator: collectives between the ranks of one training job (the data plane).
//
// A communicator is made for one membership (epoch): a fixed set of `size()` ranks. Every
// rank must call the same collectives in the same order with matching arguments;
// mismatches are detected where the backend can (the TCP backend checks each message's
// header) and reported as INTERNAL.
//
// Buffers: `count` is in elements of `type`. Operations work in place (send == recv) or
// out of place, for any count including 0 and counts smaller than or not divisible by the
// world size. f16/bf16 are reduced in f32 and rounded once per reduction step.
//
// Deadlines: every operation takes an absolute deadline. Errors, by what to do next:
//   DEADLINE_EXCEEDED  a peer did not make progress in time (stopped, overloaded);
//   UNAVAILABLE        a peer died or its connection broke;
//   ABORTED            Abort() was called (the epoch is changing);
//   INVALID_ARGUMENT   bad arguments (names the argument);
//   INTERNAL           peers disagree about the operation (a programming error).
// After any error other than INVALID_ARGUMENT the communicator is broken: every later
// operation returns the same error (GetAsyncError() too). Make a new one for the next epoch.
//
// Thread-safety: operations must be called from one thread at a time (they are ordered
// collectives). Abort(), GetAsyncError(), counters() and rank()/size() may be called from
// any thread at any time.
#ifndef RINGMASTER_COMM_COMMUNICATOR_H_
#define RINGMASTER_COMM_COMMUNICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"

namespace ringmaster::comm {

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProd};
absl::string_view ReduceOpName(ReduceOp op);

// The kinds of operation, for counters and message headers.
enum class OpKind : uint8_t {
  kAllReduce = 0,
  kAllGather = 1,
  kReduceScatter = 2,
  kBroadcast = 3,
  kSend = 4,
  kRecv = 5,
  kBarrier = 6,
};
inline constexpr int kNumOpKinds = 7;
absl::string_view OpKindName(OpKind kind);

struct OpCounters {
  uint64_t calls = 0;
  uint64_t errors = 0;
  uint64_t bytes_sent = 0;      // payload bytes this rank sent (headers not counted)
  uint64_t bytes_received = 0;  // payload bytes this rank received
  absl::Duration time;          // wall time spent inside the operation
};

// Per-rank counters, indexed by OpKind.
struct Counters {
  std::array<OpCounters, kNumOpKinds> ops;
  const OpCounters& of(OpKind kind) const { return ops[static_cast<int>(kind)]; }
  OpCounters& of(OpKind kind) { return ops[static_cast<int>(kind)]; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "tcp" or "nccl".
  virtual absl::string_view backend() const = 0;

  // recv[i] = op over ranks of send[i], for i < count, on every rank.
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type,
                                 ReduceOp op, absl::Time deadline) = 0;

  // recv (count * size() elements) = concatenation of every rank's send (count elements),
  // in rank order.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DataType type,
                                 absl::Time deadline) = 0;

  // send holds count * size() elements; rank r receives in recv (count elements) the
  // reduction over ranks of send[r * count, (r + 1) * count).
  virtual absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, absl::Time deadline) = 0;

  // recv on every rank = send on `root` (count elements). On the root, send and recv may
  // be the same buffer; on other ranks `send` is ignored (may be null).
  virtual absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type,
                                 int root, absl::Time deadline) = 0;

  // Point to point, matched in order per (sender, receiver) pair.
  virtual absl::Status Send(const void* buf, size_t count, DataType type, int peer,
                            absl::Time deadline) = 0;
  virtual absl::Status Recv(void* buf, size_t count, DataType type, int peer,
                            absl::Time deadline) = 0;

  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier(absl::Time deadline) = 0;

  // Makes operations blocked now or called later return ABORTED promptly, and closes the
  // connections so that peers fail fast too. Idempotent; callable from any thread,
  // including while another thread is inside an operation.
  virtual void Abort() = 0;

  // OK while healthy; otherwise the error that broke the communicator. Never blocks.
  virtual absl::Status GetAsyncError() const = 0;

  // A snapshot of this rank's counters.
  virtual Counters counters() const = 0;
};

// Validates arguments shared by every backend: INVALID_ARGUMENT names the argument.
absl::Status ValidateBuffers(absl::string_view op, const void* send, const void* recv,
                             size_t count);
absl::Status ValidateBuffer(absl::string_view op, absl::string_view what, const void* buf,
                            size_t count);
absl::Status ValidatePeer(absl::string_view op, absl::string_view what, int peer, int rank,
                          int size, bool allow_self);

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_COMMUNICATOR_H_
