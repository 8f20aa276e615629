#include "comm/tcp/engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::comm::tcp {
namespace {

constexpr int kMaxIov = 8;
// Longest single futex sleep: bounds how late a dead peer or an Abort() is noticed.
constexpr absl::Duration kFutexSlice = absl::Milliseconds(2);

size_t TotalBytes(const SendStream& s) {
  size_t total = 0;
  for (const SendPiece& p : s.pieces) total += p.bytes;
  return total;
}

size_t TotalBytes(const RecvStream& s) {
  size_t total = 0;
  for (const RecvPiece& p : s.pieces) total += p.bytes;
  return total;
}

std::string Describe(OpKind kind, DataType type, uint64_t seq, uint64_t bytes) {
  return absl::StrCat(OpKindName(kind), " (message ", seq, ", ", bytes, " bytes of ",
                      DataTypeName(type), ")");
}

// Counts the first of `moved` bytes towards the header still owed; returns the rest
// (payload bytes).
size_t ConsumeHeader(size_t moved, size_t* header_done) {
  size_t h = std::min(moved, sizeof(WireHeader) - *header_done);
  *header_done += h;
  return moved - h;
}

// Bytes after a message in a shared-memory ring, so that the next header (and every
// element) starts 8-aligned.
size_t RingPadding(size_t payload) { return (8 - payload % 8) % 8; }

// Messages are copied into a ring and published in chunks of this size, so the receiver
// starts on the first chunk while the sender copies the next.
constexpr size_t kRingChunk = 64 * 1024;

// Wakes the peer sleeping on the other end of `fd` (see shm_ring.h). A failure means the
// peer is gone, which the next wait finds out.
void Doorbell(int fd) {
  char one = 1;
  (void)!send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

struct SendState {
  SendStream* stream;
  int fd;
  DataType type;            // the message's, as its header names it
  size_t elem;              // bytes per element of `type`
  int after = -1;           // the state of the message before this one on the link (-1: none)
  ShmRing* ring = nullptr;  // null: the socket carries the message
  bool peer_closed = false;
  WireHeader header;
  size_t total;
  size_t pad = 0;  // ring padding after the payload
  size_t header_done = 0;
  size_t done = 0;
  size_t pad_done = 0;
  size_t piece = 0;
  size_t piece_off = 0;
  bool finished() const {
    return header_done == sizeof(WireHeader) && done == total && pad_done == pad;
  }
};

struct RecvState {
  RecvStream* stream;
  int fd;
  DataType type;
  size_t elem;
  int after = -1;
  ShmRing* ring = nullptr;  // null: the socket carries the message
  bool peer_closed = false;
  WireHeader header;  // as received
  WireHeader expect;
  size_t total;
  size_t pad = 0;
  size_t header_done = 0;
  size_t done = 0;
  size_t completed = 0;  // received and, for reducing pieces, reduced
  size_t pad_done = 0;
  size_t piece = 0;
  size_t piece_off = 0;
  bool finished() const {
    return header_done == sizeof(WireHeader) && completed == total && pad_done == pad;
  }
};

// The index of the last state in `states` on the link to or from `peer`, or -1.
template <typename State>
int LastOnLink(const absl::InlinedVector<State, 4>& states, int peer) {
  for (int i = static_cast<int>(states.size()) - 1; i >= 0; --i) {
    if (states[i].stream->peer == peer) return i;
  }
  return -1;
}

// Moves a stream's piece cursor over `bytes` payload bytes and past empty pieces.
template <typename State>
void AdvancePieces(State& st, size_t bytes) {
  const auto& pieces = st.stream->pieces;
  while (bytes > 0) {
    size_t take = std::min(bytes, pieces[st.piece].bytes - st.piece_off);
    st.piece_off += take;
    bytes -= take;
    if (st.piece_off == pieces[st.piece].bytes) {
      ++st.piece;
      st.piece_off = 0;
    }
  }
  while (st.piece < pieces.size() && pieces[st.piece].bytes == 0) ++st.piece;
}

class Engine {
 public:
  Engine(const EngineOptions& o, OpKind kind, DataType type, kernels::ReduceKind reduce,
         Traffic* traffic)
      : o_(o),
        kind_(kind),
        type_(type),
        reduce_(reduce),
        traffic_(traffic),
        elem_(DataTypeSize(type)) {}

  absl::Status Run(SendStream* sends, int num_sends, RecvStream* recvs, int num_recvs,
                   absl::Time deadline);

 private:
  absl::Status TrySend(SendState& st, size_t limit, bool* progressed);
  absl::Status TryRecv(RecvState& st, bool* progressed);
  absl::Status TrySendRing(SendState& st, size_t limit, bool* progressed);
  absl::Status TryRecvRing(RecvState& st, bool* progressed);
  absl::Status PeerClosed(int peer, size_t owed) const;
  absl::Status CheckHeader(const RecvState& st) const;
  size_t SendLimit(const SendState& st) const;
  // True once the message before `st` on its link (if any) has finished.
  template <typename State>
  static bool Ready(const State& st, const absl::InlinedVector<State, 4>& states) {
    return st.after < 0 || states[st.after].finished();
  }
  WireHeader Header(DataType type, int from_rank, uint64_t seq, uint64_t bytes) const {
    return WireHeader{kMessageMagic,
                      static_cast<uint8_t>(kind_),
                      static_cast<uint8_t>(type),
                      static_cast<uint16_t>(from_rank),
                      seq,
                      bytes,
                      o_.group,
                      0};
  }
  absl::Status Wait(absl::Time deadline);
  absl::Status DeadlineError() const;

  const EngineOptions& o_;
  const OpKind kind_;
  const DataType type_;
  const kernels::ReduceKind reduce_;
  Traffic* const traffic_;
  const size_t elem_;
  absl::InlinedVector<SendState, 4> sends_;
  absl::InlinedVector<RecvState, 4> recvs_;
};

absl::Status Engine::TrySend(SendState& st, size_t limit, bool* progressed) {
  while (!st.finished()) {
    iovec iov[kMaxIov];
    int n_iov = 0;
    size_t want = 0;
    if (st.header_done < sizeof(WireHeader)) {
      iov[n_iov++] = {reinterpret_cast<char*>(&st.header) + st.header_done,
                      sizeof(WireHeader) - st.header_done};
      want += sizeof(WireHeader) - st.header_done;
    }
    size_t budget = limit > st.done ? limit - st.done : 0;
    size_t piece = st.piece, off = st.piece_off;
    while (budget > 0 && n_iov < kMaxIov && piece < st.stream->pieces.size()) {
      const SendPiece& p = st.stream->pieces[piece];
      size_t take = std::min(budget, p.bytes - off);
      if (take > 0) {
        iov[n_iov++] = {const_cast<char*>(p.data) + off, take};
        want += take;
        budget -= take;
      }
      ++piece;
      off = 0;
    }
    if (want == 0) return absl::OkStatus();
    msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = sendmsg(st.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(OpKindName(kind_), ": sending to rank ",
                                               st.stream->peer, " failed (it exited or aborted)"));
    }
    *progressed = true;
    size_t moved = ConsumeHeader(static_cast<size_t>(n), &st.header_done);
    st.done += moved;
    traffic_->sent += moved;
    AdvancePieces(st, moved);
    if (static_cast<size_t>(n) < want) return absl::OkStatus();  // socket buffer full
  }
  return absl::OkStatus();
}

absl::Status Engine::CheckHeader(const RecvState& st) const {
  const WireHeader& h = st.header;
  const WireHeader& e = st.expect;
  int peer = st.stream->peer;
  if (h.magic != kMessageMagic) {
    return absl::InternalError(absl::StrCat(
        OpKindName(kind_), ": garbled message from rank ", peer, " (bad magic 0x",
        absl::Hex(h.magic), "); the connection carries something other than ringmaster traffic"));
  }
  if (h.group != e.group) {
    return absl::InternalError(absl::StrCat(
        "group mismatch: rank ", peer, " of group ", e.group, " sent a message of group ", h.group,
        " (", OpKindName(static_cast<OpKind>(h.kind < kNumOpKinds ? h.kind : 0)), ", message ",
        h.seq, ") while rank ", o_.rank, " expected ", Describe(kind_, st.type, e.seq, e.bytes),
        "; ranks must issue the operations of groups that share ranks in the same order"));
  }
  if (h.kind != e.kind || h.dtype != e.dtype || h.seq != e.seq || h.bytes != e.bytes ||
      h.from_rank != e.from_rank) {
    auto kind_name = [](uint8_t k) {
      return k < kNumOpKinds ? OpKindName(static_cast<OpKind>(k)) : absl::string_view("unknown");
    };
    auto type_name = [](uint8_t t) {
      return t <= static_cast<uint8_t>(DataType::kUint8) ? DataTypeName(static_cast<DataType>(t))
                                                         : absl::string_view("unknown");
    };
    return absl::InternalError(absl::StrCat(
        "collective mismatch: rank ", h.from_rank, " sent ", kind_name(h.kind), " (message ", h.seq,
        ", ", h.bytes, " bytes of ", type_name(h.dtype), ") but rank ", o_.rank, " expected ",
        Describe(kind_, st.type, e.seq, e.bytes), " from rank ", peer,
        "; every rank must call the same collectives in the same order with the same sizes"));
  }
  return absl::OkStatus();
}

absl::Status Engine::TryRecv(RecvState& st, bool* progressed) {
  const size_t segment = o_.segment_bytes;
  while (!st.finished()) {
    iovec iov[2];
    int n_iov = 0;
    size_t want = 0;
    if (st.header_done < sizeof(WireHeader)) {
      iov[n_iov++] = {reinterpret_cast<char*>(&st.header) + st.header_done,
                      sizeof(WireHeader) - st.header_done};
      want += sizeof(WireHeader) - st.header_done;
    }
    const RecvPiece* p =
        st.piece < st.stream->pieces.size() ? &st.stream->pieces[st.piece] : nullptr;
    size_t seg_start = 0;
    if (p != nullptr && st.done < st.total) {
      if (p->other == nullptr) {
        iov[n_iov++] = {p->dst + st.piece_off, p->bytes - st.piece_off};
        want += p->bytes - st.piece_off;
      } else {
        seg_start = st.piece_off - st.piece_off % segment;
        size_t seg_end = std::min(seg_start + segment, p->bytes);
        iov[n_iov++] = {o_.scratch + (st.piece_off - seg_start), seg_end - st.piece_off};
        want += seg_end - st.piece_off;
      }
    }
    msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = recvmsg(st.fd, &msg, MSG_DONTWAIT);
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat(OpKindName(kind_), ": rank ", st.stream->peer,
                       " closed its connection (it exited, crashed or aborted) with ",
                       st.total - st.done, " bytes still owed to rank ", o_.rank));
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(OpKindName(kind_), ": receiving from rank ",
                                               st.stream->peer, " failed"));
    }
    *progressed = true;
    const bool had_header = st.header_done == sizeof(WireHeader);
    size_t moved = ConsumeHeader(static_cast<size_t>(n), &st.header_done);
    if (!had_header && st.header_done == sizeof(WireHeader)) RM_RETURN_IF_ERROR(CheckHeader(st));
    if (moved > 0) {
      st.done += moved;
      traffic_->received += moved;
      st.piece_off += moved;
      if (p->other == nullptr) {
        st.completed = st.done;
      } else if (st.piece_off % segment == 0 || st.piece_off == p->bytes) {
        size_t len = st.piece_off - seg_start;
        kernels::Reduce(type_, reduce_, p->dst + seg_start, p->other + seg_start, o_.scratch,
                        len / elem_);
        st.completed = st.done;
      }
      if (st.piece_off == p->bytes) {
        ++st.piece;
        st.piece_off = 0;
      }
    }
    while (st.piece < st.stream->pieces.size() && st.stream->pieces[st.piece].bytes == 0) {
      ++st.piece;
    }
    if (st.done == st.total) st.completed = st.total;
    if (static_cast<size_t>(n) < want) return absl::OkStatus();  // drained the socket
  }
  return absl::OkStatus();
}

