#include "bench/parallel_bench.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::bench {
namespace {

std::vector<std::string> Names(const std::vector<ParallelLayout>& layouts) {
  std::vector<std::string> names;
  for (const ParallelLayout& l : layouts) names.push_back(l.Name());
  return names;
}

TEST(ParseParallelLayouts, TheIssuesLayoutsAtFourRanks) {
  auto layouts = ParseParallelLayouts(
      "dp,tp2,pp2.dp2,tp2.pp2, pp4@gpipe,pp4@zero_bubble,pp4@interleaved_1f1b,tp4.dp1", 4, "1f1b");
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  EXPECT_EQ(Names(*layouts),
            (std::vector<std::string>{"dp4", "tp2.dp2", "pp2.dp2 1f1b", "tp2.pp2 1f1b", "pp4 gpipe",
                                      "pp4 zero_bubble", "pp4 interleaved_1f1b v2", "tp4"}));
  const ParallelLayout& tp2pp2 = (*layouts)[3];
  EXPECT_EQ(tp2pp2.tp, 2);
  EXPECT_EQ(tp2pp2.pp, 2);
  EXPECT_EQ(tp2pp2.dp, 1);
  EXPECT_EQ((*layouts)[6].virtual_stages, 2);
  EXPECT_EQ((*layouts)[0].dp, 4);
}

TEST(ParseParallelLayouts, MisfitsNameTheFlagAndTheItem) {
  for (const char* text :
       {"tp3", "pp2.dp4", "xp2", "tp0", "tpx", "dp@1f1b", "pp2@fast", "", " , "}) {
    auto layouts = ParseParallelLayouts(text, 4, "1f1b");
    ASSERT_FALSE(layouts.ok()) << text;
    EXPECT_EQ(layouts.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StartsWith(layouts.status().message(), "--parallel_layouts: "))
        << layouts.status();
  }
  const absl::Status schedule = ParseParallelLayouts("dp,pp2", 4, "fast").status();
  EXPECT_TRUE(absl::StartsWith(schedule.message(), "--parallel_schedule: ")) << schedule;
  EXPECT_TRUE(ParseParallelLayouts("dp,tp2", 4, "fast").ok());  // no layout uses it
  EXPECT_TRUE(absl::StrContains(ParseParallelLayouts("tp3", 4, "1f1b").status().message(),
                                "\"tp3\": tp x pp = 3 does not divide the 4 ranks"));
}

std::string TextFile(size_t bytes) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/parallel_text";
  FILE* f = fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  fwrite(std::string(bytes, 'a').data(), 1, bytes, f);
  fclose(f);
  return path;
}

ParallelConfig SmallConfig() {
  ParallelConfig c;
  c.gpt = GptShape{4, 64, 4, 32, TextFile(4096)};
  c.world = 4;
  c.global_batch = 16;
  c.micro_batches = 4;
  return c;
}

TEST(CheckParallelConfig, NamesTheFlag) {
  const ParallelConfig c = SmallConfig();
  auto layouts = ParseParallelLayouts("dp,tp2,pp2,tp2.pp2,pp4@interleaved_1f1b", 4, "1f1b");
  ASSERT_TRUE(layouts.ok());
  ParallelConfig deep = c;
  deep.gpt.layers = 8;
  EXPECT_TRUE(CheckParallelConfig(deep, *layouts).ok()) << CheckParallelConfig(deep, *layouts);
  struct Case {
    const char* flag;
    ParallelConfig config;
  };
  std::vector<Case> cases;
  cases.push_back({"parallel_layouts", c});  // pp4 x v2 = 8 stages > 4 blocks
  ParallelConfig uneven = deep;
  uneven.global_batch = 18;
  cases.push_back({"parallel_batch", uneven});
  ParallelConfig many = deep;
  many.micro_batches = 9;  // pp2.dp2's replicas get 8
  cases.push_back({"parallel_micro_batches", many});
  ParallelConfig odd = deep;
  odd.micro_batches = 6;  // interleaved on pp 4 needs a multiple of 4
  cases.push_back({"parallel_micro_batches", odd});
  ParallelConfig heads = deep;
  heads.gpt.heads = 1;
  heads.gpt.width = 64;
  cases.push_back({"parallel_layouts", heads});  // tp 2 does not divide 1 head
  for (const Case& k : cases) {
    const absl::Status s = CheckParallelConfig(k.config, *layouts);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.flag;
    EXPECT_TRUE(absl::StartsWith(s.message(), std::string("--") + k.flag + ":")) << s;
  }
}

