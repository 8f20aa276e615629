#include "comm/tcp/tcp_communicator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/tcp/device_memory.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::comm {
namespace {

using tcp::RecvPiece;
using tcp::RecvStream;
using tcp::SendPiece;
using tcp::SendStream;

constexpr uint32_t kHandshakeMagic = 0x524d4853;  // "RMHS"
constexpr uint32_t kReplyMagic = 0x524d4852;      // "RMHR"
constexpr uint32_t kRingOfferMagic = 0x524d524f;  // "RMRO"
// 2: after the handshakes every connection carries a RingOffer and its one-byte answer.
constexpr uint32_t kProtocolVersion = 2;

struct Handshake {
  uint32_t magic;
  uint32_t version;
  uint64_t comm_id;  // FNV-1a of the store prefix
  int32_t world_size;
  int32_t from_rank;
  int32_t to_rank;
  int32_t reserved;
};
static_assert(sizeof(Handshake) == 32);

struct HandshakeReply {
  uint32_t magic;
  uint32_t accepted;  // 1 = accepted
  char reason[184];   // NUL-terminated when rejected
};
static_assert(sizeof(HandshakeReply) == 192);

// Sent on every connection after the handshakes: a shared-memory ring for this direction
// (capacity 0: none, use the socket). Answered with one byte, 'Y' (mapped; use it) or 'N'.
struct RingOffer {
  uint32_t magic;
  uint32_t reserved;
  uint64_t capacity;
  uint64_t nonce;
  char name[104];  // NUL-terminated
};
static_assert(sizeof(RingOffer) == 128);

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

kernels::ReduceKind KindOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return kernels::ReduceKind::kSum;
    case ReduceOp::kProd:
      return kernels::ReduceKind::kProd;
    case ReduceOp::kMin:
      return kernels::ReduceKind::kMin;
    case ReduceOp::kMax:
      return kernels::ReduceKind::kMax;
  }
  return kernels::ReduceKind::kSum;
}

absl::Status ValidateType(absl::string_view op, DataType type) {
  if (static_cast<uint8_t>(type) > static_cast<uint8_t>(DataType::kUint8)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown data type ", static_cast<int>(type)));
  }
  return absl::OkStatus();
}

absl::Status ValidateOp(absl::string_view name, ReduceOp op) {
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kProd)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unknown reduce op ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

// Balanced partition of `count` elements into `parts` chunks.
struct Chunks {
  size_t base, extra, elem;
  size_t Offset(int c) const { return (c * base + std::min<size_t>(c, extra)) * elem; }
  size_t Bytes(int c) const { return (base + (static_cast<size_t>(c) < extra ? 1 : 0)) * elem; }
};

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Recursive doubling all-reduce's formula for rank r (tcp_communicator.h).
uint64_t RecursiveDoublingBytes(uint64_t bytes, int n, int r) {
  int pow2 = 1, rounds = 0;
  while (pow2 * 2 <= n) {
    pow2 *= 2;
    ++rounds;
  }
  const int extra = n - pow2;
  if (r < 2 * extra) return r % 2 == 0 ? bytes : (rounds + 1) * bytes;
  return rounds * bytes;
}

// The children of position `vr` in a binomial tree of n ranks rooted at position 0: vr + m
// for every power of two m below vr's lowest set bit (below n for the root), if < n.
int BinomialChildren(int vr, int n) {
  int children = 0;
  for (int m = 1; m < n && (vr == 0 || m < (vr & -vr)); m <<= 1) children += vr + m < n;
  return children;
}

// The two streams of a ring: to the right neighbour and from the left one. Send transfer
// t forwards what receive transfer t-1 completed, so the send is gated on the receive,
// offset by the length of send transfer 0 (`first_send_bytes`).
struct Ring {
  SendStream send;
  RecvStream recv;
  Ring(int rank, int size, size_t first_send_bytes) {
    send.peer = Mod(rank + 1, size);
    send.gate = 0;
    send.gate_offset = first_send_bytes;
    recv.peer = Mod(rank - 1, size);
  }
};

// A group's id: FNV-1a over its parent's id, the parent's split count and the color. Never
// 0, the id of the communicator made by Create.
uint32_t GroupId(uint32_t parent, uint64_t split, int color) {
  const std::string bytes = absl::StrCat(parent, "/", split, "/", color);
  const uint64_t h = Fnv1a(bytes);
  const uint32_t id = static_cast<uint32_t>(h ^ (h >> 32));
  return id == 0 ? 1 : id;
}

// The bootstrap of a communicator made by Create (TcpCommunicator::Connect), for more than
// one rank: listens and publishes this rank's address, then connects to and accepts every
// peer, one connection per direction, with the handshakes. Fills `send_sockets` and
// `recv_sockets` ([peer]), which outlive it.
class Bootstrap {
 public:
  // The deadline of the whole bootstrap starts now.
  Bootstrap(const TcpCommunicatorOptions& options, std::vector<tcp::Fd>* send_sockets,
            std::vector<tcp::Fd>* recv_sockets)
      : options_(options),
        n_(options.size),
        r_(options.rank),
        deadline_(absl::Now() + options.connect_timeout),
        advertise_(options.advertise_host.empty() ? options.listen_host : options.advertise_host),
        comm_id_(Fnv1a(options.prefix)),
        send_sockets_(*send_sockets),
        recv_sockets_(*recv_sockets),
        addresses_(n_),
        same_host_(n_, false),
        answered_(n_, false) {
    answered_[r_] = true;
  }

  absl::Time deadline() const { return deadline_; }
  // [peer]: advertises this rank's host (known for every peer once Exchange succeeds).
  const std::vector<bool>& same_host() const { return same_host_; }

  // Listens and publishes "<prefix>/rank-<r>/addr".
  absl::Status ListenAndPublish() {
    int port = 0;
    RM_ASSIGN_OR_RETURN(listener_,
                        tcp::Listen(options_.listen_host, options_.listen_port, n_ + 16, &port));
    my_address_ = tcp::HostPort{advertise_, port}.ToString();
    return options_.store->Set(KeyOf(r_), my_address_);
  }

  // Everything here runs in one event loop, so that no step waits on a peer that is itself
  // waiting on us: connect to each peer as soon as its address appears (connect()
  // completes against the peer's listen backlog) and send our handshake; accept and judge
  // incoming handshakes; read each peer's verdict on ours.
  absl::Status Exchange() {
    while (accepted_ < n_ - 1 || answers_ < n_ - 1) {
      RM_RETURN_IF_ERROR(ConnectPublished());
      if (absl::Now() >= deadline_) return DeadlineError();
      RM_RETURN_IF_ERROR(PollOnce());
    }
    return absl::OkStatus();
  }

 private:
  std::string KeyOf(int rank) const {
    return absl::StrCat(options_.prefix, "/rank-", rank, "/addr");
  }
  std::string Context(absl::string_view what) const {
    return absl::StrCat("TCP bootstrap of rank ", r_, "/", n_, " (", options_.prefix, "): ", what);
  }
  std::string WithRejected(std::string why) const {
    if (!rejected_.empty()) {
      absl::StrAppend(&why, "; rejected meanwhile: ", absl::StrJoin(rejected_, "; "));
    }
    return why;
  }

