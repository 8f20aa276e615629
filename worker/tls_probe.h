// Why a TLS connection to the coordinator fails, when gRPC cannot say: a coordinator under
// mutual TLS (ringmaster --tls_client_ca) closes the connection of a client that offers no
// certificate, and gRPC reports only "Socket closed". One handshake, made here with OpenSSL,
// shows whether the server asks for a client certificate (TLS CertificateRequest).
//
// Thread-safe (no shared state). Blocks for at most `timeout` per call.
#ifndef RINGMASTER_WORKER_TLS_PROBE_H_
#define RINGMASTER_WORKER_TLS_PROBE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::worker {

// Whether the TLS server at `address` (HOST:PORT or [V6]:PORT) asks for a client
// certificate: a handshake offering none, without checking the server's certificate (it is
// not trusted with anything). UNAVAILABLE when it cannot be reached or speaks no TLS;
// DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<bool> AsksForClientCertificate(const std::string& address,
                                              absl::Duration timeout);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_TLS_PROBE_H_
