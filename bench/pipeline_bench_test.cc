#include "bench/pipeline_bench.h"

#include <string>

#include "absl/strings/match.h"
#include "bench/local_ranks.h"
#include "comm/tcp/tcp_communicator.h"
#include "gtest/gtest.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::bench {
namespace {

using train::pipeline::ScheduleKind;

PipelineBenchOptions Tiny() {
  PipelineBenchOptions o;
  o.layers = 4;
  o.width = 16;
  o.heads = 2;
  o.context = 8;
  o.vocab = 32;
  o.batch = 2;
  o.steps = 2;
  o.micro_batches = {2};
  return o;
}

// Runs the bench on `ranks` forked local ranks and returns rank 0's result, through its text.
absl::StatusOr<PipelineBenchResult> RunOnLocalRanks(int ranks, const PipelineBenchOptions& o) {
  comm::TcpCommunicatorOptions base;
  absl::StatusOr<std::string> text = RunLocalRanks(
      ranks, base, [&o](comm::TcpCommunicator& comm) -> absl::StatusOr<std::string> {
        absl::StatusOr<PipelineBenchResult> r = RunPipelineBench(comm, o);
        if (!r.ok()) return r.status();
        return PipelineResultToText(*r);
      });
  if (!text.ok()) return text.status();
  return PipelineResultFromText(*text);
}

TEST(PipelineBenchTest, EverySchedulesFiguresAreFilledAndSane) {
  constexpr int kRanks = 2, kM = 2;
  const PipelineBenchOptions o = Tiny();
  absl::StatusOr<PipelineBenchResult> r = RunOnLocalRanks(kRanks, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ranks, kRanks);
  EXPECT_EQ(r->steps, o.steps);
  ASSERT_EQ(r->cases.size(), 4u);
  for (const PipelineCase& c : r->cases) {
    const std::string name(train::pipeline::ScheduleName(c.kind));
    SCOPED_TRACE(name);
    EXPECT_TRUE(c.skipped.empty()) << c.skipped;
    EXPECT_EQ(c.micro_batches, kM);
    EXPECT_EQ(c.virtual_stages, c.kind == ScheduleKind::kInterleaved1F1B ? 2 : 1);
    ASSERT_EQ(c.ranks.size(), static_cast<size_t>(kRanks));
    ASSERT_EQ(c.simulated_in_flight.size(), static_cast<size_t>(kRanks));
    const bool simple = c.kind == ScheduleKind::kGPipe || c.kind == ScheduleKind::kOneFOneB;
    EXPECT_EQ(c.formula_simple, simple ? 1.0 / 3 : -1);  // (P−1)/(m+P−1) = 1/3
    EXPECT_GT(c.formula, 0);
    EXPECT_LT(c.formula, 1);
    EXPECT_GT(c.simulated, 0);
    EXPECT_LT(c.simulated, 1);
    for (int rank = 0; rank < kRanks; ++rank) {
      const PipelineRankMeasure& m = c.ranks[rank];
      SCOPED_TRACE(rank);
      EXPECT_GE(m.bubble, 0);
      EXPECT_LT(m.bubble, 1);
      EXPECT_GT(m.step_ms, 0);
      EXPECT_NEAR(m.tokens_per_s, kM * o.batch * o.context / (m.step_ms / 1000),
                  1e-6 * m.tokens_per_s);
      EXPECT_GT(m.forward_ms, 0);
      EXPECT_GT(m.backward_input_ms, 0);
      // The weight part is timed apart only when the schedule splits the backward.
      EXPECT_EQ(m.backward_weight_ms > 0, c.kind == ScheduleKind::kZeroBubble);
      EXPECT_GT(m.activation_bytes, 0);
      EXPECT_GT(m.peak_buffer_bytes, 0);
      EXPECT_GT(m.in_flight, 0);
      EXPECT_GT(m.cpu_share, 0);
      EXPECT_LE(m.cpu_share, 1.05);  // CPU time cannot much exceed wall time on one thread
      EXPECT_LE(m.in_flight, kM);
      EXPECT_GT(c.simulated_in_flight[rank], 0);
      EXPECT_LE(c.simulated_in_flight[rank], kM);
      if (c.kind == ScheduleKind::kOneFOneB) {
        EXPECT_LE(m.in_flight, kRanks - rank);
      }
    }
    if (c.kind == ScheduleKind::kGPipe) {
      EXPECT_EQ(c.ranks[0].in_flight, kM);
    }
    EXPECT_GE(c.max_bubble(), c.mean_bubble());
  }
  const std::string table = FormatPipelineTable(o, *r);
  EXPECT_TRUE(absl::StrContains(table, "zero_bubble")) << table;
  // P = 2 but only m = 2 ran: the first goal is not checked, the second needs m = 4.
  const std::vector<PipelineGoal> goals = PipelineGoals(*r);
  ASSERT_EQ(goals.size(), 2u);
  EXPECT_FALSE(goals[0].checked);
  EXPECT_TRUE(absl::StrContains(goals[0].line, "not checked")) << goals[0].line;
  EXPECT_TRUE(absl::StrContains(goals[0].line, "m = 2")) << goals[0].line;  // the worst
  EXPECT_FALSE(goals[1].checked);
  EXPECT_TRUE(absl::StrContains(table, goals[1].line)) << table;
}

TEST(PipelineBenchTest, InterleavedSkipsCountsNotAMultipleOfTheRanks) {
  PipelineBenchOptions o = Tiny();
  o.schedules = {ScheduleKind::kInterleaved1F1B};
  o.micro_batches = {1, 2};
  o.steps = 1;
  absl::StatusOr<PipelineBenchResult> r = RunOnLocalRanks(2, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cases.size(), 2u);
  EXPECT_TRUE(absl::StrContains(r->cases[0].skipped, "multiple of P (2)")) << r->cases[0].skipped;
  EXPECT_TRUE(r->cases[0].ranks.empty());
  EXPECT_TRUE(r->cases[1].skipped.empty());
  EXPECT_EQ(r->cases[1].ranks.size(), 2u);
  const std::string table = FormatPipelineTable(o, *r);
  EXPECT_TRUE(absl::StrContains(table, "interleaved_1f1b m = 1: needs m a multiple")) << table;
}

// A result with every goal's cases at P = 2, the bubbles chosen.
PipelineBenchResult Made(double worst_gap, double zero_bubble_bubble) {
  PipelineBenchResult r;
  r.ranks = 2;
  r.steps = 5;
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    for (int m : {1, 2, 4, 8}) {
      PipelineCase c;
      c.kind = kind;
      c.micro_batches = m;
      c.formula_simple = kind == ScheduleKind::kZeroBubble ? -1 : 1.0 / (m + 1);
      c.formula = 0.1;
      c.simulated = 0.2;
      c.simulated_in_flight = {2, 1};
      const double bubble = kind == ScheduleKind::kZeroBubble ? zero_bubble_bubble
                                                              : 1.0 / (m + 1) + 0.5 * worst_gap;
      PipelineRankMeasure a;
      a.bubble = bubble + 0.5 * worst_gap;
      a.step_ms = 10.5;
      a.activation_bytes = 1 << 20;
      a.peak_buffer_bytes = 4096;
      a.in_flight = 2;
      a.cpu_share = 0.97;
      PipelineRankMeasure b = a;
      b.bubble = bubble - 0.5 * worst_gap;
      c.ranks = {a, b};
      r.cases.push_back(c);
    }
  }
  PipelineCase skipped;
  skipped.kind = ScheduleKind::kInterleaved1F1B;
  skipped.micro_batches = 1;
  skipped.virtual_stages = 2;
  skipped.skipped = "needs m a multiple of P (2)";
  r.cases.push_back(skipped);
  return r;
}

