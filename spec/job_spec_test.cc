#include "spec/job_spec.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "spec/defaults.h"
#include "spec/yaml_proto.h"
#include "xxhash.h"

namespace ringmaster::spec {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kMinimal[] = R"(steps: 100
model: {mlp: {hidden: [8]}}
data: {fashion_mnist: {}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.1}
batch: {global: 64}
)";

const char* const kExamples[] = {
    "examples/fashion_mnist_mlp.yaml",
    "examples/fashion_mnist_cnn.yaml",
    "examples/tiny_gpt.yaml",
    "examples/sotu_bytes_gpt.yaml",
    "examples/gpt2_sotu_pretrain.yaml",
    "examples/gpt2_sotu_finetune.yaml",
    "examples/fashion_mnist_resnet18.yaml",
};

// Writes `contents` to a fresh file under the test's temporary directory.
std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << contents;
  return path;
}

std::string ErrorOf(const absl::StatusOr<JobSpec>& spec) {
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(LoadJobSpecTest, TheTokenFilesExample) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile("examples/sotu_bytes_gpt.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().tokens().train(), "out/data/sotu_bytes_train.bin");
  EXPECT_EQ(spec->data().tokens().validation(), "out/data/sotu_bytes_val.bin");
  EXPECT_EQ(spec->data().eval_every_steps(), 100);
  EXPECT_EQ(spec->data().eval_samples(), 1024);
  EXPECT_EQ(spec->model().gpt().vocab(), 256);
}

TEST(LoadJobSpecTest, TheFashionMnistMlpExample) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(kExamples[0]);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion_mnist_mlp");
  EXPECT_THAT(spec->model().mlp().hidden(), ElementsAre(512, 512));
  EXPECT_EQ(spec->optimizer().sgd().momentum(), 0.9);
  EXPECT_EQ(spec->optimizer().lr(), 0.05);
  EXPECT_EQ(spec->batch().global(), 512);
  EXPECT_EQ(spec->schedule().decay(), ScheduleSpec::DECAY_COSINE);
  EXPECT_GT(spec->schedule().warmup_steps(), 0);
  EXPECT_EQ(spec->data().fashion_mnist().dir(), kDefaultFashionMnistDir);
}

TEST(LoadJobSpecTest, TheGptExamplesCommentedZeroStage3IsItsDefaults) {
  std::string yaml;
  {
    std::ifstream in(kExamples[2]);
    ASSERT_TRUE(in) << kExamples[2];
    yaml.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Uncomment the example's ZeRO-3 lines.
  for (const char* key : {"zero_stage: 3", "fsdp: {"}) {
    const size_t at = yaml.find(absl::StrCat("  # ", key));
    ASSERT_NE(at, std::string::npos) << key;
    yaml.erase(at + 2, 2);
  }
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << yaml;
  EXPECT_EQ(spec->parallelism().zero_stage(), 3);
  JobSpec defaulted = *spec;
  defaulted.mutable_parallelism()->clear_fsdp();
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_TRUE(MessageDifferencer::Equals(defaulted, *spec));
}

TEST(LoadJobSpecTest, TheCnnAndGptExamples) {
  const absl::StatusOr<JobSpec> cnn = LoadJobSpecFile(kExamples[1]);
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_THAT(cnn->model().cnn().channels(), ElementsAre(16, 32));
  EXPECT_EQ(cnn->optimizer().adamw().eps(), 1e-8);

  const absl::StatusOr<JobSpec> gpt = LoadJobSpecFile(kExamples[2]);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(gpt->model().gpt().vocab(), 256);
  EXPECT_EQ(gpt->data().text().path(), "/usr/share/common-licenses/GPL-3");
  EXPECT_EQ(gpt->precision().compute(), PrecisionSpec::DTYPE_BF16);
  EXPECT_EQ(gpt->parallelism().activation_checkpointing_every(), 2);
}

TEST(LoadJobSpecTest, NameDefaultsToTheFileName) {
  const std::string path = WriteTemp("my job.v2.yaml", kMinimal);
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "my_job.v2");
  EXPECT_EQ(LoadJobSpecText(kMinimal)->name(), "job");
  EXPECT_EQ(LoadJobSpecText(kMinimal, {"name=x"})->name(), "x");
}

