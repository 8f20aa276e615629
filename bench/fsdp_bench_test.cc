#include "bench/fsdp_bench.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/train_config.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "train/fsdp.h"
#include "train/model_factory.h"

namespace ringmaster::bench {
namespace {

constexpr double kMiB = 1 << 20;

// A small GPT, quick to describe.
GptBenchSize Small() {
  GptBenchSize s;
  s.layers = 2;
  s.heads = 2;
  s.width = 32;
  s.context = 16;
  return s;
}

bool Has(const std::vector<std::string>& sets, absl::string_view prefix) {
  return std::any_of(sets.begin(), sets.end(),
                     [&](const std::string& s) { return absl::StartsWith(s, prefix); });
}

TEST(CaseOverrides, StageFieldsOnlyUnderTheirStage) {
  FsdpCase ddp;
  ddp.world = 4;
  auto sets = CaseOverrides(ddp, Small(), 1);
  EXPECT_TRUE(Has(sets, "parallelism.zero_stage=0"));
  EXPECT_TRUE(Has(sets, "batch.global=8"));  // 2 per rank x 4
  EXPECT_FALSE(Has(sets, "parallelism.fsdp."));
  EXPECT_FALSE(Has(sets, "precision.reduce="));

  FsdpCase z3;
  z3.zero_stage = 3;
  z3.wrap = "layer";
  z3.prefetch = "none";
  z3.compute = "bf16";
  z3.reduce = "bf16";
  sets = CaseOverrides(z3, Small(), 2);
  EXPECT_TRUE(Has(sets, "parallelism.fsdp.wrap=layer"));
  EXPECT_TRUE(Has(sets, "parallelism.fsdp.prefetch=none"));
  EXPECT_TRUE(Has(sets, "precision.reduce=bf16"));
  EXPECT_TRUE(Has(sets, "precision.compute=bf16"));
  EXPECT_TRUE(Has(sets, "parallelism.threads=2"));
}

TEST(CaseSpecYaml, EveryStageAndPrecisionIsAValidSpec) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* compute : {"fp32", "bf16"}) {
      FsdpCase c;
      c.zero_stage = stage;
      c.compute = compute;
      c.reduce = stage >= 2 ? compute : "fp32";
      auto yaml = CaseSpecYaml(c, Small(), 1);
      ASSERT_TRUE(yaml.ok()) << CaseLabel(c) << ": " << yaml.status();
      auto spec = spec::LoadJobSpecText(*yaml);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->parallelism().zero_stage(), stage);
      EXPECT_EQ(spec->model().gpt().width(), 32);
    }
  }
  FsdpCase bad;
  bad.zero_stage = 3;
  bad.wrap = "tensor";
  auto refused = CaseSpecYaml(bad, Small(), 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "wrap")) << refused.status();
}

TEST(CaseLabel, NamesStageWrappingAndPrecision) {
  FsdpCase c;
  EXPECT_EQ(CaseLabel(c), "DDP");
  c.zero_stage = 2;
  EXPECT_EQ(CaseLabel(c), "ZeRO-2");
  c.zero_stage = 3;
  c.wrap = "model";
  c.prefetch = "none";
  c.compute = "bf16";
  c.reduce = "bf16";
  EXPECT_EQ(CaseLabel(c), "ZeRO-3 model, prefetch none, bf16, reduce bf16");
}

TEST(DataParallelTraffic, RingAllReduceAndZero1Gather) {
  // 1,000 padded elements at world 4: a ring all-reduce sends 2 x 3/4 x 4,000 bytes.
  StepTraffic ddp = DataParallelTraffic(1000, 4, 0);
  EXPECT_DOUBLE_EQ(ddp.all_reduce, 6000);
  EXPECT_DOUBLE_EQ(ddp.all_gather, 0);
  StepTraffic z1 = DataParallelTraffic(1000, 4, 1);
  EXPECT_DOUBLE_EQ(z1.all_reduce, 6000);
  EXPECT_DOUBLE_EQ(z1.all_gather, 3000);
  EXPECT_DOUBLE_EQ(z1.total(), 9000);
  EXPECT_DOUBLE_EQ(DataParallelTraffic(1000, 1, 0).total(), 0);
}

// Two units of 64 and 32 padded elements at world 2 (shards 32 and 16).
train::FsdpLayout TwoUnits() {
  train::FsdpLayout layout;
  layout.world = 2;
  train::FsdpUnit a, b;
  a.padded = 64;
  a.shard = 32;
  b.padded = 32;
  b.shard = 16;
  layout.units = {a, b};
  return layout;
}