absl::Status Engine::PeerClosed(int peer, size_t owed) const {
  return absl::UnavailableError(
      absl::StrCat(OpKindName(kind_), ": rank ", peer,
                   " closed its connection (it exited, crashed or aborted) with ", owed,
                   " bytes of the operation still to move between it and rank ", o_.rank));
}

absl::Status Engine::TrySendRing(SendState& st, size_t limit, bool* progressed) {
  if (st.peer_closed) return PeerClosed(st.stream->peer, st.total - st.done);
  ShmRing& ring = *st.ring;
  constexpr size_t kHeader = sizeof(WireHeader);
  const size_t length = kHeader + st.total + st.pad;  // the message in the ring
  size_t pos = st.header_done + st.done + st.pad_done;
  // Everything up to the gate, and the padding once the payload may complete.
  size_t allowed = kHeader + std::min(limit, st.total);
  if (allowed == kHeader + st.total) allowed = length;
  size_t end = std::min(allowed, pos + ring.Space());
  // Publish whole elements only (the receiver then never sees part of one, and since
  // messages start 8-aligned no element straddles the ring's end). The gate's limit is
  // itself a whole number of elements, so this never holds back what a peer waits for.
  if (end < length && end > kHeader) end -= (end - kHeader) % st.elem;
  while (pos < end) {
    const size_t chunk_end = std::min(end, pos + kRingChunk);
    size_t off = 0;  // bytes written past the ring's head
    if (pos < kHeader) {
      size_t n = std::min(kHeader, chunk_end) - pos;
      ring.WriteAt(off, reinterpret_cast<const char*>(&st.header) + pos, n);
      off += n;
      st.header_done += n;
      pos += n;
    }
    if (pos < chunk_end && st.done < st.total) {
      size_t payload = std::min(chunk_end, kHeader + st.total) - pos;
      for (size_t left = payload; left > 0;) {
        const SendPiece& p = st.stream->pieces[st.piece];
        size_t take = std::min(left, p.bytes - st.piece_off);
        ring.WriteAt(off, p.data + st.piece_off, take);
        off += take;
        left -= take;
        AdvancePieces(st, take);
      }
      st.done += payload;
      traffic_->sent += payload;
      pos += payload;
    }
    if (pos < chunk_end) {  // padding: its bytes are never read
      size_t n = chunk_end - pos;
      st.pad_done += n;
      off += n;
      pos += n;
    }
    if (ring.Publish(off)) Doorbell(st.fd);
    *progressed = true;
  }
  return absl::OkStatus();
}

