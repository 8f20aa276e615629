#include "worker/torch_store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::worker {

struct TorchStoreServer::Connection {
  int fd = -1;
  std::string peer;
  bool closed = false;  // guarded by TorchStoreServer::mu_
  std::atomic<bool> done{false};
  std::thread thread;
};

namespace {

// What a newer PyTorch (2.x) client sends after its first byte (c10d::detail::validationMagicNumber).
constexpr uint64_t kValidateMagic = 0x3C85F7CE;

std::string Errno(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Reads exactly n bytes before `deadline`.
absl::Status ReadFull(int fd, char* buf, size_t n, absl::Time deadline) {
  while (n > 0) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, PollTimeoutMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::InternalError(Errno("poll"));
    if (ready == 0) {
      return absl::DeadlineExceededError("the rest of the request did not come in time");
    }
    ssize_t got = recv(fd, buf, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return absl::UnavailableError(Errno("recv"));
    if (got == 0) return absl::UnavailableError("the peer closed the connection mid-request");
    buf += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const std::string& data, absl::Time deadline) {
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    int ready = poll(&p, 1, PollTimeoutMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::InternalError(Errno("poll"));
    if (ready == 0) return absl::DeadlineExceededError("the reply could not be sent in time");
    ssize_t sent = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (sent < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (sent < 0) return absl::UnavailableError(Errno("send"));
    off += static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

void AppendU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<char*>(&v), 8); }
void AppendI64(std::string& out, int64_t v) { out.append(reinterpret_cast<char*>(&v), 8); }
void AppendValue(std::string& out, const std::string& v) {
  AppendU64(out, v.size());
  out.append(v);
}

std::string PeerName(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return absl::StrCat("[", host, "]:", port);
}

// A bound, listening socket for host:port, or an error naming them.
absl::StatusOr<int> Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TorchStoreServer Options.host \"", host,
                                                   "\": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = Errno("socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last_error = Errno("bind/listen");
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("TorchStoreServer cannot listen on ", host, ":", port, ": ", last_error));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TorchStoreServer>> TorchStoreServer::Start(
    const Options& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TorchStoreServer Options.port ", options.port, " is not in 0..65535 (0: pick one)"));
  }
  absl::StatusOr<int> fd = Listen(options.host, options.port);
  if (!fd.ok()) return fd.status();
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status error = absl::InternalError(Errno("getsockname"));
    close(*fd);
    return error;
  }
  int port = addr.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                 : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    absl::Status error = absl::InternalError(Errno("pipe2"));
    close(*fd);
    return error;
  }
  std::unique_ptr<TorchStoreServer> server(
      new TorchStoreServer(options, *fd, port, wake[0], wake[1]));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TorchStoreServer::TorchStoreServer(const Options& options, int listen_fd, int port,
                                   int wake_read, int wake_write)
    : options_(options),
      listen_fd_(listen_fd),
      port_(port),
      wake_read_(wake_read),
      wake_write_(wake_write) {}

TorchStoreServer::~TorchStoreServer() { Stop(); }

void TorchStoreServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& c : connections_) {
      if (!c->closed) shutdown(c->fd, SHUT_RDWR);  // wakes its thread's recv
    }
  }
  char byte = 0;
  while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) c->thread.join();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

std::vector<std::string> TorchStoreServer::Keys() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (const auto& [key, value] : data_) keys.push_back(key);
  return keys;
}

int64_t TorchStoreServer::connections_accepted() const {
  absl::ReaderMutexLock lock(&mu_);
  return connections_accepted_;
}

void TorchStoreServer::ReapFinished() {
  std::vector<std::unique_ptr<Connection>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

void TorchStoreServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      LOG(ERROR) << "torch store :" << port_ << ": " << Errno("poll") << "; accepting no more";
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    ReapFinished();
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        LOG(WARNING) << "torch store :" << port_ << ": " << Errno("accept");
      }
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->peer = PeerName(addr);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    ++connections_accepted_;
    Connection* c = connection.get();
    connections_.push_back(std::move(connection));
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

