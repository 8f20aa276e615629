// The peers are compared with ringbench over the same transport: a peer over TCP is never
// the "best peer" of a shared-memory run (ringbench comm once called itself 19x
// faster than the best peer at 1 KiB, comparing its shared memory with the peers' TCP).
#include "bench/peers.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::bench {
namespace {

using ::testing::HasSubstr;

PeerRow Row(const std::string& peer, const std::string& impl, double time_us) {
  PeerRow r;
  r.op = "all_reduce";
  r.ranks = 2;
  r.bytes = 1024;
  r.time_us = time_us;
  r.impl = impl;
  r.transport = PeerTransport(peer);
  return r;
}

TEST(PeerTransport, NamesWhatCarriesEachPeer) {
  EXPECT_EQ(PeerTransport("gloo"), "TCP");
  EXPECT_EQ(PeerTransport("mpi"), "TCP");
  EXPECT_EQ(PeerTransport("mpi_shm"), "shared memory");
  EXPECT_EQ(PeerTransport("nccl"), "");
}

TEST(BestPeer, ComparesLikeWithLike) {
  const std::vector<PeerRow> rows = {Row("gloo", "gloo:ring", 95), Row("mpi", "openmpi", 60),
                                     Row("mpi_shm", "openmpi-shm", 8)};
  // Ours over shared memory: OpenMPI's vader, not the faster-looking-slower TCP peers.
  const PeerRow* shm = BestPeer(rows, "all_reduce", 1024, "shared memory");
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->impl, "openmpi-shm");
  // Ours over TCP: the fastest TCP peer, never the shared-memory one.
  const PeerRow* tcp = BestPeer(rows, "all_reduce", 1024, "TCP");
  ASSERT_NE(tcp, nullptr);
  EXPECT_EQ(tcp->impl, "openmpi");
  // No peer over ours: none, rather than one over another transport.
  EXPECT_EQ(BestPeer({rows[0], rows[1]}, "all_reduce", 1024, "shared memory"), nullptr);
  EXPECT_EQ(BestPeer(rows, "all_gather", 1024, "TCP"), nullptr);
  EXPECT_EQ(BestPeer(rows, "all_reduce", 2048, "TCP"), nullptr);
}

TEST(PeerTransportNote, SaysEachSidesTransportAndWhatTheRatiosCompare) {
  const std::vector<PeerRow> tcp_peers = {Row("gloo", "gloo:ring", 95), Row("mpi", "openmpi", 60),
                                          Row("mpi", "openmpi", 61)};
  EXPECT_EQ(PeerTransportNote(tcp_peers, "shared memory"),
            "ours over shared memory; peers: gloo:ring (TCP), openmpi (TCP)\n"
            "no peer ran over shared memory, so no ratio: --peers mpi_shm compares with "
            "OpenMPI's shared memory (btl self,vader), or --transport tcp measures ours over "
            "the peers' transport\n");
  std::vector<PeerRow> with_shm = tcp_peers;
  with_shm.push_back(Row("mpi_shm", "openmpi-shm", 8));
  const std::string note = PeerTransportNote(with_shm, "shared memory");
  EXPECT_THAT(note, HasSubstr("openmpi-shm (shared memory)"));
  EXPECT_THAT(note, HasSubstr("ratios against the fastest peer over shared memory only"));
  EXPECT_THAT(PeerTransportNote(tcp_peers, "TCP"),
              HasSubstr("ratios against the fastest peer over TCP only"));
  EXPECT_EQ(PeerTransportNote({}, "TCP"), "");
}

TEST(PeersToCsv, EachRowNamesItsTransport) {
  EXPECT_EQ(PeersToCsv({Row("mpi_shm", "openmpi-shm", 8)}),
            "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl,transport\n"
            "all_reduce,2,1024,8.00,0.0000,0.0000,openmpi-shm,shared memory\n");
}

}  // namespace
}  // namespace ringmaster::bench
