#include "cli/local.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster::cli {
namespace {

using ::testing::UnorderedElementsAre;

std::vector<std::string> Keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.push_back(key);
  return keys;
}

LocalOutcome Outcome(const std::string& status) {
  LocalOutcome o;
  o.status = status;
  o.workers = 2;
  o.run_dir = "/tmp/ringctl-local-abc";
  o.run_dir_kept = false;
  o.job.set_epoch(2);
  o.job.set_restarts(1);
  o.job.set_reason("rank 0 \"quoted\"\n second line");
  Recovery* r = o.job.add_recoveries();
  r->set_epoch(2);
  r->set_cause("failure");
  r->set_reason("trainer on slot 1 killed by signal 9");
  r->set_old_world(2);
  r->set_new_world(1);
  r->set_rendezvous_s(0.25);
  r->set_lost_steps(-1);
  return o;
}

// The summary as a script reads it: the JSON line ringctl local writes.
nlohmann::ordered_json Written(const LocalSummary& summary) {
  return nlohmann::ordered_json::parse(ToJsonLine(summary));
}

TEST(LocalSummaryTest, ALanguageModelsValidationLossAndPerplexity) {
  train::TrainResult trainer;
  trainer.set_eval_loss(2.5);
  trainer.set_eval_perplexity(12.182493960703473);
  trainer.set_eval_accuracy(0.4);
  const nlohmann::ordered_json s = Written(MakeLocalSummary(Outcome("succeeded"), &trainer));
  EXPECT_DOUBLE_EQ(s["eval_loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(s["eval_perplexity"].get<double>(), 12.182493960703473);
  const nlohmann::ordered_json none =
      Written(MakeLocalSummary(Outcome("succeeded"), &train::TrainResult::default_instance()));
  EXPECT_EQ(none.count("eval_perplexity"), 0u) << "absent when not evaluated";
  EXPECT_EQ(none.count("eval_loss"), 0u);
}

TEST(LocalSummaryTest, TheKeysToolsAndBenchmarksRead) {
  train::TrainResult trainer;
  trainer.set_world_size(2);
  trainer.set_steps(120);
  trainer.set_final_loss(0.31);
  trainer.set_eval_accuracy(0.81);
  trainer.set_samples_per_second(5000.5);
  trainer.set_gradient_backend("tcp");  // not a summary field
  const nlohmann::ordered_json s = Written(MakeLocalSummary(Outcome("succeeded"), &trainer));
  // Every key (a JSON object's keys have no order).
  EXPECT_THAT(Keys(s),
              UnorderedElementsAre("status", "world_size", "workers", "steps", "final_loss",
                          "eval_accuracy", "samples_per_second", "tokens_per_second",
                          "skipped_steps", "parameters", "comm_seconds", "exposed_comm_seconds",
                          "elapsed_seconds", "drained", "resumed_from_step", "checkpoints_saved",
                          "checkpoint_failures", "rendezvous_count", "restarts", "recoveries",
                          "run_dir", "run_dir_kept", "parameter_bytes", "gradient_bytes",
                          "optimizer_state_bytes", "unit_buffer_bytes", "activation_bytes_peak",
                          "peak_rss_bytes", "comm_bytes_per_step", "training_seconds",
                          "evaluations", "eval_seconds", "final_eval_seconds", "eval_step"));
  EXPECT_EQ(s["status"], "succeeded");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["workers"], 2);
  EXPECT_EQ(s["steps"], 120);
  EXPECT_DOUBLE_EQ(s["final_loss"].get<double>(), 0.31);
  EXPECT_EQ(s["tokens_per_second"], 0);  // told as 0 by the trainer
  EXPECT_EQ(s["rendezvous_count"], 2);
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["recoveries"][0]["cause"], "failure");
  EXPECT_EQ(s["recoveries"][0]["old_world"], 2);
  EXPECT_DOUBLE_EQ(s["recoveries"][0]["rendezvous_seconds"].get<double>(), 0.25);
  EXPECT_EQ(s["recoveries"][0]["lost_steps"], -1);
  EXPECT_EQ(s["run_dir_kept"], false);
  EXPECT_EQ(s.count("gradient_backend"), 0u);
  EXPECT_EQ(s.count("error"), 0u) << "only when it did not succeed";
}