TEST(LoadJobSpecTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadJobSpecFile("/nonexistent/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadJobSpecTest, ParseErrorsNameFileLineColumnAndPath) {
  const std::string path = WriteTemp("bad.yaml", R"(steps: 100
model:
  mlp: {hidden: [512, abc]}
optimizer:
  adamw:
    bta1: 0.9
  lr: fast
schedule:
  decay: cosin
batch: {global: [64]}
)");
  EXPECT_THAT(
      absl::StrSplit(ErrorOf(LoadJobSpecFile(path)), '\n'),
      ElementsAre(
          absl::StrCat(path, ":3:23: model.mlp.hidden[1]: expected an integer, got \"abc\""),
          absl::StrCat(path, ":6:5: optimizer.adamw.bta1: unknown key \"bta1\"; did you mean ",
                       "\"beta1\"?"),
          absl::StrCat(path, ":7:7: optimizer.lr: expected a number, got \"fast\""),
          absl::StrCat(path, ":9:10: schedule.decay: expected one of constant, cosine, linear, ",
                       "got \"cosin\"; did you mean \"cosine\"?"),
          absl::StrCat(path, ":10:17: batch.global: expected an integer, got a list")));
}

TEST(LoadJobSpecTest, OneofConflictAndOutOfRange) {
  EXPECT_EQ(ErrorOf(LoadJobSpecText("steps: 1\nepochs: 2\n")),
            "2:1: epochs: conflicts with steps (at 1:1): only one of steps, epochs may be set");
  EXPECT_EQ(ErrorOf(LoadJobSpecText("optimizer:\n  sgd: {}\n  lamb: {}\n")),
            "3:3: optimizer.lamb: conflicts with optimizer.sgd (at 2:3): only one of sgd, "
            "adamw, lamb may be set");
  EXPECT_EQ(ErrorOf(LoadJobSpecText("parallelism: {zero_stage: 99999999999}")),
            "1:27: parallelism.zero_stage: out of range: 99999999999 is not in [-2147483648, "
            "2147483647]");
  EXPECT_EQ(ErrorOf(LoadJobSpecText("seed: -1")),
            "1:7: seed: expected a non-negative integer, got \"-1\"");
}

TEST(LoadJobSpecTest, SyntaxErrorsHaveLineAndColumn) {
  const std::string path = WriteTemp("syntax.yaml", "steps: 100\nmodel:\n  mlp: {hidden: [1, 2}\n");
  EXPECT_THAT(ErrorOf(LoadJobSpecFile(path)), HasSubstr(absl::StrCat(path, ":3:")));
  EXPECT_THAT(ErrorOf(LoadJobSpecFile(path)), HasSubstr("YAML syntax error"));
}

TEST(LoadJobSpecTest, ValidationErrorsPointAtWhereTheFieldWasWritten) {
  const std::string yaml = R"(steps: 10
model:
  gpt: {heads: 3}
data:
  fashion_mnist: {}
optimizer:
  adamw: {beta1: 1.5}
  lr: 0.001
batch:
  micro_max: 8
schedule: {warmup_steps: -20}
)";
  EXPECT_THAT(
      absl::StrSplit(ErrorOf(LoadJobSpecText(yaml)), '\n'),
      ElementsAre("3:3: model.gpt.width: must be divisible by model.gpt.heads (3), got 128",
                  "4:1: data: model.gpt needs data.text or data.tokens, got data.fashion_mnist",
                  "7:18: optimizer.adamw.beta1: must be in [0, 1), got 1.5",
                  "11:26: schedule.warmup_steps: must be >= 0, got -20",
                  "9:1: batch.global: required: samples per step over all ranks, > 0"));
}

TEST(ApplyOverrideTest, ScalarListAndElement) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(
      kMinimal, {"optimizer.lr=0.01", "model.mlp.hidden=[256, 256]", "model.mlp.hidden[1]=128",
                 "resume=1200", "checkpoint.dir=/tmp/ckpt", "precision.compute=fp16"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().lr(), 0.01);
  EXPECT_THAT(spec->model().mlp().hidden(), ElementsAre(256, 128));
  EXPECT_EQ(spec->resume(), "1200");
  EXPECT_EQ(spec->checkpoint().keep_last(), kDefaultKeepLast);
  EXPECT_EQ(spec->precision().loss_scale().initial(), kDefaultLossScaleInitial);
}

