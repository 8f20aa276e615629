// coordinator_bench: issue 5's load goals for one coordinator on this machine.
//
//   bazel run -c opt //bench:coordinator_bench -- --nodes 1000 --seconds 20
//
// A coordinator (the real services over gRPC on loopback, its SQLite database in a temp
// directory) serves --nodes simulated agents, each registering one slot and heartbeating
// at --rate Hz from --threads client threads (each its own channel), for --seconds.
// Reported: heartbeat RPC latency percentiles (goal: p99 <= 50 ms) and the heartbeats
// that missed their schedule by more than a period.
// Then a job asks for every slot (min = max = nodes) and every simulated trainer calls
// Join at once: the rendezvous time is from the first Join sent to the last answered
// (goal: <= 2 s for 1,000 members). The machine is shared: compare numbers of one run.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc_service.h"
#include "spec/job_spec.h"
#include "client/grpc_coordinator_client.h"

ABSL_FLAG(int, nodes, 1000, "simulated agents (one slot each)");
ABSL_FLAG(double, rate, 1, "heartbeats per second per node");
ABSL_FLAG(int, seconds, 20, "how long the heartbeat load runs");
ABSL_FLAG(int, threads, 16, "client threads (each with its own channel)");
ABSL_FLAG(std::string, spec, "examples/fashion_mnist_mlp.yaml", "a job spec for the rendezvous");

