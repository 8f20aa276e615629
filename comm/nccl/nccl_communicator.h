// NcclCommunicator: the Communicator backend for GPUs, over NCCL (CUDA builds only: the
// target builds with --config=cuda).
//
// One communicator = one NCCL communicator of `size` ranks, one rank per process and GPU
// (NCCL refuses two ranks on one GPU; use the TCP backend with host staging for that).
//
// Bootstrap: rank 0 calls ncclGetUniqueId and publishes it, hex-encoded, under
// "<prefix>/unique_id" in the Store; the other ranks Get it. The prefix must be fresh for
// each communicator (e.g. "job7/epoch3/nccl"): a stale id from an earlier epoch would make
// ranks wait for a root that is gone.
//
// Buffers: device memory of this communicator's GPU (cudaMalloc, or managed memory).
// Host memory, pageable or pinned, is rejected with INVALID_ARGUMENT: use the TCP backend
// for host buffers. The caller must have finished writing the send buffers before calling
// (e.g. synchronized the stream that produced them): operations run on the
// communicator's own stream, which does not wait for the caller's streams. Operations
// block until the result is complete in `recv`, so it may be used from any stream after
// they return.
//
// Blocking and errors: as Communicator (comm/communicator.h). Each operation enqueues
// NCCL work, then polls the stream, ncclCommGetAsyncError, the abort flag and the
// deadline. On a deadline the NCCL communicator is aborted (ncclCommAbort) and the
// operation returns DEADLINE_EXCEEDED; an asynchronous NCCL error is UNAVAILABLE for
// ncclRemoteError / ncclSystemError (a peer or the network failed) and INTERNAL
// otherwise. NCCL cannot tell a peer that is slow from one that is stopped: a stopped
// peer shows as DEADLINE_EXCEEDED.
//
// Arithmetic is NCCL's: f16/bf16 sums may differ in the last bit from the TCP backend's,
// and avg of integer types is the sum divided by N, truncated.
//
// Send blocks until the peer has posted the matching Recv (NCCL does not buffer), so two
// ranks must not both Send to each other first: exchange with SendRecv, one NCCL group of
// ncclSend / ncclRecv calls that progress together.
//
// Counters: NCCL picks its algorithm (ring, tree, NVLS, ...) at run time and does not
// report bytes moved, so bytes_sent / bytes_received are NOMINAL: the volume a ring
// algorithm moves per rank, with B the bytes of the per-rank buffer and N = size():
//   all_reduce      2(N-1)/N * B each way
//   all_gather      (N-1) * B each way (B = the send buffer)
//   reduce_scatter  (N-1) * B each way (B = the recv buffer)
//   broadcast       B received unless root; B sent unless last in the ring from root
//   send / recv     B
//   send_recv       the batch's sends' B sent, its receives' B received
//   barrier         0 (no payload)
// These are also the collectives' formula_bytes_sent (NCCL's documented ring volumes,
// comm::RingAllReduceBytes and RingGatherBytes); payload_bytes as communicator.h says.
//
// Groups: Split() is ncclCommSplit (non-blocking config, polled against the deadline);
// the group has its own NCCL communicator, stream and counters. Its family (the
// communicator made by Create and every group split from it) shares one fate: Abort() of
// any member, or an error that breaks one, aborts every member's NCCL communicator.
// Non-blocking operations run the blocking form on the communicator's worker thread; a
// blocking call first waits for them. NCCL runs operations of different communicators
// concurrently only as far as the GPU lets their kernels overlap: every rank must issue
// them in the same order.
//
// Thread-safety: as Communicator. Abort(), GetAsyncError(), counters(), rank(), size()
// and stream() may be called from any thread.
#ifndef RINGMASTER_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define RINGMASTER_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/store.h"

