// Thin POSIX socket helpers for the TCP backend: every blocking step has a deadline and
// every failure names the address and what to check.
#ifndef RINGMASTER_COMM_TCP_SOCKET_H_
#define RINGMASTER_COMM_TCP_SOCKET_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ringmaster::comm::tcp {

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;
};

// Parses "host:port" (IPv4 literal or name; "[v6]:port" too). INVALID_ARGUMENT names it.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

// Binds and listens on host:port (port 0 = any free port); returns the socket and the port
// actually bound. Errors name the address (e.g. "address already in use").
absl::StatusOr<Fd> Listen(const std::string& host, int port, int backlog, int* bound_port);

// Accepts one connection, waiting until `deadline` or until `wake_fd` (an eventfd, -1 for
// none) becomes readable (then ABORTED). Returns the connected socket and the peer's address.
absl::StatusOr<Fd> Accept(int listen_fd, absl::Time deadline, int wake_fd, std::string* peer);

// Connects to `address`, retrying a refused connection until `refused_deadline` (the peer
// may still be starting) and giving up at `deadline`. UNAVAILABLE says "refused" for a port
// nobody listens on, DEADLINE_EXCEEDED for no answer.
absl::StatusOr<Fd> Connect(const HostPort& address, absl::Time refused_deadline,
                           absl::Time deadline);

// Sets TCP_NODELAY, close-on-exec and the buffer sizes (0 = leave the kernel default).
absl::Status ConfigureDataSocket(int fd, int buffer_bytes);
absl::Status SetNonBlocking(int fd, bool on);

// Blocking-style exact read/write with a deadline over a non-blocking socket (for the
// handshake). UNAVAILABLE when the peer closes, DEADLINE_EXCEEDED at the deadline.
absl::Status WriteFull(int fd, const void* data, size_t size, absl::Time deadline);
absl::Status ReadFull(int fd, void* data, size_t size, absl::Time deadline);

}  // namespace ringmaster::comm::tcp

#endif  // RINGMASTER_COMM_TCP_SOCKET_H_
