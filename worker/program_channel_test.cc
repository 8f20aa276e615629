#include "worker/program_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using nlohmann::json;

// Under /tmp, not TEST_TMPDIR: Bazel's is longer than a Unix socket path may be.
std::string TempDir() {
  std::string dir = "/tmp/program_channel_testXXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr) << strerror(errno);
  return dir;
}

// The program's end: a plain blocking client socket.
int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
      << strerror(errno);
  return fd;
}

void Write(int fd, const std::string& bytes) {
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// Polls until `want` messages came, or 5 s passed (the bytes are in the kernel already; the
// deadline only bounds a broken channel).
std::vector<json> PollFor(ProgramChannel& channel, size_t want) {
  std::vector<json> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (got.size() < want && absl::Now() < deadline) {
    for (json& m : channel.Poll()) got.push_back(std::move(m));
    if (got.size() < want) absl::SleepFor(absl::Milliseconds(1));
  }
  return got;
}

// Reads one line the runner sent, blocking (bounded by SO_RCVTIMEO).
std::string ReadLine(int fd) {
  timeval timeout = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

class ProgramChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempDir() + "/control.sock";
    auto channel = ProgramChannel::Listen(path_, &clock_);
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = std::move(*channel);
  }
  void TearDown() override {
    channel_.reset();  // removes the socket file
    rmdir(path_.substr(0, path_.rfind('/')).c_str());
  }
  FakeClock clock_;
  std::string path_;
  std::unique_ptr<ProgramChannel> channel_;
};

TEST_F(ProgramChannelTest, NothingBeforeTheProgramConnects) {
  EXPECT_EQ(channel_->path(), path_);
  EXPECT_TRUE(channel_->Poll().empty());
  EXPECT_FALSE(channel_->connected());
  EXPECT_EQ(channel_->last_heard(), absl::InfinitePast());
  EXPECT_FALSE(channel_->said_hello());
}

TEST_F(ProgramChannelTest, APartialLineWaitsForItsEnd) {
  const int fd = Connect(path_);
  Write(fd, R"({"type":"report","st)");
  EXPECT_TRUE(PollFor(*channel_, 1).empty());
  EXPECT_TRUE(channel_->connected());
  Write(fd, "ep\":7,\"loss\":0.5}\n");
  std::vector<json> got = PollFor(*channel_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["type"], "report");
  EXPECT_EQ(got[0]["step"], 7);
  EXPECT_EQ(got[0]["loss"], 0.5);
  close(fd);
}

TEST_F(ProgramChannelTest, SeveralMessagesInOneReadComeInOrder) {
  const int fd = Connect(path_);
  clock_.Advance(absl::Seconds(3));
  Write(fd,
        "{\"type\":\"hello\",\"pid\":42,\"inprocess\":true}\n{\"type\":\"heartbeat\"}\n"
        "{\"type\":\"report\",\"step\":1}\n{\"type\":\"report\",\"step\":2}\n");
  std::vector<json> got = PollFor(*channel_, 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0]["type"], "hello");
  EXPECT_EQ(got[1]["type"], "heartbeat");
  EXPECT_EQ(got[2]["step"], 1);
  EXPECT_EQ(got[3]["step"], 2);
  EXPECT_TRUE(channel_->said_hello());
  EXPECT_TRUE(channel_->hello_inprocess());
  EXPECT_EQ(channel_->last_heard(), clock_.Now());
  close(fd);
}

TEST_F(ProgramChannelTest, BadLinesAreSkippedAndTheRestRead) {
  const int fd = Connect(path_);
  Write(fd,
        "not json at all\n[1,2]\n{\"step\":3}\n{\"type\":5}\n\n"
        "{\"type\":\"report\",\"step\":4}\n");
  std::vector<json> got = PollFor(*channel_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["step"], 4);
  EXPECT_TRUE(channel_->Poll().empty());
  EXPECT_TRUE(channel_->connected());
  close(fd);
}

TEST_F(ProgramChannelTest, ALineLongerThanTheLimitIsSkippedWhole) {
  const int fd = Connect(path_);
  // Written while the channel polls: the socket's buffer holds less than the line.
  std::string junk(ProgramChannel::kMaxLineBytes + 10, 'x');
  size_t written = 0;
  std::vector<json> got;
  while (written < junk.size()) {
    const ssize_t n = send(fd, junk.data() + written, junk.size() - written, MSG_DONTWAIT);
    if (n > 0) written += static_cast<size_t>(n);
    for (json& m : channel_->Poll()) got.push_back(std::move(m));
  }
  Write(fd, "tail of the long line\n{\"type\":\"heartbeat\"}\n");
  for (json& m : PollFor(*channel_, 1)) got.push_back(std::move(m));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["type"], "heartbeat");
  close(fd);
}

TEST_F(ProgramChannelTest, AReconnectReplacesTheConnectionAndLosesNothing) {
  int fd = Connect(path_);
  Write(fd, "{\"type\":\"hello\",\"pid\":1,\"inprocess\":true}\n");
  ASSERT_EQ(PollFor(*channel_, 1).size(), 1u);
  Write(fd, "{\"type\":\"report\",\"step\":10}\n");
  close(fd);
  const int second = Connect(path_);
  Write(second, "{\"type\":\"hello\",\"pid\":2,\"inprocess\":false}\n");
  std::vector<json> got = PollFor(*channel_, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]["step"], 10);  // what the first connection sent before it closed
  EXPECT_EQ(got[1]["pid"], 2);
  EXPECT_TRUE(channel_->connected());
  EXPECT_TRUE(channel_->said_hello());
  EXPECT_FALSE(channel_->hello_inprocess());
  ASSERT_TRUE(channel_->Send({{"type", "stop"}, {"reason", "drain"}}).ok());
  EXPECT_EQ(json::parse(ReadLine(second)), json({{"type", "stop"}, {"reason", "drain"}}));
  close(second);
}