TEST(ShardedTraffic, Zero2GathersEveryUnitOnceAfterTheStep) {
  const StepTraffic t = ShardedTraffic(TwoUnits(), 2, true, 2, 4);
  EXPECT_DOUBLE_EQ(t.reduce_scatter, (32 + 16) * 4);  // (N-1) x shard x reduce bytes
  EXPECT_DOUBLE_EQ(t.all_gather, (32 + 16) * 2);      // in the compute precision
  EXPECT_DOUBLE_EQ(t.all_reduce, 0);
}

TEST(ShardedTraffic, Zero3IsThePassFormula) {
  const train::FsdpLayout layout = TwoUnits();
  for (bool reshard : {true, false}) {
    const StepTraffic t = ShardedTraffic(layout, 3, reshard, 4, 4);
    const train::PassTraffic pass = train::Zero3PassTraffic(layout, reshard, 4, 4);
    EXPECT_DOUBLE_EQ(t.all_gather, pass.all_gather_bytes);
    EXPECT_DOUBLE_EQ(t.reduce_scatter, pass.reduce_scatter_bytes);
  }
  // Resharding gathers the first unit again for backward (the last one stays).
  EXPECT_DOUBLE_EQ(ShardedTraffic(layout, 3, true, 4, 4).all_gather, (2 * 32 + 16) * 4);
  EXPECT_DOUBLE_EQ(ShardedTraffic(layout, 3, false, 4, 4).all_gather, (32 + 16) * 4);
}

TEST(FormulaFor, MatchesTheModelsTableAndLayout) {
  const GptBenchSize size = Small();
  FsdpCase c;
  c.world = 2;
  auto ddp = FormulaFor(c, size);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  // The same model, built here independently.
  FsdpCase z3 = c;
  z3.zero_stage = 3;
  auto spec = spec::LoadJobSpecText(kFsdpJobSpec, CaseOverrides(z3, size, 1));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto config = config::TrainConfigFromSpec(*spec);
  ASSERT_TRUE(config.ok());
  auto model = train::CreateModel(config->model, train::DescribeJobData(*config));
  ASSERT_TRUE(model.ok());
  const int64_t elements = (*model)->table().total_elements();
  EXPECT_EQ(ddp->parameters, (*model)->table().parameter_count());
  const double padded = static_cast<double>((elements + 31) / 32 * 32);  // world x 16
  EXPECT_DOUBLE_EQ(ddp->traffic.all_reduce, 2 * padded * 4 / 2);
  EXPECT_EQ(ddp->units, 0);

  train::ShardedOptions o;
  o.table = &(*model)->table();
  o.groups = (*model)->parameter_groups();
  o.zero_stage = 3;
  o.fsdp = config->fsdp;
  auto layout = train::ShardedLayout(o, 2);
  ASSERT_TRUE(layout.ok());
  auto f = FormulaFor(z3, size);
  ASSERT_TRUE(f.ok()) << f.status();
  const train::PassTraffic pass = train::Zero3PassTraffic(*layout, true, 4, 4);
  EXPECT_DOUBLE_EQ(f->traffic.all_gather, pass.all_gather_bytes);
  EXPECT_DOUBLE_EQ(f->traffic.reduce_scatter, pass.reduce_scatter_bytes);
  EXPECT_EQ(f->units, static_cast<int>(layout->units.size()));
  EXPECT_DOUBLE_EQ(f->largest_unit_bytes, layout->largest_unit * 4.0);
  // Per block: more than one unit; the whole model: one; bf16 gathers half the bytes.
  EXPECT_GT(f->units, 1);
  FsdpCase whole = z3;
  whole.wrap = "model";
  auto one = FormulaFor(whole, size);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->units, 1);
  FsdpCase bf16 = z3;
  bf16.compute = "bf16";
  auto half = FormulaFor(bf16, size);
  ASSERT_TRUE(half.ok());
  EXPECT_DOUBLE_EQ(half->traffic.all_gather, f->traffic.all_gather / 2);
  EXPECT_DOUBLE_EQ(half->traffic.reduce_scatter, f->traffic.reduce_scatter);
}

// Lines as the trainer logs them (rank 0's twice: its progress and its log).
constexpr char kLogs[] =
    "I20261124 11:07:31.436535 26285 trainer.cc:144] memory on rank 1 (host): parameters 12.43 "
    "MiB (this rank's shard), gradients 12.43 MiB, optimizer state 24.85 MiB (formula: 24.85 + "
    "24.85 + 24.85 MiB), activations peak 68.76 MiB, unit buffers peak 13.56 MiB\n"
    "step 10/10 epoch 0 loss 3.8758\n"
    "memory on rank 0 (host): parameters 1.50 MiB (this rank's shard) (+ the whole compute "
    "copy, 3.00 MiB), gradients 1.50 MiB, optimizer state 3.00 MiB (formula: 3 + 3 + 3 MiB), "
    "activations peak 10.00 MiB, unit buffers peak 0.50 MiB, peak RSS 200.00 MiB\n"
    "I20261124 11:07:31 trainer.cc:144] memory on rank 0 (host): parameters 1.50 MiB, gradients "
    "9 MiB, optimizer state 3.00 MiB, activations peak 10.00 MiB\n";

