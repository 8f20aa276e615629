// The TCP backend's progress engine: drives a set of message streams to and from peers
// on non-blocking sockets from the calling thread alone (no helper threads).
//
// Every peer pair uses two connections, one per direction, so a rank's send and receive
// with the same neighbour never share a socket. Each message is a 32-byte header (magic,
// op kind, dtype, sender's rank and group, per-link sequence number, payload length)
// followed by the payload; the header lets the receiver detect peers that disagree about
// the operation, or about which group (sub-communicator sharing the links) it belongs to.
//
// A receive piece can be a plain copy into `dst` or a reduction: dst = other op incoming,
// applied segment by segment as bytes arrive, so that receiving, reducing and sending
// overlap. A send may be gated on a receive: it may send payload byte x only once the
// receive has completed (received and reduced) byte x - gate_offset. That one rule
// expresses the pipelined ring (send step t+1 forwards what step t received) and the
// pipelined chain broadcast.
//
// A peer on the same host may be reached through shared-memory rings instead (see
// shm_ring.h): the same messages, padded to 8 bytes so that elements never straddle the
// ring's end, copied into the ring by the sender and copied (or reduced) straight out of
// it by the receiver. The socket to that peer then carries only wake-up bytes, and its
// closing still tells us the peer is gone.
//
// Streams to one peer (or from one peer) in one run are messages on one link: they go
// one after another, in the order of the stream list, each starting when the one before
// it has finished; streams on different links progress together.
//
// Waiting: after each pass that moved no bytes the engine spins (busy-polling with
// non-blocking syscalls, or reading the rings) for `spin`, then blocks in ppoll() on the
// sockets, the abort eventfd and the deadline.
#ifndef RINGMASTER_COMM_TCP_ENGINE_H_
#define RINGMASTER_COMM_TCP_ENGINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/tcp/shm_ring.h"
#include "common/dtype.h"
#include "kernels/reduce.h"

namespace ringmaster::comm::tcp {

inline constexpr uint32_t kMessageMagic = 0x524d4d47;  // "RMMG"

struct WireHeader {
  uint32_t magic;
  uint8_t kind;        // OpKind
  uint8_t dtype;       // DataType
  uint16_t from_rank;  // the sender's rank in the group
  uint64_t seq;        // per link (sender, receiver) message counter, over every group
  uint64_t bytes;      // payload length
  uint32_t group;      // the group's id (0: the communicator made by Create)
  uint32_t reserved;
};
static_assert(sizeof(WireHeader) == 32);

struct SendPiece {
  const char* data;
  size_t bytes;
};

struct RecvPiece {
  char* dst;
  size_t bytes;
  // Null: the payload is copied into dst. Otherwise dst = other op payload (other may
  // equal dst).
  const char* other;
};

struct SendStream {
  int peer = -1;
  absl::InlinedVector<SendPiece, 4> pieces;
  // Index into the receive list this send is gated on (-1: not gated).
  int gate = -1;
  size_t gate_offset = 0;
  // The element type the message's header names, when not the operation's (a batch of
  // point-to-point messages may mix types).
  std::optional<DataType> type;
};

struct RecvStream {
  int peer = -1;
  absl::InlinedVector<RecvPiece, 4> pieces;
  // As SendStream::type: the type the message must name. Pieces that reduce must leave
  // it unset.
  std::optional<DataType> type;
};

// This rank's connections with one peer and what rides on them. Shared by every group
// that has both ranks (see tcp_communicator.h): one operation uses a link at a time.
struct Link {
  int send_fd = -1;  // carries this rank's messages to the peer
  int recv_fd = -1;  // carries the peer's messages to this rank
  // Shared-memory rings (null: the messages go over the sockets): send_ring carries our
  // messages to the peer, recv_ring the peer's to us.
  ShmRing* send_ring = nullptr;
  ShmRing* recv_ring = nullptr;
  // Message counters, advanced by RunStreams.
  uint64_t send_seq = 0;
  uint64_t recv_seq = 0;
};

struct EngineOptions {
  // This rank and its group, as the headers carry them; stream peers are ranks of the
  // same group.
  int rank = 0;
  uint32_t group = 0;
  // Link per peer, indexed by the peer's rank in the group (this rank's entry unused).
  const std::vector<Link*>* links = nullptr;
  // Readable when the communicator is aborted.
  int abort_fd = -1;
  const std::atomic<bool>* aborted = nullptr;
  // Reduce segment size in bytes; also the size of `scratch`.
  size_t segment_bytes = 0;
  char* scratch = nullptr;
  absl::Duration spin;
  // Call sched_yield() between polls while spinning: when ranks outnumber cores, the
  // peer we wait for may need this core to make progress.
  bool yield_while_spinning = false;
};

struct Traffic {
  uint64_t sent = 0;
  uint64_t received = 0;
};

// Runs the streams to completion. Returns OK, or: ABORTED (aborted), DEADLINE_EXCEEDED
// (names the peers still owed bytes), UNAVAILABLE (a peer closed or reset its
// connection), INTERNAL (a header that does not match: names both sides' views).
// `traffic` counts payload bytes moved, also on error.
absl::Status RunStreams(const EngineOptions& options, OpKind kind, DataType type,
                        kernels::ReduceKind reduce, SendStream* sends, int num_sends,
                        RecvStream* recvs, int num_recvs, absl::Time deadline, Traffic* traffic);

}  // namespace ringmaster::comm::tcp

#endif  // RINGMASTER_COMM_TCP_ENGINE_H_