void TorchStoreServer::Serve(Connection* connection) {
  for (;;) {
    uint8_t query = 0;
    ssize_t got = recv(connection->fd, &query, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got < 0) {
        LOG(WARNING) << "torch store :" << port_ << ": connection from " << connection->peer
                     << ": " << Errno("recv");
      }
      break;  // the client closed the connection between requests: its normal end
    }
    absl::Status status = HandleRequest(*connection, query);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        LOG(WARNING) << "torch store :" << port_ << ": closing the connection from "
                     << connection->peer << " after query byte " << static_cast<int>(query)
                     << ": " << status;
      }
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  connection->closed = true;
  close(connection->fd);
  connection->done.store(true);
}

absl::StatusOr<std::string> TorchStoreServer::ReadString(Connection& connection) {
  absl::Time deadline = absl::Now() + options_.message_timeout;
  uint64_t size = 0;
  absl::Status status = ReadFull(connection.fd, reinterpret_cast<char*>(&size), 8, deadline);
  if (!status.ok()) return status;
  if (size > options_.max_value_bytes && (size & 0xffffffffu) == kValidateMagic) {
    // A newer PyTorch's (2.x) first message: VALIDATE (0, read as SET here) and a uint32 magic.
    return absl::FailedPreconditionError(
        "a newer PyTorch client (its VALIDATE message, magic 0x3C85F7CE): this store speaks "
        "PyTorch 1.13's TCPStore protocol only");
  }
  if (size > options_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a key or value of ", size, " bytes, more than Options.max_value_bytes (",
                     options_.max_value_bytes, ")"));
  }
  std::string value(size, '\0');
  status = ReadFull(connection.fd, value.data(), size, deadline);
  if (!status.ok()) return status;
  return value;
}

absl::StatusOr<std::vector<std::string>> TorchStoreServer::ReadKeys(Connection& connection) {
  uint64_t count = 0;
  absl::Status status = ReadFull(connection.fd, reinterpret_cast<char*>(&count), 8,
                                 absl::Now() + options_.message_timeout);
  if (!status.ok()) return status;
  if (count > options_.max_value_bytes / 8) {
    return absl::InvalidArgumentError(absl::StrCat("a CHECK or WAIT of ", count, " keys"));
  }
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<std::string> key = ReadString(connection);
    if (!key.ok()) return key.status();
    keys.push_back(*std::move(key));
  }
  return keys;
}

