#include "cli/local.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::ElementsAre;

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

TEST(LocalSummaryTest, TheKeysToolsAndBenchmarksRead) {
  const nlohmann::json trainer = nlohmann::json::parse(
      R"({"world_size": 2, "steps": 120, "final_loss": 0.31, "eval_accuracy": 0.81,
          "samples_per_second": 5000.5, "drained": false, "unknown_key": 1})");
  const nlohmann::ordered_json s = LocalSummary(Outcome("succeeded"), trainer);
  EXPECT_THAT(Keys(s),
              ElementsAre("status", "world_size", "workers", "steps", "final_loss",
                          "eval_accuracy", "samples_per_second", "tokens_per_second",
                          "skipped_steps", "parameters", "comm_seconds", "exposed_comm_seconds",
                          "elapsed_seconds", "drained", "resumed_from_step", "checkpoints_saved",
                          "checkpoint_failures", "epochs", "restarts", "recoveries", "run_dir",
                          "run_dir_kept"));
  EXPECT_EQ(s["status"], "succeeded");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["workers"], 2);
  EXPECT_EQ(s["steps"], 120);
  EXPECT_DOUBLE_EQ(s["final_loss"].get<double>(), 0.31);
  EXPECT_TRUE(s["tokens_per_second"].is_null());  // not in the trainer's summary
  EXPECT_EQ(s["epochs"], 2);
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["recoveries"][0]["cause"], "failure");
  EXPECT_EQ(s["recoveries"][0]["old_world"], 2);
  EXPECT_DOUBLE_EQ(s["recoveries"][0]["rendezvous_seconds"].get<double>(), 0.25);
  EXPECT_EQ(s["recoveries"][0]["lost_steps"], -1);
  EXPECT_EQ(s["run_dir_kept"], false);
  EXPECT_EQ(s.count("unknown_key"), 0u);
}

TEST(LocalSummaryTest, FailedWithoutTrainerSummaryIsValidJsonWithTheError) {
  const nlohmann::ordered_json s = LocalSummary(Outcome("failed"), nullptr);
  EXPECT_TRUE(s["steps"].is_null());
  EXPECT_TRUE(s["world_size"].is_null());
  EXPECT_EQ(s["error"], "rank 0 \"quoted\"\n second line");
  // What is written parses back the same (quotes and newlines escaped).
  EXPECT_EQ(nlohmann::ordered_json::parse(s.dump()), s);
}

}  // namespace
}  // namespace ringmaster::cli
