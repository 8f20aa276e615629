// The NCCL unique id through the coordinator's bootstrap store, as in a cluster: a real
// coordinator (ringmaster's Coordinator and gRPC server, in a forked process) places a
// two-rank job; each trainer rank joins the epoch with its membership token and builds an
// NcclCommunicator whose rank 0 publishes the unique id with StoreSet under the epoch's
// store prefix and whose rank 1 reads it with StoreGet; then they all-reduce.
//
// Under --config=cudaemu each rank has its own emulated GPU; with --config=cuda it needs two
// GPUs. No process that uses gRPC or CUDA forks: the coordinator, the placement and each
// rank are children of a test process that uses neither.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc_service.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "client/coordinator_store.h"
#include "client/grpc_coordinator_client.h"

namespace ringmaster {
namespace {

constexpr char kUserToken[] = "user-secret";
constexpr char kNodeToken[] = "node-secret";
constexpr int kRanks = 2;

// A coordinator serving on loopback in a child process until `~CoordinatorProcess`.
class CoordinatorProcess {
 public:
  explicit CoordinatorProcess(const std::string& dir) {
    int ports[2], stop[2];
    EXPECT_EQ(pipe(ports), 0);
    EXPECT_EQ(pipe(stop), 0);
    pid_ = fork();
    if (pid_ == 0) {
      close(ports[0]);
      close(stop[1]);
      coordinator::CoordinatorOptions options;
      options.database = dir + "/jobs.db";
      auto c = coordinator::Coordinator::Create(options);
      if (!c.ok()) _exit(1);
      coordinator::ServerOptions server_options;
      server_options.user_token = kUserToken;
      server_options.node_token = kNodeToken;
      auto server = coordinator::Server::Start(server_options, c->get());
      if (!server.ok()) _exit(2);
      const int port = (*server)->port();
      (void)!write(ports[1], &port, sizeof(port));
      char byte;
      (void)!read(stop[0], &byte, 1);  // until the test closes its end
      server->reset();
      _exit(0);
    }
    close(ports[1]);
    close(stop[0]);
    stop_ = stop[1];
    EXPECT_EQ(read(ports[0], &port_, sizeof(port_)), static_cast<ssize_t>(sizeof(port_)));
    close(ports[0]);
  }
  ~CoordinatorProcess() {
    close(stop_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  pid_t pid_ = -1;
  int stop_ = -1;
  int port_ = 0;
};

absl::StatusOr<std::unique_ptr<client::GrpcCoordinatorClient>> Client(const std::string& address,
                                                                  const std::string& token) {
  client::CoordinatorClientOptions options;
  options.address = address;
  options.token = token;
  return client::GrpcCoordinatorClient::Create(options);
}

// Registers a node with two slots and submits a two-rank job; writes the node's two start
// commands to dir/start<i>.
absl::Status Place(const std::string& address, const std::string& dir) {
  RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {}));
  spec.set_name("ncclstore");
  spec.mutable_elastic()->set_min_ranks(kRanks);
  spec.mutable_elastic()->set_max_ranks(kRanks);
  RM_ASSIGN_OR_RETURN(auto node, Client(address, kNodeToken));
  RM_ASSIGN_OR_RETURN(auto user, Client(address, kUserToken));
  RegisterNodeRequest reg;
  reg.set_node("a");
  reg.set_slots(kRanks);
  RM_ASSIGN_OR_RETURN(RegisterNodeResponse registered, node->RegisterNode(reg));
  RM_RETURN_IF_ERROR(user->Submit(spec).status());
  HeartbeatRequest heartbeat;
  heartbeat.set_node("a");
  heartbeat.set_node_credential(registered.node_credential());
  RM_ASSIGN_OR_RETURN(HeartbeatResponse commands, node->Heartbeat(heartbeat));
  int i = 0;
  for (const AgentCommand& c : commands.commands()) {
    if (!c.has_start()) continue;
    RM_RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(dir, "/start", i++), c.start().SerializeAsString()));
  }
  if (i != kRanks) return absl::InternalError(absl::StrCat(i, " start commands"));
  return absl::OkStatus();
}

