#include "train/step_reporter.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/tensorboard_test_reader.h"

namespace ringmaster::train {
namespace {

std::string TempDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// The event files of `dir`, sorted by name.
std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (absl::StrContains(entry.path().filename().string(), "tfevents")) {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Three logged steps: plain, fp16 with an evaluation, a language model's (tokens/s).
void LogSteps(StepReporter& reporter) {
  GradientSyncStats stats;
  stats.comm_time = absl::Milliseconds(3);
  reporter.StartAt(0);
  reporter.Count(64, stats);
  StepLine a;
  a.step = 1;
  a.loss = 2.5;
  a.lr = 0.01;
  a.grad_norm = 1.25;
  reporter.Log(a, stats);
  reporter.Count(64, stats);
  StepLine b = a;
  b.step = 2;
  b.loss = 2.0;
  b.loss_scale = 32768;
  b.test_loss = 1.75;
  b.test_accuracy = 0.5;
  reporter.Log(b, stats);
}

TEST(StepReporter, TensorBoardEventsCarryTheJsonRecordsScalars) {
  TrainConfig config;
  config.log_every = 1;
  config.metrics_jsonl = TempDir("same/metrics.jsonl");
  config.metrics_tensorboard = TempDir("same/tb");
  config.name = "gpt";
  config.metrics_run = "gpt-20261202-024500";
  config.config_fingerprint = "00112233aabbccdd";
  StepReporterOptions options;
  options.config = &config;
  options.total_steps = 2;
  options.context = 16;  // a language model: tokens_per_second too
  {
    absl::StatusOr<std::unique_ptr<StepReporter>> reporter = StepReporter::Create(options);
    ASSERT_TRUE(reporter.ok()) << reporter.status();
    LogSteps(**reporter);
  }
  absl::StatusOr<std::string> jsonl = ReadFile(config.metrics_jsonl);
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  std::vector<std::string> lines = absl::StrSplit(*jsonl, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<std::string> files = EventFiles(config.metrics_tensorboard);
  ASSERT_EQ(files.size(), 1u);
  const std::vector<tensorboard::Event> events = ReadEvents(files[0]);
  ASSERT_EQ(events.size(), 3u);  // the version record, then one per logged step
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json record = nlohmann::json::parse(lines[i]);
    const tensorboard::Event& event = events[i + 1];
    EXPECT_EQ(event.step(), record["step"].get<int64_t>());
    std::map<std::string, float> scalars;
    for (const auto& v : event.summary().value()) scalars[v.tag()] = v.simple_value();
    // Every record names its run (strings, not scalars).
    EXPECT_EQ(record["job"], "gpt");
    EXPECT_EQ(record["run"], "gpt-20261202-024500");
    EXPECT_EQ(record["config"], "00112233aabbccdd");
    // Every number of the JSON record but its step, as a float; nothing else.
    std::map<std::string, float> expected;
    for (const auto& [key, value] : record.items()) {
      if (key != "step" && value.is_number()) expected[key] = static_cast<float>(value.get<double>());
    }
    EXPECT_EQ(scalars, expected) << lines[i];
  }
  // MetricsRecord's 16 numbers but step, and but test_perplexity (not evaluated here).
  EXPECT_EQ(events[2].summary().value_size(), 14);
  std::map<std::string, float> second;
  for (const auto& v : events[2].summary().value()) second[v.tag()] = v.simple_value();
  EXPECT_EQ(second["loss"], 2.0f);
  EXPECT_EQ(second["loss_scale"], 32768.0f);
  EXPECT_EQ(second["test_loss"], 1.75f);
  EXPECT_EQ(second["test_accuracy"], 0.5f);
  EXPECT_FLOAT_EQ(second["tokens_per_second"], 16 * second["samples_per_second"]);
  EXPECT_EQ(second.count("test_perplexity"), 0u);
}

TEST(StepReporter, EveryRunStartsAFileAndOnlyRankZeroWrites) {
  TrainConfig config;
  config.log_every = 1;
  config.metrics_tensorboard = TempDir("runs/tb");
  StepReporterOptions options;
  options.config = &config;
  options.total_steps = 2;
  for (int run = 0; run < 2; ++run) {  // a run and its resumption
    auto reporter = StepReporter::Create(options);
    ASSERT_TRUE(reporter.ok()) << reporter.status();
    LogSteps(**reporter);
  }
  options.rank = 1;
  auto other = StepReporter::Create(options);
  ASSERT_TRUE(other.ok()) << other.status();
  LogSteps(**other);
  const std::vector<std::string> files = EventFiles(config.metrics_tensorboard);
  ASSERT_EQ(files.size(), 2u);
  for (const std::string& f : files) EXPECT_EQ(ReadEvents(f).size(), 3u) << f;
}

TEST(StepReporter, AnUnwritableTensorBoardDirectoryIsNamed) {
  const std::string file = TempDir("not_a_dir");
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  TrainConfig config;
  config.metrics_tensorboard = file + "/tb";
  StepReporterOptions options;
  options.config = &config;
  auto reporter = StepReporter::Create(options);
  EXPECT_EQ(reporter.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(reporter.status().message(), config.metrics_tensorboard))
      << reporter.status();
}

// The progress line's throughput and ETA are the job's one rate (common/progress_rate.h, over
// the last 30 s of steps), the figures the trainer reports to the coordinator (rates()):
// samples/s = steps/s x the global batch, tokens/s that times the context. The first line
// says the window, and that data_epoch is a pass over the data.
TEST(StepReporter, TheLineSaysTheOneRateAndItsEta) {
  TrainConfig config;
  config.log_every = 1;
  std::vector<std::string> lines;
  StepReporterOptions options;
  options.config = &config;
  options.total_steps = 10;
  options.context = 16;
  options.progress = [&lines](const std::string& line) { lines.push_back(line); };
  auto reporter = StepReporter::Create(options);
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  StepReporter& r = **reporter;
  EXPECT_EQ(r.rates().steps_per_s, 0);
  r.StartAt(4);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "progress lines: samples/s (or tokens/s) and eta over the last 30 s of steps; "
            "data_epoch counts passes over the training data (not the job's membership "
            "epoch)");
  GradientSyncStats stats;
  for (int i = 0; i < 2; ++i) r.Count(64, stats);
  const StepReporter::Rates rates = r.rates();
  ASSERT_GT(rates.steps_per_s, 0);
  EXPECT_DOUBLE_EQ(rates.samples_per_s, 64 * rates.steps_per_s);
  EXPECT_DOUBLE_EQ(rates.tokens_per_s, 16 * rates.samples_per_s);
  StepLine line;
  line.step = 6;
  line.epoch = 1;
  r.Log(line, stats);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(lines[1], "step 6/10 data_epoch 1 loss")) << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[1], absl::StrFormat(" %.0f tokens/s ", rates.tokens_per_s)))
      << lines[1];
  EXPECT_TRUE(absl::StrContains(
      lines[1],
      absl::StrCat(" eta ", EtaText(*EtaSeconds(6, 10, rates.steps_per_s)))))
      << lines[1];
}