TEST_F(ProgramChannelTest, TheProgramsCloseIsSeen) {
  const int fd = Connect(path_);
  Write(fd, "{\"type\":\"heartbeat\"}\n{\"type\":\"report\",\"step\":5}");  // no final newline
  close(fd);
  std::vector<json> got = PollFor(*channel_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(channel_->connected());
  EXPECT_TRUE(absl::IsFailedPrecondition(channel_->Send({{"type", "stop"}})));
}

TEST_F(ProgramChannelTest, SendWithoutAProgramIsRefused) {
  absl::Status s = channel_->Send({{"type", "stop"}, {"reason", "epoch"}});
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(path_), std::string::npos) << s;
}

TEST_F(ProgramChannelTest, SendToAProgramThatDoesNotReadTimesOut) {
  const int fd = Connect(path_);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  channel_->Poll();
  ASSERT_TRUE(channel_->connected());
  const json big = {{"type", "world"}, {"pad", std::string(64 * 1024, 'p')}};
  absl::Status s = absl::OkStatus();
  for (int i = 0; i < 1000 && s.ok(); ++i) s = channel_->Send(big);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_FALSE(channel_->connected());
  close(fd);
}

TEST(ProgramChannelListenTest, ReplacesAStaleSocketAndRemovesItsOwn) {
  const std::string path = TempDir() + "/stale.sock";
  {
    auto first = ProgramChannel::Listen(path);
    ASSERT_TRUE(first.ok()) << first.status();
    ProgramChannel* leaked = first->release();  // a crashed runner: its socket file stays
    (void)leaked;
  }
  auto second = ProgramChannel::Listen(path);
  ASSERT_TRUE(second.ok()) << second.status();
  second->reset();
  struct stat st;
  EXPECT_NE(lstat(path.c_str(), &st), 0);
  rmdir(path.substr(0, path.rfind('/')).c_str());
}

// A runner that opens the next epoch's channel before it drops the last one: the old one's
// destructor leaves the new socket file alone.
TEST(ProgramChannelListenTest, AnOlderChannelAtThePathDoesNotRemoveTheNewersSocket) {
  const std::string path = TempDir() + "/control.sock";
  auto old_channel = ProgramChannel::Listen(path);
  ASSERT_TRUE(old_channel.ok()) << old_channel.status();
  auto new_channel = ProgramChannel::Listen(path);
  ASSERT_TRUE(new_channel.ok()) << new_channel.status();
  old_channel->reset();
  const int fd = Connect(path);
  Write(fd, "{\"type\":\"heartbeat\"}\n");
  EXPECT_EQ(PollFor(**new_channel, 1).size(), 1u);
  close(fd);
  new_channel->reset();
  struct stat st;
  EXPECT_NE(lstat(path.c_str(), &st), 0);  // the newer one removed its own
  rmdir(path.substr(0, path.rfind('/')).c_str());
}

TEST(ProgramChannelListenTest, BadPathsAreRefusedNamingThem) {
  auto no_name = ProgramChannel::Listen("/tmp/");
  EXPECT_TRUE(absl::IsInvalidArgument(no_name.status())) << no_name.status();
  auto long_name = ProgramChannel::Listen("/tmp/" + std::string(120, 'a'));
  EXPECT_TRUE(absl::IsInvalidArgument(long_name.status())) << long_name.status();
  auto no_dir = ProgramChannel::Listen("/nonexistent-dir-for-ringmaster/control.sock");
  EXPECT_TRUE(absl::IsFailedPrecondition(no_dir.status())) << no_dir.status();
  EXPECT_NE(no_dir.status().message().find("/nonexistent-dir-for-ringmaster/control.sock"),
            std::string::npos);
  const std::string deep_missing = "/nonexistent-dir-for-ringmaster/" + std::string(120, 'd') + "/c.sock";
  auto deep = ProgramChannel::Listen(deep_missing);
  EXPECT_TRUE(absl::IsFailedPrecondition(deep.status())) << deep.status();
}

// A path longer than a sockaddr_un holds (a job directory deep in a test's TMPDIR): the socket
// is made there all the same, and a program reaches it through /proc/self/fd, as the module does.
TEST(ProgramChannelListenTest, APathLongerThanASocketAddressWorks) {
  const std::string top = TempDir();
  const std::string dir = top + "/" + std::string(100, 'd');
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << strerror(errno);
  const std::string path = dir + "/control.sock";
  ASSERT_GT(path.size(), 108u);
  auto channel = ProgramChannel::Listen(path);
  ASSERT_TRUE(channel.ok()) << channel.status();
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  const int dir_fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  const int fd = Connect(absl::StrCat("/proc/self/fd/", dir_fd, "/control.sock"));
  close(dir_fd);
  Write(fd, "{\"type\":\"hello\",\"pid\":1,\"inprocess\":false}\n");
  EXPECT_EQ(PollFor(**channel, 1).size(), 1u);
  close(fd);
  channel->reset();
  EXPECT_NE(lstat(path.c_str(), &st), 0);  // removed
  rmdir(dir.c_str());
  rmdir(top.c_str());
}

}  // namespace
}  // namespace ringmaster::worker
