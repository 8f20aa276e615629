#include "worker/comm_report.h"

#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using comm::OpKind;

train::StepReport Report(int world, uint64_t calls, uint64_t sent, int64_t steps) {
  train::StepReport r;
  train::CommGroupCounters world_comm{"world", world, {}};
  comm::OpCounters& ar = world_comm.counters.of(OpKind::kAllReduce);
  ar.calls = calls;
  ar.bytes_sent = sent;
  ar.bytes_received = sent;
  ar.formula_bytes_sent = sent + 1;
  ar.payload_bytes = 2 * sent;
  ar.time = absl::Milliseconds(250);
  world_comm.counters.of(OpKind::kBarrier).calls = 1;
  r.comm.push_back(world_comm);
  train::CommGroupCounters dp{"dp", world / 2, {}};
  dp.counters.of(OpKind::kReduceScatter).calls = 3;
  r.comm.push_back(dp);
  r.buckets.push_back({/*payload_bytes=*/400, calls, sent, sent, absl::Seconds(1)});
  r.steps_run = steps;
  return r;
}

TEST(ProcessCommStats, AddsTheEpochsOfOneProcessUp) {
  ProcessCommStats totals;
  totals.Update(Report(4, 5, 1000, 5));
  totals.Update(Report(4, 10, 2000, 10));  // the same epoch, later: replaces the first
  totals.EndEpoch();
  totals.Update(Report(2, 3, 300, 3));  // the next epoch, with fresh communicators

  RankStats stats;
  totals.Fill(&stats);
  EXPECT_EQ(stats.process_steps(), 13);
  // By group, then op kind: dp's reduce_scatter; world's all_reduce, barrier.
  ASSERT_EQ(stats.comm_ops_size(), 3);
  EXPECT_EQ(stats.comm_ops(0).group(), "dp");
  EXPECT_EQ(stats.comm_ops(0).op(), "reduce_scatter");
  EXPECT_EQ(stats.comm_ops(0).calls(), 6);
  const CommOpStats& ar = stats.comm_ops(1);
  EXPECT_EQ(ar.group(), "world");
  EXPECT_EQ(ar.op(), "all_reduce");
  EXPECT_EQ(ar.group_size(), 2);  // the latest epoch's
  EXPECT_EQ(ar.calls(), 13);
  EXPECT_EQ(ar.bytes_sent(), 2300);
  EXPECT_EQ(ar.bytes_received(), 2300);
  EXPECT_EQ(ar.formula_bytes_sent(), 2302);
  EXPECT_EQ(ar.payload_bytes(), 4600);
  EXPECT_DOUBLE_EQ(ar.seconds(), 0.5);
  EXPECT_EQ(stats.comm_ops(2).op(), "barrier");
  EXPECT_EQ(stats.comm_ops(2).bytes_sent(), 0);
  ASSERT_EQ(stats.buckets_size(), 1);
  EXPECT_EQ(stats.buckets(0).bucket(), 0);
  EXPECT_EQ(stats.buckets(0).bytes(), 400);
  EXPECT_EQ(stats.buckets(0).calls(), 13);
  EXPECT_EQ(stats.buckets(0).bytes_sent(), 2300);
  EXPECT_DOUBLE_EQ(stats.buckets(0).seconds(), 2);

  // Filling again gives the same figures (Fill does not fold the current epoch in).
  RankStats again;
  totals.Fill(&again);
  EXPECT_EQ(again.comm_ops(1).calls(), 13);
}

}  // namespace
}  // namespace ringmaster::worker