  // Connects to every peer whose address has appeared in the store since (without waiting
  // for the others) and sends it our handshake.
  absl::Status ConnectPublished() {
    for (int i = 1; i < n_; ++i) {
      int p = (r_ + i) % n_;
      if (send_sockets_[p].valid()) continue;
      auto address = options_.store->Get(KeyOf(p), absl::Now());  // don't wait here
      if (absl::IsDeadlineExceeded(address.status())) continue;
      if (!address.ok()) {
        return absl::Status(
            address.status().code(),
            Context(absl::StrCat("reading rank ", p, "'s address: ", address.status().message())));
      }
      addresses_[p] = *address;
      RM_ASSIGN_OR_RETURN(tcp::HostPort hp, tcp::ParseHostPort(*address));
      if (hp.host == advertise_) same_host_[p] = true;
      auto fd =
          tcp::Connect(hp, std::min(deadline_, absl::Now() + options_.refused_retry), deadline_);
      if (!fd.ok()) {
        return absl::Status(
            fd.status().code(),
            Context(WithRejected(absl::StrCat("connecting to rank ", p, " at ", *address, ": ",
                                              fd.status().message()))));
      }
      RM_RETURN_IF_ERROR(tcp::ConfigureDataSocket(fd->get(), options_.socket_buffer_bytes));
      Handshake hs{kHandshakeMagic, kProtocolVersion, comm_id_, n_, r_, p, 0};
      RM_RETURN_IF_ERROR(tcp::WriteFull(fd->get(), &hs, sizeof(hs), deadline_));
      send_sockets_[p] = std::move(fd).value();
    }
    return absl::OkStatus();
  }

  // DEADLINE_EXCEEDED naming the peers that never published, connected or answered.
  absl::Status DeadlineError() const {
    std::vector<std::string> unpublished, missing, silent;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      if (!send_sockets_[p].valid()) unpublished.push_back(absl::StrCat(p));
      if (!recv_sockets_[p].valid()) missing.push_back(absl::StrCat(p));
      if (send_sockets_[p].valid() && !answered_[p]) silent.push_back(absl::StrCat(p));
    }
    std::string why = "deadline passed";
    if (!unpublished.empty()) {
      absl::StrAppend(&why, "; ranks ", absl::StrJoin(unpublished, ", "),
                      " never published their address under ", options_.prefix);
    }
    if (!missing.empty()) {
      absl::StrAppend(&why, "; ranks ", absl::StrJoin(missing, ", "), " never connected to ",
                      my_address_);
    }
    if (!silent.empty()) {
      absl::StrAppend(&why, "; ranks ", absl::StrJoin(silent, ", "),
                      " never answered our handshake");
    }
    return absl::DeadlineExceededError(Context(WithRejected(why)));
  }

  // One poll() of the listener and the connections still awaiting a handshake reply, and
  // the handling of whatever is ready.
  absl::Status PollOnce() {
    std::vector<pollfd> polls;
    std::vector<int> poll_peer;
    if (accepted_ < n_ - 1) {
      polls.push_back({listener_.get(), POLLIN, 0});
      poll_peer.push_back(-1);
    }
    bool all_connected = true;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      all_connected &= send_sockets_[p].valid();
      if (send_sockets_[p].valid() && !answered_[p]) {
        polls.push_back({send_sockets_[p].get(), POLLIN, 0});
        poll_peer.push_back(p);
      }
    }
    // While addresses are still missing, come back soon to look at the store
    // again.
    absl::Duration wait = deadline_ - absl::Now();
    if (!all_connected) {
      wait = std::min(wait, store_poll_);
      store_poll_ = std::min(store_poll_ * 2, absl::Milliseconds(20));
    }
    int wait_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(wait + absl::Microseconds(999)), 0, 1000));
    if (poll(polls.data(), polls.size(), wait_ms) < 0 && errno != EINTR) {
      return ErrnoToStatus(errno, Context("poll"));
    }
    for (size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      const int p = poll_peer[i];
      RM_RETURN_IF_ERROR(p >= 0 ? ReadReply(p) : AcceptOne());
    }
    return absl::OkStatus();
  }

  // Reads peer p's verdict on our handshake; a rejection fails the bootstrap.
  absl::Status ReadReply(int p) {
    HandshakeReply reply;
    absl::Status read = tcp::ReadFull(send_sockets_[p].get(), &reply, sizeof(reply),
                                      std::min(deadline_, absl::Now() + absl::Seconds(5)));
    if (!read.ok()) {
      return absl::Status(read.code(),
                          Context(absl::StrCat("no handshake reply from rank ", p, " at ",
                                               addresses_[p], ": ", read.message())));
    }
    if (reply.magic != kReplyMagic) {
      return absl::FailedPreconditionError(Context(
          absl::StrCat("garbled handshake reply from ", addresses_[p], " (published as rank ", p,
                       "): it is not a ringmaster rank; is the "
                       "store's address stale?")));
    }
    if (reply.accepted != 1) {
      reply.reason[sizeof(reply.reason) - 1] = '\0';
      return absl::FailedPreconditionError(Context(absl::StrCat(
          "rank ", p, " at ", addresses_[p], " rejected our connection: ", reply.reason)));
    }
    answered_[p] = true;
    ++answers_;
    return absl::OkStatus();
  }

  // Accepts one connection, judges its handshake and answers it. A connection that is not
  // one of our peers is told why, dropped and remembered in `rejected_`; we keep waiting.
  absl::Status AcceptOne() {
    std::string from;
    auto fd = tcp::Accept(listener_.get(), absl::Now(), -1, &from);
    if (!fd.ok()) return absl::OkStatus();  // nothing to accept after all
    RM_RETURN_IF_ERROR(tcp::ConfigureDataSocket(fd->get(), options_.socket_buffer_bytes));
    Handshake hs;
    absl::Status read = tcp::ReadFull(fd->get(), &hs, sizeof(hs),
                                      std::min(deadline_, absl::Now() + absl::Seconds(5)));
    std::string reason =
        read.ok() ? WhyReject(hs, from)
                  : absl::StrCat("no complete handshake from ", from, " (", read.message(), ")");
    HandshakeReply reply;
    std::memset(&reply, 0, sizeof(reply));
    reply.magic = kReplyMagic;
    reply.accepted = reason.empty() ? 1 : 0;
    std::strncpy(reply.reason, reason.c_str(), sizeof(reply.reason) - 1);
    absl::Status wrote = tcp::WriteFull(fd->get(), &reply, sizeof(reply),
                                        std::min(deadline_, absl::Now() + absl::Seconds(5)));
    if (!reason.empty() || !wrote.ok()) {
      if (reason.empty()) reason = absl::StrCat("could not answer ", from, ": ", wrote.message());
      LOG(WARNING) << Context(absl::StrCat("rejected a connection: ", reason));
      rejected_.push_back(reason);
      return absl::OkStatus();
    }
    recv_sockets_[hs.from_rank] = std::move(fd).value();
    ++accepted_;
    return absl::OkStatus();
  }

  // Why a complete handshake from `from` is not one of our peers'; empty if it is.
  std::string WhyReject(const Handshake& hs, absl::string_view from) const {
    if (hs.magic != kHandshakeMagic) {
      return absl::StrCat("garbled handshake from ", from, " (bad magic 0x", absl::Hex(hs.magic),
                          "): not a ringmaster rank");
    }
    if (hs.version != kProtocolVersion) {
      return absl::StrCat("handshake from ", from, " speaks protocol version ", hs.version,
                          ", this rank ", kProtocolVersion, ": mixed ringmaster versions");
    }
    if (hs.comm_id != comm_id_) {
      return absl::StrCat("wrong peer: ", from,
                          " belongs to another communicator (its store prefix is not \"",
                          options_.prefix, "\")");
    }
    if (hs.world_size != n_) {
      return absl::StrCat("wrong peer: ", from, " has world size ", hs.world_size,
                          ", this communicator ", n_);
    }
    if (hs.to_rank != r_) {
      return absl::StrCat("wrong peer: ", from, " wanted rank ", hs.to_rank, ", this is rank ", r_);
    }
    if (hs.from_rank < 0 || hs.from_rank >= n_ || hs.from_rank == r_) {
      return absl::StrCat("wrong peer: ", from, " claims rank ", hs.from_rank, ", outside [0, ", n_,
                          ") or equal to this rank");
    }
    if (recv_sockets_[hs.from_rank].valid()) {
      return absl::StrCat("wrong peer: duplicate rank ", hs.from_rank, " from ", from,
                          " (two processes started with the same rank?)");
    }
    return "";
  }

  const TcpCommunicatorOptions& options_;
  const int n_, r_;
  const absl::Time deadline_;
  const std::string advertise_;
  const uint64_t comm_id_;
  std::vector<tcp::Fd>& send_sockets_;  // [peer]: our messages to peer
  std::vector<tcp::Fd>& recv_sockets_;  // [peer]: peer's messages to us
  tcp::Fd listener_;
  std::string my_address_;              // as published
  std::vector<std::string> addresses_;  // [peer]: as published, once read
  std::vector<bool> same_host_;
  // Reasons for the connections we dropped. They go into any error of this bootstrap (they
  // are usually its cause: a wrong peer that gave up leaves a refused connection behind).
  std::vector<std::string> rejected_;
  std::vector<bool> answered_;  // [peer]: accepted our handshake (true for this rank)
  int accepted_ = 0, answers_ = 0;
  absl::Duration store_poll_ = absl::Microseconds(500);
};

}  // namespace

