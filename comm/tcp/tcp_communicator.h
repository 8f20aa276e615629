// The TCP backend: collectives built only from point-to-point messages between pairs of
// ranks, over loopback or a real network.
//
// Algorithms (chosen per call by message size; see tcp_communicator.cc):
//   AllReduce      ≤ small_message_bytes: recursive doubling (non-powers of two fold
//                  the extra ranks in first); larger: ring = reduce-scatter then
//                  all-gather, one pipelined stream per direction, reduced segment by
//                  segment as it arrives. Each rank sends 2(N-1)/N of the buffer.
//   ReduceScatter  the ring's first half.
//   AllGather      the ring's second half; recursive doubling when the world size is a
//                  power of two and the gathered output ≤ small_message_bytes.
//   Broadcast      ≤ small_message_bytes: binomial tree; larger: pipelined chain.
//   Barrier        dissemination (header-only messages).
// What each rank sends by these algorithms' formulas (OpCounters::formula_bytes_sent, B the
// payload, N the size, log = log2 of the largest power of two <= N):
//   AllReduce      ring 2(N-1)/N x B; recursive doubling log x B, and where N is not a
//                  power of two the folded ranks: the first 2(N - 2^log) ranks, even ones
//                  B (they hand over their data), odd ones (log + 1) x B (they hand back
//                  the result);
//   AllGather, ReduceScatter  (N-1)/N x B (B the whole buffer; recursive doubling's
//                  rounds send 1, 2, 4, ... blocks, (N-1) blocks in all, as the ring);
//   Broadcast      chain B, but 0 for the last rank of the chain; binomial tree B per
//                  child of the rank in the tree;
//   point-to-point and barrier: none (0).
//   SendRecv       one engine run with a stream per op: every peer's messages progress
//                  together; those on one link go in the batch's order (tcp/engine.h).
//                  Its messages are Send's, so either side may use plain Send/Recv.
//
// Transport: between ranks that advertise the same host, messages go through shared-memory
// rings (tcp/shm_ring.h) unless `shared_memory` is off; the TCP connections are still made
// and then carry only wake-ups and tell when a peer has gone. Other peers use TCP.
//
// Buffers in CUDA device memory are staged through host memory when the binary is built
// with --config=cuda (so several ranks can share one GPU, which NCCL refuses); a SendRecv
// batch stages each of its device buffers in a host buffer of its own.
//
// Groups (Split) reuse the connections and shared-memory rings of the communicator made by
// Create: no new sockets. Every message header names its group (an id derived from the
// parent's id, the number of splits before and the color), so a message of the wrong group
// is an INTERNAL mismatch, never taken for another's; operations that share a link run in
// issue order (tcp/sequencer.h). Abort() of any member aborts the whole family (they share
// the connections, which it closes); so does any error that breaks a member. Split itself
// is an all-gather of every rank's (color, key) over the parent, counted as one.
// Non-blocking operations run on the communicator's worker thread (communicator.h); until
// a family has groups or non-blocking work, operations take no turns at all.
//
// Thread-safety and error semantics: see communicator.h.
#ifndef RINGMASTER_COMM_TCP_TCP_COMMUNICATOR_H_
#define RINGMASTER_COMM_TCP_TCP_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/tcp/engine.h"
#include "comm/tcp/sequencer.h"
#include "comm/tcp/socket.h"

