// The trainer on token files (data.tokens): training windows from the train file, the
// validation file evaluated every data.eval_every_steps steps and at the end, its loss and
// perplexity in the result, the metrics and the progress line; the same figures at 1 and 2
// ranks; a token file the model's vocabulary cannot read is refused, naming the file.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "train/data/text_dataset.h"
#include "train/data/token_file.h"
#include "train/model_factory.h"
#include "train/result.pb.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using comm::testing::MultiProcOptions;
using comm::testing::RunRanks;
using data::WriteTokenFile;
using ::testing::HasSubstr;

std::string Tmp(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// Byte tokens with a 0 before each document (`ringctl data prepare --tokenizer bytes`).
std::vector<int32_t> Documents(const std::vector<std::string>& documents, int repeat) {
  std::vector<int32_t> out;
  for (int r = 0; r < repeat; ++r) {
    for (const std::string& d : documents) {
      out.push_back(0);
      for (char c : d) out.push_back(static_cast<uint8_t>(c));
    }
  }
  return out;
}

// Writes the train and validation files once; returns their paths.
std::pair<std::string, std::string> TokenFiles() {
  const std::string train = Tmp("lm_train.bin"), validation = Tmp("lm_val.bin");
  CHECK(WriteTokenFile(
            train,
            Documents({"the ring passes gradients around. ", "every rank holds the model. "}, 12))
            .ok());
  CHECK(WriteTokenFile(validation, Documents({"the ring holds gradients. "}, 6)).ok());
  return {train, validation};
}

constexpr char kSpec[] = R"(
name: tokens_test
seed: 11
steps: 12
model: {gpt: {layers: 2, heads: 2, width: 32, context: 16}}
optimizer: {adamw: {}, lr: 0.01}
schedule: {decay: constant}
batch: {global: 8}
diagnostics: {log_every: 100}
)";

struct LmRun {
  TrainResult result;                 // rank 0's
  std::vector<std::string> metrics;   // rank 0's metrics.jsonl lines
  std::vector<std::string> progress;  // rank 0's progress lines
  // The validation loss of rank 0's final parameters, evaluated here on the validation
  // samples at once (all of them, or data.eval_samples N: samples floor(i size / N)), not
  // through the trainer's evaluation batches and ranks.
  double independent_loss = -1;
};

LmRun Train(int world, const std::vector<std::string>& extra = {}) {
  // Named strings, not structured bindings: the lambdas below capture them (clang 14 cannot
  // capture a binding).
  const std::pair<std::string, std::string> files = TokenFiles();
  const std::string& train = files.first;
  const std::string& validation = files.second;
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  std::vector<std::string> overrides = {absl::StrCat("data.tokens.train=", train),
                                        absl::StrCat("data.tokens.validation=", validation),
                                        "data.eval_every_steps=4",
                                        absl::StrCat("metrics.jsonl=", dir, "/metrics.jsonl")};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  MultiProcOptions options;
  options.world_size = world;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, overrides));
    TrainerOptions o;
    RM_ASSIGN_OR_RETURN(o.config, config::TrainConfigFromSpec(spec));
    o.comm = &comm;
    o.local_ranks = comm.size();
    o.op_timeout = absl::Seconds(60);
    std::string progress;
    o.progress = [&](const std::string& line) { absl::StrAppend(&progress, line, "\n"); };
    absl::Status independent = absl::OkStatus();
    double independent_loss = -1;
    const TrainConfig& config = o.config;
    o.on_finish = [&](const state::TensorTable&, const state::FlatBuffer& params) {
      independent = [&]() -> absl::Status {
        RM_ASSIGN_OR_RETURN(auto data, data::LoadTokenDataset(validation, config.model.gpt.context,
                                                              config.model.gpt.vocab));
        RM_ASSIGN_OR_RETURN(auto model, CreateModel(config.model, data->info()));
        const int64_t size = data->size();
        const int64_t n = config.data.eval_samples > 0 ? config.data.eval_samples : size;
        std::vector<int64_t> all(n);
        for (int64_t i = 0; i < n; ++i) all[i] = i * size / n;
        Batch batch;
        RM_RETURN_IF_ERROR(data->Gather(all, &batch));
        RM_ASSIGN_OR_RETURN(StepStats s, model->Evaluate(batch, params, Precision::kFloat32));
        independent_loss = s.loss_sum / static_cast<double>(s.loss_terms);
        return absl::OkStatus();
      }();
    };
    RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
    RM_RETURN_IF_ERROR(independent);
    if (comm.rank() != 0) return absl::OkStatus();
    RM_RETURN_IF_ERROR(WriteFileAtomically(dir + "/result.json", TrainResultJson(result)));
    RM_RETURN_IF_ERROR(WriteFileAtomically(dir + "/progress.txt", progress));
    return WriteFileAtomically(dir + "/independent.txt", absl::StrCat(independent_loss));
  });
  LmRun run;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok())
        << "world " << world << " rank " << r << ": " << results[r].status;
  }
  if (auto json = ReadFile(dir + "/result.json"); json.ok()) {
    EXPECT_TRUE(FromJson(*json, &run.result, "result").ok()) << *json;
  }
  if (auto text = ReadFile(dir + "/metrics.jsonl"); text.ok()) {
    run.metrics = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  }
  if (auto text = ReadFile(dir + "/progress.txt"); text.ok()) {
    run.progress = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  }
  if (auto text = ReadFile(dir + "/independent.txt"); text.ok()) {
    EXPECT_TRUE(absl::SimpleAtod(*text, &run.independent_loss)) << *text;
  }
  return run;
}

