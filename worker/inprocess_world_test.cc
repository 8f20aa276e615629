#include "worker/inprocess_world.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using nlohmann::json;

// Under /tmp, not TEST_TMPDIR: Bazel's is longer than a Unix socket path may be.
std::string TempDir() {
  std::string dir = "/tmp/inprocess_world_testXXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr) << strerror(errno);
  return dir;
}

CommandEnvInput Epoch(int64_t epoch, int rank, int world, int port) {
  CommandEnvInput in;
  in.epoch = epoch;
  in.placement.rank = rank;
  in.placement.world_size = world;
  in.placement.local_rank = rank;
  in.placement.local_world_size = world;
  in.master_addr = "127.0.0.1";
  in.master_port = port;
  in.restart_count = 1;
  in.restart_reason = "failure";
  return in;
}

// The program's end of the channel: what it writes, and the lines the runner sends it.
class Program {
 public:
  explicit Program(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address = {};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    EXPECT_EQ(connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
        << strerror(errno);
    timeval timeout = {5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Program() { close(fd_); }
  void Say(const json& message) {
    const std::string line = message.dump() + "\n";
    ASSERT_EQ(write(fd_, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  }
  // The next line the runner sent; empty after 5 s without one.
  json Next() {
    std::string line;
    char c;
    while (read(fd_, &c, 1) == 1 && c != '\n') line.push_back(c);
    return line.empty() ? json() : json::parse(line);
  }
  // Whether the runner sent anything within 100 ms.
  bool Quiet() {
    timeval timeout = {0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    char c;
    const bool quiet = read(fd_, &c, 1) != 1;
    timeval back = {5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &back, sizeof(back));
    return quiet;
  }

 private:
  int fd_ = -1;
};

class InProcessWorldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    auto channel = ProgramChannel::Listen(dir_ + "/control.sock");
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = std::move(*channel);
  }
  void TearDown() override {
    channel_.reset();
    rmdir(dir_.c_str());
  }
  // Feeds the world every message the program sent, until `want` came (5 s at most).
  void Pump(size_t want) {
    size_t got = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (got < want && absl::Now() < deadline) {
      for (const json& m : channel_->Poll()) {
        world_.Take(m, channel_.get());
        ++got;
      }
      if (got < want) absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(got, want);
  }
  std::string dir_;
  std::unique_ptr<ProgramChannel> channel_;
  InProcessWorld world_;
};

TEST(WorldMessageTest, CarriesWhatTheProcessGroupNeeds) {
  CommandEnvInput in = Epoch(4, 1, 3, 29500);
  in.placement.group_rank = 0;
  in.placement.group_world_size = 1;
  const json m = WorldMessage(in);
  EXPECT_EQ(m, json::parse(R"({"type":"world","epoch":4,"rank":1,"world_size":3,
      "local_rank":1,"local_world_size":3,"group_rank":0,"group_world_size":1,
      "master_addr":"127.0.0.1","master_port":29500,"restart_count":1,"reason":"failure"})"));
}

TEST_F(InProcessWorldTest, TheHelloThatOptsInIsAnsweredWithTheEpochsWorld) {
  ASSERT_TRUE(world_.SetWorld(Epoch(1, 0, 2, 1000), channel_.get()).ok());
  Program program(channel_->path());
  program.Say({{"type", "hello"}, {"pid", 7}, {"inprocess", true}});
  Pump(1);
  EXPECT_TRUE(world_.opted_in());
  const json world = program.Next();
  EXPECT_EQ(world["type"], "world");
  EXPECT_EQ(world["epoch"], 1);
  EXPECT_EQ(world["master_port"], 1000);
  EXPECT_EQ(world_.world_sent(), 1);
  // A later epoch goes to it at once, once.
  ASSERT_TRUE(world_.SetWorld(Epoch(2, 1, 3, 2000), channel_.get()).ok());
  ASSERT_TRUE(world_.SetWorld(Epoch(2, 1, 3, 2000), channel_.get()).ok());
  const json next = program.Next();
  EXPECT_EQ(next["epoch"], 2);
  EXPECT_EQ(next["rank"], 1);
  EXPECT_EQ(next["world_size"], 3);
  EXPECT_TRUE(program.Quiet());
  program.Say({{"type", "world_done"}, {"epoch", 2}});
  Pump(1);
  EXPECT_EQ(world_.world_done(), 2);
}

TEST_F(InProcessWorldTest, AProgramThatDoesNotOptInGetsNoWorld) {
  ASSERT_TRUE(world_.SetWorld(Epoch(1, 0, 2, 1000), channel_.get()).ok());
  Program program(channel_->path());
  program.Say({{"type", "hello"}, {"pid", 7}, {"inprocess", false}});
  Pump(1);
  EXPECT_FALSE(world_.opted_in());
  ASSERT_TRUE(world_.SetWorld(Epoch(2, 0, 2, 2000), channel_.get()).ok());
  EXPECT_TRUE(program.Quiet());
  EXPECT_EQ(world_.world_sent(), 0);
}

TEST_F(InProcessWorldTest, AReplacementGetsNoWorldItsPredecessorFailedIn) {
  ASSERT_TRUE(world_.SetWorld(Epoch(1, 0, 2, 1000), channel_.get()).ok());
  {
    Program first(channel_->path());
    first.Say({{"type", "hello"}, {"pid", 7}, {"inprocess", true}});
    Pump(1);
    EXPECT_EQ(first.Next()["epoch"], 1);
  }
  world_.ProgramGone();
  EXPECT_FALSE(world_.opted_in());
  Program second(channel_->path());
  second.Say({{"type", "hello"}, {"pid", 8}, {"inprocess", true}});
  Pump(1);
  EXPECT_TRUE(world_.opted_in());
  EXPECT_TRUE(second.Quiet());  // it waits for the epoch that takes it back
  ASSERT_TRUE(world_.SetWorld(Epoch(3, 1, 2, 3000), channel_.get()).ok());
  const json world = second.Next();
  EXPECT_EQ(world["epoch"], 3);
  EXPECT_EQ(world["rank"], 1);
}

}  // namespace
}  // namespace ringmaster::worker
