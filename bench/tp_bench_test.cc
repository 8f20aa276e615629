#include "bench/tp_bench.h"

#include <string>

#include "absl/strings/match.h"
#include "bench/local_ranks.h"
#include "comm/tcp/tcp_communicator.h"
#include "gtest/gtest.h"

namespace ringmaster::bench {
namespace {

TpBenchOptions Small() {
  TpBenchOptions o;
  o.batch = 3;
  o.in = 8;
  o.hidden = 12;
  o.out = 5;
  o.iters = 3;
  return o;
}

// Runs the bench on `ranks` forked local ranks and returns rank 0's result.
absl::StatusOr<TpBenchResult> RunOnLocalRanks(int ranks, const TpBenchOptions& o) {
  comm::TcpCommunicatorOptions base;
  absl::StatusOr<std::string> text =
      RunLocalRanks(ranks, base, [&o](comm::TcpCommunicator& comm) -> absl::StatusOr<std::string> {
        absl::StatusOr<TpBenchResult> r = RunTpBench(comm, o);
        if (!r.ok()) return r.status();
        return TpResultToText(*r);
      });
  if (!text.ok()) return text.status();
  return TpResultFromText(*text);
}

TEST(TpBenchTest, MatchesTheUnsplitLayersWithOneAllReduceEachWay) {
  for (int ranks : {1, 2, 3}) {
    absl::StatusOr<TpBenchResult> r = RunOnLocalRanks(ranks, Small());
    ASSERT_TRUE(r.ok()) << ranks << " ranks: " << r.status();
    EXPECT_EQ(r->ranks, ranks);
    ASSERT_EQ(r->checks.size(), 6u);
    for (const TpCheck& c : r->checks) {
      EXPECT_TRUE(c.ok()) << ranks << " ranks, " << c.name << ": " << c.max_difference;
      EXPECT_GT(c.largest, 0) << c.name;
    }
    EXPECT_EQ(r->forward_all_reduces, 1);
    EXPECT_EQ(r->backward_all_reduces, 1);
    EXPECT_EQ(r->other_operations, 0);
    EXPECT_EQ(r->forward_bytes_sent > 0, ranks > 1);
    EXPECT_EQ(r->backward_bytes_sent > 0, ranks > 1);
    EXPECT_GT(r->tp_step_us, 0);
    EXPECT_GT(r->single_step_us, 0);
    EXPECT_TRUE(r->ok());
    const std::string table = FormatTpTable(Small(), *r);
    EXPECT_TRUE(absl::StrContains(table, "output y")) << table;
    EXPECT_FALSE(absl::StrContains(table, "OUTSIDE")) << table;
  }
}

TEST(TpBenchTest, ResultSurvivesTheTextForm) {
  TpBenchResult r;
  r.ranks = 2;
  r.forward_all_reduces = 1;
  r.forward_bytes_sent = 640;
  r.backward_all_reduces = 1;
  r.backward_bytes_sent = 1024;
  r.tp_step_us = 12.5;
  r.single_step_us = 20.25;
  r.checks.push_back({"output y", 1e-7, 2.5});
  r.checks.push_back({"a name with spaces", 3e-3, 1});
  absl::StatusOr<TpBenchResult> back = TpResultFromText(TpResultToText(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ranks, 2);
  EXPECT_EQ(back->backward_bytes_sent, 1024);
  EXPECT_EQ(back->single_step_us, 20.25);
  ASSERT_EQ(back->checks.size(), 2u);
  EXPECT_EQ(back->checks[1].name, "a name with spaces");
  EXPECT_EQ(back->checks[0].max_difference, 1e-7);
  EXPECT_TRUE(back->checks[0].ok());
  EXPECT_FALSE(back->checks[1].ok());  // 3e-3 > 1e-5 × 1
  EXPECT_FALSE(back->ok());
  EXPECT_FALSE(TpResultFromText("times 1").ok());
}

TEST(TpBenchTest, BadOptionsNameTheFlag) {
  TpBenchOptions o = Small();
  o.hidden = 10;
  absl::Status s = ValidateTpBench(o, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--hidden (10)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--ranks (4)")) << s;
  o = Small();
  o.batch = 0;
  s = ValidateTpBench(o, 1);
  EXPECT_TRUE(absl::StrContains(s.message(), "--batch")) << s;
  o = Small();
  o.iters = 0;
  EXPECT_TRUE(absl::StrContains(ValidateTpBench(o, 1).message(), "--iters"));
}

}  // namespace
}  // namespace ringmaster::bench