TEST(ApplyOverrideTest, AFieldInsideAOneofMemberSwitchesToIt) {
  const absl::StatusOr<JobSpec> spec =
      LoadJobSpecText(kMinimal, {"optimizer.adamw.beta2=0.95", "epochs=3"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->optimizer().has_adamw());
  EXPECT_FALSE(spec->optimizer().has_sgd());
  EXPECT_EQ(spec->optimizer().adamw().beta2(), 0.95);
  EXPECT_EQ(spec->optimizer().adamw().beta1(), kDefaultAdamBeta1);
  EXPECT_EQ(spec->optimizer().lr(), 0.1);
  EXPECT_EQ(spec->length_case(), JobSpec::kEpochs);

  JobSpec direct;
  direct.mutable_optimizer()->mutable_adamw();
  ASSERT_TRUE(ApplyOverride(&direct, "optimizer.sgd.momentum=0.8").ok());
  EXPECT_EQ(direct.optimizer().kind_case(), OptimizerSpec::kSgd);
  EXPECT_EQ(direct.optimizer().sgd().momentum(), 0.8);
}

TEST(ApplyOverrideTest, BadOverridesSayWhichAndWhy) {
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"optimizer.lrr=0.1"})),
            "--set optimizer.lrr=0.1: optimizer.lrr: unknown field \"lrr\"; did you mean \"lr\"?");
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"optimizer.lr=abc"})),
            "--set optimizer.lr=abc: optimizer.lr: expected a number, got \"abc\"");
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"schedule.decay=step"})),
            "--set schedule.decay=step: schedule.decay: expected one of constant, cosine, "
            "linear, got \"step\"");
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"optimizer.lr"})),
            "--set optimizer.lr: expected path=value");
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"model.mlp.hidden=512"})),
            "--set model.mlp.hidden=512: model.mlp.hidden: expected a list, got \"512\"");
}

TEST(ApplyOverrideTest, ValidationBlamesTheOverride) {
  EXPECT_EQ(ErrorOf(LoadJobSpecText(kMinimal, {"optimizer.lr=-1"})),
            "--set optimizer.lr=-1: optimizer.lr: must be > 0, got -1");
}

TEST(ApplyOverrideTest, LeavesTheSpecUnchangedOnError) {
  JobSpec spec;
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.5);
  const JobSpec before = spec;
  EXPECT_FALSE(ApplyOverride(&spec, "optimizer.adamw.beta1=x").ok());
  EXPECT_TRUE(MessageDifferencer::Equals(spec, before));
}

TEST(JobSpecToYamlTest, EffectiveSpecsRoundTrip) {
  for (const char* path : kExamples) {
    const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const std::string yaml = JobSpecToYaml(*spec);
    const absl::StatusOr<JobSpec> back = LoadJobSpecText(yaml);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    EXPECT_TRUE(MessageDifferencer::Equals(*back, *spec)) << yaml;
  }
}

TEST(JobSpecToYamlTest, RawSpecsRoundTrip) {
  JobSpec raw;
  ASSERT_TRUE(MergeYamlIntoMessage(kMinimal, {}, &raw, nullptr).ok());
  JobSpec back;
  ASSERT_TRUE(MergeYamlIntoMessage(JobSpecToYaml(raw), {}, &back, nullptr).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(back, raw)) << JobSpecToYaml(raw);
}

TEST(JobSpecToYamlTest, IsReadable) {
  const std::string yaml = JobSpecToYaml(*LoadJobSpecFile(kExamples[0]));
  EXPECT_THAT(yaml, HasSubstr("name: fashion_mnist_mlp\n"));
  EXPECT_THAT(yaml, HasSubstr("    hidden: [512, 512]\n    activation: relu\n"));
  EXPECT_THAT(yaml, HasSubstr("  lr: 0.05\n"));
  EXPECT_THAT(yaml, HasSubstr("  decay: cosine\n"));
  EXPECT_THAT(yaml, HasSubstr("  bucket_mb: 25\n"));
}

