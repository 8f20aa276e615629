#include "worker/program_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::worker {

namespace {

// Binds `fd` to `path`. A path longer than a sockaddr_un holds is bound through its
// directory's /proc/self/fd entry (the socket file is still made at `path`).
absl::Status BindUnix(int fd, const std::string& path) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::string bind_path = path;
  int dir_fd = -1;
  if (path.size() >= sizeof(address.sun_path)) {
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    dir_fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot listen at program channel socket ", path, ": its directory: ", strerror(errno)));
    }
    bind_path = absl::StrCat("/proc/self/fd/", dir_fd, "/", path.substr(slash + 1));
  }
  if (bind_path.size() >= sizeof(address.sun_path)) {
    if (dir_fd >= 0) close(dir_fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "program channel socket path '", path, "': its file name is too long for a Unix socket"));
  }
  std::memcpy(address.sun_path, bind_path.data(), bind_path.size());
  const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int err = errno;
  if (dir_fd >= 0) close(dir_fd);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen at program channel socket ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgramChannel>> ProgramChannel::Listen(std::string socket_path,
                                                                       Clock* clock) {
  if (socket_path.empty() || socket_path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("program channel socket path '", socket_path, "' names no file"));
  }
  // A socket file left by an earlier epoch's runner (or a crashed one) is stale: nobody
  // listens there. Anything else at the path is not ours to remove.
  struct stat st;
  if (lstat(socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(socket_path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(AF_UNIX): ", strerror(errno)));
  if (absl::Status s = BindUnix(fd, socket_path); !s.ok()) {
    close(fd);
    return s;
  }
  if (listen(fd, 4) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen at program channel socket ", socket_path, ": ", strerror(err)));
  }
  std::unique_ptr<ProgramChannel> channel(new ProgramChannel(std::move(socket_path), fd, clock));
  if (stat(channel->path_.c_str(), &st) == 0) channel->socket_inode_ = st.st_ino;
  return channel;
}

ProgramChannel::~ProgramChannel() {
  CloseConnection();
  if (listen_fd_ >= 0) close(listen_fd_);
  // Only its own socket file: a newer channel may listen at the same path already.
  struct stat st;
  if (lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == socket_inode_) {
    unlink(path_.c_str());
  }
}

void ProgramChannel::CloseConnection() {
  if (conn_fd_ >= 0) close(conn_fd_);
  conn_fd_ = -1;
  buffer_.clear();
  skipping_long_ = false;
}

void ProgramChannel::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        LOG(WARNING) << "program channel " << path_ << ": accept: " << strerror(errno);
      }
      return;
    }
    if (conn_fd_ >= 0) {
      LOG(INFO) << "program channel " << path_ << ": a new connection replaces the current one";
    }
    CloseConnection();
    conn_fd_ = fd;
    said_hello_ = false;
    hello_inprocess_ = false;
    last_heard_ = clock_->Now();
  }
}

std::vector<nlohmann::json> ProgramChannel::Poll() {
  std::vector<nlohmann::json> out;
  // The current connection's messages first: a reconnect does not lose what was sent before.
  ReadAvailable(out);
  Accept();
  ReadAvailable(out);
  return out;
}

void ProgramChannel::ReadAvailable(std::vector<nlohmann::json>& out) {
  char chunk[64 * 1024];
  while (conn_fd_ >= 0) {
    const ssize_t n = recv(conn_fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // the program closed its end (or the connection failed)
      if (n < 0) LOG(WARNING) << "program channel " << path_ << ": recv: " << strerror(errno);
      TakeLines(out);
      CloseConnection();
      return;
    }
    last_heard_ = clock_->Now();
    buffer_.append(chunk, static_cast<size_t>(n));
    TakeLines(out);
  }
}

void ProgramChannel::TakeLines(std::vector<nlohmann::json>& out) {
  size_t start = 0;
  while (true) {
    const size_t newline = buffer_.find('\n', start);
    if (newline == std::string::npos) break;
    const std::string_view line(buffer_.data() + start, newline - start);
    start = newline + 1;
    if (skipping_long_) {  // the end of a line already reported as too long
      skipping_long_ = false;
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json message = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (message.is_discarded() || !message.is_object() || !message.contains("type") ||
        !message["type"].is_string()) {
      LOG(WARNING) << "program channel " << path_
                   << ": skipped a line that is not a JSON object with a string \"type\": "
                   << line.substr(0, 200);
      continue;
    }
    if (message["type"] == "hello") {
      said_hello_ = true;
      auto inprocess = message.find("inprocess");
      hello_inprocess_ =
          inprocess != message.end() && inprocess->is_boolean() && inprocess->get<bool>();
    }
    out.push_back(std::move(message));
  }
  buffer_.erase(0, start);
  if (buffer_.size() > kMaxLineBytes) {
    LOG(WARNING) << "program channel " << path_ << ": skipped a line longer than "
                 << kMaxLineBytes << " bytes: " << buffer_.substr(0, 200);
    buffer_.clear();
    skipping_long_ = true;
  }
}

absl::Status ProgramChannel::Send(const nlohmann::json& message) {
  if (conn_fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no program is connected to ", path_, " (it has not called the module)"));
  }
  const std::string line = message.dump() + "\n";
  const absl::Time deadline = absl::Now() + kSendTimeout;
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n =
        send(conn_fd_, line.data() + sent, line.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const absl::Duration left = deadline - absl::Now();
      pollfd p = {conn_fd_, POLLOUT, 0};
      if (left > absl::ZeroDuration() &&
          poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) >= 0) {
        if (absl::Now() < deadline) continue;
      }
      CloseConnection();
      return absl::UnavailableError(absl::StrCat(
          "the program at ", path_, " did not read its channel for ",
          absl::FormatDuration(kSendTimeout), "; connection dropped"));
    }
    const int err = errno;
    CloseConnection();
    return absl::UnavailableError(
        absl::StrCat("cannot write to the program at ", path_, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::worker
