// The coordinator's HTTP port (--metrics_listen): Prometheus metrics (coordinator/metrics.h),
// the dashboard, /healthz. A small layer over Debian's cpp-httplib that applies the gRPC
// port's rules (auth.h) to every request:
//   - with a user token, every request needs "Authorization: Bearer <user token>": 401 with
//     "WWW-Authenticate: Bearer" when it is missing or not a bearer token, 403 when the token
//     is wrong (compared in constant time, CheckBearer);
//   - without a user token the port must be a loopback address (Start says INVALID_ARGUMENT);
//   - with a certificate and key it serves HTTPS only; with a client CA as well, only to
//     clients with a certificate that CA signed.
// Routes are matched on the path (exact, or with `prefix` every path below it); an unknown
// path gets 404, a method other than GET or HEAD 405.
//
// Threads: handlers run on the server's own threads (`threads` of them), several at once;
// a handler must be thread-safe and return quickly (take a snapshot, format it, return:
// never wait on the coordinator for long).
//
// Slow and idle clients (before any token check): one client address holds at most
// max_connections_per_client connections (more are refused at once), and every request must
// arrive whole and be answered within request_timeout (the TLS handshake too), so neither a
// client sending its headers a byte at a time nor hundreds of half-sent requests can take
// every thread.
#ifndef RINGMASTER_COORDINATOR_HTTP_SERVER_H_
#define RINGMASTER_COORDINATOR_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace ringmaster::coordinator {

struct HttpRequest {
  std::string path;
  // The query parameters, decoded; of a repeated one, the first value.
  std::map<std::string, std::string> params;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpRoute {
  // "/metrics"; with `prefix`, also every path below it ("/jobs" serves "/jobs/a/b").
  std::string path;
  bool prefix = false;
  HttpHandler handler;
};

struct HttpServerOptions {
  // host:port ("127.0.0.1:9090", "[::1]:9090", "0.0.0.0:9090"); port 0 picks a free one.
  std::string listen = "127.0.0.1:0";
  // Empty: no token is asked for, and `listen` must be a loopback address.
  std::string user_token;
  // PEM contents; both empty: plain HTTP. client_ca set: clients must present a
  // certificate it signed (mutual TLS), as on the gRPC port.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Connections served at once (a browser opens several; an idle kept-alive one holds a
  // thread for up to keep_alive).
  int threads = 16;
  absl::Duration keep_alive = absl::Seconds(2);
  // Each request must arrive whole (after the TLS handshake, which has as long) and its
  // response be sent within this: a client sending its headers a byte at a time, or half a
  // request and then nothing, is cut off instead of holding a thread.
  absl::Duration request_timeout = absl::Seconds(10);
  // Connections one client address may hold at once; more are answered 503 (over plain
  // HTTP) and closed at once, so one client cannot take every thread. Below `threads`.
  int max_connections_per_client = 6;
};

class HttpServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT (naming --metrics_listen, --tls_cert or
  // --tls_key) for a non-loopback address without a user token, a malformed address, half a
  // TLS configuration or TLS material that does not parse; UNAVAILABLE when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           std::vector<HttpRoute> routes);
  ~HttpServer();  // Shutdown()

  // The bound port (the picked one when `listen` asked for 0).
  int port() const { return port_; }
  // "http" or "https".
  const char* scheme() const { return tls_ ? "https" : "http"; }
  // The address of `path` here: "http://127.0.0.1:9090/metrics" (the bound port).
  std::string Url(const std::string& path) const;
  // Stops accepting connections and waits for the requests in flight. Idempotent; not to
  // be called from a handler.
  void Shutdown();

 private:
  HttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::vector<HttpRoute> routes_;
  std::string user_token_;
  std::string host_;  // as `listen` named it, without brackets
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_HTTP_SERVER_H_
