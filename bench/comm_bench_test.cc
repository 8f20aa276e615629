#include "bench/comm_bench.h"

#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"

namespace ringmaster::bench {
namespace {

TEST(ParseSizes, SuffixesListsAndGeometricRanges) {
  auto s = ParseSizes("1K,64K,4M,1G,100");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<uint64_t>{1024, 65536, 4u << 20, 1u << 30, 100}));
  auto r = ParseSizes("1K,4K,...,1M");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<uint64_t>{1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20}));
  auto bad = ParseSizes("12Q");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("12Q"), std::string::npos);
  EXPECT_FALSE(ParseSizes("...,1K").ok());
  EXPECT_FALSE(ParseSizes("").ok());
}

TEST(ParseOps, NamesAndAll) {
  EXPECT_EQ(ParseOps("all")->size(), 4u);
  EXPECT_EQ(*ParseOps("broadcast,all_reduce"),
            (std::vector<CollectiveOp>{CollectiveOp::kBroadcast, CollectiveOp::kAllReduce}));
  auto bad = ParseOps("all_to_all");
  EXPECT_NE(bad.status().message().find("all_to_all"), std::string::npos);
}

TEST(BusFactor, NcclTestsConventions) {
  EXPECT_DOUBLE_EQ(BusFactor(CollectiveOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusFactor(CollectiveOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusFactor(CollectiveOp::kReduceScatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusFactor(CollectiveOp::kBroadcast, 8), 1.0);
}

TEST(RunSweep, EveryRankGetsConsistentRowsAndValidResults) {
  comm::testing::MultiProcOptions options;
  options.world_size = 3;
  auto results = comm::testing::RunRanks(
      options, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        SweepOptions sweep;
        sweep.ops = {CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                     CollectiveOp::kReduceScatter, CollectiveOp::kBroadcast};
        sweep.sizes = {1024, 300000};
        sweep.min_iters = 3;
        sweep.max_iters = 5;
        auto rows = RunSweep(comm, sweep);
        if (!rows.ok()) return rows.status();
        if (rows->size() != 8) return absl::InternalError("expected 8 rows");
        for (const Row& r : *rows) {
          if (r.ranks != 3 || r.time_us <= 0 || r.busbw_gbps <= 0 || r.p90_us < r.time_us ||
              r.max_us < r.p90_us) {
            return absl::InternalError("implausible row");
          }
          // Mean bytes per rank per call: the ranks' sum is exact, so the mean equals the
          // formula's (N-1)/N x B for all-gather, reduce-scatter and broadcast.
          if (r.sent_bytes != r.formula_bytes ||
              (r.op != CollectiveOp::kAllReduce && r.sent_bytes != 2.0 / 3 * r.bytes)) {
            return absl::InternalError(absl::StrCat(CollectiveName(r.op), " of ", r.bytes,
                                                    ": sent ", r.sent_bytes, ", formula ",
                                                    r.formula_bytes));
          }
        }
        std::string csv = ToCsv(*rows);
        if (csv.rfind("op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,sent_bytes,formula_bytes\n"
                      "all_reduce,3,1024,",
                      0) != 0) {
          return absl::InternalError("CSV header or first row wrong: " + csv.substr(0, 80));
        }
        if (TransportName(comm) != "shared memory") {
          return absl::InternalError("transport " + TransportName(comm));
        }
        return absl::OkStatus();
      });
  for (const auto& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
}

}  // namespace
}  // namespace ringmaster::bench