absl::Status Engine::TryRecvRing(RecvState& st, bool* progressed) {
  ShmRing& ring = *st.ring;
  size_t avail = ring.Available();
  if (avail == 0) {
    return st.peer_closed ? PeerClosed(st.stream->peer, st.total - st.done) : absl::OkStatus();
  }
  constexpr size_t kHeader = sizeof(WireHeader);
  size_t consumed = 0;  // bytes read past the ring's tail, not yet released
  auto release = [&] {
    if (consumed == 0) return;
    if (ring.Release(consumed)) Doorbell(st.fd);
    avail -= consumed;
    consumed = 0;
  };
  while (consumed < avail && !st.finished()) {
    if (st.header_done < kHeader) {
      size_t n = std::min(kHeader - st.header_done, avail - consumed);
      ring.ReadAt(consumed, reinterpret_cast<char*>(&st.header) + st.header_done, n);
      consumed += n;
      st.header_done += n;
      if (st.header_done == kHeader) RM_RETURN_IF_ERROR(CheckHeader(st));
    } else if (st.done < st.total) {
      const RecvPiece& p = st.stream->pieces[st.piece];
      size_t contiguous;
      const char* src = ring.Peek(consumed, &contiguous);
      size_t n = std::min({avail - consumed, contiguous, p.bytes - st.piece_off, kRingChunk});
      if (p.other == nullptr) {
        std::memcpy(p.dst + st.piece_off, src, n);
      } else {
        // The sender publishes whole elements and elements never straddle the ring's end.
        CHECK_EQ(n % elem_, 0u);
        kernels::Reduce(type_, reduce_, p.dst + st.piece_off, p.other + st.piece_off, src,
                        n / elem_);
      }
      consumed += n;
      st.done += n;
      st.completed = st.done;
      traffic_->received += n;
      AdvancePieces(st, n);
      // Give the space back as we go, so the sender can copy the next chunk meanwhile.
      if (consumed >= kRingChunk) release();
    } else {
      size_t n = std::min(st.pad - st.pad_done, avail - consumed);
      consumed += n;
      st.pad_done += n;
    }
  }
  release();
  *progressed = true;
  return absl::OkStatus();
}

