#include "coordinator/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>

#include <memory>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::coordinator {

namespace {

// Hex HMAC-SHA256 of `message` under `secret`.
std::string Hmac(absl::string_view secret, absl::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
             &length) != nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

std::string MembershipToken(absl::string_view secret, absl::string_view job,
                            absl::string_view node, int slot) {
  return Hmac(secret, absl::StrCat(kMembershipTokenDomain, "\n", job, "\n", node, "\n", slot));
}

std::string NodeCredential(absl::string_view secret, absl::string_view node) {
  return Hmac(secret, absl::StrCat(kNodeCredentialDomain, "\n", node));
}

absl::Status CheckNodeCredential(absl::string_view secret, absl::string_view node,
                                 absl::string_view credential) {
  const std::string expected = NodeCredential(secret, node);
  if (credential.size() != expected.size() ||
      CRYPTO_memcmp(credential.data(), expected.data(), expected.size()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this call for node ", node, " does not carry that node's credential (only the agent "
        "that registered ", node, " has it)"));
  }
  return absl::OkStatus();
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

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> Bio(absl::string_view pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's reason for the last failure, or "not PEM".
std::string OpenSslReason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "not in PEM format";
  const char* reason = ERR_reason_error_string(e);
  return reason != nullptr ? reason : "not in PEM format";
}

}  // namespace

absl::Status CheckConfiguredTokens(absl::string_view user_token,
                                   absl::string_view node_token) {
  for (const auto& [token, flag] : {std::pair{user_token, "--user_token_file"},
                                    std::pair{node_token, "--node_token_file"}}) {
    if (!token.empty() && token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the token in ", flag, " has ", token.size(), " characters; use at least ",
          kMinTokenLength, " random ones (e.g. openssl rand -hex 16 > FILE; chmod 600 FILE)"));
    }
  }
  if (!user_token.empty() && user_token == node_token) {
    return absl::InvalidArgumentError(
        "--user_token_file and --node_token_file hold the same token; give each its own, "
        "or a user could act as a node and a node as a user");
  }
  return absl::OkStatus();
}

absl::Status CheckTlsMaterial(absl::string_view cert, absl::string_view key,
                              absl::string_view client_ca) {
  ERR_clear_error();
  std::unique_ptr<X509, X509Free> x509;
  if (!cert.empty()) {
    x509.reset(PEM_read_bio_X509(Bio(cert).get(), nullptr, nullptr, nullptr));
    if (x509 == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert does not hold a PEM certificate (", OpenSslReason(),
          "); give the server's certificate, \"-----BEGIN CERTIFICATE-----\""));
    }
  }
  if (!key.empty()) {
    std::unique_ptr<EVP_PKEY, KeyFree> pkey(
        PEM_read_bio_PrivateKey(Bio(key).get(), nullptr, nullptr, nullptr));
    if (pkey == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_key does not hold a PEM private key (", OpenSslReason(),
          "); give the unencrypted key of --tls_cert"));
    }
    if (x509 != nullptr && X509_check_private_key(x509.get(), pkey.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          "--tls_key is not the private key of the certificate in --tls_cert");
    }
  }
  if (!client_ca.empty()) {
    std::unique_ptr<X509, X509Free> ca(
        PEM_read_bio_X509(Bio(client_ca).get(), nullptr, nullptr, nullptr));
    if (ca == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_client_ca does not hold a PEM certificate (", OpenSslReason(), ")"));
    }
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  if (!client_ca.empty() && cert.empty()) {
    return absl::InvalidArgumentError("mutual TLS (--tls_client_ca) needs --tls_cert");
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::coordinator