TEST(JobSpecToYamlTest, ShowsZeroStage3sEffectiveOptions) {
  const JobSpec spec = *LoadJobSpecText(
      absl::StrCat(kMinimal, "precision: {compute: bf16, reduce: bf16}\n",
                   "parallelism:\n  zero_stage: 3\n  fsdp: {wrap: layer, prefetch_limit: 2}\n"));
  const std::string yaml = JobSpecToYaml(spec);
  EXPECT_THAT(yaml, HasSubstr("  compute: bf16\n  tf32: false\n  reduce: bf16\n"));
  EXPECT_THAT(yaml, HasSubstr("  zero_stage: 3\n"));
  EXPECT_THAT(yaml, HasSubstr("  fsdp:\n    wrap: layer\n    prefetch: both\n"
                              "    prefetch_limit: 2\n    reshard_after_forward: true\n"));
  const absl::StatusOr<JobSpec> back = LoadJobSpecText(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, spec)) << yaml;
  // Other stages show neither (their effective specs are as before these fields).
  const std::string stage2 =
      JobSpecToYaml(*LoadJobSpecText(kMinimal, {"parallelism.zero_stage=2"}));
  EXPECT_THAT(stage2, Not(HasSubstr("fsdp")));
  EXPECT_THAT(stage2, HasSubstr("  reduce: fp32\n"));
  EXPECT_THAT(JobSpecToYaml(*LoadJobSpecText(kMinimal)), Not(HasSubstr("reduce")));
}

TEST(JobSpecToYamlTest, ShowsTheMeshAndThePipelineAndReadsThemBack) {
  constexpr char kGpt[] = R"(steps: 10
model: {gpt: {layers: 4}}
data: {text: {path: corpus.txt}}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
parallelism:
  mesh: {tp: 2, pp: 2}
  pipeline: {micro_batches: 6}
)";
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(kGpt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string yaml = JobSpecToYaml(*spec);
  EXPECT_THAT(yaml, HasSubstr("  mesh:\n    tp: 2\n    pp: 2\n"
                              "  pipeline:\n    schedule: 1f1b\n    micro_batches: 6\n"
                              "    virtual_stages: 1\n"));
  const absl::StatusOr<JobSpec> back = LoadJobSpecText(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, *spec)) << yaml;
  // Every schedule's YAML name reads back as itself, "1f1b" (a name starting with a digit)
  // included.
  for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}) {
    const absl::StatusOr<JobSpec> with =
        LoadJobSpecText(kGpt, {absl::StrCat("parallelism.pipeline.schedule=", schedule)});
    ASSERT_TRUE(with.ok()) << with.status();
    const std::string written = JobSpecToYaml(*with);
    EXPECT_THAT(written, HasSubstr(absl::StrCat("    schedule: ", schedule, "\n")));
    const absl::StatusOr<JobSpec> read = LoadJobSpecText(written);
    ASSERT_TRUE(read.ok()) << read.status() << "\n" << written;
    EXPECT_TRUE(MessageDifferencer::Equals(*read, *with)) << written;
  }
  // Without a mesh: the default one, and no pipeline.
  const std::string plain = JobSpecToYaml(*LoadJobSpecText(kMinimal));
  EXPECT_THAT(plain, HasSubstr("  mesh:\n    tp: 1\n    pp: 1\n"));
  EXPECT_THAT(plain, Not(HasSubstr("pipeline")));
}

TEST(JobSpecToJsonTest, UsesTheYamlFieldNames) {
  const absl::StatusOr<std::string> json = JobSpecToJson(*LoadJobSpecFile(kExamples[0]));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"name\": \"fashion_mnist_mlp\""));
  EXPECT_THAT(*json, HasSubstr("\"warmup_steps\": \"100\""));
  EXPECT_THAT(*json, HasSubstr("\"decay\": \"DECAY_COSINE\""));
}

