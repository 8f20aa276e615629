#include "coordinator/http_server.h"

#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->routes_ = std::move(routes);
  server->user_token_ = options.user_token;
  server->tls_ = !options.tls_cert.empty();
  if (server->tls_) {
    server->server_ = std::make_unique<httplib::SSLServer>(
        [options](SSL_CTX& ctx) { return UseTlsMaterial(options, ctx); });
  } else {
    server->server_ = std::make_unique<httplib::Server>();
  }
  if (!server->server_->is_valid()) {
    return absl::InvalidArgumentError(
        "OpenSSL refused --tls_cert / --tls_key for the metrics port; give an unencrypted PEM "
        "key and its certificate");
  }
  // httplib's default also sets SO_REUSEPORT, which would let a second coordinator share
  // the port unnoticed: only SO_REUSEADDR (a restart need not wait for TIME_WAIT).
  server->server_->set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->server_->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options.keep_alive)));
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
