#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/auth.h"
#include "httplib.h"

namespace ringmaster::coordinator {
namespace {

// "host:port" or "[v6]:port" into the host (without brackets) and the port.
absl::Status SplitListen(const std::string& listen, std::string* host, int* port) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen ", listen,
        " is not HOST:PORT (e.g. 127.0.0.1:9090, [::1]:9090; port 0 picks a free one)"));
  };
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad();
  absl::string_view h = absl::string_view(listen).substr(0, colon);
  if (absl::StartsWith(h, "[")) {
    if (!absl::EndsWith(h, "]")) return bad();
    h = h.substr(1, h.size() - 2);
  } else if (absl::StrContains(h, ':')) {
    return bad();  // an IPv6 address needs brackets
  }
  if (h.empty() || !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return bad();
  }
  *host = std::string(h);
  return absl::OkStatus();
}

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

BioPtr Bio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

// Puts the certificate (with any chain after it) and its key into `ctx`, and with a client CA
// asks every client for a certificate it signed. The material was checked by
// CheckTlsMaterial already; false only if OpenSSL refuses it after all.
bool UseTlsMaterial(const HttpServerOptions& options, SSL_CTX& ctx) {
  const std::string& cert = options.tls_cert;
  const std::string& key = options.tls_key;
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  auto certs = Bio(cert);
  std::unique_ptr<X509, decltype(&X509_free)> leaf(
      PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr), &X509_free);
  if (leaf == nullptr || SSL_CTX_use_certificate(&ctx, leaf.get()) != 1) return false;
  while (X509* chain = PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(&ctx, chain) != 1) {  // takes `chain` on success only
      X509_free(chain);
      return false;
    }
  }
  ERR_clear_error();  // the end of the chain reads as an error
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(Bio(key).get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (pkey == nullptr || SSL_CTX_use_PrivateKey(&ctx, pkey.get()) != 1 ||
      SSL_CTX_check_private_key(&ctx) != 1) {
    return false;
  }
  if (options.tls_client_ca.empty()) return true;
  auto cas = Bio(options.tls_client_ca);
  int added = 0;
  while (X509* ca = PEM_read_bio_X509(cas.get(), nullptr, nullptr, nullptr)) {
    added += X509_STORE_add_cert(SSL_CTX_get_cert_store(&ctx), ca) == 1 ? 1 : 0;
    X509_free(ca);  // the store holds its own reference
  }
  ERR_clear_error();
  SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return added > 0;
}