bool TorchStoreServer::AllExist(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

absl::Status TorchStoreServer::HandleRequest(Connection& connection, uint8_t query) {
  std::string reply;
  switch (static_cast<TorchStoreQuery>(query)) {
    case TorchStoreQuery::kSet: {
      absl::StatusOr<std::string> key = ReadString(connection);
      if (!key.ok()) return key.status();
      absl::StatusOr<std::string> value = ReadString(connection);
      if (!value.ok()) return value.status();
      absl::MutexLock lock(&mu_);  // releasing it wakes the WAITs whose keys now all exist
      data_[*key] = *std::move(value);
      return absl::OkStatus();  // SET has no reply
    }
    case TorchStoreQuery::kCompareSet: {
      absl::StatusOr<std::string> key = ReadString(connection);
      if (!key.ok()) return key.status();
      absl::StatusOr<std::string> expected = ReadString(connection);
      if (!expected.ok()) return expected.status();
      absl::StatusOr<std::string> desired = ReadString(connection);
      if (!desired.ok()) return desired.status();
      absl::MutexLock lock(&mu_);
      auto it = data_.find(*key);
      if (it == data_.end()) {
        if (expected->empty()) data_[*key] = *desired;
        AppendValue(reply, expected->empty() ? *desired : *expected);
      } else {
        if (it->second == *expected) it->second = *desired;
        AppendValue(reply, it->second);
      }
      break;
    }
    case TorchStoreQuery::kGet: {
      absl::StatusOr<std::string> key = ReadString(connection);
      if (!key.ok()) return key.status();
      absl::ReaderMutexLock lock(&mu_);
      auto it = data_.find(*key);
      if (it == data_.end()) {
        return absl::NotFoundError(absl::StrCat("GET of key \"", *key, "\", which is not set"));
      }
      AppendValue(reply, it->second);
      break;
    }
    case TorchStoreQuery::kAdd: {
      absl::StatusOr<std::string> key = ReadString(connection);
      if (!key.ok()) return key.status();
      int64_t delta = 0;
      absl::Status status = ReadFull(connection.fd, reinterpret_cast<char*>(&delta), 8,
                                     absl::Now() + options_.message_timeout);
      if (!status.ok()) return status;
      absl::MutexLock lock(&mu_);
      auto it = data_.find(*key);
      int64_t value = 0;
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ADD to key \"", *key, "\", whose value \"", it->second, "\" is not an integer"));
      }
      if (__builtin_add_overflow(value, delta, &value)) {
        return absl::InvalidArgumentError(absl::StrCat("ADD of ", delta, " to key \"", *key,
                                                       "\" overflows int64"));
      }
      data_[*key] = absl::StrCat(value);
      AppendI64(reply, value);
      break;
    }
    case TorchStoreQuery::kCheck: {
      absl::StatusOr<std::vector<std::string>> keys = ReadKeys(connection);
      if (!keys.ok()) return keys.status();
      absl::ReaderMutexLock lock(&mu_);
      reply.push_back(static_cast<char>(AllExist(*keys) ? kTorchStoreReady
                                                        : kTorchStoreNotReady));
      break;
    }
    case TorchStoreQuery::kWait:
      return HandleWait(connection);
    case TorchStoreQuery::kGetNumKeys: {
      absl::ReaderMutexLock lock(&mu_);
      AppendI64(reply, static_cast<int64_t>(data_.size()));
      break;
    }
    case TorchStoreQuery::kWatchKey:
      return absl::UnimplementedError(
          "WATCH_KEY (query byte 7) is not supported by this store (init_process_group does "
          "not use it); host the store in the program with torch's own TCPStore if needed");
    case TorchStoreQuery::kDeleteKey: {
      absl::StatusOr<std::string> key = ReadString(connection);
      if (!key.ok()) return key.status();
      absl::MutexLock lock(&mu_);
      AppendI64(reply, static_cast<int64_t>(data_.erase(*key)));
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown query type ", static_cast<int>(query),
          " (PyTorch 1.13's TCPStore protocol has 0..8; a newer 2.x client, which sends "
          "VALIDATE first, is not supported)"));
  }
  return WriteFull(connection.fd, reply, absl::Now() + options_.send_timeout);
}

absl::Status TorchStoreServer::HandleWait(Connection& connection) {
  absl::StatusOr<std::vector<std::string>> keys = ReadKeys(connection);
  if (!keys.ok()) return keys.status();
  absl::Time deadline = absl::Now() + options_.wait_timeout;
  auto released = [this, &keys]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ || AllExist(*keys);
  };
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // In slices, to notice a client that went away while it waited.
      mu_.AwaitWithTimeout(absl::Condition(&released), absl::Milliseconds(200));
      if (stopping_) return absl::CancelledError("the store is stopping");
      if (AllExist(*keys)) break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "WAIT for ", keys->size(), " key(s) not all set within Options.wait_timeout (",
          absl::FormatDuration(options_.wait_timeout), ")"));
    }
    pollfd p{connection.fd, POLLIN, 0};
    char byte;
    if (poll(&p, 1, 0) == 1 &&
        ((p.revents & (POLLHUP | POLLERR)) != 0 ||
         recv(connection.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0)) {
      return absl::UnavailableError("the client went away during its WAIT");
    }
  }
  std::string reply(1, static_cast<char>(kTorchStoreStopWaiting));
  return WriteFull(connection.fd, reply, absl::Now() + options_.send_timeout);
}

}  // namespace ringmaster::worker
