#include "cli/estimate_cost.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster::cli {
namespace {

using ::testing::HasSubstr;

// `ringctl estimate cost ARGS -o json` as the document it prints; fails the test on an error.
nlohmann::json Estimate(const std::string& args) {
  std::vector<std::string> words = {"estimate", "cost", "-o", "json"};
  for (absl::string_view w : absl::StrSplit(args, ' ', absl::SkipEmpty())) words.emplace_back(w);
  const ParsedCommandLine parsed = ParseCommandLine(words);
  EXPECT_TRUE(parsed.line.has_value()) << args << ": " << parsed.err;
  if (!parsed.line) return nlohmann::json();
  EXPECT_EQ(parsed.line->command, Command::kEstimateCost);
  absl::StatusOr<std::string> text = EstimateCostText(parsed.line->cost, parsed.line->output);
  EXPECT_TRUE(text.ok()) << args << ": " << text.status();
  return text.ok() ? nlohmann::json::parse(*text) : nlohmann::json();
}

// The error of `ringctl estimate cost ARGS`: the parser's (exit 2) or the estimate's.
std::string Error(const std::string& args) {
  std::vector<std::string> words = {"estimate", "cost"};
  for (absl::string_view w : absl::StrSplit(args, ' ', absl::SkipEmpty())) words.emplace_back(w);
  const ParsedCommandLine parsed = ParseCommandLine(words);
  if (!parsed.line) {
    EXPECT_EQ(parsed.exit_status, 2) << args;
    return parsed.err;
  }
  absl::StatusOr<std::string> text = EstimateCostText(parsed.line->cost, parsed.line->output);
  EXPECT_FALSE(text.ok()) << args << " printed " << *text;
  return text.ok() ? "" : std::string(text.status().message());
}

// Within a relative tolerance (the seeds round their answers).
void ExpectAbout(double actual, double expected, double relative, const std::string& what) {
  EXPECT_NEAR(actual, expected, std::abs(expected) * relative) << what;
}

// Chapter 26's quiz: 6 x 7e9 x 1.4e12 = 5.88e22 FLOPs; at 312 TFLOP/s x 0.45 = 140.4 TFLOP/s,
// 4.19e8 GPU-seconds = 116,300 A100-hours; on 256 GPUs about 454 hours; $407,000 at $3.50.
TEST(EstimateCostTest, QuizSevenBillionParametersOnATrillionTokens) {
  const nlohmann::json doc = Estimate("--params 7B --tokens 1.4T --gpu a100 --gpus 256 --mfu 0.45");
  ExpectAbout(doc["flops"].get<double>(), 5.88e22, 1e-9, "flops");
  ExpectAbout(doc["gpu_hours"].get<double>(), 116300, 0.001, "A100-hours");
  ExpectAbout(doc["wall_hours"].get<double>(), 454, 0.002, "wall hours on 256");
  ExpectAbout(doc["on_demand_dollars"].get<double>(), 407000, 0.001, "dollars at $3.50");
  EXPECT_EQ(doc["gpu"]["price_per_hour"].get<double>(), 3.50);
  EXPECT_EQ(doc["gpu"]["peak_tflops"].get<double>(), 312);
}

// The text table says the same for people.
TEST(EstimateCostTest, TextTable) {
  const ParsedCommandLine parsed = ParseCommandLine(
      {"estimate", "cost", "--params", "7B", "--tokens", "1.4T", "--gpus", "256", "--mfu", "0.45"});
  ASSERT_TRUE(parsed.line.has_value()) << parsed.err;
  absl::StatusOr<std::string> text = EstimateCostText(parsed.line->cost, OutputFormat::kTable);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("= 5.88e+22 FLOPs"));
  EXPECT_THAT(*text, HasSubstr("256 x a100 (A100 SXM 80GB, 80 GB): 312 TFLOP/s peak x 0.45 MFU "
                               "= 140.4 TFLOP/s each"));
  EXPECT_THAT(*text, HasSubstr("$407,"));
  EXPECT_THAT(*text, HasSubstr("days)"));
}