absl::Status Engine::DeadlineError() const {
  std::vector<std::string> owed;
  for (const RecvState& st : recvs_) {
    if (!st.finished()) {
      owed.push_back(absl::StrCat("waiting for ", st.total - st.done, " of ", st.total,
                                  " bytes from rank ", st.stream->peer));
    }
  }
  for (const SendState& st : sends_) {
    if (!st.finished()) {
      owed.push_back(absl::StrCat(st.total - st.done, " of ", st.total,
                                  " bytes not yet sent to rank ", st.stream->peer));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      OpKindName(kind_), " on rank ", o_.rank, " missed its deadline: ", absl::StrJoin(owed, "; "),
      " (a peer is stopped, overloaded or unreachable)"));
}

size_t Engine::SendLimit(const SendState& st) const {
  if (st.stream->gate < 0) return st.total;
  return std::min(st.total, st.stream->gate_offset + recvs_[st.stream->gate].completed);
}

absl::Status Engine::Wait(absl::Time deadline) {
  // The common case of small collectives: only one ring receive to wait for. Sleep on its
  // futex (woken in microseconds by the publisher), at most kFutexSlice at a time; a
  // slice that ends without data checks the sockets (a dead peer) on the way out, and the
  // caller checks the abort flag and the deadline.
  {
    RecvState* only = nullptr;
    int waiting = 0;
    for (RecvState& st : recvs_) {
      if (st.finished() || !Ready(st, recvs_)) continue;
      ++waiting;
      only = &st;
    }
    for (SendState& st : sends_) {
      if (!Ready(st, sends_)) continue;
      const bool has_data = st.header_done < sizeof(WireHeader) || SendLimit(st) > st.done ||
                            (st.done == st.total && st.pad_done < st.pad);
      if (!st.finished() && has_data) waiting += 2;  // a send to wait for: poll below
    }
    if (waiting == 1 && only->ring != nullptr) {
      if (!only->ring->ArmConsumerFutexWait()) return absl::OkStatus();
      absl::Duration slice = std::min(deadline - absl::Now(), kFutexSlice);
      if (slice < absl::ZeroDuration()) slice = absl::ZeroDuration();
      const bool woken = only->ring->FutexWaitConsumer(slice);
      only->ring->DisarmConsumerWait();
      if (woken) return absl::OkStatus();
      pollfd p{only->fd, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        char buf[64];
        while (true) {
          const ssize_t n = recv(only->fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (n > 0) continue;
          if (n < 0 && errno == EINTR) continue;
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) only->peer_closed = true;
          break;
        }
      }
      return absl::OkStatus();
    }
  }
  absl::InlinedVector<pollfd, 9> polls;
  // For rings: the states whose flag we set, and their index in `polls`.
  absl::InlinedVector<std::pair<SendState*, size_t>, 4> sleeping_sends;
  absl::InlinedVector<std::pair<RecvState*, size_t>, 4> sleeping_recvs;
  auto disarm = [&] {
    for (auto& [st, i] : sleeping_sends) st->ring->DisarmProducerWait();
    for (auto& [st, i] : sleeping_recvs) st->ring->DisarmConsumerWait();
  };
  polls.push_back({o_.abort_fd, POLLIN, 0});
  for (SendState& st : sends_) {
    // A send waiting on its gate has nothing to write: its receive wakes us instead.
    bool has_data = st.header_done < sizeof(WireHeader) || SendLimit(st) > st.done ||
                    (st.done == st.total && st.pad_done < st.pad);
    // A message queued behind another on its link waits for that one, which we poll.
    if (st.finished() || !has_data || !Ready(st, sends_)) continue;
    if (st.ring == nullptr) {
      polls.push_back({st.fd, POLLOUT, 0});
      continue;
    }
    if (!st.ring->ArmProducerWait()) {  // space appeared meanwhile
      disarm();
      return absl::OkStatus();
    }
    // The receiver rings back on the same connection.
    sleeping_sends.push_back({&st, polls.size()});
    polls.push_back({st.fd, POLLIN, 0});
  }
  for (RecvState& st : recvs_) {
    if (st.finished() || !Ready(st, recvs_)) continue;
    if (st.ring != nullptr) {
      if (!st.ring->ArmConsumerWait()) {
        disarm();
        return absl::OkStatus();
      }
      sleeping_recvs.push_back({&st, polls.size()});
    }
    polls.push_back({st.fd, POLLIN, 0});
  }
  absl::Duration left = deadline - absl::Now();
  if (left < absl::ZeroDuration()) left = absl::ZeroDuration();
  timespec ts = absl::ToTimespec(left);
  int rc = ppoll(polls.data(), polls.size(), &ts, nullptr);
  int err = errno;
  disarm();
  if (rc < 0 && err != EINTR) return ErrnoToStatus(err, "ppoll");
  // Drain wake-up bytes; end of stream (or a reset) means the peer is gone.
  auto drain = [&](int fd, bool* closed) {
    char buf[64];
    while (true) {
      ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) *closed = true;
      return;
    }
  };
  for (auto& [st, i] : sleeping_sends) {
    if (polls[i].revents != 0) drain(st->fd, &st->peer_closed);
  }
  for (auto& [st, i] : sleeping_recvs) {
    if (polls[i].revents != 0) drain(st->fd, &st->peer_closed);
  }
  return absl::OkStatus();
}

