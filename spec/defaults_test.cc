#include "spec/defaults.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/job_spec.pb.h"

namespace ringmaster::spec {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;

TEST(ApplyJobSpecDefaultsTest, FillsTheSectionsEveryJobHas) {
  JobSpec spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.name(), "job");
  EXPECT_EQ(spec.backend(), JobSpec::BACKEND_AUTO);
  EXPECT_EQ(spec.resume(), "auto");
  EXPECT_EQ(spec.schedule().decay(), ScheduleSpec::DECAY_COSINE);
  EXPECT_EQ(spec.schedule().warmup_steps(), 0);
  EXPECT_EQ(spec.precision().compute(), PrecisionSpec::DTYPE_FP32);
  EXPECT_FALSE(spec.precision().has_loss_scale());
  EXPECT_EQ(spec.parallelism().bucket_mb(), 25);
  EXPECT_TRUE(spec.parallelism().overlap());
  EXPECT_EQ(spec.parallelism().zero_stage(), 0);
  EXPECT_TRUE(spec.parallelism().mesh().has_tp());
  EXPECT_EQ(spec.parallelism().mesh().tp(), 1);
  EXPECT_TRUE(spec.parallelism().mesh().has_pp());
  EXPECT_EQ(spec.parallelism().mesh().pp(), 1);
  EXPECT_FALSE(spec.parallelism().has_pipeline());  // pp 1: no pipeline
  EXPECT_EQ(spec.diagnostics().fingerprint_every(), 100);
  EXPECT_EQ(spec.diagnostics().log_every(), 10);
  EXPECT_EQ(spec.elastic().min_ranks(), 1);
  EXPECT_EQ(spec.elastic().max_ranks(), 0);
  EXPECT_EQ(spec.elastic().restart_budget(), 3);
  // What has no default stays unset, for validation to report.
  EXPECT_FALSE(spec.has_model());
  EXPECT_FALSE(spec.has_data());
  EXPECT_FALSE(spec.has_optimizer());
  EXPECT_FALSE(spec.has_batch());
  EXPECT_FALSE(spec.has_checkpoint());
  EXPECT_EQ(spec.length_case(), JobSpec::LENGTH_NOT_SET);
}

TEST(ApplyJobSpecDefaultsTest, FillsTheChosenModel) {
  JobSpec mlp;
  mlp.mutable_model()->mutable_mlp();
  ApplyJobSpecDefaults(&mlp);
  EXPECT_THAT(mlp.model().mlp().hidden(), ElementsAre(512, 512));
  EXPECT_EQ(mlp.model().mlp().activation(), MlpSpec::ACTIVATION_RELU);

  JobSpec cnn;
  cnn.mutable_model()->mutable_cnn();
  ApplyJobSpecDefaults(&cnn);
  EXPECT_THAT(cnn.model().cnn().channels(), ElementsAre(16, 32));
  EXPECT_EQ(cnn.model().cnn().fc(), 128);

  JobSpec gpt;
  gpt.mutable_model()->mutable_gpt()->set_width(64);
  ApplyJobSpecDefaults(&gpt);
  EXPECT_EQ(gpt.model().gpt().layers(), 4);
  EXPECT_EQ(gpt.model().gpt().heads(), 4);
  EXPECT_EQ(gpt.model().gpt().width(), 64);
  EXPECT_EQ(gpt.model().gpt().context(), 128);
  EXPECT_EQ(gpt.model().gpt().vocab(), 256);
}