struct TcpCommunicator::Family {
  // Sequencer resources 0..size-1 are the links, by peer rank.
  Family(int rank, int size) : rank(rank), sequencer(size) {}

  absl::Status error() const {
    absl::MutexLock lock(&mu);
    return error_;
  }
  // Makes `status` the family's error unless it has one, and stops waiting turns.
  void Break(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu);
      if (!error_.ok()) return;
      error_ = status;
      broken.store(true, std::memory_order_release);
    }
    sequencer.Stop(status);
  }
  // Peers blocked on us fail at once instead of waiting for their deadline. shutdown()
  // keeps the descriptors valid for threads still inside an operation.
  void CloseConnections() {
    for (auto* sockets : {&send_sockets, &recv_sockets}) {
      for (auto& s : *sockets) {
        if (s.valid()) shutdown(s.get(), SHUT_RDWR);
      }
    }
  }
  void Abort() {
    if (aborted.exchange(true)) return;
    Break(absl::AbortedError(absl::StrCat("rank ", rank, ": the communicator was aborted")));
    uint64_t one = 1;
    (void)!write(abort_event.get(), &one, sizeof(one));
    CloseConnections();
  }

  const int rank;  // in the communicator made by Create
  std::vector<tcp::Fd> send_sockets;  // [peer]: our messages to peer
  std::vector<tcp::Fd> recv_sockets;  // [peer]: peer's messages to us
  std::vector<std::unique_ptr<tcp::ShmRing>> send_ring_owners, recv_ring_owners;
  std::vector<tcp::Link> links;  // [peer]; fixed once Create returns
  std::vector<bool> same_host;   // [peer]: advertises this rank's host
  tcp::Fd abort_event;
  std::atomic<bool> aborted{false};
  std::atomic<bool> broken{false};  // error_ is set
  // Set once the family has groups or non-blocking work: from then on operations take
  // turns on the links they share (before, one thread runs one operation at a time).
  std::atomic<bool> sequenced{false};
  tcp::Sequencer sequencer;

 private:
  mutable absl::Mutex mu;
  absl::Status error_ ABSL_GUARDED_BY(mu);
};

TcpCommunicator::TcpCommunicator(std::shared_ptr<Family> family, std::vector<int> world_ranks,
                                 int rank, uint32_t group, size_t small_message_bytes)
    : family_(std::move(family)),
      world_ranks_(std::move(world_ranks)),
      rank_(rank),
      size_(static_cast<int>(world_ranks_.size())),
      group_(group),
      small_message_bytes_(small_message_bytes) {}

TcpCommunicator::~TcpCommunicator() = default;