namespace ringmaster::comm {

// The all-reduce size at or below which recursive doubling beats the ring, measured with
// `ringbench comm --tune` on the project's 2-core machine over loopback: the ring wins from
// 512 KiB up with 2 ranks (256 KiB: 37 vs 41 us); with 4 ranks on the 2 cores recursive
// doubling wins up to 1 MiB. The 2-rank crossover is the default.
inline constexpr size_t kDefaultSmallMessageBytes = 256 * 1024;

struct TcpCommunicatorOptions {
  int rank = -1;
  int size = 0;
  // Where ranks publish and find each other's addresses. Not owned; used only by Create.
  Store* store = nullptr;
  // Store key prefix, unique per communicator (e.g. "job-7/epoch-3/tcp"). Ranks that
  // share a prefix form one communicator; a stale prefix reused by another job is rejected
  // by the handshake.
  std::string prefix;
  // Address to bind ("0.0.0.0" for every interface) and port (0 = any free port).
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;
  // Address peers should connect to. Empty: listen_host (which must then not be a
  // wildcard address).
  std::string advertise_host;
  // Deadline for the whole bootstrap (publish, connect, accept, handshake).
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long a refused connection is retried before giving up (the peer published its
  // address after listening, so a refusal means it is gone).
  absl::Duration refused_retry = absl::Seconds(2);

  // Reach peers on this host through shared memory (see above). Off: TCP only.
  bool shared_memory = true;
  // Capacity of each shared-memory ring (one per direction per local peer), a power of two.
  size_t shm_ring_bytes = 1 << 20;

  // Tuning. Zero values mean the defaults below.
  size_t small_message_bytes = kDefaultSmallMessageBytes;
  // Pipelining granularity of the ring and chain (bytes; rounded to 8). 256 KiB measured
  // 3-8 % faster than 64 KiB from 16 MiB up (2 ranks); it still fits in L2 with its peers.
  size_t segment_bytes = 256 * 1024;
  // Socket buffer sizes. 0 (the default) keeps the kernel's autotuning, which measured
  // fastest here: fixed 256 KiB-4 MiB buffers were 10-50 % slower from 1 MiB up.
  int socket_buffer_bytes = 0;
  // How long a waiting rank busy-polls before blocking in ppoll(). Negative: automatic —
  // 50 µs when this host has at least as many cores as local ranks; otherwise
  // `oversubscribed_spin` (default 100 µs, best of 0/20/100/500 measured with 4 ranks on
  // 2 cores), yielding the core between polls (ranks that share cores must
  // not spin against each other).
  absl::Duration spin = absl::Microseconds(-1);
  absl::Duration oversubscribed_spin = absl::Microseconds(-1);
};

class TcpCommunicator final : public Communicator {
 public:
  // Bootstraps the communicator: listens, publishes "<prefix>/rank-<r>/addr", connects to
  // and accepts every peer (one connection per direction), and checks each peer's
  // handshake. Blocks until done or `connect_timeout`.
  // Errors: INVALID_ARGUMENT for bad options (names the field); DEADLINE_EXCEEDED when
  // peers do not appear (names them, and any connections rejected meanwhile); UNAVAILABLE
  // for refused connections; FAILED_PRECONDITION when a peer rejects our handshake or we
  // reject theirs (wrong world size, another communicator, duplicate rank).
  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Create(
      const TcpCommunicatorOptions& options);

