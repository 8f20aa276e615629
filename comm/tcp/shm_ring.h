// A single-producer, single-consumer byte ring in POSIX shared memory: the transport the
// TCP backend uses between two ranks on the same host (the TCP connection then carries
// only wake-up bytes and tells each side when the other has gone).
//
// Why: over loopback every byte crosses the kernel twice and the socket path, not the
// copies, costs most of the CPU (BENCHMARKS.md; with 4 ranks on 2 cores the collectives
// are CPU-bound). Through a ring that stays in cache the sender copies in and the receiver
// copies out (or reduces straight out of the ring), with no system call per chunk.
//
// Layout: a header (capacity, a random nonce, head and tail counters on their own cache
// lines, and the two "I am asleep" flags) followed by `capacity` bytes (a power of two).
// head and tail count bytes ever written and read; head - tail bytes are readable.
//
// Sleeping without lost wake-ups (an eventcount): a side that wants to block sets its
// waiting flag, re-checks the ring, and only then blocks in poll() on its TCP socket. The
// other side, after publishing (or releasing) bytes, clears the flag if set and, if it was
// the one to clear it, sends one byte over the TCP connection to wake the sleeper. All
// four accesses are sequentially consistent, so either the sleeper sees the new bytes or
// the publisher sees the flag.
//
// A consumer with nothing else to wait for may sleep on a futex instead (the flag word
// itself, a shared — not private — futex): the publisher that clears a futex-mode flag
// calls FUTEX_WAKE rather than sending a byte. A futex wake reaches a sleeper in a few
// microseconds; a byte through the loopback TCP stack takes tens, which is what small
// collectives with more ranks than cores paid for each hop. The futex wait is bounded
// (the caller checks its socket for a dead peer, and its abort flag, between waits).
//
// Naming and lifetime: Create() makes "/ringmaster-<pid>-<random>" in /dev/shm and maps
// it; the peer Open()s it by name and checks the nonce (a file of the same name on another
// host's /dev/shm fails that check); the creator then Unlink()s the name, so nothing is
// left behind once both map it. Space is reserved with posix_fallocate, so a full /dev/shm
// is an error at creation, never a SIGBUS later.
//
// Thread-safety: one producer thread and one consumer thread (in different processes).
#ifndef RINGMASTER_COMM_TCP_SHM_RING_H_
#define RINGMASTER_COMM_TCP_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::comm::tcp {

class ShmRing {
 public:
  // Creates and maps a ring of `capacity` bytes (a power of two, >= 4 KiB).
  // RESOURCE_EXHAUSTED when /dev/shm is full; other errors from the system calls.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(size_t capacity);
  // Maps the ring another process created. NOT_FOUND when no such name is visible here,
  // FAILED_PRECONDITION when the file is not the ring we were offered.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Open(const std::string& name, size_t capacity,
                                                       uint64_t nonce);
  ~ShmRing();

  // Removes the name (the mappings stay). Idempotent.
  void Unlink();
  const std::string& name() const { return name_; }
  uint64_t nonce() const;
  size_t capacity() const { return capacity_; }

  // Producer. Bytes [head, head + Space()) may be written; `written` bytes past head must
  // already be written-but-unpublished by the caller (WriteAt) before Publish(written).
  size_t Space() const;
  void WriteAt(size_t past_head, const void* data, size_t bytes);
  // Makes `bytes` more bytes visible. Returns true when the consumer was asleep and the
  // caller must wake it (one byte on the TCP connection).
  bool Publish(size_t bytes);

  // Consumer. Available() bytes are readable from tail; Peek gives the contiguous run at
  // `past_tail` (it may be shorter than what is available when the ring wraps).
  size_t Available() const;
  const char* Peek(size_t past_tail, size_t* contiguous) const;
  void ReadAt(size_t past_tail, void* out, size_t bytes) const;
  // Returns true when the producer was asleep and must be woken.
  bool Release(size_t bytes);

  // Eventcount: Arm*() sets this side's flag and returns true when the ring is still
  // unusable (go to sleep): empty for the consumer, less than 8 bytes of room for the
  // producer. False means it changed meanwhile (flag cleared; carry on).
  bool ArmConsumerWait();
  bool ArmProducerWait();
  // Clears this side's flag after waking (a wake-up byte may still be on its way).
  void DisarmConsumerWait();
  void DisarmProducerWait();

  // The consumer's futex mode: ArmConsumerFutexWait is ArmConsumerWait for a sleeper that
  // will call FutexWaitConsumer, which blocks until a publish wakes it or `timeout`
  // passes (then DisarmConsumerWait). Returns false when it timed out.
  bool ArmConsumerFutexWait();
  bool FutexWaitConsumer(absl::Duration timeout);

 private:
  struct Header;
  ShmRing(std::string name, void* base, size_t mapped, size_t capacity);

  std::string name_;
  bool linked_ = false;
  void* base_;
  size_t mapped_;
  size_t capacity_;
  Header* header_;
  char* data_;
};

}  // namespace ringmaster::comm::tcp

#endif  // RINGMASTER_COMM_TCP_SHM_RING_H_