void TcpCommunicator::SetUpEngine(const tcp::EngineOptions& tuning) {
  links_.assign(size_, nullptr);
  resources_ = {family_->sequencer.AddResource()};
  local_ranks_ = 1;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const int world = world_ranks_[p];
    links_[p] = &family_->links[world];
    resources_.push_back(world);
    local_ranks_ += family_->same_host[world];
  }
  segment_scratch_.resize(tuning.segment_bytes);
  tcp::EngineOptions& e = engine_options_;
  e = tuning;
  e.rank = rank_;
  e.group = group_;
  e.links = &links_;
  e.abort_fd = family_->abort_event.get();
  e.aborted = &family_->aborted;
  e.scratch = segment_scratch_.data();
}

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Create(
    const TcpCommunicatorOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpCommunicatorOptions.size must be >= 1, got ", options.size));
  }
  if (options.size > 65535) {
    return absl::InvalidArgumentError("TcpCommunicatorOptions.size must be <= 65535");
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("TcpCommunicatorOptions.rank ", options.rank,
                                                   " is outside [0, ", options.size, ")"));
  }
  if (options.size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError("TcpCommunicatorOptions.store is null");
  }
  if (options.size > 1) RM_RETURN_IF_ERROR(ValidateStoreKey(options.prefix));
  if (options.shm_ring_bytes < 4096 || options.shm_ring_bytes > (1u << 30) ||
      (options.shm_ring_bytes & (options.shm_ring_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpCommunicatorOptions.shm_ring_bytes must be a power of two in [4 KiB, 1 GiB], got ",
        options.shm_ring_bytes));
  }
  if (options.segment_bytes < 64 || options.segment_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(
        "TcpCommunicatorOptions.segment_bytes must be in [64, 64 MiB]");
  }
  std::string advertise =
      options.advertise_host.empty() ? options.listen_host : options.advertise_host;
  if (advertise == "0.0.0.0" || advertise == "::" || advertise.empty()) {
    return absl::InvalidArgumentError(
        "TcpCommunicatorOptions.advertise_host must be set to an address peers "
        "can reach "
        "when listen_host is a wildcard");
  }
  auto family = std::make_shared<Family>(options.rank, options.size);
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoToStatus(errno, "eventfd");
  family->abort_event = tcp::Fd(efd);
  std::vector<int> world(options.size);
  std::iota(world.begin(), world.end(), 0);
  std::unique_ptr<TcpCommunicator> comm(new TcpCommunicator(
      std::move(family), std::move(world), options.rank, 0, options.small_message_bytes));
  RM_RETURN_IF_ERROR(comm->Connect(options));

  tcp::EngineOptions e;
  e.segment_bytes = std::max<size_t>(64, options.segment_bytes & ~size_t{7});
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local_ranks = static_cast<int>(
      1 + std::count(comm->family_->same_host.begin(), comm->family_->same_host.end(), true));
  const bool oversubscribed = local_ranks > cores;
  if (options.spin >= absl::ZeroDuration()) {
    e.spin = options.spin;
  } else {
    e.spin = !oversubscribed                                       ? absl::Microseconds(50)
             : options.oversubscribed_spin >= absl::ZeroDuration() ? options.oversubscribed_spin
                                                                   : absl::Microseconds(100);
  }
  e.yield_while_spinning = oversubscribed;
  comm->SetUpEngine(e);
  return comm;
}

absl::Status TcpCommunicator::Connect(const TcpCommunicatorOptions& options) {
  const int n = options.size;
  family_->send_sockets.resize(n);
  family_->recv_sockets.resize(n);
  family_->links.assign(n, tcp::Link{});
  family_->same_host.assign(n, false);
  if (n == 1) return absl::OkStatus();

  Bootstrap bootstrap(options, &family_->send_sockets, &family_->recv_sockets);
  RM_RETURN_IF_ERROR(bootstrap.ListenAndPublish());
  RM_RETURN_IF_ERROR(bootstrap.Exchange());
  for (int p = 0; p < n; ++p) {
    family_->links[p].send_fd = family_->send_sockets[p].get();
    family_->links[p].recv_fd = family_->recv_sockets[p].get();
  }
  const std::vector<bool> same_host = bootstrap.same_host();
  family_->same_host = same_host;
  return SetUpRings(options, same_host, bootstrap.deadline());
}

