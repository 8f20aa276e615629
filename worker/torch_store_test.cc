// TorchStoreServer against a raw client that writes PyTorch 1.13's TCPStore messages by hand
// (the bytes torch's TCPClient sends: query byte, uint64-length strings, int64 values).
#include "worker/torch_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

constexpr uint8_t kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5,
                  kGetNumKeys = 6, kWatchKey = 7, kDeleteKey = 8;

std::string U64(uint64_t v) { return std::string(reinterpret_cast<char*>(&v), 8); }
std::string Str(const std::string& s) { return U64(s.size()) + s; }
std::string Keys(const std::vector<std::string>& keys) {
  std::string out = U64(keys.size());
  for (const auto& k : keys) out += Str(k);
  return out;
}

class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }

  void Send(uint8_t query, const std::string& args) {
    std::string msg(1, static_cast<char>(query));
    msg += args;
    ASSERT_EQ(send(fd_, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
  }
  // Exactly n bytes within `timeout`; fewer if the server closed or the time ran out.
  std::string Recv(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    std::string out;
    absl::Time deadline = absl::Now() + timeout;
    while (out.size() < n) {
      int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      pollfd p{fd_, POLLIN, 0};
      if (ms <= 0 || poll(&p, 1, ms) != 1) break;
      char buf[4096];
      ssize_t got = recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, got);
    }
    return out;
  }
  // True when the server closes this connection within `timeout`.
  bool ClosedByServer(absl::Duration timeout = absl::Seconds(10)) {
    Recv(1 << 20, timeout);
    return closed_;
  }
  int64_t RecvI64() {
    std::string b = Recv(8);
    EXPECT_EQ(b.size(), 8u);
    int64_t v = 0;
    if (b.size() == 8) memcpy(&v, b.data(), 8);
    return v;
  }
  std::string RecvValue() {
    std::string b = Recv(8);
    EXPECT_EQ(b.size(), 8u);
    uint64_t size = 0;
    if (b.size() == 8) memcpy(&size, b.data(), 8);
    return Recv(size);
  }
  uint8_t RecvByte() {
    std::string b = Recv(1);
    EXPECT_EQ(b.size(), 1u);
    return b.empty() ? 0xff : static_cast<uint8_t>(b[0]);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

class TorchStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TorchStoreServer>> server =
        TorchStoreServer::Start(TorchStoreServer::Options());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }
  std::unique_ptr<TorchStoreServer> server_;
};

TEST_F(TorchStoreTest, SetThenGet) {
  RawClient c(server_->port());
  ASSERT_TRUE(c.connected());
  c.Send(kSet, Str("/worker/attempt_0/k") + Str(std::string("v\0w", 3)));
  c.Send(kGet, Str("/worker/attempt_0/k"));
  EXPECT_EQ(c.RecvValue(), std::string("v\0w", 3));
  EXPECT_EQ(server_->Keys(), std::vector<std::string>{"/worker/attempt_0/k"});
}

TEST_F(TorchStoreTest, CompareSetAsTorch113) {
  RawClient c(server_->port());
  // A missing key with an empty expected value is set.
  c.Send(kCompareSet, Str("a") + Str("") + Str("one"));
  EXPECT_EQ(c.RecvValue(), "one");
  // A missing key with another expected value: not set, the expected value echoed.
  c.Send(kCompareSet, Str("b") + Str("x") + Str("two"));
  EXPECT_EQ(c.RecvValue(), "x");
  c.Send(kCheck, Keys({"b"}));
  EXPECT_EQ(c.RecvByte(), kTorchStoreNotReady);
  // A match replaces; a mismatch returns the current value.
  c.Send(kCompareSet, Str("a") + Str("one") + Str("uno"));
  EXPECT_EQ(c.RecvValue(), "uno");
  c.Send(kCompareSet, Str("a") + Str("one") + Str("eins"));
  EXPECT_EQ(c.RecvValue(), "uno");
}

TEST_F(TorchStoreTest, AddCreatesThenAccumulatesAsDecimalText) {
  RawClient c(server_->port());
  c.Send(kAdd, Str("init/") + U64(1));
  EXPECT_EQ(c.RecvI64(), 1);
  c.Send(kAdd, Str("init/") + U64(static_cast<uint64_t>(int64_t{-4})));
  EXPECT_EQ(c.RecvI64(), -3);
  c.Send(kGet, Str("init/"));
  EXPECT_EQ(c.RecvValue(), "-3");
}

TEST_F(TorchStoreTest, CheckNumKeysAndDelete) {
  RawClient c(server_->port());
  c.Send(kCheck, Keys({"x", "y"}));
  EXPECT_EQ(c.RecvByte(), kTorchStoreNotReady);
  c.Send(kSet, Str("x") + Str("1"));
  c.Send(kSet, Str("y") + Str("2"));
  c.Send(kCheck, Keys({"x", "y"}));
  EXPECT_EQ(c.RecvByte(), kTorchStoreReady);
  c.Send(kGetNumKeys, "");
  EXPECT_EQ(c.RecvI64(), 2);
  c.Send(kDeleteKey, Str("x"));
  EXPECT_EQ(c.RecvI64(), 1);
  c.Send(kDeleteKey, Str("x"));
  EXPECT_EQ(c.RecvI64(), 0);
  c.Send(kGetNumKeys, "");
  EXPECT_EQ(c.RecvI64(), 1);
}

