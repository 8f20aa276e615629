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

struct SendState {
  SendStream* stream;
  int fd;
  WireHeader header;
  size_t total;
  size_t header_done = 0;
  size_t done = 0;
  size_t piece = 0;
  size_t piece_off = 0;
  bool finished() const { return header_done == sizeof(WireHeader) && done == total; }
};

struct RecvState {
  RecvStream* stream;
  int fd;
  WireHeader header;  // as received
  WireHeader expect;
  size_t total;
  size_t header_done = 0;
  size_t done = 0;
  size_t completed = 0;  // received and, for reducing pieces, reduced
  size_t piece = 0;
  size_t piece_off = 0;
  bool finished() const { return header_done == sizeof(WireHeader) && completed == total; }
};

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
  absl::Status CheckHeader(const RecvState& st) const;
  size_t SendLimit(const SendState& st) const;
  WireHeader Header(int from_rank, uint64_t seq, uint64_t bytes) const {
    return WireHeader{kMessageMagic,
                      static_cast<uint8_t>(kind_),
                      static_cast<uint8_t>(type_),
                      static_cast<uint16_t>(from_rank),
                      seq,
                      bytes,
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
    while (moved > 0) {
      const SendPiece& p = st.stream->pieces[st.piece];
      size_t take = std::min(moved, p.bytes - st.piece_off);
      st.piece_off += take;
      moved -= take;
      if (st.piece_off == p.bytes) {
        ++st.piece;
        st.piece_off = 0;
      }
    }
    while (st.piece < st.stream->pieces.size() && st.stream->pieces[st.piece].bytes == 0) {
      ++st.piece;
    }
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
        Describe(kind_, type_, e.seq, e.bytes), " from rank ", peer,
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
  absl::InlinedVector<pollfd, 9> polls;
  polls.push_back({o_.abort_fd, POLLIN, 0});
  for (const SendState& st : sends_) {
    // A send waiting on its gate has nothing to write: its receive wakes us instead.
    bool has_data = st.header_done < sizeof(WireHeader) || SendLimit(st) > st.done;
    if (!st.finished() && has_data) polls.push_back({st.fd, POLLOUT, 0});
  }
  for (const RecvState& st : recvs_) {
    if (!st.finished()) polls.push_back({st.fd, POLLIN, 0});
  }
  absl::Duration left = deadline - absl::Now();
  if (left < absl::ZeroDuration()) left = absl::ZeroDuration();
  timespec ts = absl::ToTimespec(left);
  int rc = ppoll(polls.data(), polls.size(), &ts, nullptr);
  if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "ppoll");
  return absl::OkStatus();
}

absl::Status Engine::Run(SendStream* sends, int num_sends, RecvStream* recvs, int num_recvs,
                         absl::Time deadline) {
  int reducing = 0;
  for (int i = 0; i < num_recvs; ++i) {
    RecvStream& s = recvs[i];
    RecvState st{};
    st.stream = &s;
    st.fd = (*o_.recv_fds)[s.peer];
    st.total = TotalBytes(s);
    st.expect = Header(s.peer, (*o_.recv_seq)[s.peer]++, st.total);
    bool reduces = false;
    for (const RecvPiece& p : s.pieces) {
      reduces |= p.other != nullptr && p.bytes > 0;
      CHECK(p.bytes % elem_ == 0) << "receive piece not a whole number of elements";
    }
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
    st.fd = (*o_.send_fds)[s.peer];
    st.total = TotalBytes(s);
    st.header = Header(o_.rank, (*o_.send_seq)[s.peer]++, st.total);
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
      if (!st.finished()) RM_RETURN_IF_ERROR(TrySend(st, SendLimit(st), &progressed));
    }
    bool all_done = true;
    for (RecvState& st : recvs_) {
      if (!st.finished()) RM_RETURN_IF_ERROR(TryRecv(st, &progressed));
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