// The metrics records with an evaluation, by step.
std::map<int, MetricsRecord> Evaluations(const LmRun& run) {
  std::map<int, MetricsRecord> out;
  for (const std::string& line : run.metrics) {
    MetricsRecord record;
    EXPECT_TRUE(FromJson(line, &record, "metrics").ok()) << line;
    if (record.has_test_perplexity()) out[record.step()] = record;
  }
  return out;
}

TEST(TrainerTokensTest, ValidationLossAndPerplexityEveryKStepsAndAtTheEnd) {
  const LmRun run = Train(1);
  ASSERT_TRUE(run.result.has_eval_loss());
  ASSERT_TRUE(run.result.has_eval_perplexity());
  EXPECT_EQ(run.result.eval_step(), 12);
  EXPECT_NEAR(run.result.eval_perplexity(), std::exp(run.result.eval_loss()),
              1e-9 * run.result.eval_perplexity());
  // The trainer's evaluation is of the final parameters on the whole validation file.
  EXPECT_NEAR(run.result.eval_loss(), run.independent_loss, 1e-5 * run.independent_loss);

  // Every 4 steps, and at the end of the first data epoch (47 samples: 6 steps of 8).
  const std::map<int, MetricsRecord> evaluations = Evaluations(run);
  std::vector<int> steps;
  for (const auto& [step, record] : evaluations) steps.push_back(step);
  EXPECT_THAT(steps, ::testing::ElementsAre(4, 6, 8, 12));
  for (const auto& [step, record] : evaluations) {
    EXPECT_NEAR(record.test_perplexity(), std::exp(record.test_loss()),
                1e-9 * record.test_perplexity())
        << step;
  }
  EXPECT_DOUBLE_EQ(evaluations.rbegin()->second.test_loss(), run.result.eval_loss());
  // It learns: the validation perplexity falls, and from the byte vocabulary's 256 at the start.
  EXPECT_LT(evaluations.rbegin()->second.test_perplexity(),
            evaluations.begin()->second.test_perplexity());
  EXPECT_LT(evaluations.begin()->second.test_perplexity(), 256);

  int lines = 0;
  for (const std::string& line : run.progress) {
    if (absl::StrContains(line, "val_perplexity")) {
      ++lines;
      EXPECT_THAT(line, HasSubstr("val_loss"));
    }
  }
  EXPECT_EQ(lines, 4);
  EXPECT_THAT(run.progress, ::testing::Contains(::testing::AllOf(
                                ::testing::StartsWith("evaluation: "), HasSubstr("lm_val.bin"),
                                HasSubstr("10 of its 10 samples every 4 steps"))));
}

TEST(TrainerTokensTest, SamePerplexityOnOneAndTwoRanks) {
  const LmRun one = Train(1);
  const LmRun two = Train(2);
  ASSERT_TRUE(one.result.has_eval_perplexity());
  ASSERT_TRUE(two.result.has_eval_perplexity());
  EXPECT_NEAR(two.result.eval_perplexity(), one.result.eval_perplexity(),
              1e-4 * one.result.eval_perplexity());
  EXPECT_NEAR(two.independent_loss, one.independent_loss, 1e-4 * one.independent_loss);
}