TEST_F(TorchStoreTest, WaitIsReleasedOnlyWhenEveryKeyIsSetByAnotherClient) {
  RawClient waiter(server_->port());
  RawClient setter(server_->port());
  waiter.Send(kWait, Keys({"k1", "k2"}));
  EXPECT_EQ(waiter.Recv(1, absl::Milliseconds(300)), "");
  setter.Send(kSet, Str("k1") + Str("v"));
  EXPECT_EQ(waiter.Recv(1, absl::Milliseconds(300)), "");
  setter.Send(kAdd, Str("k2") + U64(7));  // ADD's creation wakes a WAIT too
  EXPECT_EQ(setter.RecvI64(), 7);
  EXPECT_EQ(waiter.RecvByte(), kTorchStoreStopWaiting);
  // The same connection goes on with the next request.
  waiter.Send(kGet, Str("k2"));
  EXPECT_EQ(waiter.RecvValue(), "7");
}

TEST_F(TorchStoreTest, WaitForKeysAlreadySetAnswersAtOnce) {
  RawClient c(server_->port());
  c.Send(kSet, Str("k") + Str("v"));
  c.Send(kWait, Keys({"k"}));
  EXPECT_EQ(c.RecvByte(), kTorchStoreStopWaiting);
}

TEST_F(TorchStoreTest, BadQueryTypeClosesOnlyThatConnection) {
  RawClient good(server_->port());
  RawClient bad(server_->port());
  good.Send(kSet, Str("k") + Str("v"));
  bad.Send(42, "");
  EXPECT_TRUE(bad.ClosedByServer());
  good.Send(kGet, Str("k"));
  EXPECT_EQ(good.RecvValue(), "v");
  RawClient later(server_->port());
  later.Send(kGetNumKeys, "");
  EXPECT_EQ(later.RecvI64(), 1);
}

TEST_F(TorchStoreTest, RefusedRequestsCloseTheConnection) {
  {
    RawClient c(server_->port());
    c.Send(kGet, Str("missing"));
    EXPECT_TRUE(c.ClosedByServer());
  }
  {
    RawClient c(server_->port());
    c.Send(kWatchKey, Str("k"));
    EXPECT_TRUE(c.ClosedByServer());
  }
  {
    RawClient c(server_->port());
    c.Send(kSet, U64(uint64_t{1} << 40));  // a 1 TiB key
    EXPECT_TRUE(c.ClosedByServer());
  }
  {
    RawClient c(server_->port());
    c.Send(kSet, Str("text") + Str("abc"));
    c.Send(kAdd, Str("text") + U64(1));
    EXPECT_TRUE(c.ClosedByServer());
  }
  {
    // A newer PyTorch's (2.x) first message: VALIDATE (0) and a uint32 magic, then its next query.
    RawClient c(server_->port());
    c.Send(0, std::string("\xce\xf7\x85\x3c", 4) + "\x04" + U64(0) + "\x00\x00");
    EXPECT_TRUE(c.ClosedByServer());
  }
  RawClient c(server_->port());
  c.Send(kGet, Str("text"));
  EXPECT_EQ(c.RecvValue(), "abc");
}

TEST(TorchStoreOptionsTest, StalledRequestIsClosedAfterMessageTimeout) {
  TorchStoreServer::Options options;
  options.message_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<TorchStoreServer>> server = TorchStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient c((*server)->port());
  c.Send(kSet, U64(10) + "abc");  // 7 of the key's bytes never come
  EXPECT_TRUE(c.ClosedByServer(absl::Seconds(5)));
}

TEST(TorchStoreOptionsTest, StopEndsAPendingWaitAndJoins) {
  absl::StatusOr<std::unique_ptr<TorchStoreServer>> server =
      TorchStoreServer::Start(TorchStoreServer::Options());
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient c((*server)->port());
  c.Send(kWait, Keys({"never"}));
  EXPECT_EQ(c.Recv(1, absl::Milliseconds(200)), "");
  absl::Time start = absl::Now();
  (*server)->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(c.ClosedByServer(absl::Seconds(2)));
  (*server)->Stop();  // idempotent
}

TEST(TorchStoreOptionsTest, BadOptionsAreNamed) {
  TorchStoreServer::Options options;
  options.port = 70000;
  absl::StatusOr<std::unique_ptr<TorchStoreServer>> server = TorchStoreServer::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("Options.port"), std::string::npos);

  absl::StatusOr<std::unique_ptr<TorchStoreServer>> first =
      TorchStoreServer::Start(TorchStoreServer::Options());
  ASSERT_TRUE(first.ok()) << first.status();
  options.port = (*first)->port();
  server = TorchStoreServer::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable) << server.status();
}

}  // namespace
}  // namespace ringmaster::worker
