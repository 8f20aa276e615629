#include "tools/cuda_emu/nccl_mesh.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <sstream>
#include <utility>

namespace rm_emu::nccl {
namespace {

constexpr uint32_t kHelloMagic = 0x6e63484c;  // "ncHL"
// Between connection attempts to a rank that does not listen yet.
constexpr int kRetryMillis = 2;
// poll() also wakes this often, so that a missed wakeup costs little.
constexpr int kPollMillis = 100;

template <typename... Args>
std::string Cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

sockaddr_un Address(const std::string& name, int rank, socklen_t* length) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  const std::string path = Cat(name, ".", rank);
  // Abstract namespace: a leading NUL, no file.
  const size_t n = std::min(path.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, path.data(), n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return address;
}

// Waits until `fd` is ready for `events` or the waker fires. ncclSuccess when ready.
ncclResult_t WaitFor(int fd, short events, const Waker& waker, std::string* error) {
  while (true) {
    if (waker.signalled()) {
      *error = "the communicator was aborted";
      return ncclInternalError;
    }
    pollfd p[2] = {{fd, events, 0}, {waker.fd(), POLLIN, 0}};
    const int n = poll(p, 2, kPollMillis);
    if (n < 0 && errno != EINTR) {
      *error = Cat("poll: ", std::strerror(errno));
      return ncclSystemError;
    }
    if (n > 0 && p[0].revents != 0) return ncclSuccess;
  }
}

ncclResult_t Closed(int peer, const char* what, std::string* error) {
  *error = Cat("rank ", peer, " closed its connection ", what,
               " (its process exited, or it aborted the communicator)");
  return ncclRemoteError;
}

ncclResult_t WriteAll(int fd, int peer, const void* data, size_t n, const Waker& waker,
                      std::string* error) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (errno == EAGAIN || errno == EINTR) {
      if (ncclResult_t r = WaitFor(fd, POLLOUT, waker, error); r != ncclSuccess) return r;
    } else {
      return Closed(peer, "while connecting", error);
    }
  }
  return ncclSuccess;
}

ncclResult_t ReadAll(int fd, int peer, void* data, size_t n, const Waker& waker,
                     std::string* error) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (ncclResult_t res = WaitFor(fd, POLLIN, waker, error); res != ncclSuccess) return res;
    } else {
      return Closed(peer, "while connecting", error);
    }
  }
  return ncclSuccess;
}

int NewSocket() { return socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0); }

// Connects to rank `peer`'s listener, retrying while it does not listen yet.
ncclResult_t ConnectTo(const std::string& name, int peer, const Waker& waker, int* out,
                       std::string* error) {
  socklen_t length;
  const sockaddr_un address = Address(name, peer, &length);
  while (true) {
    const int fd = NewSocket();
    if (fd < 0) {
      *error = Cat("socket: ", std::strerror(errno));
      return ncclSystemError;
    }
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
      *out = fd;
      return ncclSuccess;
    }
    const int err = errno;
    close(fd);
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR) {
      *error = Cat("connect to rank ", peer, ": ", std::strerror(err));
      return ncclSystemError;
    }
    // Not listening yet (or its backlog is full): wait a little, or for the waker.
    pollfd p = {waker.fd(), POLLIN, 0};
    (void)poll(&p, 1, kRetryMillis);
    if (waker.signalled()) {
      *error = "the communicator was aborted";
      return ncclInternalError;
    }
  }
}

ncclResult_t CheckHello(const Hello& hello, int nranks, std::string* error) {
  if (hello.magic != kHelloMagic) {
    *error = "a connection that is not cuda_emu NCCL's";
    return ncclSystemError;
  }
  if (hello.nranks != nranks) {
    *error = Cat("rank ", hello.rank, " joined this unique id with nranks ", hello.nranks,
                 ", this rank with nranks ", nranks, " (every rank must pass the same nranks)");
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "AllReduce";
    case Collective::kAllGather:
      return "AllGather";
    case Collective::kReduceScatter:
      return "ReduceScatter";
    case Collective::kBroadcast:
      return "Broadcast";
    case Collective::kNone:
      break;
  }
  return "?";
}

}  // namespace

Waker::Waker() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Waker::~Waker() {
  if (fd_ >= 0) close(fd_);
}