absl::Status TcpCommunicator::SetUpRings(const TcpCommunicatorOptions& options,
                                         const std::vector<bool>& same_host, absl::Time deadline) {
  const int n = size_, r = rank_;
  auto context = [&](int peer, absl::string_view what) {
    return absl::StrCat("TCP bootstrap of rank ", r, "/", n, " (", options.prefix,
                        "): shared memory with rank ", peer, ": ", what);
  };
  std::vector<std::unique_ptr<tcp::ShmRing>>& send_owners = family_->send_ring_owners;
  std::vector<std::unique_ptr<tcp::ShmRing>>& recv_owners = family_->recv_ring_owners;
  std::vector<tcp::Link>& links = family_->links;
  send_owners.resize(n);
  recv_owners.resize(n);
  // Offer a ring to every peer that advertised our host (a different /dev/shm — another
  // container — makes the peer decline); the others get an empty offer.
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    RingOffer offer;
    std::memset(&offer, 0, sizeof(offer));
    offer.magic = kRingOfferMagic;
    if (options.shared_memory && same_host[p]) {
      auto ring = tcp::ShmRing::Create(options.shm_ring_bytes);
      if (ring.ok()) {
        offer.capacity = (*ring)->capacity();
        offer.nonce = (*ring)->nonce();
        std::strncpy(offer.name, (*ring)->name().c_str(), sizeof(offer.name) - 1);
        send_owners[p] = std::move(ring).value();
      } else {
        LOG(WARNING) << context(p, absl::StrCat("falling back to TCP: ", ring.status().message()));
      }
    }
    RM_RETURN_IF_ERROR(tcp::WriteFull(links[p].send_fd, &offer, sizeof(offer), deadline));
  }
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    RingOffer offer;
    absl::Status read = tcp::ReadFull(links[p].recv_fd, &offer, sizeof(offer), deadline);
    if (!read.ok()) {
      return absl::Status(read.code(), context(p, absl::StrCat("no ring offer: ", read.message())));
    }
    if (offer.magic != kRingOfferMagic) {
      return absl::FailedPreconditionError(context(p, "garbled ring offer"));
    }
    char answer = 'N';
    if (offer.capacity > 0 && options.shared_memory) {
      offer.name[sizeof(offer.name) - 1] = '\0';
      auto ring = tcp::ShmRing::Open(offer.name, offer.capacity, offer.nonce);
      if (ring.ok()) {
        recv_owners[p] = std::move(ring).value();
        answer = 'Y';
      } else {
        LOG(INFO) << context(p, absl::StrCat("using TCP: ", ring.status().message()));
      }
    }
    RM_RETURN_IF_ERROR(tcp::WriteFull(links[p].recv_fd, &answer, 1, deadline));
  }
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    char answer = 'N';
    absl::Status read = tcp::ReadFull(links[p].send_fd, &answer, 1, deadline);
    if (!read.ok()) {
      return absl::Status(
          read.code(), context(p, absl::StrCat("no answer to our ring offer: ", read.message())));
    }
    if (send_owners[p] != nullptr) {
      send_owners[p]->Unlink();
      if (answer != 'Y') send_owners[p].reset();
    }
  }
  for (int p = 0; p < n; ++p) {
    links[p].send_ring = send_owners[p].get();
    links[p].recv_ring = recv_owners[p].get();
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Health, counters, abort.

void TcpCommunicator::Abort() { family_->Abort(); }

int TcpCommunicator::shared_memory_peers() const {
  int peers = 0;
  for (const tcp::Link* link : links_) {
    peers += link != nullptr && link->send_ring != nullptr && link->recv_ring != nullptr;
  }
  return peers;
}

absl::Status TcpCommunicator::GetAsyncError() const { return family_->error(); }

Counters TcpCommunicator::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

template <typename Fn>
absl::Status TcpCommunicator::Guarded(OpKind kind, Fn&& fn) {
  Family& family = *family_;
  if (family.broken.load(std::memory_order_acquire)) {
    absl::Status error = family.error();
    absl::MutexLock lock(&mu_);
    OpCounters& c = counters_.of(kind);
    ++c.calls;
    ++c.errors;
    return error;
  }
  op_traffic_ = tcp::Traffic{};
  op_payload_bytes_ = 0;
  op_formula_bytes_ = 0;
  const absl::Time start = absl::Now();
  absl::Status status = fn();
  const absl::Duration took = absl::Now() - start;
  if (!status.ok() && family.aborted.load()) {
    status =
        absl::AbortedError(absl::StrCat(OpKindName(kind), " on rank ", rank_,
                                        ": the communicator was aborted (", status.message(), ")"));
  }
  if (!status.ok() && group_ != 0) {
    // The ranks in the message are the group's: say which ranks of the world they are.
    status = absl::Status(status.code(),
                          absl::StrCat("in group ", group_, " of world ranks [",
                                       absl::StrJoin(world_ranks_, ","), "]: ", status.message()));
  }
  bool breaks = !status.ok() && !absl::IsInvalidArgument(status);
  {
    absl::MutexLock lock(&mu_);
    OpCounters& c = counters_.of(kind);
    ++c.calls;
    c.bytes_sent += op_traffic_.sent;
    c.bytes_received += op_traffic_.received;
    c.payload_bytes += op_payload_bytes_;
    c.formula_bytes_sent += op_formula_bytes_;
    c.time += took;
    if (!status.ok()) ++c.errors;
  }
  if (breaks) family.Break(status);
  if (breaks && !absl::IsDeadlineExceeded(status)) {
    // The streams are out of step now; closing them makes every peer fail fast
    // rather than at its deadline. After a timeout the sockets stay open: the
    // peers time out on their own and report DEADLINE_EXCEEDED, which says what
    // happened.
    family.CloseConnections();
  }
  return status;
}

template <typename Fn>
absl::Status TcpCommunicator::InTurn(OpKind kind, const tcp::Sequencer::Ticket& ticket,
                                     absl::Time deadline, Fn&& fn) {
  Family& family = *family_;
  absl::Status status = Guarded(kind, [&]() -> absl::Status {
    absl::Status turn = family.sequencer.AwaitTurn(ticket, deadline);
    if (!turn.ok() && !family.broken.load()) {
      turn = absl::Status(turn.code(),
                          absl::StrCat(OpKindName(kind), " on rank ", rank_, ": ", turn.message()));
    }
    RM_RETURN_IF_ERROR(turn);
    return fn();
  });
  family.sequencer.Release(ticket);
  return status;
}

template <typename Fn>
absl::Status TcpCommunicator::Ordered(OpKind kind, absl::Time deadline, Fn&& fn) {
  Family& family = *family_;
  if (!family.sequenced.load(std::memory_order_acquire)) return Guarded(kind, fn);
  return InTurn(kind, family.sequencer.Issue(resources_), deadline, fn);
}

template <typename Fn>
Work TcpCommunicator::Async(OpKind kind, absl::Time deadline, Fn fn) {
  Family& family = *family_;
  family.sequenced.store(true, std::memory_order_release);
  return queue_.Enqueue([this, kind, deadline, ticket = family.sequencer.Issue(resources_), fn] {
    return InTurn(kind, ticket, deadline, fn);
  });
}

absl::Status TcpCommunicator::Run(OpKind kind, DataType type, kernels::ReduceKind reduce,
                                  SendStream* sends, int num_sends, RecvStream* recvs,
                                  int num_recvs, absl::Time deadline) {
  return tcp::RunStreams(engine_options_, kind, type, reduce, sends, num_sends, recvs, num_recvs,
                         deadline, &op_traffic_);
}

template <typename Fn>
absl::Status TcpCommunicator::Staged(const void* send, size_t send_bytes, void* recv,
                                     size_t recv_bytes, Fn&& fn) {
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  const bool send_dev = send_bytes > 0 && tcp::IsDevicePointer(s);
  const bool recv_dev = recv_bytes > 0 && tcp::IsDevicePointer(r);
  if (!send_dev && !recv_dev) return fn(s, r);
  const char* host_send = s;
  char* host_recv = r;
  const bool send_in_recv = send_dev && recv_dev && s >= r && s + send_bytes <= r + recv_bytes;
  const bool recv_in_send = send_dev && recv_dev && r >= s && r + recv_bytes <= s + send_bytes;
  if (recv_in_send) {
    staging_send_.resize(send_bytes);
    RM_RETURN_IF_ERROR(tcp::CopyDeviceToHost(staging_send_.data(), s, send_bytes));
    host_send = staging_send_.data();
    host_recv = staging_send_.data() + (r - s);
  } else {
    if (recv_dev) {
      staging_recv_.resize(recv_bytes);
      host_recv = staging_recv_.data();
    }
    if (send_in_recv) {
      host_send = host_recv + (s - r);
      RM_RETURN_IF_ERROR(tcp::CopyDeviceToHost(host_recv + (s - r), s, send_bytes));
    } else if (send_dev) {
      staging_send_.resize(send_bytes);
      RM_RETURN_IF_ERROR(tcp::CopyDeviceToHost(staging_send_.data(), s, send_bytes));
      host_send = staging_send_.data();
    }
  }
  RM_RETURN_IF_ERROR(fn(host_send, host_recv));
  if (recv_dev) RM_RETURN_IF_ERROR(tcp::CopyHostToDevice(r, host_recv, recv_bytes));
  return absl::OkStatus();
}

char* TcpCommunicator::Scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

// ---------------------------------------------------------------------------------------
// All-reduce.

auto TcpCommunicator::AllReduceOp(AllReduceAlgorithm algorithm, const void* send, void* recv,
                                  size_t count, DataType type, ReduceOp op, absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(send, bytes, recv, bytes, [&](const char* s, char* r) {
      return AllReduceHost(algorithm, s, r, count, type, op, deadline);
    });
  };
}

auto TcpCommunicator::AllGatherOp(const void* send, void* recv, size_t count, DataType type,
                                  absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(send, bytes, recv, bytes * size_, [&](const char* s, char* r) {
      return AllGatherHost(s, r, count, type, deadline);
    });
  };
}

auto TcpCommunicator::ReduceScatterOp(const void* send, void* recv, size_t count, DataType type,
                                      ReduceOp op, absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(send, bytes * size_, recv, bytes, [&](const char* s, char* r) {
      return ReduceScatterHost(s, r, count, type, op, deadline);
    });
  };
}

auto TcpCommunicator::BroadcastOp(const void* send, void* recv, size_t count, DataType type,
                                  int root, absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(send, rank_ == root ? bytes : 0, recv, bytes, [&](const char* s, char* r) {
      return BroadcastHost(s, r, count, type, root, deadline);
    });
  };
}

auto TcpCommunicator::SendOp(const void* buf, size_t count, DataType type, int peer,
                             absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(buf, bytes, nullptr, 0, [&](const char* s, char*) -> absl::Status {
      RM_RETURN_IF_ERROR(ValidateType("Send", type));
      RM_RETURN_IF_ERROR(ValidatePeer("Send", "peer", peer, rank_, size_, false));
      RM_RETURN_IF_ERROR(ValidateBuffer("Send", "buffer", s, count));
      op_payload_bytes_ = bytes;
      SendStream stream{peer, {SendPiece{s, bytes}}};
      return Run(OpKind::kSend, type, kernels::ReduceKind::kSum, &stream, 1, nullptr, 0, deadline);
    });
  };
}

