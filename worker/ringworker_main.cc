// ringworker: the node agent. One per node (a systemd unit, or a pod per node), started
// before any job; it runs the trainers the coordinator places on this node.
//
//   ringworker --coordinator HOST:PORT --slots N [--node NAME] [--advertise_host ADDR]
//              [--work_dir DIR] [--node_token_file F] [--preemption_notice_file F]
//              [--tls_ca F [--tls_client_cert F --tls_client_key F]] [--log_listen HOST:PORT]
//              [--trainer_memory_limit_mib N] [--gpus none|auto|required]
// Its trainers reach the coordinator as it does (the same address, CA and client
// certificate), each with its own membership token.
//
// The agent serves its trainers' logs to the coordinator (ringctl logs) on --log_listen
// (default: the advertise host, or 127.0.0.1 without a node token; a free port), asking
// for the node token.
//
// SIGTERM drains the node (the jobs on it shrink with no lost step; the agent exits when
// its trainers have left); a second SIGTERM kills the trainers and exits at once. Before
// the node has registered (the coordinator cannot be reached), SIGTERM exits at once.
// Trainers die with their agent (a kill -9 of ringworker kills them too), and an agent
// started again on the same --work_dir ends any trainer an earlier one left running
// (recorded in <work_dir>/@trainers) before it registers; two agents cannot share a
// --work_dir (<work_dir>/@agent.lock).
// --gpus=required (the GPU DaemonSet sets it) checks at start that this node has a usable
// GPU per slot (worker/gpu_check.h) and otherwise exits at once naming the cause (a build
// without CUDA, no driver, no GPU visible, fewer than --slots), rather than registering
// slots whose trainers would train on the CPU.
// Exit status: 0 after a drain or stop, 1 when the coordinator refuses the node (or, under
// mutual TLS, asks for a client certificate that --tls_client_cert does not give), 2 for
// bad flags, 3 when --gpus=required finds the GPUs unusable.
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/version.h"
#include "worker/agent.h"
#include "worker/gpu_check.h"
#include "worker/tls_probe.h"
#include "client/grpc_coordinator_client.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "the coordinator's host:port");
ABSL_FLAG(std::string, node, "", "this node's name (default: the host name)");
ABSL_FLAG(int, slots, 0, "trainer slots on this node (GPUs, or CPU slots); required");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1",
          "the address other nodes reach this node's trainers at");
ABSL_FLAG(std::string, work_dir, "/var/lib/ringworker",
          "where trainers' specs, tokens and logs go");
ABSL_FLAG(std::string, trainer, "", "the ringtrainer binary (default: next to ringworker)");
ABSL_FLAG(std::string, trainer_flags, "",
          "extra flags for every trainer, comma-separated (e.g. --op_timeout_s=30)");
ABSL_FLAG(std::string, node_token_file, "", "file holding the node token");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the coordinator's certificate (TLS)");
ABSL_FLAG(std::string, tls_client_cert, "",
          "PEM client certificate for a coordinator that asks for one (mutual TLS)");
ABSL_FLAG(std::string, tls_client_key, "", "PEM key of --tls_client_cert");
ABSL_FLAG(std::string, preemption_notice_file, "",
          "drain as soon as this file exists (a cloud's spot notice hook writes it)");
ABSL_FLAG(double, drain_grace_s, 120, "longest wait for the trainers to leave on a drain");
ABSL_FLAG(int64_t, memory_mib, -1,
          "memory the node's trainers may use, MiB, reported to the coordinator for placement "
          "(default: the machine's; 0: do not report)");
ABSL_FLAG(int64_t, trainer_memory_limit_mib, 0,
          "each trainer's memory limit, MiB (its RLIMIT_DATA: the heap it may have); a "
          "trainer whose training state does not fit fails with RESOURCE_EXHAUSTED; 0: none");
ABSL_FLAG(std::string, log_listen, "",
          "host:port where the coordinator reads the trainers' logs (ringctl logs); default "
          "the advertise host (127.0.0.1 without a node token), any free port; \"off\": "
          "serve none");