TEST(ParallelJob, TheSpecCarriesTheMeshAndTheSchedule) {
  const ParallelConfig c = SmallConfig();
  auto layouts = ParseParallelLayouts("tp2.pp2@zero_bubble,dp", 4, "1f1b");
  ASSERT_TRUE(layouts.ok());
  LocalJobOptions job = ParallelJob(RingmasterOptions{}, c, (*layouts)[0]);
  EXPECT_EQ(job.world, 4);
  EXPECT_EQ(job.run_name, "parallel-tp2.pp2-zero_bubble");
  auto spec = spec::LoadJobSpecText(job.spec_yaml, job.overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->model().has_gpt());
  EXPECT_EQ(spec->model().gpt().layers(), 4);
  EXPECT_EQ(spec->batch().global(), 16);
  EXPECT_EQ(spec->parallelism().mesh().tp(), 2);
  EXPECT_EQ(spec->parallelism().mesh().pp(), 2);
  EXPECT_EQ(spec->parallelism().pipeline().schedule(), PipelineSpec::SCHEDULE_ZERO_BUBBLE);
  EXPECT_EQ(spec->parallelism().pipeline().micro_batches(), 4);
  LocalJobOptions dp = ParallelJob(RingmasterOptions{}, c, (*layouts)[1]);
  auto dp_spec = spec::LoadJobSpecText(dp.spec_yaml, dp.overrides);
  ASSERT_TRUE(dp_spec.ok()) << dp_spec.status();
  EXPECT_EQ(dp_spec->parallelism().mesh().tp(), 1);
  EXPECT_EQ(dp_spec->parallelism().mesh().pp(), 1);
  EXPECT_FALSE(dp_spec->parallelism().pipeline().has_micro_batches());
}

// A run of `layout` on 2 ranks whose ranks report `blocks` block parameters each.
ParallelRun FakeRun(const std::string& layout_text, double blocks) {
  ParallelRun run;
  run.layout = (*ParseParallelLayouts(layout_text, 2, "1f1b"))[0];
  run.stats.step_ms = 250;
  run.stats.samples_per_second = 10;
  run.summary.set_pipeline_bubble_formula(0.2);
  for (int r = 0; r < 2; ++r) {
    train::RankResult* rr = run.summary.add_ranks();
    rr->set_rank(r);
    rr->set_parameter_bytes(1 << 20);
    rr->set_gradient_bytes(1 << 20);
    rr->set_optimizer_state_bytes(r == 0 ? 2 << 20 : 4 << 20);
    rr->set_activation_bytes_peak(r == 0 ? 3 << 20 : 1 << 20);
    rr->set_peak_rss_bytes(100 << 20);
    rr->set_comm_bytes_per_step(r == 0 ? 4 << 20 : 2 << 20);
    rr->set_pipeline_bytes_per_step(r == 0 ? 1 << 20 : 0);
    rr->set_tensor_parallel_bytes_per_step(r == 0 ? 1 << 20 : 1 << 20);
    rr->set_block_parameters(blocks + r);
    rr->set_pipeline_bubble(r == 0 ? 0.1 : 0.3);
  }
  return run;
}

TEST(Figures, TheLargestRanksMemoryAndTheMeanTraffic) {
  const ParallelFigures f = Figures(FakeRun("pp2", 100), 64);
  EXPECT_EQ(f.step_ms, 250);
  EXPECT_EQ(f.tokens_per_second, 640);
  EXPECT_EQ(f.state_bytes, 6 << 20);
  EXPECT_EQ(f.activation_bytes, 3 << 20);
  EXPECT_EQ(f.block_parameters, 101);
  EXPECT_EQ(f.pp_bytes_per_step, 0.5 * (1 << 20));
  EXPECT_EQ(f.tp_bytes_per_step, 1 << 20);
  EXPECT_EQ(f.dp_bytes_per_step, 1.5 * (1 << 20));  // ((4 - 1 - 1) + (2 - 0 - 1)) / 2 MiB
  EXPECT_DOUBLE_EQ(f.bubble, 0.2);
  EXPECT_DOUBLE_EQ(f.bubble_formula, 0.2);
  const ParallelFigures dp = Figures(FakeRun("dp", 100), 64);
  EXPECT_EQ(dp.bubble, -1);  // no pipeline
}

TEST(ParallelTable, OneRowALayoutAgainstDataParallelism) {
  ParallelConfig c;
  c.world = 2;
  const std::vector<ParallelRun> runs = {FakeRun("dp", 1000), FakeRun("pp2", 500)};
  const std::string table = ParallelTable(runs, c);
  EXPECT_TRUE(absl::StrContains(table, "layout")) << table;
  EXPECT_TRUE(absl::StrContains(table, "\ndp2 ")) << table;
  EXPECT_TRUE(absl::StrContains(table, "\npp2 1f1b ")) << table;
  EXPECT_TRUE(absl::StrContains(table, "20.0%")) << table;   // the bubble and its formula
  EXPECT_TRUE(absl::StrContains(table, " 1.00 ")) << table;  // vs dp
}

TEST(TensorParallelGoalLine, HalfWithinTwoPercent) {
  EXPECT_TRUE(absl::StrContains(TensorParallelGoalLine({FakeRun("dp", 1000), FakeRun("tp2", 500)}),
                                ": PASS (0.500"));
  EXPECT_TRUE(absl::StrContains(TensorParallelGoalLine({FakeRun("dp", 1000), FakeRun("tp2", 515)}),
                                ": MISS (0.515"));
  EXPECT_TRUE(absl::StrContains(TensorParallelGoalLine({FakeRun("dp", 1000)}), "not checked"));
}

}  // namespace
}  // namespace ringmaster::bench