TEST(JobSpecHashTest, StableAndSensitive) {
  const JobSpec spec = *LoadJobSpecText(kMinimal);
  EXPECT_EQ(JobSpecHash(spec), JobSpecHash(*LoadJobSpecText(kMinimal)));
  // xxh3 of the serialization, computed here independently.
  EXPECT_EQ(JobSpecHash(spec), XXH3_64bits(spec.SerializeAsString().data(), spec.ByteSizeLong()));
  // Pinned: the hash must not change between runs, machines or builds (only when the
  // effective spec itself changes: the default `data.final_eval: true` moved it last; a
  // checkpoint's TrainingSpecHash leaves that operational field out).
  const JobSpec pinned = *LoadJobSpecText(
      "name: pinned\nsteps: 1\nmodel: {mlp: {}}\ndata: {fashion_mnist: {}}\n"
      "optimizer: {sgd: {}, lr: 0.1}\nbatch: {global: 1}\n");
  EXPECT_EQ(JobSpecHash(pinned), 17716475405562054780u);
  EXPECT_NE(JobSpecHash(spec), JobSpecHash(*LoadJobSpecText(kMinimal, {"optimizer.lr=0.2"})));
  EXPECT_NE(JobSpecHash(spec), JobSpecHash(*LoadJobSpecText(kMinimal, {"seed=1"})));
}

TEST(JobSpecHashTest, KeyOrderAndWrittenDefaultsDoNotMatter) {
  const std::string reordered = R"(batch: {global: 64}
optimizer: {lr: 0.1, sgd: {momentum: 0.9}}
data: {fashion_mnist: {dir: /usr/share/datasets/fashion-mnist}}
parallelism: {overlap: true, bucket_mb: 25}
model: {mlp: {hidden: [8]}}
steps: 100
)";
  EXPECT_EQ(JobSpecHash(*LoadJobSpecText(kMinimal)), JobSpecHash(*LoadJobSpecText(reordered)));
}

TEST(TrainingSpecHashTest, IgnoresOperationalFieldsOnly) {
  const JobSpec spec = *LoadJobSpecText(kMinimal);
  const JobSpec operational =
      *LoadJobSpecText(kMinimal, {"name=other", "checkpoint.dir=/c", "checkpoint.every_steps=5",
                                  "parallelism.zero_stage=2", "resume=never",
                                  "data.fashion_mnist.dir=/elsewhere", "backend=tcp",
                                  "device=cpu"});
  EXPECT_NE(JobSpecHash(spec), JobSpecHash(operational));
  EXPECT_EQ(TrainingSpecHash(spec), TrainingSpecHash(operational));
  EXPECT_NE(TrainingSpecHash(spec),
            TrainingSpecHash(*LoadJobSpecText(kMinimal, {"model.mlp.hidden=[9]"})));
  EXPECT_NE(TrainingSpecHash(spec), TrainingSpecHash(*LoadJobSpecText(kMinimal, {"seed=3"})));
}

TEST(TrainingSpecHashTest, AnyZeroStageFsdpOptionOrReducePrecisionResumes) {
  // A checkpoint loads across stages and wrappings: what differs only in them is the same
  // training.
  const JobSpec stage0 = *LoadJobSpecText(kMinimal);
  const std::vector<JobSpec> others = {
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=1"}),
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=2"}),
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=2", "precision.reduce=bf16"}),
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=3"}),
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=3", "precision.reduce=bf16",
                                  "parallelism.fsdp.wrap=layer", "parallelism.fsdp.prefetch=none",
                                  "parallelism.fsdp.prefetch_limit=4",
                                  "parallelism.fsdp.reshard_after_forward=false"}),
      *LoadJobSpecText(kMinimal, {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=model",
                                  "parallelism.fsdp.prefetch=forward"}),
      // Another mesh (set after loading: validation would want model.gpt for it, and only
      // the hashes are tested here).
      [] {
        JobSpec meshed = *LoadJobSpecText(kMinimal);
        meshed.mutable_parallelism()->mutable_mesh()->set_pp(2);
        meshed.mutable_parallelism()->mutable_mesh()->set_tp(2);
        meshed.mutable_parallelism()->mutable_pipeline()->set_micro_batches(4);
        return meshed;
      }(),
  };
  for (const JobSpec& other : others) {
    EXPECT_NE(JobSpecHash(stage0), JobSpecHash(other)) << other.parallelism().DebugString();
    EXPECT_EQ(TrainingSpecHash(stage0), TrainingSpecHash(other))
        << other.parallelism().DebugString() << other.precision().DebugString();
    EXPECT_EQ(TrainingSpecText(stage0), TrainingSpecText(other));
  }
  // Precision as a whole is not operational: the compute precision is what is trained.
  EXPECT_NE(TrainingSpecHash(stage0),
            TrainingSpecHash(*LoadJobSpecText(kMinimal, {"precision.compute=bf16"})));
}

