// The program channel: a command job's program and its rank's ringtrainer, over a Unix stream
// socket. The runner listens at a path it puts in the program's environment
// (RINGMASTER_CONTROL_SOCKET) before it starts the program; the program (python/ringmaster)
// connects and writes newline-delimited JSON objects, each with a "type":
//   program → runner: hello {pid, inprocess}, report {step, loss, samples, tokens, scalars,
//                     time}, heartbeat (every 0.5 s from a daemon thread), world_done {epoch}
//   runner → program: stop {reason}, world {epoch, rank, world_size, ...} (in-process only)
// The channel moves messages; what they mean is the runner's business.
//
// One program at a time: a new connection replaces the current one (a reconnect, say after
// the program's module was reloaded), after the current one's complete messages were read.
// A line that is not a JSON object with a string "type" is logged, naming the socket and the
// line, and skipped; so is a line longer than kMaxLineBytes.
//
// Thread-safety: not synchronised; one thread owns a ProgramChannel. Nothing blocks but Send,
// which waits at most kSendTimeout for room in the socket's buffer.
#ifndef RINGMASTER_WORKER_PROGRAM_CHANNEL_H_
#define RINGMASTER_WORKER_PROGRAM_CHANNEL_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "nlohmann/json.hpp"

namespace ringmaster::worker {

class ProgramChannel {
 public:
  static constexpr size_t kMaxLineBytes = 1 << 20;
  static constexpr absl::Duration kSendTimeout = absl::Seconds(1);

  // Listens at `socket_path` (a stale socket file there is replaced). A path longer than a
  // sockaddr_un holds (107 bytes) is bound through its directory's /proc/self/fd entry; the
  // program connects to it the same way (python/ringmaster does). INVALID_ARGUMENT when the
  // path names no file, or its file name alone is too long; FAILED_PRECONDITION when it
  // cannot be bound (its directory missing or not writable). `clock` (not owned, never
  // null) dates last_heard().
  static absl::StatusOr<std::unique_ptr<ProgramChannel>> Listen(std::string socket_path,
                                                                Clock* clock = Clock::Real());
  // Closes the sockets and removes the socket file, unless another channel has replaced it.
  ~ProgramChannel();
  ProgramChannel(const ProgramChannel&) = delete;
  ProgramChannel& operator=(const ProgramChannel&) = delete;

  const std::string& path() const { return path_; }

  // Non-blocking: accepts a waiting connection, reads what has arrived and returns the whole
  // messages received since the last call, in order. A "hello" sets hello_inprocess().
  std::vector<nlohmann::json> Poll();

  // Whether a program is connected (until it closes its end and Poll sees that).
  bool connected() const { return conn_fd_ >= 0; }
  // When the program's last bytes (or its connection) arrived; InfinitePast before any.
  absl::Time last_heard() const { return last_heard_; }
  // Whether the program's last hello said "inprocess": true.
  bool hello_inprocess() const { return hello_inprocess_; }
  // Whether the current connection said hello.
  bool said_hello() const { return said_hello_; }

  // Writes `message` as one line. FAILED_PRECONDITION when no program is connected;
  // UNAVAILABLE when the program closed its end or the line did not fit within kSendTimeout
  // (the connection is then dropped: a half-written line would corrupt the next).
  absl::Status Send(const nlohmann::json& message);

 private:
  ProgramChannel(std::string path, int listen_fd, Clock* clock)
      : path_(std::move(path)), listen_fd_(listen_fd), clock_(clock) {}
  void Accept();
  void ReadAvailable(std::vector<nlohmann::json>& out);
  void TakeLines(std::vector<nlohmann::json>& out);
  void CloseConnection();

  std::string path_;
  int listen_fd_ = -1;
  int conn_fd_ = -1;
  ino_t socket_inode_ = 0;  // of the socket file it bound (the destructor removes only that)
  Clock* clock_;
  std::string buffer_;         // bytes after the last complete line
  bool skipping_long_ = false;  // dropping a line longer than kMaxLineBytes until its end
  absl::Time last_heard_ = absl::InfinitePast();
  bool hello_inprocess_ = false;
  bool said_hello_ = false;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_PROGRAM_CHANNEL_H_