// One trainer: joins the epoch, bootstraps NCCL through the coordinator's store, all-reduces.
absl::Status Rank(const std::string& address, const std::string& dir, int slot_index) {
  RM_ASSIGN_OR_RETURN(std::string bytes, ReadFile(absl::StrCat(dir, "/start", slot_index)));
  StartTrainerCommand start;
  if (!start.ParseFromString(bytes)) return absl::DataLossError("start command");
  RM_ASSIGN_OR_RETURN(auto client, Client(address, start.membership_token()));
  JoinRequest join;
  join.set_job(start.job());
  join.set_epoch(start.epoch());
  *join.mutable_slot() = start.slot();
  RM_ASSIGN_OR_RETURN(JoinResponse joined, client->Join(join, absl::Now() + absl::Seconds(60)));
  const int device = comm::testing::UseOwnGpu(joined.rank());
  // The store a trainer uses under a coordinator (worker/elastic_trainer.cc), this epoch's.
  client::CoordinatorStore store(client.get(), start.job(), start.slot(), joined.epoch());
  RM_ASSIGN_OR_RETURN(auto nccl,
                      comm::NcclCommunicator::Create({.rank = joined.rank(),
                                                      .size = joined.world_size(),
                                                      .store = &store,
                                                      .prefix = joined.store_prefix() + "nccl",
                                                      .device = device,
                                                      .init_timeout = absl::Seconds(60)}));
  // The id is in the coordinator's store, under the epoch's prefix.
  RM_ASSIGN_OR_RETURN(std::string id, store.Get(joined.store_prefix() + "nccl/unique_id",
                                                absl::Now() + absl::Seconds(5)));
  if (id.size() != 256) return absl::InternalError(absl::StrCat("unique id of ", id.size()));
  int32_t* value = nullptr;
  if (cudaMalloc(&value, sizeof(int32_t)) != cudaSuccess) return absl::InternalError("cudaMalloc");
  const int32_t mine = joined.rank() + 1;
  cudaMemcpy(value, &mine, sizeof(mine), cudaMemcpyHostToDevice);
  RM_RETURN_IF_ERROR(nccl->AllReduce(value, value, 1, DataType::kInt32, comm::ReduceOp::kSum,
                                     absl::Now() + absl::Seconds(30)));
  int32_t sum = 0;
  cudaMemcpy(&sum, value, sizeof(sum), cudaMemcpyDeviceToHost);
  cudaFree(value);
  if (sum != 3) return absl::InternalError(absl::StrCat("sum ", sum, ", want 3"));
  if (nccl->backend() != "nccl") return absl::InternalError("backend");
  return absl::OkStatus();
}

TEST(NcclCoordinatorStore, TheUniqueIdTravelsThroughTheCoordinator) {
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {
    GTEST_SKIP() << "fewer than " << kRanks << " GPUs (run it on the CPU with --config=cudaemu)";
  }
  const std::string dir = comm::testing::FreshStoreDir();
  std::filesystem::create_directories(dir);
  CoordinatorProcess coordinator(dir);
  const std::string address = coordinator.address();
  ASSERT_EQ(comm::testing::RunInChild([&] {
              absl::Status s = Place(address, dir);
              if (!s.ok()) std::fprintf(stderr, "placing the job: %s\n", s.ToString().c_str());
              return s.ok() ? 0 : 1;
            }),
            0);
  comm::testing::MultiProcOptions options;
  options.world_size = kRanks;
  const auto results = comm::testing::RunRanks(
      options,
      [&](comm::TcpCommunicator& tcp, absl::Duration*) { return Rank(address, dir, tcp.rank()); });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "slot " << r << ": " << results[r].status;
  }
}

}  // namespace
}  // namespace ringmaster