namespace ringmaster::comm {

struct NcclCommunicatorOptions {
  int rank = -1;
  int size = 0;
  // Where rank 0 publishes the NCCL unique id. Not owned; must outlive Create().
  Store* store = nullptr;
  // Store key prefix for this communicator, e.g. "job7/epoch3/nccl".
  std::string prefix;
  // CUDA device ordinal; -1 = the calling thread's current device.
  int device = -1;
  // Bounds Create(): waiting for the unique id and NCCL's own initialization.
  absl::Duration init_timeout = absl::Seconds(60);
  // Bounds the destructor's orderly shutdown (ncclCommFinalize); past it the NCCL
  // communicator is aborted instead.
  absl::Duration finalize_timeout = absl::Seconds(10);
};

class NcclCommunicator final : public Communicator {
 public:
  // Blocks until every rank has joined or `init_timeout` passes.
  // Errors: INVALID_ARGUMENT for bad options (names the field); DEADLINE_EXCEEDED when
  // the unique id or the peers do not arrive in time; UNAVAILABLE for NCCL remote or
  // system errors during initialization; INTERNAL for CUDA errors (no GPU, bad device)
  // and other NCCL errors; the Store's errors when it fails.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclCommunicatorOptions& options);

  // Healthy: flushes and destroys the NCCL communicator (ncclCommFinalize, bounded by
  // `finalize_timeout`, then ncclCommDestroy). Broken or aborted: ncclCommAbort if not
  // done already. Must not run concurrently with any other method.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "nccl"; }
  int device() const { return device_; }
  // The stream operations run on (created non-blocking). Owned by the communicator.
  // Work enqueued on it runs in order with the operations.
  cudaStream_t stream() const { return stream_; }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override;
  // In place: send == recv (send is recv's first `count` elements), or NCCL's layout,
  // send == recv + rank() * count elements.
  absl::Status AllGather(const void* send, void* recv, size_t count, DataType type,
                         absl::Time deadline) override;
  // In place: recv == send (the result overwrites send's first `count` elements; send's
  // block rank() is clobbered), or NCCL's layout, recv == send + rank() * count elements.
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             absl::Time deadline) override;
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                         absl::Time deadline) override;
  absl::Status Send(const void* buf, size_t count, DataType type, int peer,
                    absl::Time deadline) override;
  absl::Status Recv(void* buf, size_t count, DataType type, int peer, absl::Time deadline) override;
  // ncclSend / ncclRecv for each op (of count > 0) in one ncclGroupStart/ncclGroupEnd.
  absl::Status SendRecv(absl::Span<const PointToPoint> ops, absl::Time deadline) override;
  // An all-reduce of one int32 on a device buffer owned by the communicator.
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

  // ncclCommSplit; the group is an NcclCommunicator on the same device. Errors: as an
  // operation (DEADLINE_EXCEEDED when the split does not finish in time, which breaks the
  // family).
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      absl::Time deadline) override;

  // Sets the abort flag and aborts the NCCL communicator (ncclCommAbort), of this and of
  // every member of its family: kernels in flight quit, peers' operations fail. Blocks while ncclCommAbort runs (it waits for
  // the aborted kernels to exit), and for at most one short NCCL call of the thread
  // inside an operation. That operation then returns ABORTED.
  void Abort() override;

  // Also polls ncclCommGetAsyncError when no operation holds the NCCL communicator, so
  // a watchdog sees a failure between operations.
  absl::Status GetAsyncError() const override;
  Counters counters() const override;

 private:
  // The members of one family, for family-wide aborts.
  struct Family {
    absl::Mutex mu;
    std::vector<NcclCommunicator*> members ABSL_GUARDED_BY(mu);
  };

  NcclCommunicator(int rank, int size, int device, absl::Duration finalize_timeout,
                   std::shared_ptr<Family> family);
  // Creates the stream and the barrier buffer (on the current device).
  absl::Status AllocateResources();
  // Breaks every member of the family with `status` (this one too) and aborts their
  // NCCL communicators. Must not hold comm_mu_ or mu_.
  void BreakFamily(const absl::Status& status);
  // The blocking forms: waits for this communicator's queued non-blocking operations,
  // then runs fn (which reports itself through Finish).
  template <typename Fn>
  absl::Status InOrder(OpKind kind, absl::Time deadline, Fn&& fn);

  // The operations, run on the caller's thread (the blocking forms call them InOrder, the
  // worker thread for the non-blocking ones).
  absl::Status AllReduceNow(const void* send, void* recv, size_t count, DataType type,
                            ReduceOp op, absl::Time deadline);
  absl::Status AllGatherNow(const void* send, void* recv, size_t count, DataType type,
                            absl::Time deadline);
  absl::Status ReduceScatterNow(const void* send, void* recv, size_t count, DataType type,
                                ReduceOp op, absl::Time deadline);
  absl::Status BroadcastNow(const void* send, void* recv, size_t count, DataType type, int root,
                            absl::Time deadline);
  absl::Status SendNow(const void* buf, size_t count, DataType type, int peer,
                       absl::Time deadline);
  absl::Status RecvNow(void* buf, size_t count, DataType type, int peer, absl::Time deadline);
  absl::Status SendRecvNow(absl::Span<const PointToPoint> ops, absl::Time deadline);
  absl::Status BarrierNow(absl::Time deadline);

  // OK, or the error that broke the communicator.
  absl::Status CheckHealthy() const;
  // Records one operation's outcome in the counters (bytes only on success). Any error
  // but INVALID_ARGUMENT breaks the family and aborts NCCL before returning, so no
  // kernel still touches the caller's buffers. Returns the error that broke it, or
  // `status`.
  // `payload` and `formula` are OpCounters::payload_bytes and formula_bytes_sent (the
  // collectives' formula is their nominal `sent`; point-to-point has none).
  absl::Status Finish(OpKind kind, absl::Time start, absl::Status status, uint64_t sent,
                      uint64_t received, uint64_t payload, uint64_t formula);
  // INVALID_ARGUMENT unless `ptr` is device memory of this GPU or managed memory.
  absl::Status CheckDevicePointer(absl::string_view op, absl::string_view what,
                                  const void* ptr) const;
  // Calls `enqueue(comm)` (NCCL and CUDA calls on stream_) with the NCCL communicator
  // locked, then Wait()s.
  template <typename Enqueue>
  absl::Status Run(absl::string_view op, absl::Time deadline, Enqueue enqueue);
  // Polls until NCCL has launched the work and stream_ has drained: ABORTED when Abort()
  // was called, DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE / INTERNAL for NCCL's
  // asynchronous errors, INTERNAL for CUDA errors.
  absl::Status Wait(absl::string_view op, absl::Time deadline);
  // Makes `status` the communicator's error unless it has one; returns the error that
  // broke it.
  absl::Status Break(absl::Status status) const;
  // ncclCommAbort, once; a concurrent caller waits until it has finished.
  void AbortComm() const;

  const int rank_;
  const int size_;
  const int device_;
  const absl::Duration finalize_timeout_;
  cudaStream_t stream_ = nullptr;
  int32_t* barrier_buffer_ = nullptr;  // device memory, one int32

  // Set first by Abort(); read by the polling loop without locks.
  std::atomic<bool> abort_requested_{false};

  // Serializes calls on comm_ (NCCL communicators are not thread-safe) and its
  // destruction. Held only for short, non-blocking NCCL calls, and by ncclCommAbort.
  // Mutable: GetAsyncError() const polls NCCL and aborts on the error it finds.
  mutable absl::Mutex comm_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;
  mutable bool comm_aborted_ ABSL_GUARDED_BY(comm_mu_) = false;

  mutable absl::Mutex mu_;
  mutable absl::Status error_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);

  const std::shared_ptr<Family> family_;
  // Last: destroyed first, so that no queued operation outlives what it uses.
  OpQueue queue_;
};

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_NCCL_NCCL_COMMUNICATOR_H_
