// ringmaster: the coordinator. One per cluster (a systemd unit, or a Kubernetes
// Deployment with one replica and a persistent volume for --db).
//
//   ringmaster --listen 127.0.0.1:7070 --db /var/lib/ringmaster/jobs.db
//   ringmaster --listen 0.0.0.0:7070 --db ... --user_token_file F --node_token_file F
//              [--tls_cert F --tls_key F [--tls_client_ca F]] [--metrics_listen HOST:PORT]
//
// Without tokens it listens on loopback only, and says so. SIGTERM or SIGINT stops it
// gracefully; after kill -9 a new one on the same --db resumes every job.
// Exit status: 0 after a signal, 1 when it cannot serve, 2 for bad flags.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "coordinator/auth.h"
#include "common/version.h"
#include "coordinator/dashboard.h"
#include "coordinator/grpc_service.h"
#include "coordinator/http_server.h"
#include "coordinator/metrics.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "address to serve on (host:port)");
ABSL_FLAG(std::string, db, "ringmaster.db",
          "the SQLite job database (created when missing; an existing one that is empty or "
          "lacks ringmaster's tables is refused: see --fresh_db)");
ABSL_FLAG(bool, fresh_db, false,
          "start a new cluster on a --db file that is empty or lacks ringmaster's tables "
          "(truncated, or made by something else) instead of refusing it: every job it held "
          "and the membership secret are forgotten, so running agents must be restarted");
ABSL_FLAG(std::string, user_token_file, "", "file holding the token users present");
ABSL_FLAG(std::string, node_token_file, "", "file holding the token agents present");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (TLS when given)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA that client certificates must chain to "
                                          "(mutual TLS)");
ABSL_FLAG(double, heartbeat_s, 1, "how often agents heartbeat");
ABSL_FLAG(double, lease_s, 3, "an agent silent this long is dead, with its trainers");
ABSL_FLAG(double, join_timeout_s, 30, "every trainer of a forming epoch must join within this");
ABSL_FLAG(double, ready_timeout_s, 120, "every member must be ready within this after commit");
ABSL_FLAG(double, hang_timeout_s, 120, "a member without progress this long is hung (0: off)");
ABSL_FLAG(double, rendezvous_timeout_s, 300, "a job below min_ranks fails after this long");
ABSL_FLAG(double, slot_backoff_s, 10, "a slot whose trainer failed rests this long");
ABSL_FLAG(double, grow_after_s, 5, "a running job grows into free slots after running this long");
ABSL_FLAG(double, restore_grace_s, 10,
          "after a restart, agents have this long (or the lease) to register again");
ABSL_FLAG(int, verbosity, 0, "glog verbosity (1: every decision)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of the HTTP port serving /metrics (Prometheus), /healthz and the "
          "dashboard (/, /jobs/JOB); empty: off. Same rules as --listen: the user token and "
          "TLS flags (mutual TLS included) apply, loopback only without a user token");

