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
// Groups: Split() makes a sub-communicator over some of the ranks, a Communicator of its
// own (rank, size, counters, every operation), and groups split again. A communicator and
// every group made from it, directly or not, form a *family* that shares one set of
// connections (TCP) or one abort fate (NCCL): Abort() of any member, or an error that
// breaks one (a dead peer, a missed deadline), breaks every member of the family on this
// rank, so a rank notices a failure in whichever group it next uses. Make a new family for
// the next epoch. Members may be destroyed in any order.
//
// Point to point: Send and Recv move one message; SendRecv moves a batch of sends and
// receives, to and from any peers, that progress together (NCCL's grouped send/recv,
// torch's batch_isend_irecv), so that a rank can send to one neighbour while it receives
// from another, and two ranks can exchange large messages without deadlock. Messages
// match in order per (sender, receiver) pair, whichever of these calls sent or received
// them.
//
// Non-blocking operations (the *Async forms) are issued at once and run on the
// communicator's own worker thread, in issue order; Wait() for the returned Work before
// touching its buffers. Operations that may share a connection (every operation of one
// communicator; on TCP also those of family members with a common peer) run in the order
// this rank issued them, blocking and non-blocking alike; the others run concurrently
// (e.g. an all-gather on the dp group while the tp group all-reduces). Every
// rank must issue the operations of overlapping groups in the same relative order, as with
// MPI communicators.
//
// Thread-safety: operations on one communicator must be issued from one thread at a time
// (they are ordered collectives); different members of a family may be used from
// different threads. Abort(), GetAsyncError(), counters() and rank()/size() may be called
// from any thread at any time.
#ifndef RINGMASTER_COMM_COMMUNICATOR_H_
#define RINGMASTER_COMM_COMMUNICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
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
  kSendRecv = 7,  // a SendRecv batch: its sends' and receives' bytes, one call per batch
};
inline constexpr int kNumOpKinds = 8;
absl::string_view OpKindName(OpKind kind);

struct OpCounters {
  uint64_t calls = 0;
  uint64_t errors = 0;
  uint64_t bytes_sent = 0;      // payload bytes this rank sent (headers not counted)
  uint64_t bytes_received = 0;  // payload bytes this rank received
  absl::Duration time;          // wall time spent inside the operation
  // The calls' buffers, B: count x element size for all-reduce, broadcast and the
  // point-to-point calls; the whole buffer (count x size() x element size) for all-gather
  // (its output) and reduce-scatter (its input). 0 for barriers.
  uint64_t payload_bytes = 0;
  // What this rank sends by the formula of the algorithm the backend chose for each call
  // (the backend's header lists them, e.g. a ring all-reduce 2(N-1)/N x B, see
  // RingAllReduceBytes), set where the algorithm is chosen, so that it sits beside the
  // measured bytes_sent; 0 where no formula applies (point-to-point, barrier).
  uint64_t formula_bytes_sent = 0;
};

// Per-rank counters, indexed by OpKind.
struct Counters {
  std::array<OpCounters, kNumOpKinds> ops;
  const OpCounters& of(OpKind kind) const { return ops[static_cast<int>(kind)]; }
  OpCounters& of(OpKind kind) { return ops[static_cast<int>(kind)]; }
};

// What one rank sends by the ring algorithms' formulas, for N = `n` ranks and B = `bytes`
// (OpCounters::payload_bytes), rounded down to a whole byte. The ring moves B in N chunks;
// when N does not divide B's elements the chunks differ by one element, so one rank's
// measured bytes differ from these by less than two elements (the ranks' sum is exact).
//   all-reduce (reduce-scatter then all-gather)    2(N-1)/N x B
//   all-gather, reduce-scatter (B: the whole buffer)  (N-1)/N x B
uint64_t RingAllReduceBytes(uint64_t bytes, int n);
uint64_t RingGatherBytes(uint64_t bytes, int n);

// The handle of a non-blocking operation. Copies share the operation.
class Work {
 public:
  // A handle with no operation: Wait() returns FAILED_PRECONDITION.
  Work() = default;
  // An operation that is already over, with `status`.
  static Work Done(absl::Status status);

  // Blocks until the operation has finished and returns its result (the errors of its
  // blocking form), or DEADLINE_EXCEEDED, saying so, when `deadline` passes first: the
  // operation is then still running (it ends by its own deadline, or at once after
  // Abort()) and its buffers still in use; Wait again.
  absl::Status Wait(absl::Time deadline) const;
  // True once the operation has finished. Never blocks.
  bool done() const;

 private:
  friend class OpQueue;
  struct State {
    mutable absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

// One message of a SendRecv batch.
struct PointToPoint {
  enum class Kind : uint8_t { kSend = 0, kRecv = 1 };
  Kind kind = Kind::kSend;
  const void* send = nullptr;  // kSend: the `count` elements to send
  void* recv = nullptr;        // kRecv: where the `count` elements received go
  size_t count = 0;
  DataType type = DataType::kFloat32;
  int peer = -1;  // the rank sent to or received from; not this rank