TEST(TrainerTokensTest, WithoutEvalEveryStepsTheEndIsEvaluatedOnce) {
  const LmRun run = Train(1, {"data.eval_every_steps=0", "data.eval_every_epoch=false"});
  ASSERT_TRUE(run.result.has_eval_perplexity());
  EXPECT_EQ(run.result.eval_step(), 12);
  EXPECT_TRUE(Evaluations(run).empty());
  EXPECT_NEAR(run.result.eval_loss(), run.independent_loss, 1e-5 * run.independent_loss);
}

TEST(TrainerTokensTest, AnEpochsEvaluationIsFollowedByOneOfTheFinalParameters) {
  // An evaluation at the end of the first epoch (step 6), then at the end the last step's
  // (9), which is no epoch's end.
  const LmRun run = Train(1, {"data.eval_every_steps=0", "steps=9"});
  std::vector<int> steps;
  for (const auto& [step, record] : Evaluations(run)) steps.push_back(step);
  EXPECT_THAT(steps, ::testing::ElementsAre(6));
  EXPECT_EQ(run.result.eval_step(), 9);
  EXPECT_NEAR(run.result.eval_loss(), run.independent_loss, 1e-5 * run.independent_loss);
}

TEST(TrainerTokensTest, EvalSamplesSpreadOverTheValidationFile) {
  // 6 of the 10 validation samples (0, 1, 3, 5, 6, 8), on 2 ranks.
  const LmRun some = Train(2, {"data.eval_samples=6"});
  const LmRun all = Train(2);
  ASSERT_TRUE(some.result.has_eval_loss());
  EXPECT_NEAR(some.result.eval_loss(), some.independent_loss, 1e-5 * some.independent_loss);
  EXPECT_NE(some.result.eval_loss(), all.result.eval_loss());
  EXPECT_NEAR(all.result.eval_loss(), all.independent_loss, 1e-5 * all.independent_loss);
}

// Fine-tuning from another job's checkpoint (init_from) evaluates the weights it starts from
// before its first step: the line gives the pre-trained job's final validation loss, on 2
// ranks under ZeRO-3 as on the 1 rank that trained it; a job without init_from says nothing.
TEST(TrainerTokensTest, TheWeightsOfInitFromAreEvaluatedAtStepZero) {
  const std::string root = comm::testing::FreshStoreDir() + "-pretrained";
  const LmRun pre = Train(1, {"checkpoint.dir=" + root, "checkpoint.every_steps=12"});
  ASSERT_GT(pre.result.eval_loss(), 0);
  const std::string want = absl::StrCat("validation at step 0 (the weights of init_from): loss ",
                                        absl::SixDigits(pre.result.eval_loss()), " perplexity ",
                                        absl::SixDigits(pre.result.eval_perplexity()));
  auto said = [](const LmRun& run, const std::string& line) {
    return std::count(run.progress.begin(), run.progress.end(), line);
  };
  EXPECT_EQ(said(pre, want), 0);
  const LmRun tuned = Train(2, {"init_from=" + root + "/tokens_test", "name=tuned",
                                "parallelism.zero_stage=3", "steps=4"});
  EXPECT_EQ(said(tuned, want), 1) << absl::StrJoin(tuned.progress, "\n");
  EXPECT_EQ(tuned.result.eval_step(), 4);  // the evaluations after it as before
}

TEST(TrainerTokensTest, VocabularyTheModelCannotReadNamesTheFile) {
  const std::string path = Tmp("wide_ids.bin");
  std::vector<int32_t> ids(100, 7);
  ids[57] = 300;
  ASSERT_TRUE(WriteTokenFile(path, ids).ok());
  auto spec = spec::LoadJobSpecText(kSpec, {absl::StrCat("data.tokens.train=", path)});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto config = config::TrainConfigFromSpec(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  auto data = LoadJobData(*config);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(path));
  EXPECT_THAT(data.status().message(), HasSubstr("token 300 at position 57"));
  EXPECT_THAT(data.status().message(), HasSubstr("vocabulary of 256"));

  // A GPT-2-sized vocabulary reads it.
  config->model.gpt.vocab = 50257;
  auto wide = LoadJobData(*config);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->train->info().vocab_size, 50257);
  EXPECT_EQ(wide->test, nullptr) << "no validation file, no evaluation";
}

}  // namespace
}  // namespace ringmaster::train