// A connection's bytes for httplib's request parser, plain or over TLS, on a non-blocking
// socket: every read and write waits at most until the deadline of the request in progress
// (set_deadline), so a client that sends its headers a byte at a time, or half a request and
// then nothing, cannot hold the thread past it (httplib's own timeouts are per read).
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}

  void set_deadline(absl::Time deadline) { deadline_ = deadline; }

  bool is_readable() const override {
    return (ssl_ != nullptr && SSL_pending(ssl_) > 0) || Wait(POLLIN);
  }
  bool is_writable() const override { return Wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    while (true) {
      ssize_t n;
      int want = POLLIN;
      if (ssl_ == nullptr) {
        n = recv(fd_, ptr, size, 0);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      } else {
        n = SSL_read(ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
        if (n > 0) return n;
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error == SSL_ERROR_ZERO_RETURN) return 0;
        if (error == SSL_ERROR_WANT_WRITE) {
          want = POLLOUT;
        } else if (error != SSL_ERROR_WANT_READ) {
          return -1;
        }
      }
      if (!Wait(want)) return -1;
    }
  }

  ssize_t write(const char* ptr, size_t size) override {
    while (true) {
      ssize_t n;
      int want = POLLOUT;
      if (ssl_ == nullptr) {
        n = send(fd_, ptr, size, MSG_NOSIGNAL);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      } else {
        n = SSL_write(ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
        if (n > 0) return n;
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error == SSL_ERROR_WANT_READ) {
          want = POLLIN;
        } else if (error != SSL_ERROR_WANT_WRITE) {
          return -1;
        }
      }
      if (!Wait(want)) return -1;
    }
  }

  // The TLS handshake, by the same deadline. False: failed or too slow.
  bool Accept() {
    while (true) {
      const int rc = SSL_accept(ssl_);
      if (rc == 1) return true;
      const int error = SSL_get_error(ssl_, rc);
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) return false;
      if (!Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT)) return false;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(&getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(&getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Until the socket is ready for `events` or the deadline passes.
  bool Wait(short events) const {
    while (true) {
      const absl::Duration left = deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd p{fd_, events, 0};
      const int rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }

  void Address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return;
    char text[INET6_ADDRSTRLEN] = "";
    if (address.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
      inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      port = ntohs(v4->sin_port);
    } else if (address.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
      inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
      port = ntohs(v6->sin6_port);
    }
    ip = text;
  }

  const int fd_;
  SSL* const ssl_;
  absl::Time deadline_ = absl::InfinitePast();
};

// httplib's server with its connection handling replaced: at most
// max_connections_per_client connections per client address (more are refused at once),
// the TLS handshake (with a context of our own) and each request bounded by
// request_timeout (DeadlineStream), httplib's parser and routing otherwise.
class GuardedServer final : public httplib::Server {
 public:
  // Takes `tls` (null: plain HTTP).
  GuardedServer(const HttpServerOptions& options, SSL_CTX* tls)
      : options_(options), tls_(tls) {}
  ~GuardedServer() override {
    if (tls_ != nullptr) SSL_CTX_free(tls_);
  }

  // httplib listens with a backlog of 5: a burst of connections (a client opening hundreds)
  // would have the kernel drop everyone's connection attempts until the accept loop caught
  // up. Call after binding.
  bool EnlargeBacklog() { return ::listen(svr_sock_, SOMAXCONN) == 0; }

 private:
  bool process_and_close_socket(socket_t sock) override {
    DeadlineStream peer_of(sock, nullptr);
    std::string client;
    int client_port = 0;
    peer_of.get_remote_ip_and_port(client, client_port);
    const bool admitted = Admit(client);
    bool ok = false;
    if (!admitted) {
      Refuse(sock, client);
    } else {
      const int flags = fcntl(sock, F_GETFL);
      if (flags >= 0 && fcntl(sock, F_SETFL, flags | O_NONBLOCK) == 0) ok = Serve(sock);
      Release(client);
    }
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return ok;
  }

  // The requests of one connection, kept alive as httplib would.
  bool Serve(int sock) {
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, &SSL_free);
    if (tls_ != nullptr) {
      ssl.reset(SSL_new(tls_));
      if (ssl == nullptr || SSL_set_fd(ssl.get(), sock) != 1) return false;
    }
    DeadlineStream stream(sock, ssl.get());
    if (ssl != nullptr) {
      stream.set_deadline(absl::Now() + options_.request_timeout);
      if (!stream.Accept()) return false;
    }
    bool ok = false;
    for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
      // The next request has keep_alive to begin, then request_timeout to arrive whole and be
      // answered.
      stream.set_deadline(absl::Now() + options_.keep_alive);
      if (!stream.is_readable()) break;
      stream.set_deadline(absl::Now() + options_.request_timeout);
      bool closed = false;
      ok = process_request(stream, /*close_connection=*/left == 1, closed, nullptr);
      if (!ok || closed) break;
    }
    if (ssl != nullptr && ok) SSL_shutdown(ssl.get());
    return ok;
  }

  bool Admit(const std::string& client) {
    absl::MutexLock lock(&mu_);
    int& open = open_[client];
    if (open >= options_.max_connections_per_client) return false;
    ++open;
    return true;
  }
  void Release(const std::string& client) {
    absl::MutexLock lock(&mu_);
    if (--open_[client] <= 0) open_.erase(client);
  }

  // Says why before closing (plain HTTP only: a TLS client would not read it).
  void Refuse(int sock, const std::string& client) const {
    // What the client sent already is read first: closing a socket with unread data resets
    // the connection, and the answer below could be lost.
    char discard[4096];
    for (int i = 0; i < 16 && recv(sock, discard, sizeof(discard), MSG_DONTWAIT) > 0; ++i) {
    }
    if (tls_ != nullptr) return;
    const std::string body = absl::StrCat(
        "more than ", options_.max_connections_per_client, " connections from ", client,
        " at once; close some and retry\n");
    const std::string response = absl::StrCat(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        "Retry-After: 1\r\nConnection: close\r\nContent-Length: ", body.size(), "\r\n\r\n",
        body);
    send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  const HttpServerOptions options_;
  SSL_CTX* const tls_;
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);  // connections per client address
};

// The route serving `path`: an exact one first, else the longest prefix route.
const HttpRoute* FindRoute(const std::vector<HttpRoute>& routes, const std::string& path) {
  const HttpRoute* best = nullptr;
  for (const HttpRoute& route : routes) {
    if (route.path == path) return &route;
    if (!route.prefix) continue;
    const bool under = absl::EndsWith(route.path, "/")
                           ? absl::StartsWith(path, route.path)
                           : absl::StartsWith(path, absl::StrCat(route.path, "/"));
    if (under && (best == nullptr || route.path.size() > best->path.size())) best = &route;
  }
  return best;
}