auto TcpCommunicator::RecvOp(void* buf, size_t count, DataType type, int peer,
                             absl::Time deadline) {
  return [=, this] {
    const size_t bytes = count * DataTypeSize(type);
    return Staged(nullptr, 0, buf, bytes, [&](const char*, char* r) -> absl::Status {
      RM_RETURN_IF_ERROR(ValidateType("Recv", type));
      RM_RETURN_IF_ERROR(ValidatePeer("Recv", "peer", peer, rank_, size_, false));
      RM_RETURN_IF_ERROR(ValidateBuffer("Recv", "buffer", r, count));
      op_payload_bytes_ = bytes;
      RecvStream stream{peer, {RecvPiece{r, bytes, nullptr}}};
      // Messages carry the sender's op kind: a Recv matches the peer's Send.
      return Run(OpKind::kSend, type, kernels::ReduceKind::kSum, nullptr, 0, &stream, 1, deadline);
    });
  };
}

auto TcpCommunicator::SendRecvOp(std::vector<PointToPoint> ops, absl::Time deadline) {
  return [ops = std::move(ops), deadline, this]() -> absl::Status {
    RM_RETURN_IF_ERROR(ValidateBatch(ops, rank_, size_));
    for (const PointToPoint& op : ops) op_payload_bytes_ += op.count * DataTypeSize(op.type);
    // Device buffers go through host staging buffers of their own (the engine needs
    // every message's buffer at once); the receives are copied back once all are in.
    if (staging_batch_.size() < ops.size()) staging_batch_.resize(ops.size());
    std::vector<const char*> host(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      const bool sends = op.kind == PointToPoint::Kind::kSend;
      const size_t bytes = op.count * DataTypeSize(op.type);
      host[i] = static_cast<const char*>(sends ? op.send : op.recv);
      if (bytes == 0 || !tcp::IsDevicePointer(host[i])) continue;
      std::vector<char>& staging = staging_batch_[i];
      staging.resize(bytes);
      if (sends) RM_RETURN_IF_ERROR(tcp::CopyDeviceToHost(staging.data(), op.send, bytes));
      host[i] = staging.data();
    }
    std::vector<SendStream> sends;
    std::vector<RecvStream> recvs;
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      const size_t bytes = op.count * DataTypeSize(op.type);
      if (op.kind == PointToPoint::Kind::kSend) {
        sends.push_back(SendStream{op.peer, {SendPiece{host[i], bytes}}, -1, 0, op.type});
      } else {
        recvs.push_back(
            RecvStream{op.peer, {RecvPiece{const_cast<char*>(host[i]), bytes, nullptr}}, op.type});
      }
    }
    // The messages are Send's (as a Recv expects them), whatever their type.
    absl::Status status =
        Run(OpKind::kSend, DataType::kUint8, kernels::ReduceKind::kSum, sends.data(),
            static_cast<int>(sends.size()), recvs.data(), static_cast<int>(recvs.size()), deadline);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("SendRecv of ", ops.size(), " ops: ", status.message()));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      if (op.kind != PointToPoint::Kind::kRecv || host[i] == op.recv) continue;
      RM_RETURN_IF_ERROR(tcp::CopyHostToDevice(op.recv, host[i], op.count * DataTypeSize(op.type)));
    }
    return absl::OkStatus();
  };
}

absl::Status TcpCommunicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                        ReduceOp op, absl::Time deadline) {
  return AllReduceWith(AllReduceAlgorithm::kAuto, send, recv, count, type, op, deadline);
}

absl::Status TcpCommunicator::AllReduceWith(AllReduceAlgorithm algorithm, const void* send,
                                            void* recv, size_t count, DataType type, ReduceOp op,
                                            absl::Time deadline) {
  return Ordered(OpKind::kAllReduce, deadline,
                 AllReduceOp(algorithm, send, recv, count, type, op, deadline));
}

absl::Status TcpCommunicator::AllGather(const void* send, void* recv, size_t count, DataType type,
                                        absl::Time deadline) {
  return Ordered(OpKind::kAllGather, deadline, AllGatherOp(send, recv, count, type, deadline));
}

absl::Status TcpCommunicator::ReduceScatter(const void* send, void* recv, size_t count,
                                            DataType type, ReduceOp op, absl::Time deadline) {
  return Ordered(OpKind::kReduceScatter, deadline,
                 ReduceScatterOp(send, recv, count, type, op, deadline));
}

absl::Status TcpCommunicator::Broadcast(const void* send, void* recv, size_t count, DataType type,
                                        int root, absl::Time deadline) {
  return Ordered(OpKind::kBroadcast, deadline,
                 BroadcastOp(send, recv, count, type, root, deadline));
}

absl::Status TcpCommunicator::Send(const void* buf, size_t count, DataType type, int peer,
                                   absl::Time deadline) {
  return Ordered(OpKind::kSend, deadline, SendOp(buf, count, type, peer, deadline));
}

absl::Status TcpCommunicator::Recv(void* buf, size_t count, DataType type, int peer,
                                   absl::Time deadline) {
  return Ordered(OpKind::kRecv, deadline, RecvOp(buf, count, type, peer, deadline));
}

absl::Status TcpCommunicator::SendRecv(absl::Span<const PointToPoint> ops, absl::Time deadline) {
  if (ops.empty()) return family_->error();  // nothing to move, nothing to wait for
  return Ordered(OpKind::kSendRecv, deadline,
                 SendRecvOp(std::vector<PointToPoint>(ops.begin(), ops.end()), deadline));
}

Work TcpCommunicator::AllReduceAsync(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, absl::Time deadline) {
  return Async(OpKind::kAllReduce, deadline,
               AllReduceOp(AllReduceAlgorithm::kAuto, send, recv, count, type, op, deadline));
}

Work TcpCommunicator::AllGatherAsync(const void* send, void* recv, size_t count, DataType type,
                                     absl::Time deadline) {
  return Async(OpKind::kAllGather, deadline, AllGatherOp(send, recv, count, type, deadline));
}

Work TcpCommunicator::ReduceScatterAsync(const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, absl::Time deadline) {
  return Async(OpKind::kReduceScatter, deadline,
               ReduceScatterOp(send, recv, count, type, op, deadline));
}

Work TcpCommunicator::BroadcastAsync(const void* send, void* recv, size_t count, DataType type,
                                     int root, absl::Time deadline) {
  return Async(OpKind::kBroadcast, deadline, BroadcastOp(send, recv, count, type, root, deadline));
}

Work TcpCommunicator::SendAsync(const void* buf, size_t count, DataType type, int peer,
                                absl::Time deadline) {
  return Async(OpKind::kSend, deadline, SendOp(buf, count, type, peer, deadline));
}

Work TcpCommunicator::RecvAsync(void* buf, size_t count, DataType type, int peer,
                                absl::Time deadline) {
  return Async(OpKind::kRecv, deadline, RecvOp(buf, count, type, peer, deadline));
}

