#include "coordinator/http_server.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace ringmaster::coordinator {
namespace {

constexpr char kToken[] = "0123456789abcdef0123";

// A route that answers with the path and parameters it was given.
HttpRoute Echo(std::string path, bool prefix) {
  HttpRoute route;
  route.path = std::move(path);
  route.prefix = prefix;
  route.handler = [tag = route.path](const HttpRequest& request) {
    HttpResponse response;
    response.body = absl::StrCat(tag, " got ", request.path);
    for (const auto& [k, v] : request.params) absl::StrAppend(&response.body, " ", k, "=", v);
    return response;
  };
  return route;
}

std::vector<HttpRoute> Routes() {
  std::vector<HttpRoute> routes = {Echo("/metrics", false), Echo("/jobs", true),
                                   Echo("/jobs/special", true)};
  HttpRoute teapot;
  teapot.path = "/teapot";
  teapot.handler = [](const HttpRequest&) {
    HttpResponse response;
    response.status = 418;
    response.content_type = "application/json";
    response.body = "{}";
    return response;
  };
  routes.push_back(teapot);
  return routes;
}

std::unique_ptr<HttpServer> StartOrDie(HttpServerOptions options) {
  auto server = HttpServer::Start(options, Routes());
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(HttpServer, RoutesExactAndPrefix) {
  auto server = StartOrDie({});
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_STREQ(server->scheme(), "http");
  EXPECT_EQ(server->Url("/metrics"), absl::StrCat("http://127.0.0.1:", server->port(), "/metrics"));
  httplib::Client client("127.0.0.1", server->port());

  auto r = client.Get("/metrics?job=a%20b&x=1&x=2");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "/metrics got /metrics job=a b x=1");
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; charset=utf-8");

  r = client.Get("/jobs/a/b");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "/jobs got /jobs/a/b");
  r = client.Get("/jobs");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "/jobs got /jobs");
  r = client.Get("/jobs/special/1");  // the longest prefix wins
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "/jobs/special got /jobs/special/1");

  r = client.Get("/teapot");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 418);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, "{}");
}

