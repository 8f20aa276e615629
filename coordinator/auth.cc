#include "coordinator/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::coordinator {

std::string MembershipToken(absl::string_view secret, absl::string_view job,
                            absl::string_view node, int slot) {
  const std::string message = absl::StrCat(job, "\n", node, "\n", slot);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
             &length) != nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

absl::Status CheckBearer(absl::string_view header, absl::string_view expected,
                         absl::string_view what) {
  if (expected.empty()) return absl::OkStatus();
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!absl::StartsWith(header, kPrefix)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this call needs the ", what, " in the authorization metadata: \"Bearer <token>\""));
  }
  const absl::string_view token = header.substr(kPrefix.size());
  if (token.size() != expected.size() ||
      CRYPTO_memcmp(token.data(), expected.data(), token.size()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("wrong ", what));
  }
  return absl::OkStatus();
}

std::string NewSecret() {
  unsigned char bytes[32];
  CHECK_EQ(RAND_bytes(bytes, sizeof(bytes)), 1) << "no randomness from OpenSSL";
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), 32));
}

}  // namespace ringmaster::coordinator