// Exercise 26.20: A100 80GB at $3.50 on demand, 65 % spot discount; the break-even number of
// preemptions when each loses 30 minutes: spot at s = 0.35p over T0 hours plus n·0.5 hours
// costs as much as on demand when 0.35(T0 + 0.5n) = T0, n = T0(1/0.35 - 1)/0.5.
TEST(EstimateCostTest, Exercise26_20ThreeModels) {
  const struct {
    const char* args;
    double flops, rate;  // 6ND; 312e12 x MFU
    int gpus;
  } models[] = {
      {"--params 110M --tokens 3.3B --gpus 8 --mfu 0.45", 6 * 110e6 * 3.3e9, 312e12 * 0.45, 8},
      {"--params 345M --tokens 40B --gpus 16 --mfu 0.42", 6 * 345e6 * 40e9, 312e12 * 0.42, 16},
      {"--params 3B --tokens 500B --gpus 64 --mfu 0.38", 6 * 3e9 * 500e9, 312e12 * 0.38, 64},
  };
  // By hand: BERT-base 4.309 GPU-hours, GPT-2 medium 175.5, the 3B model 21,086.
  const double hand_gpu_hours[] = {4.309, 175.52, 21086};
  for (int i = 0; i < 3; ++i) {
    const auto& m = models[i];
    const nlohmann::json doc = Estimate(absl::StrCat(
        m.args, " --gpu a100 --price 3.50 --spot_discount 0.65 --lost_per_preemption 30m"));
    const double gpu_hours = m.flops / m.rate / 3600;
    ExpectAbout(gpu_hours, hand_gpu_hours[i], 0.001, m.args);
    ExpectAbout(doc["gpu_hours"].get<double>(), gpu_hours, 1e-9, m.args);
    ExpectAbout(doc["on_demand_dollars"].get<double>(), gpu_hours * 3.50, 1e-9, m.args);
    ExpectAbout(doc["spot_dollars"].get<double>(), gpu_hours * 3.50 * 0.35, 1e-9, m.args);
    const double wall = gpu_hours / m.gpus;
    ExpectAbout(doc["break_even_preemptions"].get<double>(), wall * (1 / 0.35 - 1) / 0.5, 1e-9,
                m.args);
  }
  // BERT-base: $15.08 on demand, $5.28 on spot, and two preemptions of 30 minutes already
  // cost as much (its 32-minute run has little to lose).
  const nlohmann::json bert = Estimate(
      "--params 110M --tokens 3.3B --gpus 8 --mfu 0.45 --spot_discount 0.65 "
      "--lost_per_preemption 30m");
  ExpectAbout(bert["on_demand_dollars"].get<double>(), 15.08, 0.001, "BERT on demand");
  ExpectAbout(bert["spot_dollars"].get<double>(), 5.28, 0.001, "BERT spot");
  ExpectAbout(bert["break_even_preemptions"].get<double>(), 2.0, 0.001, "BERT break-even");
}

// Exercise 26.21: 1e21 FLOPs. Option A, 32 A100 80GB on demand at $3.50, MFU 0.45:
// 1e21 / 140.4e12 = 7.12e6 GPU-seconds = 1978 GPU-hours, 61.8 h, $6,925. Option B, 128 A100
// 40GB on spot at $1.10, MFU 0.35: 2544 GPU-hours, 19.87 h without preemptions; 2 a day,
// each losing an hour: the run takes 19.87 / (1 - 2/24) = 21.68 h and 128 x 21.68 x $1.10 =
// $3,053. $50,000 buys 50000/3.5 x 140.4e12 x 3600 = 7.22e21 FLOPs on A, and
// 50000/1.1 x 109.2e12 x 3600 x (1 - 2/24) = 1.64e22 on B.
TEST(EstimateCostTest, Exercise26_21TwoOptionsAndTheBudget) {
  const nlohmann::json a =
      Estimate("--flops 1e21 --gpu a100 --gpus 32 --mfu 0.45 --price 3.50 --budget 50000");
  ExpectAbout(a["gpu_hours"].get<double>(), 1978.3, 0.0005, "A GPU-hours");
  ExpectAbout(a["wall_hours"].get<double>(), 61.82, 0.0005, "A wall");
  ExpectAbout(a["on_demand_dollars"].get<double>(), 6924.2, 0.0005, "A dollars");
  ExpectAbout(a["budget_on_demand_flops"].get<double>(), 50000 / 3.5 * 140.4e12 * 3600, 1e-9,
              "A budget");
  const nlohmann::json b = Estimate(
      "--flops 1e21 --gpu a100-40gb --gpus 128 --mfu 0.35 --spot_price 1.10 "
      "--preemptions_per_day 2 --lost_per_preemption 1h --budget 50000");
  const double t0 = 1e21 / (312e12 * 0.35) / 3600 / 128;
  ExpectAbout(t0, 19.87, 0.001, "B wall without preemptions");
  ExpectAbout(b["wall_hours"].get<double>(), t0, 1e-9, "B wall");
  ExpectAbout(b["spot_wall_hours"].get<double>(), t0 / (1 - 2.0 / 24), 1e-9, "B spot wall");
  ExpectAbout(b["spot_preempted_dollars"].get<double>(), 3053, 0.001, "B dollars");
  ExpectAbout(b["expected_preemptions"].get<double>(), 2.0 / 24 * t0 / (1 - 2.0 / 24), 1e-9,
              "B preemptions");
  ExpectAbout(b["budget_spot_flops"].get<double>(),
              50000 / 1.1 * 312e12 * 0.35 * 3600 * (1 - 2.0 / 24), 1e-9, "B budget");
  // (b): B buys more than twice the compute.
  EXPECT_GT(b["budget_spot_flops"].get<double>(), 2 * a["budget_on_demand_flops"].get<double>());
}