// The training time is the steps': it stops at the last step counted (what follows, a
// checkpoint or the final evaluation, is in no rate), and an evaluation between steps
// (ExcludeFromRates) is not in it. The bounds hold whatever the pauses measure.
TEST(StepReporter, TrainingTimeIsTheStepsLessEvaluations) {
  TrainConfig config;
  StepReporterOptions options;
  options.config = &config;
  options.total_steps = 10;
  auto reporter = StepReporter::Create(options);
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  StepReporter& r = **reporter;
  GradientSyncStats stats;
  const absl::Time before_start = absl::Now();
  r.StartAt(0);
  const absl::Time after_start = absl::Now();
  EXPECT_EQ(r.training_time(), absl::ZeroDuration());
  r.Count(64, stats);
  const absl::Duration one_step = r.training_time();
  EXPECT_GT(one_step, absl::ZeroDuration());
  absl::SleepFor(absl::Milliseconds(20));  // after the step: not training
  EXPECT_EQ(r.training_time(), one_step);
  const absl::Time evaluation_start = absl::Now();
  absl::SleepFor(absl::Milliseconds(20));  // an evaluation
  const absl::Duration evaluation = absl::Now() - evaluation_start;
  r.ExcludeFromRates(evaluation);
  const absl::Time before_count = absl::Now();
  r.Count(64, stats);
  const absl::Time after_count = absl::Now();
  EXPECT_GE(r.training_time(), before_count - after_start - evaluation);
  EXPECT_LE(r.training_time(), after_count - before_start - evaluation);
  EXPECT_EQ(r.total_samples(), 128);
}

// A data epoch's last step may take a smaller batch: samples per second count the samples the
// window's steps took (the summary's figure), not the steps' rate times the last batch (a
// 96-sample last step of 512-sample ones printed a fifth of the true figure).
TEST(StepReporter, SamplesPerSecondCountTheSamplesNotTheLastBatch) {
  TrainConfig config;
  StepReporterOptions options;
  options.config = &config;
  options.total_steps = 10;
  auto reporter = StepReporter::Create(options);
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  StepReporter& r = **reporter;
  GradientSyncStats stats;
  r.StartAt(0);
  r.Count(64, stats);
  r.Count(64, stats);
  absl::SleepFor(absl::Milliseconds(1));  // a positive span whatever the clock's grain
  r.Count(16, stats);
  const StepReporter::Rates rates = r.rates();
  ASSERT_GT(rates.steps_per_s, 0);
  // Both rates span the same points: their ratio is the samples per step, 144 / 3.
  EXPECT_NEAR(rates.samples_per_s / rates.steps_per_s, 48, 1e-9 * 48);
}

}  // namespace
}  // namespace ringmaster::train
