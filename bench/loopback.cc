#include "bench/loopback.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/time/clock.h"
#include "comm/tcp/socket.h"
#include "common/status_macros.h"

namespace ringmaster::bench {
namespace {

using comm::tcp::Fd;

constexpr size_t kChunk = 1 << 20;

// Sends on `out` (if valid) and receives on `in` (if valid) until `duration` has passed;
// returns bytes received. The sender stops by closing; the receiver drains to EOF.
uint64_t Pump(int out, int in, absl::Duration duration) {
  std::vector<char> buf(kChunk, 1), sink(kChunk);
  uint64_t received = 0;
  absl::Time end = absl::Now() + duration;
  bool sending = out >= 0, receiving = in >= 0;
  while (sending || receiving) {
    if (sending && absl::Now() >= end) {
      shutdown(out, SHUT_WR);
      sending = false;
    }
    pollfd fds[2];
    int nfds = 0;
    if (sending) fds[nfds++] = {out, POLLOUT, 0};
    if (receiving) fds[nfds++] = {in, POLLIN, 0};
    if (nfds == 0) break;
    poll(fds, nfds, 100);
    if (sending) send(out, buf.data(), buf.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (receiving) {
      ssize_t n = recv(in, sink.data(), sink.size(), MSG_DONTWAIT);
      if (n > 0) received += n;
      if (n == 0) receiving = false;
    }
  }
  return received;
}

absl::StatusOr<double> RunPattern(bool both_ways, absl::Duration duration) {
  int port = 0;
  RM_ASSIGN_OR_RETURN(Fd listener, comm::tcp::Listen("127.0.0.1", 0, 4, &port));
  absl::Time far = absl::Now() + absl::Seconds(10);
  comm::tcp::HostPort hp{"127.0.0.1", port};
  // a_to_b: parent -> child; b_to_a: child -> parent.
  RM_ASSIGN_OR_RETURN(Fd a_out, comm::tcp::Connect(hp, far, far));
  RM_ASSIGN_OR_RETURN(Fd b_out, comm::tcp::Connect(hp, far, far));
  std::string peer;
  RM_ASSIGN_OR_RETURN(Fd b_in, comm::tcp::Accept(listener.get(), far, -1, &peer));
  RM_ASSIGN_OR_RETURN(Fd a_in, comm::tcp::Accept(listener.get(), far, -1, &peer));
  for (int fd : {a_out.get(), b_out.get(), a_in.get(), b_in.get()}) {
    RM_RETURN_IF_ERROR(comm::tcp::ConfigureDataSocket(fd, 4 << 20));
  }
  int result_pipe[2];
  if (pipe(result_pipe) != 0) return ErrnoToStatus(errno, "pipe");
  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    uint64_t got = Pump(both_ways ? b_out.get() : -1, b_in.get(), duration);
    (void)!write(result_pipe[1], &got, sizeof(got));
    _exit(0);
  }
  absl::Time start = absl::Now();
  uint64_t mine = Pump(a_out.get(), both_ways ? a_in.get() : -1, duration);
  uint64_t theirs = 0;
  (void)!read(result_pipe[0], &theirs, sizeof(theirs));
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int status;
  waitpid(pid, &status, 0);
  close(result_pipe[0]);
  close(result_pipe[1]);
  double per_direction = both_ways ? (mine + theirs) / 2.0 : static_cast<double>(theirs);
  return per_direction / seconds / 1e9;
}

}  // namespace

absl::StatusOr<LoopbackResult> MeasureLoopback(absl::Duration duration) {
  LoopbackResult result;
  RM_ASSIGN_OR_RETURN(result.one_way_gbps, RunPattern(false, duration));
  RM_ASSIGN_OR_RETURN(result.bidirectional_gbps, RunPattern(true, duration));
  return result;
}

}  // namespace ringmaster::bench