// Exercise 35.22: a job of 24 hours on 8 A100s (192 A100-hours). (a) 16 A100s: 12 hours,
// the same $672; (b) 32 A10Gs for 48 hours: 1536 A10G-hours at $1.006, $1,545; (c) spot at
// $1.225 with a checkpoint every hour (2 minutes a save), 10 minutes to restart and 2
// preemptions a day: each loses 30 + 10 minutes; the run takes 24 x (1 + 2/60) / (1 - 2/24 x
// 2/3) = 26.26 h and costs 8 x 26.26 x $1.225 = $257; Young/Daly's interval is
// sqrt(2 x 2 min x 12 h) = sqrt(0.8) h = 53.7 min.
TEST(EstimateCostTest, Exercise35_22ScaleCheaperGpusOrSpot) {
  const nlohmann::json base = Estimate("--gpu_hours 192 --gpu a100 --gpus 8");
  EXPECT_NEAR(base["wall_hours"].get<double>(), 24, 1e-9);
  EXPECT_NEAR(base["on_demand_dollars"].get<double>(), 672, 1e-9);
  const nlohmann::json a = Estimate("--gpu_hours 192 --gpu a100 --gpus 16");
  EXPECT_NEAR(a["wall_hours"].get<double>(), 12, 1e-9);
  EXPECT_NEAR(a["on_demand_dollars"].get<double>(), 672, 1e-9);
  const nlohmann::json b = Estimate("--gpu_hours 1536 --gpu a10g --gpus 32");
  EXPECT_NEAR(b["wall_hours"].get<double>(), 48, 1e-9);
  EXPECT_NEAR(b["on_demand_dollars"].get<double>(), 1536 * 1.006, 1e-9);
  const nlohmann::json c = Estimate(
      "--gpu_hours 192 --gpu a100 --gpus 8 --preemptions_per_day 2 --checkpoint_interval 1h "
      "--checkpoint_save 2m --restart 10m");
  EXPECT_NEAR(c["lost_hours_per_preemption"].get<double>(), 0.5 + 10.0 / 60, 1e-12);
  const double wall = 24 * (1 + 2.0 / 60) / (1 - 2.0 / 24 * (0.5 + 10.0 / 60));
  ExpectAbout(wall, 26.26, 0.001, "by hand");
  EXPECT_NEAR(c["spot_wall_hours"].get<double>(), wall, 1e-9);
  EXPECT_NEAR(c["spot_preempted_dollars"].get<double>(), wall * 8 * 3.50 * 0.35, 1e-9);
  EXPECT_NEAR(c["young_daly_interval_hours"].get<double>() * 60, 53.67, 0.01);
  // Spot still costs as much as on demand only at many more preemptions: the break-even
  // rate λ* with 24.8 h of work: 1 - 24.8 x 0.35 / 24 = λ* x 2/3.
  EXPECT_NEAR(c["break_even_preemptions_per_day"].get<double>(),
              24 * (1 - 24 * (1 + 2.0 / 60) * 0.35 / 24) / (0.5 + 10.0 / 60), 1e-9);
}

// The MTBF is another way to give the rate; a rate whose lost work outgrows the progress
// never ends (null in JSON, "never" in the table).
TEST(EstimateCostTest, MtbfAndARunThatNeverEnds) {
  const nlohmann::json mtbf = Estimate(
      "--gpu_hours 100 --mtbf 6h --checkpoint_interval 2h --checkpoint_save 1m");
  EXPECT_NEAR(mtbf["preemptions_per_day"].get<double>(), 4, 1e-12);
  EXPECT_NEAR(mtbf["young_daly_interval_hours"].get<double>(), std::sqrt(2 * (1.0 / 60) * 6),
              1e-12);
  const nlohmann::json never =
      Estimate("--gpu_hours 100 --preemptions_per_day 48 --checkpoint_interval 2h");
  EXPECT_TRUE(never["spot_wall_hours"].is_null());
  const ParsedCommandLine parsed = ParseCommandLine(
      {"estimate", "cost", "--gpu_hours", "100", "--preemptions_per_day", "48",
       "--checkpoint_interval", "2h"});
  ASSERT_TRUE(parsed.line.has_value());
  absl::StatusOr<std::string> text = EstimateCostText(parsed.line->cost, OutputFormat::kTable);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("never ends"));
}

