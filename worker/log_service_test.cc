// The agent's log service over real gRPC on loopback: the node token is asked for and
// checked; only the logs of trainers the agent ran (or found from an earlier run) are
// served, never a file outside the work directory (job names that are paths, symbolic
// links); offsets from the start and from the end; a log that grows is read on from where
// the last read ended; a forgotten job is not served.
#include "worker/log_service.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"

namespace ringmaster::worker {
namespace {

constexpr char kToken[] = "node-token-0123456789";

void Write(const std::string& path, const std::string& text, bool append = false) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, append ? std::ios::app : std::ios::trunc) << text;
}

class LogServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/logs-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    work_ = root_ + "/work";
    std::filesystem::create_directories(work_);
  }

  void StartService() {
    service_.reset();
    auto s = LogService::Start({.listen = "127.0.0.1:0", .node_token = kToken, .work_dir = work_});
    ASSERT_TRUE(s.ok()) << s.status();
    service_ = std::move(*s);
    stub_ = AgentService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", service_->port()), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Read(const std::string& job, int slot, int64_t offset, ReadLogResponse* response,
                    int max_bytes = 0, const std::string& token = kToken) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ReadLogRequest r;
    r.set_job(job);
    r.set_slot(slot);
    r.set_offset(offset);
    r.set_max_bytes(max_bytes);
    return stub_->ReadLog(&ctx, r, response);
  }

  std::string root_, work_;
  std::unique_ptr<LogService> service_;
  std::unique_ptr<AgentService::Stub> stub_;
};

TEST_F(LogServiceTest, TheNodeTokenIsAskedForAndChecked) {
  StartService();
  Write(work_ + "/j/slot-0.log", "hello\n");
  service_->Add("j", 0);
  ReadLogResponse r;
  EXPECT_EQ(Read("j", 0, 0, &r, 0, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Read("j", 0, 0, &r, 0, "wrong-token-0123456789").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(Read("j", 0, 0, &r).ok());
  EXPECT_EQ(r.data(), "hello\n");
}

TEST_F(LogServiceTest, OffsetsFromTheStartAndFromTheEndAndAGrowingLog) {
  StartService();
  Write(work_ + "/j/slot-1.log", "0123456789");
  service_->Add("j", 1);
  ReadLogResponse r;
  ASSERT_TRUE(Read("j", 1, 0, &r, 4).ok());
  EXPECT_EQ(r.data(), "0123");
  EXPECT_EQ(r.offset(), 0);
  EXPECT_EQ(r.size(), 10);
  EXPECT_TRUE(r.running());
  ASSERT_TRUE(Read("j", 1, 4, &r).ok());
  EXPECT_EQ(r.data(), "456789");
  EXPECT_EQ(r.offset(), 4);
  ASSERT_TRUE(Read("j", 1, 10, &r).ok());
  EXPECT_EQ(r.data(), "");
  ASSERT_TRUE(Read("j", 1, 99, &r).ok());
  EXPECT_EQ(r.data(), "");
  EXPECT_EQ(r.offset(), 10);
  // From the end: the last 3 bytes; more than the file holds is all of it.
  ASSERT_TRUE(Read("j", 1, -3, &r).ok());
  EXPECT_EQ(r.data(), "789");
  EXPECT_EQ(r.offset(), 7);
  ASSERT_TRUE(Read("j", 1, -100, &r).ok());
  EXPECT_EQ(r.data(), "0123456789");
  // The trainer writes on; a follower reads on from where it was, and learns when the
  // trainer has gone.
  Write(work_ + "/j/slot-1.log", "abc", /*append=*/true);
  service_->SetRunning("j", 1, false);
  ASSERT_TRUE(Read("j", 1, 10, &r).ok());
  EXPECT_EQ(r.data(), "abc");
  EXPECT_FALSE(r.running());
  EXPECT_EQ(Read("j", 1, -1, &r, -5).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(LogServiceTest, OnlyLogsOfTrainersItRanAreServed) {
  StartService();
  // A log it did not start a trainer for (written after it started), another slot, another
  // job.
  Write(work_ + "/j/slot-0.log", "not mine\n");
  ReadLogResponse r;
  EXPECT_EQ(Read("j", 0, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  service_->Add("j", 1);
  EXPECT_EQ(Read("j", 0, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Read("k", 1, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  // Its own, deleted meanwhile.
  EXPECT_EQ(Read("j", 1, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Read("j", -1, 0, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(LogServiceTest, NoPathLeadsOutOfTheWorkDirectory) {
  StartService();
  Write(root_ + "/secret/slot-0.log", "secret\n");
  Write(root_ + "/secret.txt", "secret\n");
  ReadLogResponse r;
  for (const char* job : {"../secret", "..", ".", "/etc", "a/../../secret", ""}) {
    service_->Add(job, 0);  // even if the agent were told so
    grpc::Status s = Read(job, 0, 0, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << job;
    EXPECT_EQ(r.data(), "") << job;
  }
  // Symbolic links, to a directory or to a file outside, are not followed.
  std::filesystem::create_directory_symlink(root_ + "/secret", work_ + "/link");
  service_->Add("link", 0);
  EXPECT_EQ(Read("link", 0, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  std::filesystem::create_directories(work_ + "/j");
  std::filesystem::create_symlink(root_ + "/secret.txt", work_ + "/j/slot-0.log");
  service_->Add("j", 0);
  EXPECT_EQ(Read("j", 0, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(r.data(), "");
}

TEST_F(LogServiceTest, LogsOfAnEarlierRunStayReadableUntilTheJobIsForgotten) {
  Write(work_ + "/j/slot-2.log", "from before\n");
  Write(work_ + "/j/spec.yaml", "name: j\n");
  StartService();
  ReadLogResponse r;
  ASSERT_TRUE(Read("j", 2, 0, &r).ok());
  EXPECT_EQ(r.data(), "from before\n");
  EXPECT_FALSE(r.running());
  service_->Forget("j");
  EXPECT_EQ(Read("j", 2, 0, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(LogServiceTest, WithoutANodeTokenOnlyLoopbackIsServed) {
  // "127.example.invalid" is a host name, not an address in 127.0.0.0/8.
  for (const char* listen : {"0.0.0.0:0", "127.example.invalid:0"}) {
    auto s = LogService::Start({.listen = listen, .node_token = "", .work_dir = work_});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(s.status().message().find("not a loopback address"), std::string::npos)
        << s.status();
  }
  EXPECT_TRUE(LogService::Start({.listen = "127.0.0.1:0", .node_token = "", .work_dir = work_})
                  .ok());
}

}  // namespace
}  // namespace ringmaster::worker