// The figures the README promises in the summary file: rank 0's memory and traffic, and
// the training time apart from the evaluations', as the trainer told them.
TEST(LocalSummaryTest, RankZerosMemoryTrafficAndTimesAsTheTrainerToldThem) {
  train::TrainResult trainer;
  trainer.set_parameter_bytes(2678824);
  trainer.set_gradient_bytes(2678824);
  trainer.set_optimizer_state_bytes(2678824);
  trainer.set_unit_buffer_bytes(0);
  trainer.set_activation_bytes_peak(1 << 20);
  trainer.set_peak_rss_bytes(150e6);
  trainer.set_comm_bytes_per_step(2678900);
  trainer.set_training_seconds(4.5);
  trainer.set_evaluations(2);
  trainer.set_eval_seconds(1.25);
  trainer.set_final_eval_seconds(0.75);
  trainer.set_eval_step(120);
  const nlohmann::ordered_json s = Written(MakeLocalSummary(Outcome("succeeded"), &trainer));
  EXPECT_EQ(s["parameter_bytes"], 2678824);
  EXPECT_EQ(s["gradient_bytes"], 2678824);
  EXPECT_EQ(s["optimizer_state_bytes"], 2678824);
  EXPECT_EQ(s["unit_buffer_bytes"], 0) << "told, if 0";
  EXPECT_EQ(s["activation_bytes_peak"], 1 << 20);
  EXPECT_EQ(s["peak_rss_bytes"], 150e6);
  EXPECT_EQ(s["comm_bytes_per_step"], 2678900);
  EXPECT_EQ(s["training_seconds"], 4.5);
  EXPECT_EQ(s["evaluations"], 2);
  EXPECT_EQ(s["eval_seconds"], 1.25);
  EXPECT_EQ(s["final_eval_seconds"], 0.75);
  EXPECT_EQ(s["eval_step"], 120);
  const nlohmann::ordered_json failed = Written(MakeLocalSummary(Outcome("failed"), nullptr));
  EXPECT_EQ(failed.count("parameter_bytes"), 0u) << "nothing the trainer did not tell";
}

TEST(RanksTableTest, OneLineARankWithItsCoordinatesAndTraffic) {
  train::TrainResult result;
  EXPECT_EQ(RanksTable(result), "");
  for (int r = 0; r < 2; ++r) {
    train::RankResult* rr = result.add_ranks();
    rr->set_rank(r);
    rr->set_pp_rank(r);
    rr->set_tp_rank(1 - r);
    rr->set_parameter_bytes(2 << 20);
    rr->set_comm_bytes_per_step(3 << 20);
    rr->set_pipeline_bytes_per_step(1 << 20);
    rr->set_tensor_parallel_bytes_per_step(r << 19);
    rr->set_pipeline_bubble(0.25);
  }
  const std::string table = RanksTable(result);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << table;
  EXPECT_NE(lines[0].find("rank"), std::string::npos) << table;
  // Rank 1: pp 1, dp 0, tp 0; 2 MiB of parameters; 1 MiB through pp, 0.5 through tp, 1.5 else.
  EXPECT_NE(lines[2].find("   1   1   0   0 |       2.00"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("1.000     0.500     1.500 |   25.0%"), std::string::npos) << table;
}

TEST(LocalSummaryTest, FailedWithoutTrainerSummaryIsValidJsonWithTheError) {
  const LocalSummary summary = MakeLocalSummary(Outcome("failed"), nullptr);
  const nlohmann::ordered_json s = Written(summary);
  EXPECT_EQ(s.count("steps"), 0u) << "nothing the trainer did not tell";
  EXPECT_EQ(s.count("world_size"), 0u);
  EXPECT_EQ(s["error"], "rank 0 \"quoted\"\n second line");
  // What is written reads back the same (quotes and newlines escaped).
  LocalSummary back;
  ASSERT_TRUE(FromJson(ToJsonLine(summary), &back, "summary").ok());
  EXPECT_EQ(back.SerializeAsString(), summary.SerializeAsString());
}

TEST(EvaluationTextTest, NoTestAccuracyForALanguageModel) {
  JobSpec gpt;
  gpt.mutable_model()->mutable_gpt();
  gpt.mutable_data()->mutable_text()->set_path("/usr/share/common-licenses/GPL-3");
  LocalSummary summary;
  // A byte-text GPT has no validation set: said so, with the field that gives one.
  EXPECT_EQ(EvaluationText(summary, gpt),
            "no validation (a language model is validated on data.tokens.validation)");
  summary.set_eval_perplexity(26.447);
  summary.set_eval_loss(3.2752);
  EXPECT_EQ(EvaluationText(summary, gpt), "validation perplexity 26.45 (loss 3.2752)");

  JobSpec mlp;
  mlp.mutable_model()->mutable_mlp();
  LocalSummary classified;
  classified.set_eval_accuracy(0.8912);
  EXPECT_EQ(EvaluationText(classified, mlp), "test accuracy 0.8912");
  EXPECT_EQ(EvaluationText(LocalSummary(), mlp), "no test accuracy (not evaluated)");
}

TEST(CommandJobNameTest, TheScriptsStem) {
  EXPECT_EQ(CommandJobName({"/usr/bin/python3", "-u", "examples/torch_ddp/train.py", "--x"}),
            "train");
  EXPECT_EQ(CommandJobName({"python3", "-m", "pkg.train", "--steps", "3"}), "pkg.train");
  EXPECT_EQ(CommandJobName({"./run me.sh"}), "run_me");
  EXPECT_EQ(CommandJobName({"/bin/sh", "-c", "echo $RANK"}), "sh");
  EXPECT_EQ(CommandJobName({"/"}), "command");
}

}  // namespace
}  // namespace ringmaster::cli
