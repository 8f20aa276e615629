// Failures the TCP backend must survive without hanging: a rank killed or stopped in the
// middle of a collective, Abort() from another thread, peers that disagree about the
// operation, and bootstrap against wrong, refused or garbled peers.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/store.h"
#include "comm/tcp/socket.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using testing::MultiProcOptions;
using testing::RankResult;
using testing::RunRanks;

constexpr absl::Duration kOpTimeout = absl::Seconds(3);

// Every fault runs over both transports: shared-memory rings (local ranks' default, where
// the TCP connection only carries wake-ups) and TCP alone.
class TcpFaults : public ::testing::TestWithParam<bool> {
 protected:
  MultiProcOptions Options(int world_size) const {
    MultiProcOptions options;
    options.world_size = world_size;
    options.comm.shared_memory = GetParam();
    return options;
  }
};

// Repeats a 64 MiB all-reduce until it fails; the victim dies or stops partway through
// its first one.
absl::Status AllReduceUntilFailure(TcpCommunicator& comm, int victim, int signal,
                                   absl::Duration* elapsed) {
  std::vector<float> buf(16 << 20, 1.0f);
  if (comm.rank() == victim) {
    std::thread([signal] {
      absl::SleepFor(absl::Milliseconds(30));
      raise(signal);
    }).detach();
  }
  for (int i = 0; i < 1000; ++i) {
    absl::Time start = absl::Now();
    absl::Status s = comm.AllReduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                                    ReduceOp::kSum, start + kOpTimeout);
    *elapsed = absl::Now() - start;
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST_P(TcpFaults, KilledRankMakesEverySurvivorFailWithinTwiceTheDeadline) {
  MultiProcOptions options = Options(4);
  options.victims = {2};
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration* elapsed) {
    return AllReduceUntilFailure(comm, 2, SIGKILL, elapsed);
  });
  EXPECT_EQ(results[2].exit_detail, "signal 9");
  for (int r : {0, 1, 3}) {
    const RankResult& res = results[r];
    ASSERT_TRUE(res.reported) << "rank " << r << ": " << res.status;
    EXPECT_TRUE(absl::IsUnavailable(res.status) || absl::IsAborted(res.status))
        << "rank " << r << ": " << res.status;
    EXPECT_LE(res.elapsed, 2 * kOpTimeout) << "rank " << r;
  }
}

TEST_P(TcpFaults, StoppedRankMakesTheOthersMissTheirDeadline) {
  MultiProcOptions options = Options(3);
  options.victims = {1};
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration* elapsed) {
    return AllReduceUntilFailure(comm, 1, SIGSTOP, elapsed);
  });
  for (int r : {0, 2}) {
    const RankResult& res = results[r];
    ASSERT_TRUE(res.reported) << "rank " << r << ": " << res.status;
    EXPECT_TRUE(absl::IsDeadlineExceeded(res.status)) << "rank " << r << ": " << res.status;
    EXPECT_GE(res.elapsed, kOpTimeout) << "rank " << r;
    EXPECT_LE(res.elapsed, 2 * kOpTimeout) << "rank " << r;
    EXPECT_NE(res.status.message().find("rank"), std::string::npos) << res.status;
  }
}

TEST_P(TcpFaults, AbortFromAnotherThreadUnblocksAndBreaksTheCommunicator) {
  MultiProcOptions options = Options(2);
  auto results =
      RunRanks(options, [](TcpCommunicator& comm, absl::Duration* elapsed) -> absl::Status {
        const absl::Time far = absl::Now() + absl::Seconds(60);
        std::vector<float> buf(1 << 20, 1.0f);
        if (comm.rank() == 1) {
          // Never joins the all-reduce: rank 0 blocks until its own Abort().
          absl::SleepFor(absl::Seconds(1));
          return absl::OkStatus();
        }
        std::thread aborter([&comm] {
          absl::SleepFor(absl::Milliseconds(100));
          comm.Abort();
          comm.Abort();  // idempotent
        });
        absl::Time start = absl::Now();
        absl::Status s = comm.AllReduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                                        ReduceOp::kSum, far);
        *elapsed = absl::Now() - start;
        aborter.join();
        if (!absl::IsAborted(s)) return absl::InternalError(absl::StrCat("got ", s.ToString()));
        if (*elapsed > absl::Seconds(5)) return absl::InternalError("abort was not prompt");
        absl::Status later = comm.Barrier(far);
        if (!absl::IsAborted(later) || !absl::IsAborted(comm.GetAsyncError())) {
          return absl::InternalError(absl::StrCat("after abort: ", later.ToString()));
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
}

TEST_P(TcpFaults, MismatchedCollectivesAreReportedNotHung) {
  MultiProcOptions options = Options(2);
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::vector<float> a(100, 1.0f), b(200);
    if (comm.rank() == 0) {
      return comm.AllReduce(a.data(), a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum,
                            deadline);
    }
    return comm.AllGather(a.data(), b.data(), a.size(), DataType::kFloat32, deadline);
  });
  bool mismatch_named = false;
  for (const RankResult& r : results) {
    ASSERT_TRUE(r.reported);
    EXPECT_FALSE(r.status.ok());
    EXPECT_FALSE(absl::IsDeadlineExceeded(r.status)) << r.status;
    mismatch_named |= r.status.message().find("collective mismatch") != std::string::npos;
  }
  EXPECT_TRUE(mismatch_named) << results[0].status << " / " << results[1].status;
}