Work TcpCommunicator::SendRecvAsync(absl::Span<const PointToPoint> ops, absl::Time deadline) {
  if (ops.empty()) return Work::Done(family_->error());
  return Async(OpKind::kSendRecv, deadline,
               SendRecvOp(std::vector<PointToPoint>(ops.begin(), ops.end()), deadline));
}

absl::StatusOr<std::unique_ptr<Communicator>> TcpCommunicator::Split(int color, int key,
                                                                     absl::Time deadline) {
  // From now on operations take turns on the links they share with the group's.
  family_->sequenced.store(true, std::memory_order_release);
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  RM_RETURN_IF_ERROR(AllGather(mine, all.data(), 2, DataType::kInt64, deadline));
  const uint64_t split = splits_++;
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<int> members;  // ranks here, ordered by (key, rank)
  for (int p = 0; p < size_; ++p) {
    if (all[2 * p] == color) members.push_back(p);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  std::vector<int> world(members.size());
  int rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    world[i] = world_ranks_[members[i]];
    if (members[i] == rank_) rank = static_cast<int>(i);
  }
  std::unique_ptr<TcpCommunicator> group(new TcpCommunicator(
      family_, std::move(world), rank, GroupId(group_, split, color), small_message_bytes_));
  group->SetUpEngine(engine_options_);
  return group;
}

