// Whether a listen address stays on this machine: servers that run without tokens must
// listen on loopback only, so this decides what an unauthenticated port exposes.
#ifndef RINGMASTER_COMMON_LOOPBACK_H_
#define RINGMASTER_COMMON_LOOPBACK_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ringmaster {

// True when `host_port` ("HOST:PORT", "[V6]:PORT", or a bare host) names a loopback
// address: an IPv4 address in 127.0.0.0/8, ::1, an IPv4-mapped ::ffff:127.x.y.z, or
// "localhost" (any case). The host is parsed as an address (inet_pton), never matched by
// prefix: a host name such as "127.example.com" is not loopback, and neither is anything
// that does not parse (conservative: a caller refusing non-loopback refuses it too).
// Pure; thread-safe.
bool IsLoopbackAddress(absl::string_view host_port);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_LOOPBACK_H_
