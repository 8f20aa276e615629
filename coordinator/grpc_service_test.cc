// The coordinator over real gRPC on loopback: tokens (none, wrong, another job's
// membership), bad input, a Join that blocks until the last candidate arrives, the
// bootstrap store across clients, Watch streaming changes, message size limits, the
// health service, and the loopback-only rule without tokens.
#include "coordinator/grpc_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/auth.h"
#include "grpcpp/grpcpp.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "spec/job_spec.h"
#include "worker/log_service.h"

namespace ringmaster::coordinator {
namespace {

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/grpc-", getpid(), "-",
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    CoordinatorOptions options;
    options.database = dir + "/jobs.db";
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    ServerOptions server_options;
    server_options.user_token = "user-secret";
    server_options.node_token = "node-secret";
    server_options.max_message_bytes = 64 << 10;
    server_options.max_log_streams = 2;
    auto server = Server::Start(server_options, coordinator_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    jobs_ = JobService::NewStub(channel_);
    workers_ = WorkerService::NewStub(channel_);
    auto spec = spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {});
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    spec_.set_name("mlp");
    spec_.mutable_elastic()->set_min_ranks(2);
    spec_.mutable_elastic()->set_max_ranks(2);
  }
  void TearDown() override {
    server_.reset();
    coordinator_.reset();
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token,
                                               absl::Duration timeout = absl::Seconds(10)) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }

  // Registers node a with two slots, submits the job; returns the two start commands.
  std::vector<StartTrainerCommand> Place() {
    RegisterNodeRequest reg;
    reg.set_node("a");
    reg.set_slots(2);
    RegisterNodeResponse reg_response;
    EXPECT_TRUE(workers_->RegisterNode(Context("node-secret").get(), reg, &reg_response).ok());
    SubmitRequest submit;
    *submit.mutable_spec() = spec_;
    Job job;
    grpc::Status s = jobs_->Submit(Context("user-secret").get(), submit, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    HeartbeatRequest hb;
    hb.set_node("a");
    hb.set_node_credential(reg_response.node_credential());
    HeartbeatResponse hb_response;
    EXPECT_TRUE(workers_->Heartbeat(Context("node-secret").get(), hb, &hb_response).ok());
    std::vector<StartTrainerCommand> starts;
    for (const AgentCommand& c : hb_response.commands()) starts.push_back(c.start());
    return starts;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<JobService::Stub> jobs_;
  std::unique_ptr<WorkerService::Stub> workers_;
  JobSpec spec_;
};

TEST_F(GrpcServiceTest, TokensAreRequiredAndChecked) {
  SubmitRequest submit;
  *submit.mutable_spec() = spec_;
  Job job;
  EXPECT_EQ(jobs_->Submit(Context("").get(), submit, &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(jobs_->Submit(Context("node-secret").get(), submit, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  RegisterNodeRequest reg;
  reg.set_node("a");
  reg.set_slots(2);
  RegisterNodeResponse reg_response;
  EXPECT_EQ(workers_->RegisterNode(Context("user-secret").get(), reg, &reg_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  const std::vector<StartTrainerCommand> starts = Place();
  ASSERT_EQ(starts.size(), 2u);
  // A trainer's token is for its own slot (and job) only.
  ReadyRequest ready;
  ready.set_job("mlp");
  ready.set_epoch(1);
  *ready.mutable_slot() = Slot("a", 1);
  ReadyResponse ready_response;
  EXPECT_EQ(workers_->Ready(Context(starts[0].membership_token()).get(), ready, &ready_response)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(workers_->Ready(Context("node-secret").get(), ready, &ready_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // With its own token the call gets through to the state machine (not committed yet).
  EXPECT_EQ(workers_->Ready(Context(starts[1].membership_token()).get(), ready, &ready_response)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// Issue 36 point 20: four kinds of credential (user token, node token, a node's credential,
// a trainer's membership token) and four places that check one. None is accepted in
// another's place, even for a job named "node" (whose membership token on slot 0 was a
// node's credential when both were the same HMAC input).
TEST_F(GrpcServiceTest, NoTokenOfOneKindIsValidAsAnother) {
  spec_.set_name("node");
  const std::vector<StartTrainerCommand> starts = Place();
  ASSERT_EQ(starts.size(), 2u);
  const StartTrainerCommand& start = starts[0].slot().slot() == 0 ? starts[0] : starts[1];
  ASSERT_EQ(start.slot().slot(), 0);
  ASSERT_EQ(start.job(), "node");
  const std::map<std::string, std::string> kinds = {
      {"user token", "user-secret"},
      {"node token", "node-secret"},
      {"node credential", coordinator_->NodeCredentialFor("a")},
      {"membership token", start.membership_token()},
  };
  // Each place: whether a call carrying `token` in it gets through.
  const std::map<std::string, std::function<bool(const std::string&)>> places = {
      {"user token",
       [&](const std::string& token) {
         GetJobRequest get;
         get.set_job("node");
         Job job;
         return jobs_->Get(Context(token).get(), get, &job).ok();
       }},
      {"node token",
       [&](const std::string& token) {
         HeartbeatRequest hb;
         hb.set_node("a");
         hb.set_node_credential(kinds.at("node credential"));
         HeartbeatResponse response;
         return workers_->Heartbeat(Context(token).get(), hb, &response).ok();
       }},
      {"node credential",
       [&](const std::string& token) {
         HeartbeatRequest hb;
         hb.set_node("a");
         hb.set_node_credential(token);
         HeartbeatResponse response;
         return workers_->Heartbeat(Context("node-secret").get(), hb, &response).ok();
       }},
      {"membership token",
       [&](const std::string& token) {
         StoreAddRequest add;
         add.set_job("node");
         *add.mutable_slot() = start.slot();
         add.set_epoch(start.epoch());
         add.set_key("k");
         add.set_delta(1);
         StoreAddResponse response;
         return workers_->StoreAdd(Context(token).get(), add, &response).ok();
       }},
  };
  for (const auto& [place, accepts] : places) {
    for (const auto& [kind, token] : kinds) {
      EXPECT_EQ(accepts(token), kind == place) << "the " << kind << " where the " << place
                                               << " belongs";
    }
  }
  EXPECT_NE(kinds.at("node credential"), kinds.at("membership token"));
}

TEST_F(GrpcServiceTest, BadInputNamesTheField) {
  SubmitRequest submit;
  *submit.mutable_spec() = spec_;
  submit.mutable_spec()->mutable_optimizer()->set_lr(-1);
  Job job;
  grpc::Status s = jobs_->Submit(Context("user-secret").get(), submit, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("optimizer.lr"), std::string::npos) << s.error_message();
  GetJobRequest get;
  get.set_job("nope");
  EXPECT_EQ(jobs_->Get(Context("user-secret").get(), get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Larger than the server accepts.
  submit.mutable_spec()->set_name(std::string(100 << 10, 'x'));
  EXPECT_EQ(jobs_->Submit(Context("user-secret").get(), submit, &job).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// What ringctl's YAML loader refuses is refused when it comes over raw gRPC: the coordinator's Submit runs the same spec::ValidateJobSpec.
TEST_F(GrpcServiceTest, ASubmitOverRawGrpcIsValidatedAsRingctlDoes) {
  const std::vector<std::pair<std::function<void(JobSpec*)>, std::string>> cases = {
      {[](JobSpec* s) { s->mutable_optimizer()->set_lr(std::numeric_limits<double>::infinity()); },
       "optimizer.lr: must be a finite number"},
      {[](JobSpec* s) { s->mutable_optimizer()->set_lr(std::nan("")); },
       "optimizer.lr: must be a finite number"},
      {[](JobSpec* s) { s->set_backend(static_cast<JobSpec::Backend>(99)); },
       "backend: must be one of"},
  };
  for (const auto& [change, want] : cases) {
    SubmitRequest submit;
    *submit.mutable_spec() = spec_;
    change(submit.mutable_spec());
    Job job;
    grpc::Status s = jobs_->Submit(Context("user-secret").get(), submit, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << want;
    EXPECT_NE(s.error_message().find(want), std::string::npos) << s.error_message();
  }
  ListJobsRequest list;
  ListJobsResponse listed;
  ASSERT_TRUE(jobs_->List(Context("user-secret").get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0) << "a refused spec left a job behind";
}

TEST_F(GrpcServiceTest, JoinBlocksUntilTheEpochCommitsThenStoreAndWatchWork) {
  const std::vector<StartTrainerCommand> starts = Place();
  ASSERT_EQ(starts.size(), 2u);
  JoinResponse first;
  grpc::Status first_status;
  std::thread joiner([&] {
    JoinRequest join;
    join.set_job("mlp");
    join.set_epoch(1);
    *join.mutable_slot() = starts[1].slot();
    first_status = workers_->Join(Context(starts[1].membership_token()).get(), join, &first);
  });
  absl::SleepFor(absl::Milliseconds(200));  // the first join is waiting (no way to observe it)
  JoinRequest join;
  join.set_job("mlp");
  join.set_epoch(1);
  *join.mutable_slot() = starts[0].slot();
  JoinResponse second;
  ASSERT_TRUE(workers_->Join(Context(starts[0].membership_token()).get(), join, &second).ok());
  joiner.join();
  ASSERT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_EQ(first.rank(), 1);
  EXPECT_EQ(second.rank(), 0);
  EXPECT_EQ(second.world_size(), 2);

  // Rank 0 publishes; rank 1 waits for it.
  StoreGetResponse got;
  grpc::Status get_status;
  std::thread reader([&] {
    StoreGetRequest get;
    get.set_job("mlp");
    get.set_epoch(first.epoch());
    *get.mutable_slot() = starts[1].slot();
    get.add_keys(first.store_prefix() + "addr0");
    get_status = workers_->StoreGet(Context(starts[1].membership_token()).get(), get, &got);
  });
  StoreSetRequest set;
  set.set_job("mlp");
  set.set_epoch(second.epoch());
  *set.mutable_slot() = starts[0].slot();
  set.set_key(second.store_prefix() + "addr0");
  set.set_value("127.0.0.1:12345");
  StoreSetResponse set_response;
  ASSERT_TRUE(workers_->StoreSet(Context(starts[0].membership_token()).get(), set, &set_response)
                  .ok());
  reader.join();
  ASSERT_TRUE(get_status.ok()) << get_status.error_message();
  EXPECT_EQ(got.values(0), "127.0.0.1:12345");

  // Watch: the current state, then the change to RUNNING, then CANCELLED ends the stream.
  auto watch_ctx = Context("user-secret");
  WatchJobRequest watch;
  watch.set_job("mlp");
  auto stream = jobs_->Watch(watch_ctx.get(), watch);
  JobEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.job().phase(), JOB_PHASE_COMMITTED);
  for (const StartTrainerCommand& start : starts) {
    ReadyRequest ready;
    ready.set_job("mlp");
    ready.set_epoch(1);
    *ready.mutable_slot() = start.slot();
    ReadyResponse ready_response;
    ASSERT_TRUE(workers_->Ready(Context(start.membership_token()).get(), ready, &ready_response)
                    .ok());
  }
  do {
    ASSERT_TRUE(stream->Read(&event));
  } while (event.job().phase() != JOB_PHASE_RUNNING);
  CancelJobRequest cancel;
  cancel.set_job("mlp");
  Job cancelled;
  ASSERT_TRUE(jobs_->Cancel(Context("user-secret").get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.phase(), JOB_PHASE_CANCELLED);
  while (stream->Read(&event)) {
  }
  EXPECT_EQ(event.job().phase(), JOB_PHASE_CANCELLED);
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(GrpcServiceTest, JoinReturnsAtItsDeadline) {
  const std::vector<StartTrainerCommand> starts = Place();
  JoinRequest join;
  join.set_job("mlp");
  join.set_epoch(1);
  *join.mutable_slot() = starts[0].slot();
  JoinResponse response;
  const absl::Time start = absl::Now();
  grpc::Status s = workers_->Join(Context(starts[0].membership_token(), absl::Milliseconds(300)).get(),
                                  join, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// A client that sends bytes that are no protobuf of the method's request type (a client
// built from other .proto files, say) is told so: INVALID_ARGUMENT naming the method, not
// gRPC's bare UNIMPLEMENTED (issue 17, point 15).
TEST_F(GrpcServiceTest, AMalformedRequestIsNamedAsSuch) {
  grpc::GenericStub stub(channel_);
  const char garbage[] = "\xff\xff\xff\xff\x0f";
  grpc::Slice slice(garbage, sizeof(garbage) - 1);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer user-secret");
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/ringmaster.JobService/Get", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("/ringmaster.JobService/Get"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("not a valid protobuf message"), std::string::npos);
}

TEST_F(GrpcServiceTest, HealthServiceAnswers) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = health->Check(Context("").get(), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ServerOptions, NonLoopbackNeedsTokens) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  ServerOptions options;
  // A host name starting with "127." is not loopback: any name resolves
  // wherever its owner points it.
  for (const char* listen : {"0.0.0.0:0", "127.example.invalid:0"}) {
    options.listen = listen;
    auto server = Server::Start(options, nullptr);
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_NE(server.status().message().find("--user_token_file"), std::string::npos)
        << server.status();
  }
  options.listen = "127.0.0.1:0";
  options.tls_cert = "x";
  EXPECT_EQ(Server::Start(options, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

// A port another socket holds: Start says so, naming the address (it used to crash while
// tearing down the server that never started).
TEST(ServerStart, APortInUseIsAnErrorNotACrash) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  auto server = Server::Start(options, nullptr);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable) << server.status();
  EXPECT_NE(server.status().message().find(options.listen), std::string::npos)
      << server.status();
  EXPECT_NE(server.status().message().find("in use"), std::string::npos) << server.status();
  close(fd);
}

// gRPC would set SO_REUSEPORT, letting a second coordinator serve the same address (and
// split the clients between the two). The second is refused, naming the cause.
TEST(ServerStart, ASecondCoordinatorOnTheSamePortIsRefused) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/reuseport-", getpid());
  std::filesystem::remove_all(dir);
  CoordinatorOptions options;
  options.database = dir + "/first.db";
  auto first_coordinator = Coordinator::Create(options);
  ASSERT_TRUE(first_coordinator.ok()) << first_coordinator.status();
  options.database = dir + "/second.db";
  auto second_coordinator = Coordinator::Create(options);
  ASSERT_TRUE(second_coordinator.ok()) << second_coordinator.status();
  ServerOptions server_options;
  auto first = Server::Start(server_options, first_coordinator->get());
  ASSERT_TRUE(first.ok()) << first.status();
  server_options.listen = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = Server::Start(server_options, second_coordinator->get());
  ASSERT_FALSE(second.ok()) << "a second coordinator serves port " << (*first)->port();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
}

// A file that is not a certificate or key is named as such, not as "cannot listen".
TEST(ServerStart, BadTlsFilesAreNamed) {
  ServerOptions options;
  options.tls_cert = "not a certificate";
  options.tls_key = "not a key";
  auto server = Server::Start(options, nullptr);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--tls_cert does not hold a PEM certificate"),
            std::string::npos)
      << server.status();
  EXPECT_EQ(CheckTlsMaterial("", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                             "")
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(CheckTlsMaterial("", "", "garbage").message().find("--tls_client_ca"),
            std::string::npos);
}

// --- Jobs a user manages: delete, nodes, logs through the agent's log service. ---

class ManageTest : public GrpcServiceTest {
 protected:
  void SetUp() override {
    GrpcServiceTest::SetUp();
    work_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/agent-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_ + "/mlp");
  }
  void TearDown() override {
    GrpcServiceTest::TearDown();
    agent_logs_.reset();
  }

  void StartAgentLogs(const std::string& token = "node-secret") {
    auto logs = worker::LogService::Start(
        {.listen = "127.0.0.1:0", .node_token = token, .work_dir = work_});
    ASSERT_TRUE(logs.ok()) << logs.status();
    agent_logs_ = std::move(*logs);
  }

  // Node a (2 slots, serving logs at `log_address`) runs the job; both ranks have joined.
  void RunJob(const std::string& log_address) {
    RegisterNodeRequest reg;
    reg.set_node("a");
    reg.set_slots(2);
    reg.set_log_address(log_address);
    RegisterNodeResponse registered;
    ASSERT_TRUE(workers_->RegisterNode(Context("node-secret").get(), reg, &registered).ok());
    SubmitRequest submit;
    *submit.mutable_spec() = spec_;
    Job job;
    ASSERT_TRUE(jobs_->Submit(Context("user-secret").get(), submit, &job).ok());
    for (int slot = 0; slot < 2; ++slot) {
      JoinRequest join;
      join.set_job("mlp");
      join.set_epoch(1);
      *join.mutable_slot() = Slot("a", slot);
      coordinator_->Join(join, absl::Now() + absl::Seconds(10), [](auto) {});
    }
    ASSERT_EQ(coordinator_->Get("mlp")->phase(), JOB_PHASE_COMMITTED);
  }

  void AppendLog(int slot, const std::string& text) {
    std::ofstream(absl::StrCat(work_, "/mlp/slot-", slot, ".log"), std::ios::app) << text;
  }

  // The whole stream of a Logs call, and how it ended.
  grpc::Status ReadLogs(const LogsRequest& request, std::string* text,
                        const std::string& token = "user-secret") {
    auto ctx = Context(token);
    auto stream = jobs_->Logs(ctx.get(), request);
    LogChunk chunk;
    while (stream->Read(&chunk)) text->append(chunk.data());
    return stream->Finish();
  }

  std::string work_;
  std::unique_ptr<worker::LogService> agent_logs_;
};

TEST_F(ManageTest, LogsOfARankAreReadFromItsAgent) {
  StartAgentLogs();
  AppendLog(0, "rank 0 says hello\n");
  AppendLog(1, "rank 1 says hello\n");
  agent_logs_->Add("mlp", 0);
  agent_logs_->Add("mlp", 1);
  RunJob(absl::StrCat("127.0.0.1:", agent_logs_->port()));
  LogsRequest request;
  request.set_job("mlp");
  std::string text;
  grpc::Status s = ReadLogs(request, &text);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(text, "rank 0 says hello\n");
  request.set_rank(1);
  text.clear();
  ASSERT_TRUE(ReadLogs(request, &text).ok());
  EXPECT_EQ(text, "rank 1 says hello\n");
  request.set_tail_bytes(6);
  text.clear();
  ASSERT_TRUE(ReadLogs(request, &text).ok());
  EXPECT_EQ(text, "hello\n");
  // Not for a node's token, nor for an unknown job or rank.
  text.clear();
  EXPECT_EQ(ReadLogs(request, &text, "node-secret").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  request.set_job("nope");
  EXPECT_EQ(ReadLogs(request, &text).error_code(), grpc::StatusCode::NOT_FOUND);
  request.set_job("mlp");
  request.set_rank(7);
  EXPECT_EQ(ReadLogs(request, &text).error_code(), grpc::StatusCode::NOT_FOUND);
  // A slot the agent ran no trainer on: the agent's NOT_FOUND, naming the node.
  *request.mutable_slot() = Slot("a", 5);
  s = ReadLogs(request, &text);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("node a"), std::string::npos) << s.error_message();
  EXPECT_EQ(text, "");
}

TEST_F(ManageTest, AFollowedLogStreamsUntilTheJobEndsAndItsTrainerIsGone) {
  StartAgentLogs();
  AppendLog(0, "step 1\n");
  agent_logs_->Add("mlp", 0);
  RunJob(absl::StrCat("127.0.0.1:", agent_logs_->port()));
  LogsRequest request;
  request.set_job("mlp");
  request.set_follow(true);
  auto ctx = Context("user-secret", absl::Seconds(30));
  auto stream = jobs_->Logs(ctx.get(), request);
  LogChunk chunk;
  ASSERT_TRUE(stream->Read(&chunk));
  EXPECT_EQ(chunk.data(), "step 1\n");
  EXPECT_EQ(chunk.offset(), 0);
  EXPECT_EQ(chunk.slot().node(), "a");
  // The trainer writes on: the follower gets it.
  AppendLog(0, "step 2\n");
  ASSERT_TRUE(stream->Read(&chunk));
  EXPECT_EQ(chunk.data(), "step 2\n");
  EXPECT_EQ(chunk.offset(), 7);
  // The job ends; its trainer writes its last words and is gone: the stream ends with them.
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  AppendLog(0, "stopped\n");
  agent_logs_->SetRunning("mlp", 0, false);
  std::string rest;
  while (stream->Read(&chunk)) rest += chunk.data();
  grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(rest, "stopped\n");
  // The log stays readable after the job ended, until it is deleted.
  request.set_follow(false);
  std::string text;
  ASSERT_TRUE(ReadLogs(request, &text).ok());
  EXPECT_EQ(text, "step 1\nstep 2\nstopped\n");
}

TEST_F(ManageTest, LogStreamsAreBoundedAndEndWhenTheClientLeaves) {
  StartAgentLogs();
  agent_logs_->Add("mlp", 0);
  AppendLog(0, "x\n");
  RunJob(absl::StrCat("127.0.0.1:", agent_logs_->port()));
  LogsRequest request;
  request.set_job("mlp");
  request.set_follow(true);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<LogChunk>>> streams;
  for (int i = 0; i < 2; ++i) {  // max_log_streams
    contexts.push_back(Context("user-secret", absl::Seconds(30)));
    streams.push_back(jobs_->Logs(contexts.back().get(), request));
    LogChunk chunk;
    ASSERT_TRUE(streams.back()->Read(&chunk));
  }
  std::string text;
  grpc::Status third = ReadLogs(request, &text);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  // A client that leaves frees its stream (and its thread).
  contexts[0]->TryCancel();
  EXPECT_EQ(streams[0]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  grpc::Status again;
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto ctx = Context("user-secret");
    LogsRequest once = request;
    once.set_follow(false);
    auto stream = jobs_->Logs(ctx.get(), once);
    LogChunk chunk;
    while (stream->Read(&chunk)) {
    }
    again = stream->Finish();
    if (again.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  contexts[1]->TryCancel();
  streams[1]->Finish();
}

TEST_F(ManageTest, AnAgentThatCannotBeReachedOrRefusesIsNamed) {
  StartAgentLogs("another-node-token");
  agent_logs_->Add("mlp", 0);
  AppendLog(0, "x\n");
  RunJob(absl::StrCat("127.0.0.1:", agent_logs_->port()));
  LogsRequest request;
  request.set_job("mlp");
  std::string text;
  grpc::Status refused = ReadLogs(request, &text);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("--node_token_file"), std::string::npos)
      << refused.error_message();
  const int port = agent_logs_->port();
  agent_logs_.reset();
  grpc::Status down = ReadLogs(request, &text);
  EXPECT_EQ(down.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(down.error_message().find(absl::StrCat("node a at 127.0.0.1:", port)),
            std::string::npos)
      << down.error_message();
  EXPECT_NE(down.error_message().find("mlp/slot-0.log"), std::string::npos)
      << down.error_message();
}

TEST_F(ManageTest, DeleteAndListNodesOverGrpc) {
  RunJob("");
  ListNodesResponse nodes;
  ASSERT_TRUE(jobs_->ListNodes(Context("user-secret").get(), ListNodesRequest(), &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).slots(1).job(), "mlp");
  EXPECT_EQ(jobs_->ListNodes(Context("").get(), ListNodesRequest(), &nodes).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  DeleteJobRequest del;
  del.set_job("mlp");
  DeleteJobResponse deleted;
  grpc::Status live = jobs_->Delete(Context("user-secret").get(), del, &deleted);
  EXPECT_EQ(live.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(live.error_message().find("committed: cancel it first"), std::string::npos)
      << live.error_message();
  ASSERT_TRUE(coordinator_->Cancel("mlp").ok());
  ASSERT_TRUE(jobs_->Delete(Context("user-secret").get(), del, &deleted).ok());
  EXPECT_EQ(jobs_->Delete(Context("user-secret").get(), del, &deleted).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace ringmaster::coordinator
