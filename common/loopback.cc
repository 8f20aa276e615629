#include "common/loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>

#include "absl/strings/ascii.h"

namespace ringmaster {
namespace {

// The host of "HOST:PORT", "[V6]:PORT", "V6" or "HOST".
std::string HostOf(absl::string_view host_port) {
  if (!host_port.empty() && host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos) return "";
    return std::string(host_port.substr(1, close - 1));
  }
  const size_t colon = host_port.find(':');
  if (colon != absl::string_view::npos && host_port.find(':', colon + 1) == absl::string_view::npos) {
    return std::string(host_port.substr(0, colon));  // one colon: HOST:PORT
  }
  return std::string(host_port);  // no colon, or a bare IPv6 address
}

}  // namespace

bool IsLoopbackAddress(absl::string_view host_port) {
  const std::string host = HostOf(host_port);
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace ringmaster