  static PointToPoint Send(const void* buf, size_t count, DataType type, int peer) {
    return {Kind::kSend, buf, nullptr, count, type, peer};
  }
  static PointToPoint Recv(void* buf, size_t count, DataType type, int peer) {
    return {Kind::kRecv, nullptr, buf, count, type, peer};
  }
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

  // Runs every send and receive of `ops` at once, to and from any peers, and returns when
  // all are complete (see "Point to point" above). Each op is one message, matched by the
  // peer's Send / Recv or by an op of the peer's batch; messages of one batch to (or from)
  // one peer travel in the batch's order, after those this rank issued before to (or
  // from) that peer. The receive buffers must not overlap each other or a send buffer of
  // the batch. An empty batch returns at once (OK, or the error that broke the
  // communicator) and is not counted. Errors: as Send/Recv's; INVALID_ARGUMENT names the
  // op by its index and field ("SendRecv ops[2]: peer 5 is outside [0, 4)"), and then
  // nothing is sent. Counted under OpKind::kSendRecv (one call per batch).
  virtual absl::Status SendRecv(absl::Span<const PointToPoint> ops, absl::Time deadline) = 0;

  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier(absl::Time deadline) = 0;

  // Non-blocking forms of the operations above: same arguments and contract, started now
  // (see "Non-blocking operations" above); the result comes from Work::Wait. The deadline
  // bounds the operation itself, counted from now.
  virtual Work AllReduceAsync(const void* send, void* recv, size_t count, DataType type,
                              ReduceOp op, absl::Time deadline) = 0;
  virtual Work AllGatherAsync(const void* send, void* recv, size_t count, DataType type,
                              absl::Time deadline) = 0;
  virtual Work ReduceScatterAsync(const void* send, void* recv, size_t count, DataType type,
                                  ReduceOp op, absl::Time deadline) = 0;
  virtual Work BroadcastAsync(const void* send, void* recv, size_t count, DataType type,
                              int root, absl::Time deadline) = 0;
  virtual Work SendAsync(const void* buf, size_t count, DataType type, int peer,
                         absl::Time deadline) = 0;
  virtual Work RecvAsync(void* buf, size_t count, DataType type, int peer,
                         absl::Time deadline) = 0;
  // `ops` is copied; the buffers it names stay in use until the Work is done.
  virtual Work SendRecvAsync(absl::Span<const PointToPoint> ops, absl::Time deadline) = 0;

  // Collective over this communicator (MPI_Comm_split, ncclCommSplit): the ranks passing
  // the same non-negative `color` form a new communicator, ranked by `key`, ties by their
  // rank here. A rank passing a negative color joins no group and gets nullptr (OK). The
  // group is a member of this one's family (see "Groups" above); it may outlive this one.
  // Errors: those of a collective; a broken communicator cannot split.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                              absl::Time deadline) = 0;

  // Makes operations blocked now or called later return ABORTED promptly, and closes the
  // connections so that peers fail fast too. Idempotent; callable from any thread,
  // including while another thread is inside an operation.
  virtual void Abort() = 0;

  // OK while healthy; otherwise the error that broke the communicator. Never blocks.
  virtual absl::Status GetAsyncError() const = 0;

  // A snapshot of this rank's counters.
  virtual Counters counters() const = 0;
};

// Runs a communicator's non-blocking operations on a thread of its own (started by the
// first Enqueue), one at a time, in the order they were queued. The destructor waits for
// the queued operations to finish (each is bounded by its deadline; Abort() the
// communicator first to end them at once), so destroy the queue before what they use.
// Thread-safety: any thread.
class OpQueue {
 public:
  OpQueue() = default;
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  Work Enqueue(std::function<absl::Status()> op);
  // Waits for the queued operations and ends the thread; Enqueue must not be called
  // after. Idempotent; the destructor calls it.
  void Stop();
  // Blocks until every operation queued so far has finished, or DEADLINE_EXCEEDED.
  absl::Status Drain(absl::Time deadline);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::pair<std::function<absl::Status()>, Work>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // 1 while the thread runs an operation
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Validates arguments shared by every backend: INVALID_ARGUMENT names the argument.
absl::Status ValidateBuffers(absl::string_view op, const void* send, const void* recv,
                             size_t count);
absl::Status ValidateBuffer(absl::string_view op, absl::string_view what, const void* buf,
                            size_t count);
absl::Status ValidatePeer(absl::string_view op, absl::string_view what, int peer, int rank,
                          int size, bool allow_self);
// Checks what every backend checks in a SendRecv batch, naming the op by its index: the
// kind, the type, the peer (not this rank), the buffer (non-null when count > 0), the
// length, and that no receive buffer overlaps another buffer of the batch.
absl::Status ValidateBatch(absl::Span<const PointToPoint> ops, int rank, int size);
// "SendRecv ops[i]": how errors name op i of a batch.
std::string BatchOpName(size_t index);

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_COMMUNICATOR_H_