TEST(TrainingSpecTextTest, OneLinePerTrainingFieldWithoutOperationalOnes) {
  const JobSpec spec = *LoadJobSpecText(kMinimal, {"checkpoint.dir=/c", "name=n"});
  const std::string text = TrainingSpecText(spec);
  EXPECT_THAT(text, HasSubstr("seed: 0\nsteps: 100\n"));
  EXPECT_THAT(text, HasSubstr("\nmodel.mlp.hidden: [8]\n"));
  EXPECT_THAT(text, HasSubstr("\noptimizer.sgd.momentum: 0.9\n"));
  EXPECT_THAT(text, HasSubstr("\noptimizer.lr: 0.1\n"));
  EXPECT_THAT(text, HasSubstr("\nschedule.decay: cosine\n"));
  EXPECT_THAT(text, Not(HasSubstr("checkpoint")));
  EXPECT_THAT(text, Not(HasSubstr("name")));
  // Equal text for equal training specs; a changed field shows on its own line.
  EXPECT_EQ(text, TrainingSpecText(*LoadJobSpecText(kMinimal, {"resume=never"})));
  EXPECT_THAT(TrainingSpecText(*LoadJobSpecText(kMinimal, {"steps=200"})),
              HasSubstr("\nsteps: 200\n"));
}

TEST(JobSpecDeviceTest, DefaultsToAutoAndNamesABadValue) {
  EXPECT_EQ(LoadJobSpecText(kMinimal)->device(), JobSpec::DEVICE_AUTO);
  EXPECT_EQ(LoadJobSpecText(kMinimal, {"device=cuda"})->device(), JobSpec::DEVICE_CUDA);
  EXPECT_EQ(LoadJobSpecText(kMinimal, {"device=cpu"})->device(), JobSpec::DEVICE_CPU);
  const absl::Status bad = LoadJobSpecText(kMinimal, {"device=gpu"}).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("device"));
}

TEST(ParseResumeTest, AutoNeverExtendOrAStep) {
  EXPECT_EQ(ParseResume("auto")->kind, ResumePoint::Kind::kAuto);
  EXPECT_EQ(ParseResume("Extend")->kind, ResumePoint::Kind::kExtend);
  EXPECT_EQ(ParseResume("NEVER")->kind, ResumePoint::Kind::kNever);
  EXPECT_EQ(ParseResume("1200")->kind, ResumePoint::Kind::kStep);
  EXPECT_EQ(ParseResume("1200")->step, 1200);
  for (const char* bad : {"", "-1", "+5", "12x", "latest", "1.5"}) {
    EXPECT_EQ(ParseResume(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseResumeTest, AStepWrittenAsAYamlIntegerIsAccepted) {
  const absl::StatusOr<JobSpec> spec =
      LoadJobSpecText(absl::StrCat(kMinimal, "resume: 300\ncheckpoint: {dir: /c}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(ParseResume(spec->resume())->step, 300);
}

TEST(RanksHoldWholeStateTest, OnlyPlainDataParallelism) {
  JobSpec spec;
  EXPECT_TRUE(RanksHoldWholeState(spec));
  spec.mutable_parallelism()->set_zero_stage(1);
  EXPECT_FALSE(RanksHoldWholeState(spec)) << "ZeRO-1 shards the optimizer state";
  spec.mutable_parallelism()->set_zero_stage(0);
  spec.mutable_parallelism()->mutable_mesh()->set_tp(2);
  EXPECT_FALSE(RanksHoldWholeState(spec));
  spec.mutable_parallelism()->mutable_mesh()->set_tp(1);
  spec.mutable_parallelism()->mutable_mesh()->set_pp(2);
  EXPECT_FALSE(RanksHoldWholeState(spec));
  spec.mutable_parallelism()->mutable_mesh()->set_pp(1);
  EXPECT_TRUE(RanksHoldWholeState(spec));
}

}  // namespace
}  // namespace ringmaster::spec