absl::Status Engine::Run(SendStream* sends, int num_sends, RecvStream* recvs, int num_recvs,
                         absl::Time deadline) {
  int reducing = 0;
  for (int i = 0; i < num_recvs; ++i) {
    RecvStream& s = recvs[i];
    RecvState st{};
    st.stream = &s;
    Link& link = *(*o_.links)[s.peer];
    st.fd = link.recv_fd;
    st.total = TotalBytes(s);
    st.type = s.type.value_or(type_);
    st.elem = DataTypeSize(st.type);
    if ((st.ring = link.recv_ring) != nullptr) st.pad = RingPadding(st.total);
    st.expect = Header(st.type, s.peer, link.recv_seq++, st.total);
    st.after = LastOnLink(recvs_, s.peer);
    bool reduces = false;
    for (const RecvPiece& p : s.pieces) {
      reduces |= p.other != nullptr && p.bytes > 0;
      CHECK(p.bytes % st.elem == 0) << "receive piece not a whole number of elements";
    }
    CHECK(!reduces || st.type == type_) << "a reducing receive has the operation's type";
    reducing += reduces;
    while (st.piece < s.pieces.size() && s.pieces[st.piece].bytes == 0) ++st.piece;
    recvs_.push_back(st);
  }
  CHECK_LE(reducing, 1) << "the engine reduces into one scratch segment: one reducing receive";
  CHECK(reducing == 0 || (o_.scratch != nullptr && o_.segment_bytes % 8 == 0));
  for (int i = 0; i < num_sends; ++i) {
    SendStream& s = sends[i];
    SendState st{};
    st.stream = &s;
    Link& link = *(*o_.links)[s.peer];
    st.fd = link.send_fd;
    st.total = TotalBytes(s);
    st.type = s.type.value_or(type_);
    st.elem = DataTypeSize(st.type);
    if ((st.ring = link.send_ring) != nullptr) st.pad = RingPadding(st.total);
    st.header = Header(st.type, o_.rank, link.send_seq++, st.total);
    st.after = LastOnLink(sends_, s.peer);
    while (st.piece < s.pieces.size() && s.pieces[st.piece].bytes == 0) ++st.piece;
    sends_.push_back(st);
  }

  absl::Time spin_until = absl::Now() + o_.spin;
  while (true) {
    if (o_.aborted->load(std::memory_order_acquire)) {
      return absl::AbortedError(
          absl::StrCat(OpKindName(kind_), " on rank ", o_.rank, ": the communicator was aborted"));
    }
    bool progressed = false;
    for (SendState& st : sends_) {
      if (st.finished() || !Ready(st, sends_)) continue;
      RM_RETURN_IF_ERROR(st.ring != nullptr ? TrySendRing(st, SendLimit(st), &progressed)
                                            : TrySend(st, SendLimit(st), &progressed));
    }
    bool all_done = true;
    for (RecvState& st : recvs_) {
      if (!st.finished() && Ready(st, recvs_)) {
        RM_RETURN_IF_ERROR(st.ring != nullptr ? TryRecvRing(st, &progressed)
                                              : TryRecv(st, &progressed));
      }
      all_done &= st.finished();
    }
    for (SendState& st : sends_) all_done &= st.finished();
    if (all_done) return absl::OkStatus();
    if (progressed) {
      if (o_.spin > absl::ZeroDuration()) spin_until = absl::Now() + o_.spin;
      continue;
    }
    absl::Time now = absl::Now();
    if (now >= deadline) return DeadlineError();
    if (now < spin_until) {
      if (o_.yield_while_spinning) sched_yield();
      continue;
    }
    RM_RETURN_IF_ERROR(Wait(deadline));
  }
}

}  // namespace

absl::Status RunStreams(const EngineOptions& options, OpKind kind, DataType type,
                        kernels::ReduceKind reduce, SendStream* sends, int num_sends,
                        RecvStream* recvs, int num_recvs, absl::Time deadline, Traffic* traffic) {
  Engine engine(options, kind, type, reduce, traffic);
  return engine.Run(sends, num_sends, recvs, num_recvs, deadline);
}

}  // namespace ringmaster::comm::tcp