TEST(ApplyJobSpecDefaultsTest, FillsDataAndOptimizer) {
  JobSpec spec;
  spec.mutable_data()->mutable_fashion_mnist();
  spec.mutable_optimizer()->mutable_adamw()->set_beta2(0.95);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.data().fashion_mnist().dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_TRUE(spec.data().fashion_mnist().normalize());
  EXPECT_TRUE(spec.data().eval_every_epoch());
  EXPECT_EQ(spec.optimizer().adamw().beta1(), 0.9);
  EXPECT_EQ(spec.optimizer().adamw().beta2(), 0.95);
  EXPECT_EQ(spec.optimizer().adamw().eps(), 1e-8);

  JobSpec lamb;
  lamb.mutable_optimizer()->mutable_lamb();
  ApplyJobSpecDefaults(&lamb);
  EXPECT_EQ(lamb.optimizer().lamb().eps(), 1e-6);
}

TEST(ApplyJobSpecDefaultsTest, LossScaleForFp16Only) {
  JobSpec spec;
  spec.mutable_precision()->set_compute(PrecisionSpec::DTYPE_FP16);
  ApplyJobSpecDefaults(&spec);
  const LossScaleSpec& scale = spec.precision().loss_scale();
  EXPECT_EQ(scale.mode(), LossScaleSpec::MODE_DYNAMIC);
  EXPECT_EQ(scale.initial(), 65536);
  EXPECT_EQ(scale.growth_interval(), 2000);
  EXPECT_EQ(scale.growth_factor(), 2);
  EXPECT_EQ(scale.backoff_factor(), 0.5);

  JobSpec bf16;
  bf16.mutable_precision()->set_compute(PrecisionSpec::DTYPE_BF16);
  ApplyJobSpecDefaults(&bf16);
  EXPECT_FALSE(bf16.precision().has_loss_scale());
}

TEST(ApplyJobSpecDefaultsTest, FsdpForZeroStage3Only) {
  JobSpec spec;
  spec.mutable_parallelism()->set_zero_stage(3);
  spec.mutable_parallelism()->mutable_fsdp()->set_wrap(FsdpSpec::WRAP_LAYER);
  ApplyJobSpecDefaults(&spec);
  const FsdpSpec& fsdp = spec.parallelism().fsdp();
  EXPECT_EQ(fsdp.wrap(), FsdpSpec::WRAP_LAYER);  // written: kept
  EXPECT_EQ(fsdp.prefetch(), FsdpSpec::PREFETCH_BOTH);
  EXPECT_EQ(fsdp.prefetch_limit(), 1);
  EXPECT_TRUE(fsdp.has_reshard_after_forward());
  EXPECT_TRUE(fsdp.reshard_after_forward());

  JobSpec defaulted;
  defaulted.mutable_parallelism()->set_zero_stage(3);
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_EQ(defaulted.parallelism().fsdp().wrap(), FsdpSpec::WRAP_BLOCK);

  // Under another stage the section stays unset: a field written there is the user's, for
  // validation to refuse.
  for (const int stage : {0, 1, 2}) {
    JobSpec other;
    other.mutable_parallelism()->set_zero_stage(stage);
    ApplyJobSpecDefaults(&other);
    EXPECT_FALSE(other.parallelism().has_fsdp()) << stage;
  }
}

TEST(ApplyJobSpecDefaultsTest, MeshKeepsWhatIsWritten) {
  JobSpec tp;
  tp.mutable_parallelism()->mutable_mesh()->set_tp(2);
  ApplyJobSpecDefaults(&tp);
  EXPECT_EQ(tp.parallelism().mesh().tp(), 2);
  EXPECT_EQ(tp.parallelism().mesh().pp(), 1);
  EXPECT_FALSE(tp.parallelism().has_pipeline());

  JobSpec pp;
  pp.mutable_parallelism()->mutable_mesh()->set_pp(2);
  ApplyJobSpecDefaults(&pp);
  EXPECT_EQ(pp.parallelism().mesh().tp(), 1);
  EXPECT_EQ(pp.parallelism().mesh().pp(), 2);
}

