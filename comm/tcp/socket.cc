#include "comm/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::comm::tcp {
namespace {

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string port_text = absl::StrCat(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host \"", host, "\": ", gai_strerror(rc)));
  }
  return result;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() { reset(); }

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  HostPort out;
  size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", text, "\" is not of the form host:port"));
  }
  absl::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  out.host = std::string(host);
  if (!absl::SimpleAtoi(text.substr(colon + 1), &out.port) || out.port <= 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", text, "\" has no valid port (1-65535)"));
  }
  return out;
}

absl::Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return ErrnoToStatus(errno, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return ErrnoToStatus(errno, "fcntl(F_SETFL)");
  return absl::OkStatus();
}

absl::Status ConfigureDataSocket(int fd, int buffer_bytes) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoToStatus(errno, "setsockopt(TCP_NODELAY)");
  }
  if (buffer_bytes > 0) {
    // Best effort: the kernel caps these at net.core.{w,r}mem_max.
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return ErrnoToStatus(errno, "fcntl(FD_CLOEXEC)");
  return SetNonBlocking(fd, true);
}

absl::StatusOr<Fd> Listen(const std::string& host, int port, int backlog, int* bound_port) {
  RM_ASSIGN_OR_RETURN(addrinfo * list, Resolve(host, port, /*passive=*/true));
  absl::Status last = absl::UnavailableError(absl::StrCat("no address to listen on for ", host));
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoToStatus(errno, "socket");
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    std::string where = HostPort{host, port}.ToString();
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoToStatus(
          errno, absl::StrCat("bind ", where, " (is the port in use, or the host not local?)"));
      continue;
    }
    if (listen(fd.get(), backlog) != 0) {
      last = ErrnoToStatus(errno, absl::StrCat("listen ", where));
      continue;
    }
    sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      last = ErrnoToStatus(errno, "getsockname");
      continue;
    }
    *bound_port = addr.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    freeaddrinfo(list);
    return fd;
  }
  freeaddrinfo(list);
  return last;
}

absl::StatusOr<Fd> Accept(int listen_fd, absl::Time deadline, int wake_fd, std::string* peer) {
  while (true) {
    sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      char text[INET6_ADDRSTRLEN] = "?";
      int port = 0;
      if (addr.ss_family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&addr);
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
        port = ntohs(in->sin_port);
      } else if (addr.ss_family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
        port = ntohs(in6->sin6_port);
      }
      *peer = HostPort{text, port}.ToString();
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      return ErrnoToStatus(errno, "accept");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("no connection arrived before the deadline");
    }
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int rc = poll(fds, wake_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(accept)");
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) {
      return absl::AbortedError("aborted while waiting for connections");
    }
  }
}

absl::StatusOr<Fd> Connect(const HostPort& address, absl::Time refused_deadline,
                           absl::Time deadline) {
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    RM_ASSIGN_OR_RETURN(addrinfo * list, Resolve(address.host, address.port, /*passive=*/false));
    absl::Status last;
    for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!fd.valid()) {
        last = ErrnoToStatus(errno, "socket");
        continue;
      }
      int rc = connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno != EINPROGRESS) {
        last = ErrnoToStatus(errno, absl::StrCat("connect to ", address.ToString()));
        continue;
      }
      if (rc != 0) {
        // Wait for the connection to finish or fail.
        while (true) {
          pollfd p = {fd.get(), POLLOUT, 0};
          int prc = poll(&p, 1, PollTimeoutMs(deadline));
          if (prc < 0 && errno == EINTR) continue;
          if (prc < 0) return ErrnoToStatus(errno, "poll(connect)");
          if (prc > 0) break;
          if (absl::Now() >= deadline) {
            freeaddrinfo(list);
            return absl::DeadlineExceededError(
                absl::StrCat("connect to ", address.ToString(),
                             ": no answer before the deadline (is a firewall dropping packets?)"));
          }
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last = ErrnoToStatus(err, absl::StrCat("connect to ", address.ToString()));
          continue;
        }
      }
      freeaddrinfo(list);
      return fd;
    }
    freeaddrinfo(list);
    absl::Time now = absl::Now();
    if (now >= refused_deadline || now >= deadline) {
      return absl::Status(last.code(), absl::StrCat(last.message(),
                                                    " (nothing is listening there: did that "
                                                    "rank exit, or is the address stale?)"));
    }
    absl::SleepFor(std::min(backoff, refused_deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(100));
  }
}

absl::Status WriteFull(int fd, const void* data, size_t size, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoToStatus(errno, "send");
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("send timed out");
    pollfd pfd = {fd, POLLOUT, 0};
    poll(&pfd, 1, PollTimeoutMs(deadline));
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed by the other side");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoToStatus(errno, "recv");
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("receive timed out");
    pollfd pfd = {fd, POLLIN, 0};
    poll(&pfd, 1, PollTimeoutMs(deadline));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::comm::tcp