INSTANTIATE_TEST_SUITE_P(Transports, TcpFaults, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

// ---------------------------------------------------------------------------------------
// Bootstrap against the wrong peers, in one process (threads play the ranks).

std::unique_ptr<FileStore> NewStore() {
  FileStoreOptions options;
  options.directory = testing::FreshStoreDir();
  return std::move(FileStore::Create(options)).value();
}

TcpCommunicatorOptions Options(Store* store, const std::string& prefix, int rank, int size) {
  TcpCommunicatorOptions o;
  o.store = store;
  o.prefix = prefix;
  o.rank = rank;
  o.size = size;
  o.connect_timeout = absl::Seconds(2);
  o.refused_retry = absl::Milliseconds(200);
  return o;
}

TEST(TcpBootstrap, PeerOfAnotherCommunicatorIsRejectedOnBothSides) {
  auto store = NewStore();
  absl::Status a0_status;
  std::thread a0(
      [&] { a0_status = TcpCommunicator::Create(Options(store.get(), "job-a", 0, 2)).status(); });
  // Point communicator B's rank 0 at A's rank 0, as a stale store entry would.
  auto address = store->Get("job-a/rank-0/addr", absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(address.ok()) << address.status();
  ASSERT_TRUE(store->Set("job-b/rank-0/addr", *address).ok());
  absl::Status b1 = TcpCommunicator::Create(Options(store.get(), "job-b", 1, 2)).status();
  a0.join();
  EXPECT_EQ(b1.code(), absl::StatusCode::kFailedPrecondition) << b1;
  EXPECT_NE(b1.message().find("rejected our connection"), std::string::npos) << b1;
  EXPECT_NE(b1.message().find("another communicator"), std::string::npos) << b1;
  EXPECT_EQ(a0_status.code(), absl::StatusCode::kDeadlineExceeded) << a0_status;
  EXPECT_NE(a0_status.message().find("another communicator"), std::string::npos) << a0_status;
}

TEST(TcpBootstrap, WorldSizeMismatchIsAWrongPeer) {
  auto store = NewStore();
  absl::Status s0;
  std::thread t0([&] { s0 = TcpCommunicator::Create(Options(store.get(), "job", 0, 2)).status(); });
  auto s1 = TcpCommunicator::Create(Options(store.get(), "job", 1, 3)).status();
  t0.join();
  // Rank 1 (world 3) also waits for a rank 2 that never comes; rank 0 rejects it.
  EXPECT_FALSE(s1.ok());
  EXPECT_FALSE(s0.ok());
  EXPECT_NE(s0.message().find("world size"), std::string::npos) << s0;
}

TEST(TcpBootstrap, RefusedConnectionIsUnavailableAndSaysRefused) {
  auto store = NewStore();
  // A port that nobody listens on: bind, note it, close.
  int port = 0;
  {
    auto fd = tcp::Listen("127.0.0.1", 0, 1, &port);
    ASSERT_TRUE(fd.ok());
  }
  ASSERT_TRUE(store->Set("job/rank-1/addr", absl::StrCat("127.0.0.1:", port)).ok());
  absl::Time start = absl::Now();
  auto s = TcpCommunicator::Create(Options(store.get(), "job", 0, 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(TcpBootstrap, GarbledHandshakeIsRejectedWithAReason) {
  auto store = NewStore();
  absl::Status s0;
  std::thread t0([&] { s0 = TcpCommunicator::Create(Options(store.get(), "job", 0, 2)).status(); });
  auto address = store->Get("job/rank-0/addr", absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(address.ok());
  auto hp = tcp::ParseHostPort(*address);
  ASSERT_TRUE(hp.ok());
  auto fd = tcp::Connect(*hp, absl::Now() + absl::Seconds(1), absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(fd.ok()) << fd.status();
  char garbage[32];
  memset(garbage, 'x', sizeof(garbage));
  ASSERT_TRUE(
      tcp::WriteFull(fd->get(), garbage, sizeof(garbage), absl::Now() + absl::Seconds(1)).ok());
  char reply[192];
  ASSERT_TRUE(tcp::ReadFull(fd->get(), reply, sizeof(reply), absl::Now() + absl::Seconds(2)).ok());
  EXPECT_NE(std::string(reply + 8).find("garbled handshake"), std::string::npos) << reply + 8;
  t0.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s0.message().find("garbled handshake"), std::string::npos) << s0;
}

TEST(TcpBootstrap, GarbledReplyFromANonRingmasterServer) {
  auto store = NewStore();
  int port = 0;
  auto listener = tcp::Listen("127.0.0.1", 0, 4, &port);
  ASSERT_TRUE(listener.ok());
  std::thread server([&] {
    std::string peer;
    auto conn = tcp::Accept(listener->get(), absl::Now() + absl::Seconds(5), -1, &peer);
    if (!conn.ok()) return;
    std::string junk = "HTTP/1.1 400 Bad Request\r\n\r\n" + std::string(200, ' ');
    (void)tcp::WriteFull(conn->get(), junk.data(), junk.size(), absl::Now() + absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(500));
  });
  ASSERT_TRUE(store->Set("job/rank-1/addr", absl::StrCat("127.0.0.1:", port)).ok());
  auto s = TcpCommunicator::Create(Options(store.get(), "job", 0, 2)).status();
  server.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("not a ringmaster rank"), std::string::npos) << s;
}

TEST(TcpBootstrap, MissingPeerTimesOutNamingIt) {
  auto store = NewStore();
  auto s = TcpCommunicator::Create(Options(store.get(), "job", 0, 3)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("ranks 1, 2 never published their address"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::comm
