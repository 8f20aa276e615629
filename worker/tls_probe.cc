#include "worker/tls_probe.h"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ringmaster::worker {
namespace {

// Set by the client-certificate callback: the server sent a CertificateRequest.
int AskedIndex() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

int NoClientCertificate(SSL* ssl, X509**, EVP_PKEY**) {
  *static_cast<bool*>(SSL_get_ex_data(ssl, AskedIndex())) = true;
  return 0;  // none to offer
}

// A connected TCP socket, its reads and writes bounded by `timeout`; -1 with `error` set.
int Connect(const std::string& address, absl::Duration timeout, std::string* error) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    *error = "not HOST:PORT";
    return -1;
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints, &found);
      rc != 0 || found == nullptr) {
    *error = gai_strerror(rc);
    return -1;
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv = {static_cast<time_t>(absl::ToInt64Seconds(timeout)),
                static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000)};
  const bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
                  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0 &&
                  connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  if (!ok) *error = strerror(errno);
  freeaddrinfo(found);
  if (!ok && fd >= 0) close(fd);
  return ok ? fd : -1;
}

}  // namespace

absl::StatusOr<bool> AsksForClientCertificate(const std::string& address,
                                              absl::Duration timeout) {
  std::string error;
  const int fd = Connect(address, timeout, &error);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", error));
  }
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        &SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, &SSL_free);
  if (ctx != nullptr) {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
    SSL_CTX_set_client_cert_cb(ctx.get(), NoClientCertificate);
    ssl.reset(SSL_new(ctx.get()));
  }
  if (ssl == nullptr) {
    close(fd);
    return absl::InternalError("cannot make an OpenSSL client");
  }
  bool asked = false;
  SSL_set_ex_data(ssl.get(), AskedIndex(), &asked);
  SSL_set_fd(ssl.get(), fd);
  const int rc = SSL_connect(ssl.get());
  const bool timed_out = rc != 1 && (errno == EAGAIN || errno == EWOULDBLOCK);
  unsigned long ssl_error = ERR_get_error();
  ERR_clear_error();
  SSL_shutdown(ssl.get());
  close(fd);
  // Under TLS 1.3 the request comes with the server's first flight, before the handshake
  // ends: asked is known whether or not the server then cuts the connection.
  if (asked) return true;
  if (rc == 1) return false;
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("no TLS handshake with ", address, " within ", absl::FormatDuration(timeout)));
  }
  char text[256] = "the connection was closed";
  if (ssl_error != 0) ERR_error_string_n(ssl_error, text, sizeof(text));
  return absl::UnavailableError(absl::StrCat("no TLS handshake with ", address, ": ", text));
}

}  // namespace ringmaster::worker