ABSL_FLAG(std::string, gpus, "auto",
          "what the node's GPUs must be: \"required\" (a usable GPU per slot, or exit 3 "
          "naming the cause: no CUDA in this build, no driver, no GPU visible, too few), "
          "\"auto\" (say what trainers will use), \"none\" (CPU slots; not probed)");

namespace ringmaster {
namespace {

std::atomic<bool> g_drain{false};
std::atomic<bool> g_stop{false};

int Fail(int code, const std::string& message) {
  fprintf(stderr, "ringworker: %s\n", message.c_str());
  return code;
}

std::string DefaultTrainer(const char* argv0) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe = n > 0 ? std::string(self, n) : std::string(argv0);
  return (std::filesystem::path(exe).parent_path() / "ringtrainer").string();
}

// The host memory the node offers its ranks: --memory_mib when given (>= 0), else the
// machine's physical memory (0 when unknown: not stated).
int64_t NodeMemoryBytes(int64_t memory_mib) {
  if (memory_mib >= 0) return memory_mib << 20;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

// Where the agent serves its trainers' logs (--log_listen): "off" for nowhere; by default
// loopback without tokens (the coordinator listens on loopback, so it is on this machine),
// else the advertised host on a free port.
std::string LogListen(const std::string& flag, const std::string& advertise_host, bool tokens) {
  if (flag == "off") return "";
  if (!flag.empty()) return flag;
  if (!tokens) return "127.0.0.1:0";
  return advertise_host.find(':') == std::string::npos ? absl::StrCat(advertise_host, ":0")
                                                       : absl::StrCat("[", advertise_host, "]:0");
}

// gRPC says only "Socket closed" when a coordinator under mutual TLS turns away a client
// without a certificate: the agent asks the server itself, and stops (exit 1) naming the
// flags.
std::function<absl::Status(const absl::Status&)> DiagnoseMissingClientCertificate(
    const std::string& address) {
  return [address](const absl::Status&) {
    absl::StatusOr<bool> asks = worker::AsksForClientCertificate(address, absl::Seconds(2));
    if (!asks.ok() || !*asks) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator at ", address, " asks for a client certificate (mutual TLS: "
        "ringmaster --tls_client_ca) and this agent offers none, so the TLS handshake "
        "fails: give --tls_client_cert and --tls_client_key (a certificate signed by the "
        "CA of its --tls_client_ca)"));
  };
}

int Main(int argc, char** argv) {
  // SIGTERM: drain, then stop. Taken by sigwait on a thread of its own (below), so the
  // flags are plain atomics. Blocked first, before any thread (gRPC's) starts, so that
  // every thread inherits the mask and no handler (glog's) sees the signal.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::SetProgramUsageMessage("the ringmaster node agent; see --helpfull");
  ParseFlagsWithUsage(argc, argv, "ringworker");
  LoggingOptions logging;
  logging.program_name = argv[0];
  InitLogging(logging);
  if (absl::GetFlag(FLAGS_slots) < 1) return Fail(2, "--slots must be at least 1");
  const int64_t limit_mib = absl::GetFlag(FLAGS_trainer_memory_limit_mib);
  if (limit_mib < 0 || limit_mib > (int64_t{1} << 40)) {
    return Fail(2, absl::StrCat("--trainer_memory_limit_mib: ", limit_mib,
                                " is not a number of MiB in [0, 2^40] (0: no limit)"));
  }
  auto gpu_policy = worker::ParseGpuPolicy(absl::GetFlag(FLAGS_gpus));
  if (!gpu_policy.ok()) return Fail(2, std::string(gpu_policy.status().message()));
  worker::GpuCheckOptions gpu_check;
  gpu_check.policy = *gpu_policy;
  gpu_check.slots = absl::GetFlag(FLAGS_slots);
  absl::StatusOr<std::string> gpus = worker::CheckGpus(
      gpu_check,
      gpu_check.policy == worker::GpuPolicy::kNone ? worker::GpuProbe{} : worker::ProbeGpus());
  if (!gpus.ok()) return Fail(3, std::string(gpus.status().message()));
  std::string node = absl::GetFlag(FLAGS_node);
  if (node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    node = host;
  }
  std::string trainer = absl::GetFlag(FLAGS_trainer);
  if (trainer.empty()) trainer = DefaultTrainer(argv[0]);
  if (access(trainer.c_str(), X_OK) != 0) {
    return Fail(2, absl::StrCat("--trainer ", trainer, " is not an executable file"));
  }
  client::CoordinatorClientOptions co;
  co.address = absl::GetFlag(FLAGS_coordinator);
  if (!absl::GetFlag(FLAGS_node_token_file).empty()) {
    auto token = ReadSecretFile(absl::GetFlag(FLAGS_node_token_file));
    if (!token.ok()) return Fail(2, std::string(token.status().message()));
    co.token = std::string(absl::StripAsciiWhitespace(*token));
  }
  // The trainers read the same files (paths made absolute: they run in another directory).
  client::TlsFiles tls;
  for (auto [flag, path] : {std::pair{&FLAGS_tls_ca, &tls.ca},
                            std::pair{&FLAGS_tls_client_cert, &tls.client_cert},
                            std::pair{&FLAGS_tls_client_key, &tls.client_key}}) {
    std::error_code ec;
    if (!absl::GetFlag(*flag).empty()) {
      *path = std::filesystem::absolute(absl::GetFlag(*flag), ec).string();
    }
  }
  if (absl::Status s = client::ReadTlsFiles(tls, &co); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  // The loop retries by itself; a short retry keeps it responsive to SIGTERM.
  co.retry_for = absl::Seconds(2);
  auto client = ringmaster::client::GrpcCoordinatorClient::Create(co);
  if (!client.ok()) return Fail(2, std::string(client.status().message()));

  std::thread([signals] {
    while (true) {
      int sig = 0;
      sigwait(&signals, &sig);
      if (g_drain.exchange(true)) g_stop.store(true);
    }
  }).detach();

  worker::AgentOptions options;
  options.client = client->get();
  options.coordinator_address = co.address;
  options.tls_ca_file = tls.ca;
  options.tls_client_cert_file = tls.client_cert;
  options.tls_client_key_file = tls.client_key;
  options.node = node;
  options.slots = absl::GetFlag(FLAGS_slots);
  options.memory_bytes = NodeMemoryBytes(absl::GetFlag(FLAGS_memory_mib));
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.trainer_binary = trainer;
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  options.trainer_records_dir = options.work_dir + "/@trainers";
  for (absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_trainer_flags), ',', absl::SkipEmpty())) {
    options.trainer_flags.emplace_back(f);
  }
  options.trainer_memory_limit_bytes = limit_mib << 20;
  options.drain_grace = absl::Seconds(absl::GetFlag(FLAGS_drain_grace_s));
  options.node_token = co.token;
  options.log_listen = LogListen(absl::GetFlag(FLAGS_log_listen), options.advertise_host,
                                 !co.token.empty());
  if (!tls.ca.empty() && tls.client_cert.empty()) {
    options.diagnose_unreachable = DiagnoseMissingClientCertificate(co.address);
  }
  options.preemption_notice_file = absl::GetFlag(FLAGS_preemption_notice_file);
  options.drain_requested = &g_drain;
  options.stop_requested = &g_stop;
  options.log = [node](const std::string& line) {
    printf("ringworker %s: %s\n", node.c_str(), line.c_str());
    fflush(stdout);
  };
  options.log(*gpus);
  worker::Agent agent(options);
  absl::Status s = agent.Run();
  if (absl::IsCancelled(s)) {
    // SIGTERM before the node registered: nothing runs here, nothing to drain.
    options.log(absl::StrCat("exiting: ", s.message()));
    return 0;
  }
  if (!s.ok()) return Fail(absl::IsFailedPrecondition(s) ? 1 : 2, s.ToString());
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) { return ringmaster::Main(argc, argv); }