// A spec: its GPT's parameters, and steps x batch.global x context tokens (tiny_gpt: 2000
// steps of 32 sequences of 128 bytes).
TEST(EstimateCostTest, FromASpec) {
  const nlohmann::json doc = Estimate("--spec examples/tiny_gpt.yaml --gpu h100 --mfu 0.3");
  EXPECT_EQ(doc["tokens"].get<double>(), 2000.0 * 32 * 128);
  // 4 layers of width 128 over 256 bytes and 128 positions: per layer 2 LayerNorms
  // (2 x 256), attention 128x384+384 and 128x128+128, the MLP 128x512+512 and 512x128+128;
  // embeddings 256x128 + 128x128; the final LayerNorm 256; the head 128x256 (untied).
  const double per_layer = 2 * 256 + (128 * 384 + 384) + (128 * 128 + 128) + (128 * 512 + 512) +
                           (512 * 128 + 128);
  const double parameters = 4 * per_layer + 256 * 128 + 128 * 128 + 256 + 128 * 256;
  EXPECT_EQ(doc["parameters"].get<double>(), parameters);
  EXPECT_EQ(doc["flops"].get<double>(), 6 * parameters * 2000.0 * 32 * 128);
  // --set and --tokens override the spec's.
  const nlohmann::json shorter =
      Estimate("--spec examples/tiny_gpt.yaml --set steps=100 --tokens 1e9");
  EXPECT_EQ(shorter["tokens"].get<double>(), 1e9);
}

TEST(EstimateCostTest, BadFlagsNameTheFlag) {
  EXPECT_THAT(Error(""), HasSubstr("give the work"));
  EXPECT_THAT(Error("--params 7B"), HasSubstr("--tokens: required with --params"));
  EXPECT_THAT(Error("--params 7Q --tokens 1T"), HasSubstr("--params: \"7Q\" is not a count"));
  EXPECT_THAT(Error("--params 7B --tokens lots"), HasSubstr("--tokens: \"lots\""));
  EXPECT_THAT(Error("--flops 1e21 --gpu h900"), HasSubstr("--gpu: unknown GPU kind \"h900\""));
  EXPECT_THAT(Error("--flops 1e21 --gpu h900"), HasSubstr("a100, a100-40gb, h100, h200"));
  EXPECT_THAT(Error("--flops 1e21 --mfu 1.5"), HasSubstr("--mfu: must be in (0, 1]"));
  EXPECT_THAT(Error("--flops 1e21 --mfu 0"), HasSubstr("--mfu"));
  EXPECT_THAT(Error("--flops 1e21 --gpus 0"), HasSubstr("--gpus"));
  EXPECT_THAT(Error("--flops 1e21 --price -1"), HasSubstr("--price: must be >= 0"));
  EXPECT_THAT(Error("--flops 1e21 --spot_discount 1"), HasSubstr("--spot_discount"));
  EXPECT_THAT(Error("--flops 1e21 --spot_price 1 --spot_discount 0.5"),
              HasSubstr("--spot_price"));
  EXPECT_THAT(Error("--flops 1e21 --checkpoint_interval 60"),
              HasSubstr("--checkpoint_interval: \"60\" is not a positive duration (e.g. 90s"));
  EXPECT_THAT(Error("--flops 1e21 --checkpoint_interval 0s"),
              HasSubstr("--checkpoint_interval"));
  EXPECT_THAT(Error("--flops 1e21 --mtbf 12h --preemptions_per_day 2"), HasSubstr("--mtbf"));
  EXPECT_THAT(Error("--flops 1e21 --restart 10m"),
              HasSubstr("--restart: needs --checkpoint_interval"));
  EXPECT_THAT(Error("--flops 1e21 --checkpoint_interval 1h --restart 5m --lost_per_preemption 1h"),
              HasSubstr("--restart: --lost_per_preemption already counts"));
  EXPECT_THAT(Error("--flops 1e21 --params 7B"), HasSubstr("--flops"));
  EXPECT_THAT(Error("--params 7B --tokens 1T --spec x.yaml"), HasSubstr("--params"));
  EXPECT_THAT(Error("--spec /nonexistent.yaml"), HasSubstr("--spec /nonexistent.yaml: "));
  EXPECT_THAT(Error("--spec examples/fashion_mnist_mlp.yaml"),
              HasSubstr("--tokens: required: the spec"));
  EXPECT_THAT(Error("--flops 1e21 -o wide"), HasSubstr("-o"));
}

}  // namespace
}  // namespace ringmaster::cli