namespace ringmaster {
namespace {

int Fail(int code, const std::string& message) {
  fprintf(stderr, "ringmaster: %s\n", message.c_str());
  return code;
}

absl::Duration Seconds(const absl::Flag<double>& flag, const char* name, std::string* error) {
  const double v = absl::GetFlag(flag);
  if (!(v >= 0) || v > 86400 * 365) {
    *error = absl::StrCat("--", name, " must be between 0 and one year, got ", v);
  }
  return absl::Seconds(v);
}

// Reads a whole file (tokens, certificates); empty path gives "". A `secret` (a token, a
// key) must not be readable by every user of the machine.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path, const char* flag,
                                         bool secret) {
  if (path.empty()) return std::string();
  auto text = secret ? ReadSecretFile(path) : ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": ", text.status().message()));
  }
  return *text;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("the ringmaster coordinator; see --helpfull");
  ParseFlagsWithUsage(argc, argv, "ringmaster");
  LoggingOptions logging;
  logging.program_name = argv[0];
  logging.verbosity = absl::GetFlag(FLAGS_verbosity);
  InitLogging(logging);

  // SIGTERM and SIGINT are taken by sigwait below; block them before any thread starts so
  // that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::string error;
  coordinator::CoordinatorOptions options;
  options.database = absl::GetFlag(FLAGS_db);
  options.store.start_fresh = absl::GetFlag(FLAGS_fresh_db);
  options.heartbeat_interval = Seconds(FLAGS_heartbeat_s, "heartbeat_s", &error);
  options.membership.lease = Seconds(FLAGS_lease_s, "lease_s", &error);
  options.membership.join_timeout = Seconds(FLAGS_join_timeout_s, "join_timeout_s", &error);
  options.membership.ready_timeout = Seconds(FLAGS_ready_timeout_s, "ready_timeout_s", &error);
  options.membership.hang_timeout = Seconds(FLAGS_hang_timeout_s, "hang_timeout_s", &error);
  options.membership.rendezvous_timeout =
      Seconds(FLAGS_rendezvous_timeout_s, "rendezvous_timeout_s", &error);
  options.membership.slot_backoff = Seconds(FLAGS_slot_backoff_s, "slot_backoff_s", &error);
  options.membership.grow_after = Seconds(FLAGS_grow_after_s, "grow_after_s", &error);
  options.membership.restore_grace = Seconds(FLAGS_restore_grace_s, "restore_grace_s", &error);
  if (!error.empty()) return Fail(2, error);
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.membership.lease <= options.heartbeat_interval) {
    return Fail(2, "--lease_s must be longer than --heartbeat_s, and both positive");
  }

  coordinator::ServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  struct {
    std::string* into;
    std::string path;
    const char* flag;
    bool secret;
  } files[] = {
      {&server_options.user_token, absl::GetFlag(FLAGS_user_token_file), "user_token_file",
       true},
      {&server_options.node_token, absl::GetFlag(FLAGS_node_token_file), "node_token_file",
       true},
      {&server_options.tls_cert, absl::GetFlag(FLAGS_tls_cert), "tls_cert", false},
      {&server_options.tls_key, absl::GetFlag(FLAGS_tls_key), "tls_key", true},
      {&server_options.tls_client_ca, absl::GetFlag(FLAGS_tls_client_ca), "tls_client_ca",
       false},
  };
  for (auto& f : files) {
    auto text = ReadFlagFile(f.path, f.flag, f.secret);
    if (!text.ok()) return Fail(2, std::string(text.status().message()));
    *f.into = *text;
  }
  for (std::string* token : {&server_options.user_token, &server_options.node_token}) {
    *token = std::string(absl::StripAsciiWhitespace(*token));
  }
  if (absl::Status s =
          coordinator::CheckConfiguredTokens(server_options.user_token, server_options.node_token);
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }

  const bool open = !server_options.user_token.empty() && !server_options.node_token.empty();
  if (!open && !coordinator::IsLoopbackAddress(server_options.listen)) {
    return Fail(2, absl::StrCat("--listen ", server_options.listen,
                                " is not a loopback address: give --user_token_file and "
                                "--node_token_file, or listen on 127.0.0.1"));
  }
  auto coordinator = coordinator::Coordinator::Create(options);
  if (!coordinator.ok()) return Fail(1, std::string(coordinator.status().message()));
  std::unique_ptr<coordinator::HttpServer> http;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen); !listen.empty()) {
    coordinator::HttpServerOptions http_options;
    http_options.listen = listen;
    http_options.user_token = server_options.user_token;
    http_options.tls_cert = server_options.tls_cert;
    http_options.tls_key = server_options.tls_key;
    http_options.tls_client_ca = server_options.tls_client_ca;
    std::vector<coordinator::HttpRoute> routes =
        coordinator::MonitoringRoutes(coordinator->get());
    for (coordinator::HttpRoute& route :
         coordinator::dashboard::DashboardRoutes(coordinator->get())) {
      routes.push_back(std::move(route));
    }
    auto started = coordinator::HttpServer::Start(http_options, std::move(routes));
    if (!started.ok()) {
      return Fail(started.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                  std::string(started.status().message()));
    }
    http = std::move(*started);
  }
  auto server = coordinator::Server::Start(server_options, coordinator->get());
  if (!server.ok()) {
    return Fail(server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                std::string(server.status().message()));
  }
  printf("ringmaster: serving on %s (port %d), jobs in %s%s\n", server_options.listen.c_str(),
         (*server)->port(), options.database.c_str(),
         open ? "" : "; no tokens configured: loopback only");
  if (http != nullptr) printf("ringmaster: metrics on %s\n", http->Url("/metrics").c_str());
  fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  printf("ringmaster: %s, stopping\n", strsignal(signal_number));
  if (http != nullptr) http->Shutdown();
  (*server)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) { return ringmaster::Main(argc, argv); }