TEST(ApplyJobSpecDefaultsTest, PipelineForMoreThanOneStageOnly) {
  for (const int32_t stages : {2, 3, 8}) {
    JobSpec spec;
    spec.mutable_parallelism()->mutable_mesh()->set_pp(stages);
    ApplyJobSpecDefaults(&spec);
    const PipelineSpec& pipeline = spec.parallelism().pipeline();
    EXPECT_EQ(pipeline.schedule(), PipelineSpec::SCHEDULE_1F1B) << stages;
    EXPECT_EQ(pipeline.micro_batches(), 2 * stages);
    EXPECT_TRUE(pipeline.has_virtual_stages());
    EXPECT_EQ(pipeline.virtual_stages(), 1);
  }

  JobSpec written;
  written.mutable_parallelism()->mutable_mesh()->set_pp(4);
  written.mutable_parallelism()->mutable_pipeline()->set_schedule(
      PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
  written.mutable_parallelism()->mutable_pipeline()->set_virtual_stages(2);
  ApplyJobSpecDefaults(&written);
  EXPECT_EQ(written.parallelism().pipeline().schedule(), PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
  EXPECT_EQ(written.parallelism().pipeline().virtual_stages(), 2);
  EXPECT_EQ(written.parallelism().pipeline().micro_batches(), 8);

  // Issue 36 point 10: interleaved_1f1b without virtual_stages got 1, which it cannot run;
  // its default is 2, as `ringctl estimate pipeline`'s.
  JobSpec interleaved;
  interleaved.mutable_parallelism()->mutable_mesh()->set_pp(2);
  interleaved.mutable_parallelism()->mutable_pipeline()->set_schedule(
      PipelineSpec::SCHEDULE_INTERLEAVED_1F1B);
  ApplyJobSpecDefaults(&interleaved);
  EXPECT_EQ(interleaved.parallelism().pipeline().virtual_stages(), 2);

  // One stage (or a bad pp, for validation to name): the section stays as written, so that
  // a field written there is the user's, for validation to refuse.
  for (const int32_t stages : {1, 0, -2}) {
    JobSpec other;
    other.mutable_parallelism()->mutable_mesh()->set_pp(stages);
    ApplyJobSpecDefaults(&other);
    EXPECT_FALSE(other.parallelism().has_pipeline()) << stages;
    JobSpec gpipe;
    gpipe.mutable_parallelism()->mutable_mesh()->set_pp(stages);
    gpipe.mutable_parallelism()->mutable_pipeline()->set_schedule(PipelineSpec::SCHEDULE_GPIPE);
    ApplyJobSpecDefaults(&gpipe);
    EXPECT_FALSE(gpipe.parallelism().pipeline().has_micro_batches()) << stages;
    EXPECT_FALSE(gpipe.parallelism().pipeline().has_virtual_stages()) << stages;
  }

  // A pp too large for 2 × pp micro-batches: the most an int32 holds (validation refuses the
  // pp: more stages than any model's blocks).
  JobSpec huge;
  huge.mutable_parallelism()->mutable_mesh()->set_pp(std::numeric_limits<int32_t>::max());
  ApplyJobSpecDefaults(&huge);
  EXPECT_EQ(huge.parallelism().pipeline().micro_batches(), std::numeric_limits<int32_t>::max());
}

TEST(ApplyJobSpecDefaultsTest, ReducePrecisionForZeroStages2And3Only) {
  for (const int stage : {2, 3}) {
    JobSpec spec;
    spec.mutable_parallelism()->set_zero_stage(stage);
    spec.mutable_precision()->set_compute(PrecisionSpec::DTYPE_BF16);
    ApplyJobSpecDefaults(&spec);
    EXPECT_EQ(spec.precision().reduce(), PrecisionSpec::DTYPE_FP32) << stage;
  }
  JobSpec written;
  written.mutable_parallelism()->set_zero_stage(2);
  written.mutable_precision()->set_reduce(PrecisionSpec::DTYPE_BF16);
  ApplyJobSpecDefaults(&written);
  EXPECT_EQ(written.precision().reduce(), PrecisionSpec::DTYPE_BF16);
  // Stages 0 and 1 all-reduce in fp32 whatever it says; their effective spec is as before.
  for (const int stage : {0, 1}) {
    JobSpec spec;
    spec.mutable_parallelism()->set_zero_stage(stage);
    ApplyJobSpecDefaults(&spec);
    EXPECT_EQ(spec.precision().reduce(), PrecisionSpec::DTYPE_UNSPECIFIED) << stage;
  }
}

TEST(ApplyJobSpecDefaultsTest, CheckpointDefaultsOnlyWhenCheckpointing) {
  JobSpec spec;
  spec.mutable_checkpoint()->set_dir("/ckpt");
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_TRUE(spec.checkpoint().async());
  EXPECT_EQ(spec.checkpoint().on_busy(), CheckpointSpec::ON_BUSY_WAIT);
  EXPECT_EQ(spec.checkpoint().on_failure(), CheckpointSpec::ON_FAILURE_CONTINUE);
  EXPECT_EQ(spec.checkpoint().drain_grace_seconds(), 30);
}

TEST(ApplyJobSpecDefaultsTest, ExplicitZerosAndFalsesAreKept) {
  JobSpec spec;
  spec.mutable_parallelism()->set_overlap(false);
  spec.mutable_parallelism()->set_bucket_mb(0);
  spec.mutable_data()->mutable_fashion_mnist()->set_normalize(false);
  spec.mutable_data()->set_eval_every_epoch(false);
  spec.mutable_checkpoint()->set_dir("/ckpt");
  spec.mutable_checkpoint()->set_async(false);
  spec.mutable_checkpoint()->set_keep_last(0);
  spec.mutable_diagnostics()->set_fingerprint_every(0);
  spec.mutable_parallelism()->set_zero_stage(3);
  spec.mutable_parallelism()->mutable_fsdp()->set_reshard_after_forward(false);
  spec.mutable_parallelism()->mutable_mesh()->set_tp(0);
  spec.mutable_parallelism()->mutable_mesh()->set_pp(2);
  spec.mutable_parallelism()->mutable_pipeline()->set_micro_batches(0);
  spec.mutable_parallelism()->mutable_pipeline()->set_virtual_stages(0);
  ApplyJobSpecDefaults(&spec);
  EXPECT_FALSE(spec.parallelism().overlap());
  EXPECT_EQ(spec.parallelism().bucket_mb(), 0);
  EXPECT_FALSE(spec.data().fashion_mnist().normalize());
  EXPECT_FALSE(spec.data().eval_every_epoch());
  EXPECT_FALSE(spec.checkpoint().async());
  EXPECT_EQ(spec.checkpoint().keep_last(), 0);
  EXPECT_EQ(spec.diagnostics().fingerprint_every(), 0);
  EXPECT_FALSE(spec.parallelism().fsdp().reshard_after_forward());
  EXPECT_EQ(spec.parallelism().mesh().tp(), 0);
  EXPECT_EQ(spec.parallelism().pipeline().micro_batches(), 0);
  EXPECT_EQ(spec.parallelism().pipeline().virtual_stages(), 0);
}

TEST(ApplyJobSpecDefaultsTest, IsIdempotent) {
  JobSpec once;
  once.mutable_model()->mutable_gpt();
  once.mutable_optimizer()->mutable_lamb();
  once.mutable_precision()->set_compute(PrecisionSpec::DTYPE_FP16);
  once.mutable_checkpoint()->set_dir("/ckpt");
  once.mutable_parallelism()->set_zero_stage(3);
  once.mutable_parallelism()->mutable_mesh()->set_pp(2);
  ApplyJobSpecDefaults(&once);
  JobSpec twice = once;
  ApplyJobSpecDefaults(&twice);
  EXPECT_TRUE(MessageDifferencer::Equals(once, twice));
}

}  // namespace
}  // namespace ringmaster::spec