TEST(ParseRankMemory, ReadsEveryRanksLineOnce) {
  auto ranks = ParseRankMemory(kLogs);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  const RankMemory& r0 = (*ranks)[0];
  EXPECT_EQ(r0.rank, 0);
  EXPECT_DOUBLE_EQ(r0.parameters, 1.5 * kMiB);
  EXPECT_DOUBLE_EQ(r0.compute_copy, 3 * kMiB);
  EXPECT_DOUBLE_EQ(r0.gradients, 1.5 * kMiB);  // the first line, not the later one
  EXPECT_DOUBLE_EQ(r0.state(), 9 * kMiB);
  EXPECT_DOUBLE_EQ(r0.peak(), 19.5 * kMiB);
  EXPECT_DOUBLE_EQ(r0.peak_rss, 200 * kMiB);
  const RankMemory& r1 = (*ranks)[1];
  EXPECT_EQ(r1.rank, 1);
  EXPECT_DOUBLE_EQ(r1.optimizer, 24.85 * kMiB);
  EXPECT_DOUBLE_EQ(r1.compute_copy, 0);
  EXPECT_DOUBLE_EQ(r1.unit_buffers, 13.56 * kMiB);
  EXPECT_DOUBLE_EQ(r1.activations, 68.76 * kMiB);
  EXPECT_LT(r1.peak_rss, 0);  // today's lines have none

  auto none = ParseRankMemory("no memory here\n");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto bad = ParseRankMemory("x\nmemory on rank 2 (host): parameters lots, gradients 1 MiB\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "line 2")) << bad.status();
}

// The summary's per-rank bytes replace the lines' rounded MiB: all of rank 1's (no copy), and
// rank 0's but its parameters, which the result counts with ZeRO-2's compute copy.
TEST(UseExactBytes, TakesTheSummarysRanks) {
  auto ranks = ParseRankMemory(kLogs);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  train::TrainResult summary;
  for (int rank : {1, 0, 5}) {  // any order; rank 5 is not in the logs
    train::RankResult* r = summary.add_ranks();
    r->set_rank(rank);
    r->set_parameter_bytes(1000 + rank);
    r->set_gradient_bytes(2000 + rank);
    r->set_optimizer_state_bytes(3000 + rank);
    r->set_activation_bytes_peak(4000 + rank);
    r->set_unit_buffer_bytes(5000 + rank);
  }
  UseExactBytes(summary, &*ranks);
  ASSERT_EQ(ranks->size(), 2u);
  const RankMemory& r0 = (*ranks)[0];
  EXPECT_DOUBLE_EQ(r0.parameters, 1.5 * kMiB);
  EXPECT_DOUBLE_EQ(r0.compute_copy, 3 * kMiB);
  EXPECT_DOUBLE_EQ(r0.gradients, 2000);
  EXPECT_DOUBLE_EQ(r0.unit_buffers, 5000);
  const RankMemory& r1 = (*ranks)[1];
  EXPECT_DOUBLE_EQ(r1.parameters, 1001);
  EXPECT_DOUBLE_EQ(r1.optimizer, 3001);
  EXPECT_DOUBLE_EQ(r1.activations, 4001);
  EXPECT_DOUBLE_EQ(r1.unit_buffers, 5001);
  EXPECT_DOUBLE_EQ(r1.peak(), 1001 + 2001 + 3001 + 4001 + 5001);
}

// What a rank sent over 3 steps: 1000 + 500 + 16 bytes a step in 10 + 5 + 1 calls.
StepTraffic ThreeStepsOfTraffic() {
  StepTraffic totals;
  totals.all_gather = 3000;
  totals.all_gather_calls = 30;
  totals.reduce_scatter = 1500;
  totals.reduce_scatter_calls = 15;
  totals.all_reduce = 48;
  totals.all_reduce_calls = 3;
  return totals;
}

TEST(ParseProbeTraffic, PerStepByRankAndRoundTrips) {
  const StepTraffic totals = ThreeStepsOfTraffic();
  const std::string out = absl::StrCat("some log line\n", ProbeTrafficLine(1, 3, totals), "\n",
                                       ProbeTrafficLine(0, 3, totals), "\n");
  auto ranks = ParseProbeTraffic(out);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_DOUBLE_EQ((*ranks)[0].all_gather, 1000);
  EXPECT_DOUBLE_EQ((*ranks)[0].all_gather_calls, 10);
  EXPECT_DOUBLE_EQ((*ranks)[1].reduce_scatter, 500);
  EXPECT_DOUBLE_EQ((*ranks)[1].all_reduce, 16);
  EXPECT_DOUBLE_EQ((*ranks)[1].total(), 1516);

  EXPECT_EQ(ParseProbeTraffic("nothing\n").status().code(), absl::StatusCode::kNotFound);
  auto bad = ParseProbeTraffic("traffic rank=0 steps=0 all_gather=1/1 reduce_scatter=1/1 "
                               "all_reduce=1/1\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = ParseProbeTraffic("traffic rank=0 steps=2 all_gather=1/1\n");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseProbeTraffic, TheLinksCountersWhenOnALink) {
  StepTraffic totals = ThreeStepsOfTraffic();
  totals.link_tx_bytes = 4800;
  totals.link_drops = 6;
  auto ranks = ParseProbeTraffic(ProbeTrafficLine(0, 3, totals));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_DOUBLE_EQ((*ranks)[0].link_tx_bytes, 1600);
  EXPECT_DOUBLE_EQ((*ranks)[0].link_drops, 2);
  EXPECT_DOUBLE_EQ((*ranks)[0].total(), 1516);
  // Without a link there are no link counters.
  totals.link_tx_bytes = totals.link_drops = -1;
  ranks = ParseProbeTraffic(ProbeTrafficLine(0, 3, totals));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_LT((*ranks)[0].link_tx_bytes, 0);
  auto bad = ParseProbeTraffic("traffic rank=0 steps=2 all_gather=1/1 reduce_scatter=1/1 "
                               "all_reduce=1/1 link_tx=12\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrafficFromSummary, OnlyWhenTheTrainerReportsIt) {
  EXPECT_FALSE(TrafficFromSummary(R"({"steps":10,"peak_rss_bytes":1e8})").has_value());
  EXPECT_FALSE(TrafficFromSummary("not json").has_value());
  auto t = TrafficFromSummary(R"({"steps":10,"gathered_bytes":5000,"reduced_bytes":2500})");
  ASSERT_TRUE(t.has_value());
  EXPECT_DOUBLE_EQ(t->all_gather, 500);
  EXPECT_DOUBLE_EQ(t->reduce_scatter, 250);
  EXPECT_DOUBLE_EQ(t->total(), 750);
  EXPECT_FALSE(
      TrafficFromSummary(R"({"steps":0,"gathered_bytes":5000,"reduced_bytes":2500})").has_value());
}

TEST(Goals, StepTimeAndExposedAtTheirLimits) {
  EXPECT_TRUE(StepTimeGoal(115, 100).pass);
  EXPECT_FALSE(StepTimeGoal(116, 100).pass);
  EXPECT_DOUBLE_EQ(StepTimeGoal(116, 100).ratio, 1.16);
  EXPECT_FALSE(StepTimeGoal(10, 0).pass);  // no reference: not met
  EXPECT_TRUE(ExposedGoal(5, 10).pass);
  EXPECT_FALSE(ExposedGoal(5.1, 10).pass);
  EXPECT_FALSE(ExposedGoal(0, 0).pass);
  EXPECT_TRUE(absl::StrContains(ExposedGoal(5, 10).numbers, "5.00 ms/step"));
}

TEST(Goals, MemoryAgainstStateOverNPlusTwoUnitsPlusActivations) {
  RankMemory m;
  m.rank = 1;
  m.parameters = 10 * kMiB;
  m.gradients = 10 * kMiB;
  m.optimizer = 20 * kMiB;
  m.activations = 30 * kMiB;
  m.unit_buffers = 6 * kMiB;
  // Bound: 80 / 2 + 2 x 3 + 30 = 76 MiB; peak 40 + 6 + 30 = 76.
  GoalCheck at = MemoryGoal(m, 80 * kMiB, 2, 3 * kMiB);
  EXPECT_TRUE(at.pass) << at.numbers;
  EXPECT_DOUBLE_EQ(at.ratio, 1);
  m.unit_buffers = 7 * kMiB;
  GoalCheck over = MemoryGoal(m, 80 * kMiB, 2, 3 * kMiB);
  EXPECT_FALSE(over.pass);
  EXPECT_NEAR(over.ratio, 77.0 / 76.0, 1e-12);
  EXPECT_TRUE(absl::StrContains(over.numbers, "bound 76.00 MiB")) << over.numbers;
  EXPECT_TRUE(absl::StrContains(over.name, "rank 1"));
}

}  // namespace
}  // namespace ringmaster::bench