namespace ringmaster {
namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

std::unique_ptr<client::GrpcCoordinatorClient> Client(int port, const std::string& token) {
  client::CoordinatorClientOptions o;
  o.address = absl::StrCat("127.0.0.1:", port);
  o.token = token;
  o.wait_step = absl::Seconds(30);
  return *client::GrpcCoordinatorClient::Create(o);
}

int Main() {
  // A socket or two per simulated trainer: lift the descriptor limit to its hard maximum.
  rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  const int nodes = absl::GetFlag(FLAGS_nodes), threads = absl::GetFlag(FLAGS_threads);
  if (nodes < 1 || threads < 1 || absl::GetFlag(FLAGS_rate) <= 0) {
    fprintf(stderr, "--nodes, --threads and --rate must be positive\n");
    return 2;
  }
  const std::string dir = absl::StrCat("/tmp/coordinator-bench-", getpid());
  std::filesystem::remove_all(dir);
  coordinator::CoordinatorOptions co;
  co.database = dir + "/jobs.db";
  co.membership.lease = absl::Seconds(10);
  co.membership.join_timeout = absl::Seconds(60);
  co.membership.hang_timeout = absl::ZeroDuration();
  auto coordinator = coordinator::Coordinator::Create(co);
  if (!coordinator.ok()) {
    fprintf(stderr, "%s\n", coordinator.status().ToString().c_str());
    return 1;
  }
  coordinator::ServerOptions so;
  so.listen = "127.0.0.1:0";
  auto server = coordinator::Server::Start(so, coordinator->get());
  if (!server.ok()) {
    fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  auto node_name = [](int i) { return absl::StrCat("node", 10000 + i); };

  // Registration; each node's later calls carry the credential it was given.
  std::vector<std::string> credentials(nodes);
  {
    auto client = Client(port, "");
    for (int i = 0; i < nodes; ++i) {
      RegisterNodeRequest r;
      r.set_node(node_name(i));
      r.set_slots(1);
      auto s = client->RegisterNode(r);
      if (!s.ok()) {
        fprintf(stderr, "register: %s\n", s.status().ToString().c_str());
        return 1;
      }
      credentials[i] = s->node_credential();
    }
  }

  // Heartbeat load: thread t owns nodes t, t + threads, ...; each node beats at `rate`.
  const absl::Duration period = absl::Seconds(1.0 / absl::GetFlag(FLAGS_rate));
  const absl::Time start = absl::Now() + absl::Milliseconds(200);
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  absl::Mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<int64_t> late{0}, failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto client = Client(port, "");
      std::vector<double> mine;
      std::vector<int> owned;
      for (int i = t; i < nodes; i += threads) owned.push_back(i);
      for (int64_t round = 0;; ++round) {
        for (size_t k = 0; k < owned.size(); ++k) {
          // Spread each node's beats evenly over the period.
          const absl::Time due = start + period * round + period * (static_cast<double>(k) /
                                                                    owned.size());
          if (due >= end) goto done;
          const absl::Time now = absl::Now();
          if (due > now) absl::SleepFor(due - now);
          if (absl::Now() - due > period) late.fetch_add(1);
          HeartbeatRequest r;
          r.set_node(node_name(owned[k]));
          r.set_node_credential(credentials[owned[k]]);
          const absl::Time sent = absl::Now();
          if (!client->Heartbeat(r).ok()) failed.fetch_add(1);
          mine.push_back(absl::ToDoubleMilliseconds(absl::Now() - sent));
        }
      }
    done:
      absl::MutexLock lock(&mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  for (auto& th : pool) th.join();
  pool.clear();
  const double p50 = Percentile(latencies_ms, 0.5), p99 = Percentile(latencies_ms, 0.99);
  printf("coordinator_bench: %d nodes heartbeating at %.3g Hz for %d s from %d threads\n", nodes,
         absl::GetFlag(FLAGS_rate), absl::GetFlag(FLAGS_seconds), threads);
  printf("  heartbeats: %zu, failed %ld, late by more than a period %ld\n", latencies_ms.size(),
         static_cast<long>(failed.load()), static_cast<long>(late.load()));
  printf("  latency: p50 %.2f ms, p99 %.2f ms, max %.2f ms   (goal p99 <= 50 ms: %s)\n", p50, p99,
         Percentile(latencies_ms, 1.0), p99 <= 50 ? "met" : "NOT met");

  // Rendezvous of every slot.
  auto spec = spec::LoadJobSpecFile(absl::GetFlag(FLAGS_spec), {});
  if (!spec.ok()) {
    fprintf(stderr, "--spec: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  spec->set_name("rendezvous");
  spec->mutable_elastic()->set_min_ranks(nodes);
  spec->mutable_elastic()->set_max_ranks(nodes);
  auto job = (*coordinator)->Submit(*spec);
  if (!job.ok() || job->members_size() != nodes) {
    fprintf(stderr, "submit: %s\n", job.ok() ? "not placed" : job.status().ToString().c_str());
    return 1;
  }
  // Every simulated trainer's client is made first; then all Join at once.
  std::vector<std::unique_ptr<client::GrpcCoordinatorClient>> clients;
  for (int i = 0; i < nodes; ++i) {
    ringmaster::SlotRef slot;
    slot.set_node(node_name(i));
    slot.set_slot(0);
    clients.push_back(Client(port, (*coordinator)->MembershipTokenFor("rendezvous", slot)));
  }
  std::atomic<int> joined{0}, errors{0};
  std::atomic<int64_t> last_ns{0};
  absl::Notification go;
  absl::Time first;
  for (int i = 0; i < nodes; ++i) {
    pool.emplace_back([&, i] {
      JoinRequest r;
      r.set_job("rendezvous");
      r.set_epoch(1);
      r.mutable_slot()->set_node(node_name(i));
      r.mutable_slot()->set_slot(0);
      go.WaitForNotification();
      auto response = clients[i]->Join(r, absl::Now() + absl::Seconds(60));
      if (response.ok() && response->world_size() == nodes) {
        joined.fetch_add(1);
      } else {
        errors.fetch_add(1);
      }
      const int64_t ns = absl::ToInt64Nanoseconds(absl::Now() - first);
      int64_t prev = last_ns.load();
      while (ns > prev && !last_ns.compare_exchange_weak(prev, ns)) {
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // the threads are parked at the barrier
  first = absl::Now();
  go.Notify();
  for (auto& th : pool) th.join();
  const double rendezvous_s = static_cast<double>(last_ns.load()) / 1e9;
  printf("  rendezvous of %d members: %.2f s from the first Join to the last answer, %d joined, "
         "%d errors   (goal <= 2 s: %s)\n",
         nodes, rendezvous_s, joined.load(), errors.load(),
         rendezvous_s <= 2 && errors.load() == 0 ? "met" : "NOT met");
  (*server)->Shutdown();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringmaster::Main();
}