TEST(HttpServer, UnknownPathsAndMethods) {
  auto server = StartOrDie({});
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  for (const char* path : {"/", "/metricsx", "/metrics/x", "/jobsx", "/nothing"}) {
    auto r = client.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
  }
  auto r = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = client.Head("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, UserTokenIsRequired) {
  HttpServerOptions options;
  options.user_token = kToken;
  auto server = StartOrDie(options);
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());

  for (const char* path : {"/metrics", "/nothing"}) {  // no token: not even a 404
    auto r = client.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer realm=\"ringmaster\"");
  }
  auto r = client.Get("/metrics", {{"Authorization", absl::StrCat("Basic ", kToken)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = client.Get("/metrics", {{"Authorization", "Bearer 0123456789abcdef0124"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(r->body, "wrong user token\n");

  client.set_bearer_token_auth(kToken);
  r = client.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "/metrics got /metrics");
  r = client.Get("/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

TEST(HttpServer, WithoutTokenOnlyLoopback) {
  HttpServerOptions options;
  options.listen = "0.0.0.0:0";
  auto server = HttpServer::Start(options, Routes());
  ASSERT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--metrics_listen 0.0.0.0:0 is not a loopback"),
            std::string::npos)
      << server.status();

  options.user_token = kToken;  // with a token any address will do
  server = HttpServer::Start(options, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_bearer_token_auth(kToken);
  auto r = client.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);

  for (const char* listen : {"[::1]:0", "localhost:0"}) {
    options.user_token.clear();
    options.listen = listen;
    server = HttpServer::Start(options, Routes());
    // ::1 may be absent in a container; then binding fails, but not for the rule.
    EXPECT_NE(server.status().code(), absl::StatusCode::kInvalidArgument)
        << listen << ": " << server.status();
  }
}

TEST(HttpServer, BadAddressesAndBusyPorts) {
  for (const char* listen : {"", "9090", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000",
                             "::1:80", ":80"}) {
    HttpServerOptions options;
    options.listen = listen;
    auto server = HttpServer::Start(options, Routes());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(server.status().message().find("--metrics_listen"), std::string::npos);
  }
  auto first = StartOrDie({});
  ASSERT_NE(first, nullptr);
  HttpServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", first->port());
  auto second = HttpServer::Start(options, Routes());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(HttpServer, ShutdownIsPromptAndIdempotent) {
  for (int i = 0; i < 20; ++i) {  // Shutdown at once after Start must not miss the loop
    auto server = StartOrDie({});
    ASSERT_NE(server, nullptr);
    server->Shutdown();
    server->Shutdown();
  }
  auto server = StartOrDie({});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  server->Shutdown();
  httplib::Client client("127.0.0.1", port);
  EXPECT_FALSE(client.Get("/metrics")) << "still serving after Shutdown";
}

// A certificate and its key, PEM: self-signed, or signed by `issuer` (a certificate and key
// this made).
struct Pem {
  std::string cert, key;
};

Pem Certificate(const std::string& name, const Pem* issuer = nullptr) {
  const auto read_bio = [](const std::string& pem) {
    return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  };
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), issuer == nullptr ? 1 : 2);
  X509_gmtime_adj(X509_getm_notBefore(cert), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_pubkey(cert, key);
  if (issuer == nullptr) {
    // Self-signed ones may sign others (the test's CA).
    X509_EXTENSION* ca =
        X509V3_EXT_conf_nid(nullptr, nullptr, NID_basic_constraints, "critical,CA:TRUE");
    X509_add_ext(cert, ca, -1);
    X509_EXTENSION_free(ca);
    X509_set_issuer_name(cert, X509_get_subject_name(cert));
    X509_sign(cert, key, EVP_sha256());
  } else {
    BIO* cert_bio = read_bio(issuer->cert);
    BIO* key_bio = read_bio(issuer->key);
    X509* issuer_cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
    EVP_PKEY* issuer_key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
    X509_set_issuer_name(cert, X509_get_subject_name(issuer_cert));
    X509_sign(cert, issuer_key, EVP_sha256());
    X509_free(issuer_cert);
    EVP_PKEY_free(issuer_key);
    BIO_free(cert_bio);
    BIO_free(key_bio);
  }
  const auto pem = [](auto write) {
    BIO* bio = BIO_new(BIO_s_mem());
    write(bio);
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string text(data, n);
    BIO_free(bio);
    return text;
  };
  Pem out;
  out.cert = pem([&](BIO* b) { PEM_write_bio_X509(b, cert); });
  out.key = pem(
      [&](BIO* b) { PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
  X509_free(cert);
  EVP_PKEY_free(key);
  return out;
}

TEST(HttpServer, ServesHttpsWithCertificate) {
  HttpServerOptions options;
  const Pem server_pem = Certificate("127.0.0.1");
  options.tls_cert = server_pem.cert;
  options.tls_key = server_pem.key;
  options.user_token = kToken;
  auto server = StartOrDie(options);
  ASSERT_NE(server, nullptr);
  EXPECT_STREQ(server->scheme(), "https");
  EXPECT_EQ(server->Url("/"), absl::StrCat("https://127.0.0.1:", server->port(), "/"));

  httplib::SSLClient tls("127.0.0.1", server->port());
  tls.enable_server_certificate_verification(false);  // self-signed
  tls.set_bearer_token_auth(kToken);
  auto r = tls.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "/metrics got /metrics");

  httplib::Client plain("127.0.0.1", server->port());
  plain.set_bearer_token_auth(kToken);
  EXPECT_FALSE(plain.Get("/metrics")) << "plain HTTP answered on the HTTPS port";
}

TEST(HttpServer, BadTlsMaterialIsNamed) {
  HttpServerOptions options;
  options.tls_cert = Certificate("127.0.0.1").cert;
  auto server = HttpServer::Start(options, Routes());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  options.tls_key = "not a key";
  server = HttpServer::Start(options, Routes());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--tls_key"), std::string::npos) << server.status();
  options.tls_key = Certificate("127.0.0.1").key;  // another certificate's key
  server = HttpServer::Start(options, Routes());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
}

// With a client CA, only clients with a certificate it signed are served (mutual TLS).
TEST(HttpServer, MutualTlsWantsAClientCertificate) {
  const Pem ca = Certificate("test CA");
  const Pem client = Certificate("a user", &ca);
  const Pem stranger = Certificate("someone");  // self-signed
  const Pem server_pem = Certificate("127.0.0.1");
  HttpServerOptions options;
  options.tls_cert = server_pem.cert;
  options.tls_key = server_pem.key;
  options.tls_client_ca = ca.cert;
  auto server = StartOrDie(options);
  ASSERT_NE(server, nullptr);

  const std::string dir = std::getenv("TEST_TMPDIR");
  const auto client_with = [&](const Pem& pem, const std::string& name) {
    std::ofstream(dir + "/" + name + ".pem") << pem.cert;
    std::ofstream(dir + "/" + name + ".key") << pem.key;
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", server->port(),
                                                  dir + "/" + name + ".pem",
                                                  dir + "/" + name + ".key");
    c->enable_server_certificate_verification(false);
    return c;
  };
  auto r = client_with(client, "client")->Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(client_with(stranger, "stranger")->Get("/metrics"))
      << "served a certificate the CA did not sign";
  httplib::SSLClient anonymous("127.0.0.1", server->port());
  anonymous.enable_server_certificate_verification(false);
  EXPECT_FALSE(anonymous.Get("/metrics")) << "served a client without a certificate";

  options.tls_cert.clear();
  options.tls_key.clear();
  EXPECT_EQ(HttpServer::Start(options, Routes()).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a client CA without a server certificate";
}

}  // namespace
}  // namespace ringmaster::coordinator