TEST(PipelineBenchTest, GoalsAreComputedFromTheResult) {
  // 1f1b at m = 4 measures 1/5 + gap/2 on average.
  std::vector<PipelineGoal> g = PipelineGoals(Made(0.02, 0.05));
  EXPECT_TRUE(g[0].checked && g[0].pass) << g[0].line;
  EXPECT_TRUE(absl::StrContains(g[0].line, ": PASS (worst:")) << g[0].line;
  EXPECT_TRUE(g[1].checked && g[1].pass) << g[1].line;
  g = PipelineGoals(Made(0.08, 0.15));
  EXPECT_TRUE(g[0].checked && !g[0].pass) << g[0].line;
  EXPECT_TRUE(absl::StrContains(g[0].line, ": MISS (worst:")) << g[0].line;
  EXPECT_TRUE(absl::StrContains(g[0].line, "+4.0 points")) << g[0].line;
  EXPECT_TRUE(g[1].checked && !g[1].pass) << g[1].line;
  EXPECT_TRUE(absl::StrContains(g[1].line, "15.0% vs 24.0%")) << g[1].line;
  PipelineBenchResult four = Made(0, 0);
  four.ranks = 4;
  g = PipelineGoals(four);
  EXPECT_FALSE(g[0].checked);
  EXPECT_TRUE(absl::StrContains(g[0].line, "P = 4")) << g[0].line;
}