absl::Status TcpCommunicator::Barrier(absl::Time deadline) {
  return Ordered(OpKind::kBarrier, deadline, [&]() -> absl::Status {
    // Dissemination: in round k every rank signals rank + 2^k and hears from rank - 2^k.
    const int n = size_, r = rank_;
    for (int k = 1; k < n; k <<= 1) {
      SendStream s{Mod(r + k, n), {}};
      RecvStream v{Mod(r - k, n), {}};
      RM_RETURN_IF_ERROR(Run(OpKind::kBarrier, DataType::kUint8, kernels::ReduceKind::kSum, &s, 1,
                             &v, 1, deadline));
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------
// Algorithms, on host memory.

absl::Status TcpCommunicator::AllReduceHost(AllReduceAlgorithm algorithm, const char* send,
                                            char* recv, size_t count, DataType type, ReduceOp op,
                                            absl::Time deadline) {
  RM_RETURN_IF_ERROR(ValidateType("AllReduce", type));
  RM_RETURN_IF_ERROR(ValidateOp("AllReduce", op));
  RM_RETURN_IF_ERROR(ValidateBuffers("AllReduce", send, recv, count));
  const size_t bytes = count * DataTypeSize(type);
  op_payload_bytes_ = bytes;
  if (count == 0) return absl::OkStatus();
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, bytes);
    return absl::OkStatus();
  }
  if (algorithm == AllReduceAlgorithm::kAuto) {
    algorithm = bytes <= small_message_bytes_ ? AllReduceAlgorithm::kRecursiveDoubling
                                              : AllReduceAlgorithm::kRing;
  }
  op_formula_bytes_ = algorithm == AllReduceAlgorithm::kRing
                          ? RingAllReduceBytes(bytes, size_)
                          : RecursiveDoublingBytes(bytes, size_, rank_);
  const kernels::ReduceKind kind = KindOf(op);
  RM_RETURN_IF_ERROR(algorithm == AllReduceAlgorithm::kRing
                         ? RingAllReduce(send, recv, count, type, kind, deadline)
                         : RecursiveDoublingAllReduce(send, recv, count, type, kind, deadline));
  if (op == ReduceOp::kAvg) kernels::DivideBy(type, recv, count, size_);
  return absl::OkStatus();
}

absl::Status TcpCommunicator::RingAllReduce(const char* send, char* recv, size_t count,
                                            DataType type, kernels::ReduceKind reduce,
                                            absl::Time deadline) {
  const int n = size_, r = rank_;
  const Chunks chunks{count / n, count % n, DataTypeSize(type)};
  Ring ring(r, n, chunks.Bytes(r));
  SendStream& out = ring.send;
  RecvStream& in = ring.recv;
  // Reduce-scatter: step t sends chunk r-t (reduced in step t-1) and reduces
  // chunk r-t-1.
  for (int t = 0; t < n - 1; ++t) {
    int sc = Mod(r - t, n), rc = Mod(r - t - 1, n);
    const char* from = (t == 0 ? send : recv) + chunks.Offset(sc);
    out.pieces.push_back(SendPiece{from, chunks.Bytes(sc)});
    in.pieces.push_back(
        RecvPiece{recv + chunks.Offset(rc), chunks.Bytes(rc), send + chunks.Offset(rc)});
  }
  // All-gather: step t forwards chunk r+1-t, fully reduced, and receives chunk
  // r-t.
  for (int t = 0; t < n - 1; ++t) {
    int sc = Mod(r + 1 - t, n), rc = Mod(r - t, n);
    out.pieces.push_back(SendPiece{recv + chunks.Offset(sc), chunks.Bytes(sc)});
    in.pieces.push_back(RecvPiece{recv + chunks.Offset(rc), chunks.Bytes(rc), nullptr});
  }
  return Run(OpKind::kAllReduce, type, reduce, &out, 1, &in, 1, deadline);
}

absl::Status TcpCommunicator::RecursiveDoublingAllReduce(const char* send, char* recv, size_t count,
                                                         DataType type, kernels::ReduceKind reduce,
                                                         absl::Time deadline) {
  const int n = size_, r = rank_;
  const size_t bytes = count * DataTypeSize(type);
  if (send != recv) std::memcpy(recv, send, bytes);
  char* tmp = Scratch(bytes);
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;

  // Fold: among the first 2*extra ranks, even ones hand their data to the next
  // odd one and wait for the result.
  int vrank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      SendStream s{r + 1, {SendPiece{recv, bytes}}};
      RM_RETURN_IF_ERROR(Run(OpKind::kAllReduce, type, reduce, &s, 1, nullptr, 0, deadline));
      RecvStream v{r + 1, {RecvPiece{recv, bytes, nullptr}}};
      return Run(OpKind::kAllReduce, type, reduce, nullptr, 0, &v, 1, deadline);
    }
    RecvStream v{r - 1, {RecvPiece{recv, bytes, recv}}};
    RM_RETURN_IF_ERROR(Run(OpKind::kAllReduce, type, reduce, nullptr, 0, &v, 1, deadline));
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }
  for (int mask = 1; mask < pow2; mask <<= 1) {
    int vpeer = vrank ^ mask;
    int peer = vpeer < extra ? 2 * vpeer + 1 : vpeer + extra;
    SendStream s{peer, {SendPiece{recv, bytes}}};
    RecvStream v{peer, {RecvPiece{tmp, bytes, nullptr}}};
    RM_RETURN_IF_ERROR(Run(OpKind::kAllReduce, type, reduce, &s, 1, &v, 1, deadline));
    // Both sides compute the same commutative op, so every rank ends
    // bit-identical.
    kernels::Reduce(type, reduce, recv, recv, tmp, count);
  }
  if (r < 2 * extra) {
    SendStream s{r - 1, {SendPiece{recv, bytes}}};
    RM_RETURN_IF_ERROR(Run(OpKind::kAllReduce, type, reduce, &s, 1, nullptr, 0, deadline));
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::AllGatherHost(const char* send, char* recv, size_t count,
                                            DataType type, absl::Time deadline) {
  RM_RETURN_IF_ERROR(ValidateType("AllGather", type));
  RM_RETURN_IF_ERROR(ValidateBuffers("AllGather", send, recv, count));
  if (count == 0) return absl::OkStatus();
  const int n = size_, r = rank_;
  const size_t bytes = count * DataTypeSize(type);
  op_payload_bytes_ = bytes * n;
  op_formula_bytes_ = RingGatherBytes(bytes * n, n);  // recursive doubling's too
  if (send != recv + r * bytes) std::memcpy(recv + r * bytes, send, bytes);
  if (n == 1) return absl::OkStatus();
  const auto kind = kernels::ReduceKind::kSum;  // unused: nothing is reduced
  if ((n & (n - 1)) == 0 && bytes * n <= small_message_bytes_) {
    // Recursive doubling: log2(n) exchanges of the block gathered so far, which is
    // contiguous because blocks sit in rank order.
    for (int mask = 1; mask < n; mask <<= 1) {
      const int peer = r ^ mask;
      const size_t mine = static_cast<size_t>(r & ~(mask - 1)) * bytes;
      const size_t theirs = static_cast<size_t>(peer & ~(mask - 1)) * bytes;
      SendStream s{peer, {SendPiece{recv + mine, bytes * mask}}};
      RecvStream v{peer, {RecvPiece{recv + theirs, bytes * mask, nullptr}}};
      RM_RETURN_IF_ERROR(Run(OpKind::kAllGather, type, kind, &s, 1, &v, 1, deadline));
    }
    return absl::OkStatus();
  }
  // Ring: step t forwards block r-t (received in step t-1) and receives block r-t-1.
  Ring ring(r, n, bytes);
  SendStream& s = ring.send;
  RecvStream& v = ring.recv;
  for (int t = 0; t < n - 1; ++t) {
    s.pieces.push_back(SendPiece{recv + Mod(r - t, n) * bytes, bytes});
    v.pieces.push_back(RecvPiece{recv + Mod(r - t - 1, n) * bytes, bytes, nullptr});
  }
  return Run(OpKind::kAllGather, type, kind, &s, 1, &v, 1, deadline);
}

absl::Status TcpCommunicator::ReduceScatterHost(const char* send, char* recv, size_t count,
                                                DataType type, ReduceOp op, absl::Time deadline) {
  RM_RETURN_IF_ERROR(ValidateType("ReduceScatter", type));
  RM_RETURN_IF_ERROR(ValidateOp("ReduceScatter", op));
  RM_RETURN_IF_ERROR(ValidateBuffers("ReduceScatter", send, recv, count));
  if (count == 0) return absl::OkStatus();
  const int n = size_, r = rank_;
  const size_t bytes = count * DataTypeSize(type);
  op_payload_bytes_ = bytes * n;
  op_formula_bytes_ = RingGatherBytes(bytes * n, n);
  if (n == 1) {
    if (send != recv) std::memcpy(recv, send, bytes);
  } else {
    // Ring: step t forwards the partial sum of block r-t-1 and reduces block r-t-2 into
    // scratch; the last step reduces this rank's own block straight into `recv`.
    char* partial = Scratch(bytes * n);
    Ring ring(r, n, bytes);
    SendStream& s = ring.send;
    RecvStream& v = ring.recv;
    for (int t = 0; t < n - 1; ++t) {
      const int sc = Mod(r - t - 1, n), rc = Mod(r - t - 2, n);
      s.pieces.push_back(SendPiece{(t == 0 ? send : partial) + sc * bytes, bytes});
      char* dst = t == n - 2 ? recv : partial + rc * bytes;
      v.pieces.push_back(RecvPiece{dst, bytes, send + rc * bytes});
    }
    RM_RETURN_IF_ERROR(Run(OpKind::kReduceScatter, type, KindOf(op), &s, 1, &v, 1, deadline));
  }
  if (op == ReduceOp::kAvg) kernels::DivideBy(type, recv, count, n);
  return absl::OkStatus();
}

absl::Status TcpCommunicator::BroadcastHost(const char* send, char* recv, size_t count,
                                            DataType type, int root, absl::Time deadline) {
  RM_RETURN_IF_ERROR(ValidateType("Broadcast", type));
  RM_RETURN_IF_ERROR(ValidatePeer("Broadcast", "root", root, rank_, size_, true));
  RM_RETURN_IF_ERROR(ValidateBuffers("Broadcast", rank_ == root ? send : recv, recv, count));
  if (count == 0) return absl::OkStatus();
  const int n = size_, r = rank_;
  const size_t bytes = count * DataTypeSize(type);
  op_payload_bytes_ = bytes;
  if (r == root && send != recv) std::memcpy(recv, send, bytes);
  if (n == 1) return absl::OkStatus();
  const int vr = Mod(r - root, n);              // position relative to the root
  const auto kind = kernels::ReduceKind::kSum;  // unused: nothing is reduced
  const bool chain = bytes > small_message_bytes_;
  op_formula_bytes_ = chain ? (vr != n - 1 ? bytes : 0) : BinomialChildren(vr, n) * bytes;
  if (chain) {
    // Pipelined chain root -> root+1 -> ...: each rank forwards segments as they land.
    SendStream s{Mod(r + 1, n), {SendPiece{recv, bytes}}};
    RecvStream v{Mod(r - 1, n), {RecvPiece{recv, bytes, nullptr}}};
    if (vr == 0) return Run(OpKind::kBroadcast, type, kind, &s, 1, nullptr, 0, deadline);
    if (vr == n - 1) return Run(OpKind::kBroadcast, type, kind, nullptr, 0, &v, 1, deadline);
    s.gate = 0;
    return Run(OpKind::kBroadcast, type, kind, &s, 1, &v, 1, deadline);
  }
  // Binomial tree: receive from the parent, then send to every child at once.
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      RecvStream v{Mod(vr - mask + root, n), {RecvPiece{recv, bytes, nullptr}}};
      RM_RETURN_IF_ERROR(Run(OpKind::kBroadcast, type, kind, nullptr, 0, &v, 1, deadline));
      break;
    }
    mask <<= 1;
  }
  absl::InlinedVector<SendStream, 8> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n)
      sends.push_back(SendStream{Mod(vr + mask + root, n), {SendPiece{recv, bytes}}});
  }
  if (sends.empty()) return absl::OkStatus();
  return Run(OpKind::kBroadcast, type, kind, sends.data(), static_cast<int>(sends.size()), nullptr,
             0, deadline);
}

}  // namespace ringmaster::comm
