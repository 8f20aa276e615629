#include "bench/emulated_link.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/store.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace ringmaster::bench {
namespace {

// Skips the test where this machine cannot make the link (not root, no iproute2), saying why;
// tools/setup.sh installs iproute2 and CI runs as root.
#define SKIP_WITHOUT_LINK()                                                    \
  if (absl::Status support = CheckLinkSupport(); !support.ok()) {              \
    GTEST_SKIP() << "no emulated link on this machine: " << support.message(); \
  }

// Rank r's communicator on the link: its address, TCP only.
absl::StatusOr<std::unique_ptr<comm::TcpCommunicator>> LinkCommunicator(
    int rank, int world, const std::string& store_dir, std::unique_ptr<comm::FileStore>* store) {
  RM_ASSIGN_OR_RETURN(*store, comm::FileStore::Create({store_dir}));
  comm::TcpCommunicatorOptions o;
  o.rank = rank;
  o.size = world;
  o.store = store->get();
  o.prefix = "link_test";
  o.listen_host = LinkAddress(rank);
  o.shared_memory = false;
  o.connect_timeout = absl::Seconds(30);
  return comm::TcpCommunicator::Create(o);
}

TEST(EmulatedLinkTest, RefusesBadArguments) {
  const auto nothing = [](int) { return absl::OkStatus(); };
  EXPECT_EQ(RunRanksOnLink(0, {}, nothing).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunRanksOnLink(kMaxLinkRanks + 1, {}, nothing).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status no_rate = RunRanksOnLink(2, {.gbit = 0}, nothing);
  EXPECT_EQ(no_rate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_rate.message(), "gbit")) << no_rate;
}

TEST(EmulatedLinkTest, LinkAddressesAreDistinct) {
  EXPECT_EQ(LinkAddress(0), "10.231.0.1");
  EXPECT_EQ(LinkAddress(1), "10.231.0.2");
}

// 4 MB from rank 0 to rank 1 over a 100 Mbit/s link: every byte crosses rank 0's link
// (its interface's counter), and no faster than the rate allows once the bucket's burst is
// spent. Each side checks what it can see and returns an error the caller gets back.
TEST(EmulatedLinkTest, MessagesCrossTheLinkAtItsRate) {
  SKIP_WITHOUT_LINK();
  constexpr size_t kBytes = 4 << 20;
  EmulatedLinkOptions link;
  link.gbit = 0.1;
  link.burst_bytes = 64 << 10;
  const std::string store_dir = comm::testing::FreshStoreDir();
  const absl::Status status = RunRanksOnLink(2, link, [&](int rank) -> absl::Status {
    std::unique_ptr<comm::FileStore> store;
    RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::TcpCommunicator> comm,
                        LinkCommunicator(rank, 2, store_dir, &store));
    if (comm->shared_memory_peers() != 0) {
      return absl::InternalError("the peers share memory: the link is bypassed");
    }
    std::vector<uint8_t> data(kBytes);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    if (rank == 1) {
      RM_RETURN_IF_ERROR(comm->Recv(data.data(), kBytes, DataType::kUint8, 0, deadline));
      for (size_t i = 0; i < kBytes; ++i) {
        if (data[i] != static_cast<uint8_t>(i * 7 + 3)) {
          return absl::InternalError(absl::StrCat("byte ", i, " arrived wrong"));
        }
      }
      return comm->Barrier(deadline);
    }
    for (size_t i = 0; i < kBytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
    RM_ASSIGN_OR_RETURN(const LinkCounters before, ReadLinkCounters());
    const absl::Time start = absl::Now();
    RM_RETURN_IF_ERROR(comm->Send(data.data(), kBytes, DataType::kUint8, 1, deadline));
    RM_RETURN_IF_ERROR(comm->Barrier(deadline));  // rank 1 has it all
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    RM_ASSIGN_OR_RETURN(const LinkCounters after, ReadLinkCounters());
    const int64_t sent = after.tx_bytes - before.tx_bytes;
    if (sent < static_cast<int64_t>(kBytes)) {
      return absl::InternalError(
          absl::StrCat("the link carried ", sent, " bytes of a ", kBytes, "-byte message"));
    }
    // The bucket lets `burst` through at once; the rest leaves at the rate at most.
    const double least = static_cast<double>(kBytes - link.burst_bytes) * 8 / (link.gbit * 1e9);
    if (seconds < least) {
      return absl::InternalError(absl::StrCat("4 MiB crossed a 100 Mbit/s link in ", seconds,
                                              " s, faster than the ", least, " s it allows"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  // Nothing was made in this process's namespace.
  absl::StatusOr<std::string> dev = ReadFile("/proc/self/net/dev");
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_FALSE(absl::StrContains(*dev, kLinkInterface)) << *dev;
  EXPECT_FALSE(absl::StrContains(*dev, "rmlink")) << *dev;
}

TEST(EmulatedLinkTest, ReportsEachRanksError) {
  SKIP_WITHOUT_LINK();
  const absl::Status status = RunRanksOnLink(3, {}, [](int rank) -> absl::Status {
    // Each rank sees its own end of the link, up, with its address.
    RM_ASSIGN_OR_RETURN(const LinkCounters c, ReadLinkCounters());
    if (c.qdisc_drops != 0) return absl::InternalError("drops before any traffic");
    if (rank == 1) return absl::DataLossError("rank one's own failure");
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "rank 1: DATA_LOSS: rank one's own failure"))
      << status;
  EXPECT_FALSE(absl::StrContains(status.message(), "rank 0")) << status;
  EXPECT_FALSE(absl::StrContains(status.message(), "rank 2")) << status;
}

TEST(EmulatedLinkTest, ARanksNamespaceHoldsOnlyItsLink) {
  SKIP_WITHOUT_LINK();
  // Its namespace has its own loopback (down) and its link, nothing else.
  const absl::Status status = RunRanksOnLink(1, {}, [](int) -> absl::Status {
    RM_ASSIGN_OR_RETURN(const std::string dev, ReadFile("/proc/self/net/dev"));
    int interfaces = 0;
    for (size_t at = dev.find(':'); at != std::string::npos; at = dev.find(':', at + 1)) {
      ++interfaces;
    }
    if (interfaces != 2 || !absl::StrContains(dev, kLinkInterface)) {
      return absl::InternalError(absl::StrCat("the rank's namespace has:\n", dev));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace ringmaster::bench