TEST(PipelineBenchTest, ResultSurvivesTheTextForm) {
  const PipelineBenchResult r = Made(0.02, 0.05);
  absl::StatusOr<PipelineBenchResult> back = PipelineResultFromText(PipelineResultToText(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ranks, 2);
  EXPECT_EQ(back->steps, 5);
  ASSERT_EQ(back->cases.size(), r.cases.size());
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const PipelineCase &a = r.cases[i], &b = back->cases[i];
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.micro_batches, b.micro_batches);
    EXPECT_EQ(a.virtual_stages, b.virtual_stages);
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(a.formula_simple, b.formula_simple);
    EXPECT_EQ(a.simulated, b.simulated);
    EXPECT_EQ(a.simulated_in_flight, b.simulated_in_flight);
    ASSERT_EQ(a.ranks.size(), b.ranks.size());
    for (size_t k = 0; k < a.ranks.size(); ++k) {
      EXPECT_EQ(a.ranks[k].bubble, b.ranks[k].bubble);
      EXPECT_EQ(a.ranks[k].step_ms, b.ranks[k].step_ms);
      EXPECT_EQ(a.ranks[k].activation_bytes, b.ranks[k].activation_bytes);
      EXPECT_EQ(a.ranks[k].peak_buffer_bytes, b.ranks[k].peak_buffer_bytes);
      EXPECT_EQ(a.ranks[k].in_flight, b.ranks[k].in_flight);
      EXPECT_EQ(a.ranks[k].cpu_share, b.ranks[k].cpu_share);
    }
  }
  EXPECT_EQ(back->cases.back().skipped, "needs m a multiple of P (2)");
  EXPECT_FALSE(PipelineResultFromText("case gpipe 2").ok());
  EXPECT_FALSE(PipelineResultFromText("case nope 2 1 0 0 0 -").ok());
  EXPECT_FALSE(PipelineResultFromText("rank 1 2 3 4 5 6 7 8 9 1").ok());  // no case before it
}

TEST(PipelineBenchTest, BadOptionsNameTheFlag) {
  PipelineBenchOptions o = Tiny();
  EXPECT_TRUE(ValidatePipelineBench(o, 2).ok());
  o.heads = 3;
  absl::Status s = ValidatePipelineBench(o, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--heads (3)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--width (16)")) << s;
  o = Tiny();
  s = ValidatePipelineBench(o, 5);
  EXPECT_TRUE(absl::StrContains(s.message(), "--layers (4)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--ranks (5)")) << s;
  for (auto [field, flag] : std::vector<std::pair<int64_t PipelineBenchOptions::*, const char*>>{
           {&PipelineBenchOptions::width, "--width"},
           {&PipelineBenchOptions::context, "--context"},
           {&PipelineBenchOptions::vocab, "--vocab"},
           {&PipelineBenchOptions::batch, "--batch"}}) {
    o = Tiny();
    o.*field = 0;
    EXPECT_TRUE(absl::StrContains(ValidatePipelineBench(o, 2).message(), flag)) << flag;
  }
  o = Tiny();
  o.steps = 0;
  EXPECT_TRUE(absl::StrContains(ValidatePipelineBench(o, 2).message(), "--steps"));
  o = Tiny();
  o.micro_batches = {2, 0};
  EXPECT_TRUE(absl::StrContains(ValidatePipelineBench(o, 2).message(), "--micro_batches"));
  o = Tiny();
  o.schedules.clear();
  EXPECT_TRUE(absl::StrContains(ValidatePipelineBench(o, 2).message(), "--schedules"));

  absl::StatusOr<std::vector<ScheduleKind>> kinds = ParsePipelineSchedules("gpipe, zero_bubble");
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  EXPECT_EQ(*kinds, (std::vector<ScheduleKind>{ScheduleKind::kGPipe, ScheduleKind::kZeroBubble}));
  kinds = ParsePipelineSchedules("gpipe,2f2b");
  EXPECT_EQ(kinds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(kinds.status().message(), "--schedules")) << kinds.status();
  EXPECT_TRUE(absl::StrContains(kinds.status().message(), "2f2b")) << kinds.status();
  EXPECT_FALSE(ParsePipelineSchedules("").ok());

  absl::StatusOr<std::vector<int>> counts = ParseMicroBatchCounts("1,2,4,8");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(*counts, (std::vector<int>{1, 2, 4, 8}));
  counts = ParseMicroBatchCounts("1,x");
  EXPECT_TRUE(absl::StrContains(counts.status().message(), "--micro_batches: \"x\"")) << counts.status();
  EXPECT_FALSE(ParseMicroBatchCounts("0").ok());
}

}  // namespace
}  // namespace ringmaster::bench