void Reply(int status, std::string content_type, std::string body, httplib::Response& res) {
  res.status = status;
  res.set_content(std::move(body), content_type.c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              std::vector<HttpRoute> routes) {
  std::string host;
  int port = 0;
  RM_RETURN_IF_ERROR(SplitListen(options.listen, &host, &port));
  if (options.user_token.empty() && !IsLoopbackAddress(options.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen ", options.listen,
        " is not a loopback address: give --user_token_file (scrapers then send "
        "\"Authorization: Bearer <user token>\"), or listen on 127.0.0.1"));
  }
  RM_RETURN_IF_ERROR(
      CheckTlsMaterial(options.tls_cert, options.tls_key, options.tls_client_ca));
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HttpServerOptions.threads must be at least 1, got ", options.threads));
  }

  if (options.max_connections_per_client < 1 ||
      options.max_connections_per_client >= options.threads ||
      options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HttpServerOptions.max_connections_per_client must be 1 to threads - 1 (", options.threads,
        " - 1), got ", options.max_connections_per_client, ", and request_timeout positive"));
  }

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->routes_ = std::move(routes);
  server->user_token_ = options.user_token;
  server->tls_ = !options.tls_cert.empty();
  SSL_CTX* tls = nullptr;
  if (server->tls_) {
    tls = SSL_CTX_new(TLS_server_method());
    if (tls == nullptr || !UseTlsMaterial(options, *tls)) {
      if (tls != nullptr) SSL_CTX_free(tls);
      ERR_clear_error();
      return absl::InvalidArgumentError(
          "OpenSSL refused --tls_cert / --tls_key for the metrics port; give an unencrypted "
          "PEM key and its certificate");
    }
  }
  auto guarded = std::make_unique<GuardedServer>(options, tls);
  GuardedServer* guarded_server = guarded.get();
  server->server_ = std::move(guarded);
  // httplib's default also sets SO_REUSEPORT, which would let a second coordinator share
  // the port unnoticed: only SO_REUSEADDR (a restart need not wait for TIME_WAIT).
  server->server_->set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int threads = options.threads;
  server->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  // Everything is answered before httplib's own routing: auth first (so an unknown path
  // tells nothing to a caller without the token), then the routes.
  HttpServer* self = server.get();
  server->server_->set_pre_routing_handler(
      [self](const httplib::Request& req, httplib::Response& res) {
        const absl::Status auth = CheckBearer(req.get_header_value("Authorization"),
                                              self->user_token_, "user token");
        if (auth.code() == absl::StatusCode::kUnauthenticated) {
          res.set_header("WWW-Authenticate", "Bearer realm=\"ringmaster\"");
          Reply(401, "text/plain; charset=utf-8", absl::StrCat(auth.message(), "\n"), res);
        } else if (!auth.ok()) {
          Reply(403, "text/plain; charset=utf-8", absl::StrCat(auth.message(), "\n"), res);
        } else if (req.method != "GET" && req.method != "HEAD") {
          res.set_header("Allow", "GET, HEAD");
          Reply(405, "text/plain; charset=utf-8", "only GET and HEAD are served here\n", res);
        } else if (const HttpRoute* route = FindRoute(self->routes_, req.path);
                   route == nullptr) {
          Reply(404, "text/plain; charset=utf-8", absl::StrCat("no page at ", req.path, "\n"),
                res);
        } else {
          HttpRequest request;
          request.path = req.path;
          for (const auto& [name, value] : req.params) request.params.emplace(name, value);
          HttpResponse response = route->handler(request);
          Reply(response.status, std::move(response.content_type), std::move(response.body),
                res);
        }
        return httplib::Server::HandlerResponse::Handled;
      });

  if (port == 0) {
    port = server->server_->bind_to_any_port(host);
  } else if (!server->server_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --metrics_listen ",
                                               options.listen, " (in use, or not this host's)"));
  }
  if (!guarded_server->EnlargeBacklog()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --metrics_listen ",
                                               options.listen, ": ", strerror(errno)));
  }
  server->port_ = port;
  server->host_ = host;
  // The socket listens already (bind_to_port), so connections queue until this thread
  // accepts them.
  server->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  // httplib's stop() does nothing before the loop runs: wait for it, so that a Shutdown()
  // right after Start() cannot miss it (the loop starts at once; no I/O before it).
  while (!server->server_->is_running()) absl::SleepFor(absl::Milliseconds(1));
  return server;
}

std::string HttpServer::Url(const std::string& path) const {
  const bool v6 = absl::StrContains(host_, ':');
  return absl::StrCat(scheme(), "://", v6 ? "[" : "", host_, v6 ? "]" : "", ":", port_, path);
}

void HttpServer::Shutdown() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

HttpServer::~HttpServer() { Shutdown(); }

}  // namespace ringmaster::coordinator