void Waker::Signal() {
  signalled_.store(true);
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

std::string Describe(const Header& h) {
  switch (h.kind) {
    case Kind::kData:
      return Cat("Send of ", h.count, " elements of type ", int{h.type});
    case Kind::kAck:
      return "the acknowledgement of a Send";
    case Kind::kEarly:
      return "the notice of a Send kept for a later Recv";
    case Kind::kCollective:
      break;
  }
  std::string what =
      Cat(CollectiveName(h.collective), " of ", h.count, " elements of type ", int{h.type});
  if (h.collective == Collective::kAllReduce || h.collective == Collective::kReduceScatter) {
    what += Cat(", op ", int{h.op});
  }
  if (h.collective == Collective::kBroadcast) what += Cat(", root ", h.root);
  return what;
}

ncclResult_t Mesh::Connect(const std::string& name, int rank, int nranks, const Hello& mine,
                           const Waker& waker, std::unique_ptr<Mesh>* mesh,
                           std::vector<Hello>* peers, std::string* error) {
  std::unique_ptr<Mesh> m(new Mesh(rank, nranks));
  peers->assign(nranks, Hello{});
  (*peers)[rank] = mine;
  (*peers)[rank].magic = kHelloMagic;
  Hello hello = (*peers)[rank];
  if (nranks == 1) {
    *mesh = std::move(m);
    return ncclSuccess;
  }
  // Kept for the communicator's life: the name stays taken, so that a second communicator
  // with the same id is refused rather than joined.
  const int listener = m->listener_ = NewSocket();
  if (listener < 0) {
    *error = Cat("socket: ", std::strerror(errno));
    return ncclSystemError;
  }
  socklen_t length;
  const sockaddr_un address = Address(name, rank, &length);
  if (bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    if (errno == EADDRINUSE) {
      *error = Cat("rank ", rank,
                   " of this unique id is in use already (a unique id makes one communicator; "
                   "call ncclGetUniqueId for each)");
      return ncclInvalidUsage;
    }
    *error = Cat("bind: ", std::strerror(errno));
    return ncclSystemError;
  }
  if (listen(listener, nranks) != 0) {
    *error = Cat("listen: ", std::strerror(errno));
    return ncclSystemError;
  }
  // Lower ranks: connect, introduce ourselves, read their answer. (A lower rank answers
  // once it is connected to its own lower ranks: by induction, nobody waits in a cycle.)
  for (int peer = 0; peer < rank; ++peer) {
    if (ncclResult_t r = ConnectTo(name, peer, waker, &m->fds_[peer], error); r != ncclSuccess) {
      return r;
    }
    if (ncclResult_t r = WriteAll(m->fds_[peer], peer, &hello, sizeof(hello), waker, error);
        r != ncclSuccess) {
      return r;
    }
    Hello& theirs = (*peers)[peer];
    if (ncclResult_t r = ReadAll(m->fds_[peer], peer, &theirs, sizeof(theirs), waker, error);
        r != ncclSuccess) {
      return r;
    }
    if (ncclResult_t r = CheckHello(theirs, nranks, error); r != ncclSuccess) return r;
  }
  // Higher ranks: accept, read who it is, answer.
  for (int accepted = rank + 1; accepted < nranks; ++accepted) {
    int fd = -1;
    while (fd < 0) {
      if (ncclResult_t r = WaitFor(listener, POLLIN, waker, error); r != ncclSuccess) return r;
      fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        *error = Cat("accept: ", std::strerror(errno));
        return ncclSystemError;
      }
    }
    Hello theirs;
    ncclResult_t r = ReadAll(fd, -1, &theirs, sizeof(theirs), waker, error);
    if (r == ncclSuccess) {
      r = CheckHello(theirs, nranks, error);
      // Answer even a peer that disagrees, so that it can tell what is wrong too.
      std::string ignored;
      if (r == ncclInvalidUsage) {
        (void)WriteAll(fd, theirs.rank, &hello, sizeof(hello), waker, &ignored);
      }
    }
    if (r == ncclSuccess &&
        (theirs.rank <= rank || theirs.rank >= nranks || m->fds_[theirs.rank] >= 0)) {
      *error = Cat("a peer says it is rank ", theirs.rank, ", which is not expected here");
      r = ncclInvalidUsage;
    }
    if (r != ncclSuccess) {
      close(fd);
      return r;
    }
    m->fds_[theirs.rank] = fd;
    (*peers)[theirs.rank] = theirs;
    if (r = WriteAll(fd, theirs.rank, &hello, sizeof(hello), waker, error); r != ncclSuccess) {
      return r;
    }
  }
  *mesh = std::move(m);
  return ncclSuccess;
}