  ~TcpCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "tcp"; }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DataType type,
                         absl::Time deadline) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             absl::Time deadline) override;
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                         absl::Time deadline) override;
  absl::Status Send(const void* buf, size_t count, DataType type, int peer,
                    absl::Time deadline) override;
  absl::Status Recv(void* buf, size_t count, DataType type, int peer, absl::Time deadline) override;
  // One engine run with a stream per op (see the header comment).
  absl::Status SendRecv(absl::Span<const PointToPoint> ops, absl::Time deadline) override;
  absl::Status Barrier(absl::Time deadline) override;
  Work AllReduceAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                      absl::Time deadline) override;
  Work AllGatherAsync(const void* send, void* recv, size_t count, DataType type,
                      absl::Time deadline) override;
  Work ReduceScatterAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                          absl::Time deadline) override;
  Work BroadcastAsync(const void* send, void* recv, size_t count, DataType type, int root,
                      absl::Time deadline) override;
  Work SendAsync(const void* buf, size_t count, DataType type, int peer,
                 absl::Time deadline) override;
  Work RecvAsync(void* buf, size_t count, DataType type, int peer, absl::Time deadline) override;
  Work SendRecvAsync(absl::Span<const PointToPoint> ops, absl::Time deadline) override;
  // The group is a TcpCommunicator.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      absl::Time deadline) override;
  void Abort() override;
  absl::Status GetAsyncError() const override;
  Counters counters() const override;

  // Algorithm variants, for tests and `ringbench comm --tune`. Same contract as AllReduce.
  enum class AllReduceAlgorithm { kAuto, kRing, kRecursiveDoubling };
  absl::Status AllReduceWith(AllReduceAlgorithm algorithm, const void* send, void* recv,
                             size_t count, DataType type, ReduceOp op, absl::Time deadline);

  // The busy-poll time in force (after resolving the automatic setting).
  absl::Duration spin() const { return engine_options_.spin; }
  // Ranks of this communicator that advertise the same host as this one.
  int local_ranks() const { return local_ranks_; }
  // Peers reached through shared-memory rings (both directions).
  int shared_memory_peers() const;
  // The id every message of this communicator carries: 0 for one made by Create.
  uint32_t group_id() const { return group_; }
  // This communicator's ranks as ranks of the one made by Create ([rank()]: this rank's).
  const std::vector<int>& world_ranks() const { return world_ranks_; }

 private:
  // What a family shares: the connections and rings, the abort flag, the error, the
  // sequencer (tcp_communicator.cc).
  struct Family;

  TcpCommunicator(std::shared_ptr<Family> family, std::vector<int> world_ranks, int rank,
                  uint32_t group, size_t small_message_bytes);
  absl::Status Connect(const TcpCommunicatorOptions& options);
  // Offers, accepts and maps the shared-memory rings (after the handshakes).
  absl::Status SetUpRings(const TcpCommunicatorOptions& options, const std::vector<bool>& same_host,
                          absl::Time deadline);
  // Points the engine at the family's links for this communicator's ranks.
  void SetUpEngine(const tcp::EngineOptions& tuning);

  // Common wrapper: checks health, times the op, updates counters, breaks on error.
  template <typename Fn>
  absl::Status Guarded(OpKind kind, Fn&& fn);
  // Guarded, once the ticket's turn has come (see sequencer.h); then releases the ticket.
  template <typename Fn>
  absl::Status InTurn(OpKind kind, const tcp::Sequencer::Ticket& ticket, absl::Time deadline,
                      Fn&& fn);
  // The blocking forms: Guarded, or InTurn of a ticket taken now once the family has
  // groups or non-blocking work.
  template <typename Fn>
  absl::Status Ordered(OpKind kind, absl::Time deadline, Fn&& fn);
  // Takes the operation's turns now and runs it, Ordered, on the worker thread.
  template <typename Fn>
  Work Async(OpKind kind, absl::Time deadline, Fn fn);
  // The operations as closures (arguments by value), for Ordered and Async.
  auto AllReduceOp(AllReduceAlgorithm algorithm, const void* send, void* recv, size_t count,
                   DataType type, ReduceOp op, absl::Time deadline);
  auto AllGatherOp(const void* send, void* recv, size_t count, DataType type,
                   absl::Time deadline);
  auto ReduceScatterOp(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                       absl::Time deadline);
  auto BroadcastOp(const void* send, void* recv, size_t count, DataType type, int root,
                   absl::Time deadline);
  auto SendOp(const void* buf, size_t count, DataType type, int peer, absl::Time deadline);
  auto RecvOp(void* buf, size_t count, DataType type, int peer, absl::Time deadline);
  auto SendRecvOp(std::vector<PointToPoint> ops, absl::Time deadline);
  absl::Status Run(OpKind kind, DataType type, kernels::ReduceKind reduce, tcp::SendStream* sends,
                   int num_sends, tcp::RecvStream* recvs, int num_recvs, absl::Time deadline);
  char* Scratch(size_t bytes);
  // Calls fn(host_send, host_recv). CUDA device buffers are first copied into host
  // staging buffers (keeping in-place layouts in place), and the result copied back.
  template <typename Fn>
  absl::Status Staged(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, Fn&& fn);

  absl::Status RingAllReduce(const char* send, char* recv, size_t count, DataType type,
                             kernels::ReduceKind reduce, absl::Time deadline);
  absl::Status RecursiveDoublingAllReduce(const char* send, char* recv, size_t count, DataType type,
                                          kernels::ReduceKind reduce, absl::Time deadline);
  // The operations on host memory (after staging), arguments validated here.
  absl::Status AllReduceHost(AllReduceAlgorithm algorithm, const char* send, char* recv,
                             size_t count, DataType type, ReduceOp op, absl::Time deadline);
  absl::Status AllGatherHost(const char* send, char* recv, size_t count, DataType type,
                             absl::Time deadline);
  absl::Status ReduceScatterHost(const char* send, char* recv, size_t count, DataType type,
                                 ReduceOp op, absl::Time deadline);
  absl::Status BroadcastHost(const char* send, char* recv, size_t count, DataType type, int root,
                             absl::Time deadline);

  const std::shared_ptr<Family> family_;
  const std::vector<int> world_ranks_;  // [rank in this communicator] -> rank in the family
  const int rank_;
  const int size_;
  const uint32_t group_;
  const size_t small_message_bytes_;
  int local_ranks_ = 1;
  uint64_t splits_ = 0;  // Split calls so far (the same on every rank: it is a collective)

  std::vector<tcp::Link*> links_;  // [rank here] -> the family's link; null for this rank
  // The sequencer resources an operation takes: this communicator, and its peers' links.
  std::vector<int> resources_;
  tcp::EngineOptions engine_options_;
  tcp::Traffic op_traffic_;    // payload moved by the operation in progress
  // The operation in progress's OpCounters::payload_bytes and formula_bytes_sent, set where
  // its algorithm is chosen.
  uint64_t op_payload_bytes_ = 0;
  uint64_t op_formula_bytes_ = 0;
  std::vector<char> scratch_;  // op-local scratch (grow-only)
  std::vector<char> segment_scratch_;
  std::vector<char> staging_send_, staging_recv_;  // host copies of device buffers
  std::vector<std::vector<char>> staging_batch_;   // [op of a SendRecv batch]: the same

  mutable absl::Mutex mu_;
  Counters counters_ ABSL_GUARDED_BY(mu_);

  // Last: destroyed first, so that no queued operation outlives what it uses.
  OpQueue queue_;
};

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_TCP_TCP_COMMUNICATOR_H_