Mesh::~Mesh() {
  if (listener_ >= 0) close(listener_);
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

void Mesh::Shutdown() {
  for (int fd : fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
}

namespace {

// One peer's side of an Exchange.
struct Channel {
  int fd = -1;
  struct Out {
    Header header;
    const char* data;
    size_t done = 0;  // of sizeof(Header) + header.bytes
  };
  std::deque<Out> out;
  std::vector<Mesh::Expect> expected;  // in order, taken as they match
  std::vector<bool> taken;
  // The message being read.
  Header in_header;
  size_t in_done = 0;  // of sizeof(Header) + bytes
  int in_match = -1;   // index into expected, once the header is in (kKept: into Mesh::early_)
  static constexpr int kKept = -2;
  char* kept = nullptr;  // where a kept kData's payload goes

  // Queues a payload-less answer to `of` (a kAck or a kEarly).
  void Answer(const Header& of, Kind kind) {
    Header h = of;
    h.kind = kind;
    h.bytes = 0;
    out.push_back({h, nullptr});
  }

  bool Waiting() const {
    for (bool t : taken) {
      if (!t) return true;
    }
    return in_done > 0;
  }
};

}  // namespace

ncclResult_t Mesh::Exchange(std::vector<Send> sends, std::vector<Expect> expects,
                            const Waker& waker, std::string* error, const Waker* also) {
  std::vector<Channel> channels(fds_.size());
  for (size_t p = 0; p < fds_.size(); ++p) channels[p].fd = fds_[p];
  for (const Send& s : sends) {
    channels[s.peer].out.push_back({s.header, static_cast<const char*>(s.data)});
  }
  for (const Expect& e : expects) {
    channels[e.peer].expected.push_back(e);
    channels[e.peer].taken.push_back(false);
  }
  // Take kept kData in order: each peer's first kData Expects, one by one.
  for (size_t p = 0; p < channels.size(); ++p) {
    Channel& c = channels[p];
    for (size_t e = 0; e < c.expected.size() && !early_[p].empty(); ++e) {
      if (c.expected[e].header.kind != Kind::kData) continue;
      Early& kept = early_[p].front();
      if (std::memcmp(&kept.header, &c.expected[e].header, sizeof(Header)) != 0) {
        *error = Cat("rank ", p, " sent ", Describe(kept.header), " where this rank ", rank_,
                     " expected ", Describe(c.expected[e].header),
                     " (the ranks called different operations: on a GPU they would hang)");
        return ncclInvalidUsage;
      }
      if (!kept.payload.empty()) {
        std::memcpy(c.expected[e].dest, kept.payload.data(), kept.payload.size());
      }
      c.taken[e] = true;
      if (c.expected[e].ack) c.Answer(kept.header, Kind::kAck);
      early_[p].pop_front();
    }
  }
  std::vector<pollfd> polled;
  std::vector<int> peer_of;
  while (true) {
    if (waker.signalled() || (also != nullptr && also->signalled())) {
      *error = "the communicator was aborted";
      return ncclInternalError;
    }
    polled.clear();
    peer_of.clear();
    for (size_t p = 0; p < channels.size(); ++p) {
      const Channel& c = channels[p];
      short events = 0;
      if (!c.out.empty()) events |= POLLOUT;
      if (c.Waiting()) events |= POLLIN;
      if (events != 0) {
        polled.push_back({c.fd, events, 0});
        peer_of.push_back(static_cast<int>(p));
      }
    }
    if (polled.empty()) return ncclSuccess;
    polled.push_back({waker.fd(), POLLIN, 0});
    if (also != nullptr) polled.push_back({also->fd(), POLLIN, 0});
    const int n = poll(polled.data(), polled.size(), kPollMillis);
    if (n < 0 && errno != EINTR) {
      *error = Cat("poll: ", std::strerror(errno));
      return ncclSystemError;
    }
    if (n <= 0) continue;
    for (size_t i = 0; i < peer_of.size(); ++i) {
      const int peer = peer_of[i];
      Channel& c = channels[peer];
      const short revents = polled[i].revents;
      if (revents == 0) continue;
      // Write what we can.
      while ((revents & (POLLOUT | POLLERR | POLLHUP)) && !c.out.empty()) {
        Channel::Out& o = c.out.front();
        const size_t total = sizeof(Header) + o.header.bytes;
        const char* from = o.done < sizeof(Header)
                               ? reinterpret_cast<const char*>(&o.header) + o.done
                               : o.data + (o.done - sizeof(Header));
        const size_t left = o.done < sizeof(Header) ? sizeof(Header) - o.done : total - o.done;
        const ssize_t w = send(c.fd, from, left, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (w <= 0) return Closed(peer, "while this rank was sending to it", error);
        o.done += static_cast<size_t>(w);
        if (o.done == total) c.out.pop_front();
      }
      // Read what has come, when we expect something of this peer.
      while ((revents & (POLLIN | POLLERR | POLLHUP)) && c.Waiting()) {
        char* to;
        size_t left;
        if (c.in_done < sizeof(Header)) {
          to = reinterpret_cast<char*>(&c.in_header) + c.in_done;
          left = sizeof(Header) - c.in_done;
        } else {
          char* dest = c.in_match == Channel::kKept
                           ? c.kept
                           : static_cast<char*>(c.expected[c.in_match].dest);
          to = dest + (c.in_done - sizeof(Header));
          left = sizeof(Header) + c.in_header.bytes - c.in_done;
        }
        ssize_t r = left == 0 ? 0 : recv(c.fd, to, left, 0);
        if (left != 0) {
          if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
          if (r <= 0) return Closed(peer, "while this rank waited for its data", error);
          c.in_done += static_cast<size_t>(r);
        }
        if (c.in_done == sizeof(Header) && c.in_match == -1 && c.in_header.kind == Kind::kEarly) {
          // The peer keeps our kData for a later Recv. If we keep one of its own while we
          // wait for it to take ours, both ranks sent first.
          c.in_done = 0;
          bool waits_for_ack = false;
          for (size_t e = 0; e < c.expected.size(); ++e) {
            waits_for_ack |= !c.taken[e] && c.expected[e].header.kind == Kind::kAck;
          }
          if (waits_for_ack && !early_[peer].empty()) {
            *error = Cat("rank ", peer, " sent ", Describe(early_[peer].front().header),
                         " where this rank ", rank_,
                         " expected the acknowledgement of a Send, and waits for this rank's "
                         "Send in turn (both ranks send first: on a GPU they would hang)");
            return ncclInvalidUsage;
          }
          continue;
        }
        if (c.in_done == sizeof(Header) && c.in_match == -1) {
          // The header is in: match it to the first open expectation of its kind.
          for (size_t e = 0; e < c.expected.size() && c.in_match < 0; ++e) {
            if (!c.taken[e] && c.expected[e].header.kind == c.in_header.kind) {
              c.in_match = static_cast<int>(e);
            }
          }
          if (c.in_match < 0 && c.in_header.kind == Kind::kData) {
            // No Recv of this peer's here yet: keep the data for a later Exchange's.
            early_[peer].push_back({c.in_header, std::vector<char>(c.in_header.bytes)});
            c.kept = early_[peer].back().payload.data();
            c.in_match = Channel::kKept;
          }
          const Header* want = c.in_match >= 0 ? &c.expected[c.in_match].header : nullptr;
          if (c.in_match == Channel::kKept) want = &c.in_header;
          if (want == nullptr || std::memcmp(want, &c.in_header, sizeof(Header)) != 0) {
            std::string expected_text;
            for (size_t e = 0; e < c.expected.size(); ++e) {
              if (!c.taken[e]) {
                expected_text +=
                    (expected_text.empty() ? "" : " or ") + Describe(c.expected[e].header);
              }
            }
            *error = Cat("rank ", peer, " sent ", Describe(c.in_header), " where this rank ", rank_,
                         " expected ", expected_text,
                         " (the ranks called different operations: on a GPU they would hang)");
            return ncclInvalidUsage;
          }
        }
        if (c.in_match == Channel::kKept && c.in_done == sizeof(Header) + c.in_header.bytes) {
          c.Answer(c.in_header, Kind::kEarly);
          c.in_match = -1;
          c.in_done = 0;
          break;  // back through poll() to send the notice
        }
        if (c.in_match >= 0 && c.in_done == sizeof(Header) + c.in_header.bytes) {
          const Expect& e = c.expected[c.in_match];
          c.taken[c.in_match] = true;
          if (e.ack) c.Answer(e.header, Kind::kAck);
          c.in_match = -1;
          c.in_done = 0;
          // Come back through poll() for any ack to send.
          if (!c.out.empty()) break;
        }
      }
    }
  }
}

}  // namespace rm_emu::nccl
