#include "spec/defaults.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace ringmaster::spec {
namespace {

void FillModel(ModelSpec* model) {
  if (model->has_mlp()) {
    MlpSpec* mlp = model->mutable_mlp();
    if (mlp->hidden().empty())
      mlp->mutable_hidden()->Add(kDefaultMlpHidden.begin(), kDefaultMlpHidden.end());
    if (mlp->activation() == MlpSpec::ACTIVATION_UNSPECIFIED)
      mlp->set_activation(kDefaultMlpActivation);
  } else if (model->has_cnn()) {
    CnnSpec* cnn = model->mutable_cnn();
    if (cnn->channels().empty()) {
      cnn->mutable_channels()->Add(kDefaultCnnChannels.begin(), kDefaultCnnChannels.end());
    }
    if (!cnn->has_fc()) cnn->set_fc(kDefaultCnnFc);
  } else if (model->has_resnet18()) {
    Resnet18Spec* resnet = model->mutable_resnet18();
    if (!resnet->has_width()) resnet->set_width(kDefaultResnet18Width);
  } else if (model->has_gpt()) {
    GptSpec* gpt = model->mutable_gpt();
    if (!gpt->has_layers()) gpt->set_layers(kDefaultGptLayers);
    if (!gpt->has_heads()) gpt->set_heads(kDefaultGptHeads);
    if (!gpt->has_width()) gpt->set_width(kDefaultGptWidth);
    if (!gpt->has_context()) gpt->set_context(kDefaultGptContext);
    if (!gpt->has_vocab()) gpt->set_vocab(kDefaultGptVocab);
  } else if (model->has_gpt2()) {
    GptSpec* gpt = model->mutable_gpt2();
    if (!gpt->has_layers()) gpt->set_layers(kDefaultGpt2Layers);
    if (!gpt->has_heads()) gpt->set_heads(kDefaultGpt2Heads);
    if (!gpt->has_width()) gpt->set_width(kDefaultGpt2Width);
    if (!gpt->has_context()) gpt->set_context(kDefaultGpt2Context);
    // vocab stays unset: GPT-2's is fixed (validate.cc refuses another).
  }
}

void FillData(DataSpec* data) {
  if (data->has_fashion_mnist()) {
    FashionMnistSpec* mnist = data->mutable_fashion_mnist();
    if (mnist->dir().empty()) mnist->set_dir(std::string(kDefaultFashionMnistDir));
    if (!mnist->has_normalize()) mnist->set_normalize(kDefaultNormalize);
  }
  if (data->has_mnist()) {
    MnistSpec* mnist = data->mutable_mnist();
    if (mnist->dir().empty()) mnist->set_dir(std::string(kDefaultMnistDir));
    if (!mnist->has_normalize()) mnist->set_normalize(kDefaultNormalize);
  }
  if (!data->has_eval_every_epoch()) data->set_eval_every_epoch(kDefaultEvalEveryEpoch);
  if (!data->has_final_eval()) data->set_final_eval(kDefaultFinalEval);
}

void FillAdam(AdamSpec* adam, double eps) {
  if (!adam->has_beta1()) adam->set_beta1(kDefaultAdamBeta1);
  if (!adam->has_beta2()) adam->set_beta2(kDefaultAdamBeta2);
  if (!adam->has_eps()) adam->set_eps(eps);
}

// `zero_stage`: the reduce precision applies to stages 2 and 3 only.
void FillPrecision(int32_t zero_stage, PrecisionSpec* precision) {
  if (precision->compute() == PrecisionSpec::DTYPE_UNSPECIFIED) {
    precision->set_compute(kDefaultCompute);
  }
  if (zero_stage >= 2 && precision->reduce() == PrecisionSpec::DTYPE_UNSPECIFIED) {
    precision->set_reduce(kDefaultReduce);
  }
  if (precision->compute() != PrecisionSpec::DTYPE_FP16) return;
  LossScaleSpec* scale = precision->mutable_loss_scale();
  if (scale->mode() == LossScaleSpec::MODE_UNSPECIFIED) scale->set_mode(kDefaultLossScaleMode);
  if (!scale->has_initial()) scale->set_initial(kDefaultLossScaleInitial);
  if (!scale->has_growth_interval()) scale->set_growth_interval(kDefaultLossScaleGrowthInterval);
  if (!scale->has_growth_factor()) scale->set_growth_factor(kDefaultLossScaleGrowthFactor);
  if (!scale->has_backoff_factor()) scale->set_backoff_factor(kDefaultLossScaleBackoffFactor);
}

void FillFsdp(FsdpSpec* fsdp) {
  if (fsdp->wrap() == FsdpSpec::WRAP_UNSPECIFIED) fsdp->set_wrap(kDefaultFsdpWrap);
  if (fsdp->prefetch() == FsdpSpec::PREFETCH_UNSPECIFIED) fsdp->set_prefetch(kDefaultFsdpPrefetch);
  if (!fsdp->has_prefetch_limit()) fsdp->set_prefetch_limit(kDefaultFsdpPrefetchLimit);
  if (!fsdp->has_reshard_after_forward()) {
    fsdp->set_reshard_after_forward(kDefaultFsdpReshardAfterForward);
  }
}

void FillMesh(MeshSpec* mesh) {
  if (!mesh->has_tp()) mesh->set_tp(kDefaultMeshTp);
  if (!mesh->has_pp()) mesh->set_pp(kDefaultMeshPp);
}

// `pp` > 1: the pipeline's stages.
void FillPipeline(int32_t pp, PipelineSpec* pipeline) {
  if (pipeline->schedule() == PipelineSpec::SCHEDULE_UNSPECIFIED) {
    pipeline->set_schedule(kDefaultPipelineSchedule);
  }
  if (!pipeline->has_micro_batches()) {
    // Saturated: a pp this large is refused by validation (more stages than blocks).
    pipeline->set_micro_batches(static_cast<int32_t>(
        std::min<int64_t>(int64_t{kDefaultPipelineMicroBatchesPerStage} * pp,
                          std::numeric_limits<int32_t>::max())));
  }
  if (!pipeline->has_virtual_stages()) {
    pipeline->set_virtual_stages(pipeline->schedule() == PipelineSpec::SCHEDULE_INTERLEAVED_1F1B
                                     ? kDefaultInterleavedVirtualStages
                                     : kDefaultPipelineVirtualStages);
  }
}

void FillCheckpoint(CheckpointSpec* checkpoint) {
  if (!checkpoint->has_keep_last()) checkpoint->set_keep_last(kDefaultKeepLast);
  if (!checkpoint->has_async()) checkpoint->set_async(kDefaultAsyncCheckpoint);
  if (checkpoint->on_busy() == CheckpointSpec::ON_BUSY_UNSPECIFIED) {
    checkpoint->set_on_busy(kDefaultOnBusy);
  }
  if (checkpoint->on_failure() == CheckpointSpec::ON_FAILURE_UNSPECIFIED) {
    checkpoint->set_on_failure(kDefaultOnFailure);
  }
  if (!checkpoint->has_drain_grace_seconds()) {
    checkpoint->set_drain_grace_seconds(kDefaultDrainGraceSeconds);
  }
}

void FillElastic(ElasticSpec* elastic) {
  if (!elastic->has_min_ranks()) elastic->set_min_ranks(kDefaultMinRanks);
  if (!elastic->has_restart_budget()) elastic->set_restart_budget(kDefaultRestartBudget);
}

void FillCommandJob(JobSpec* spec) {
  CommandSpec* command = spec->mutable_command();
  if (!command->has_stop_grace_s()) command->set_stop_grace_s(kDefaultCommandStopGraceSeconds);
  if (!spec->checkpoint().dir().empty()) FillCheckpoint(spec->mutable_checkpoint());
  FillElastic(spec->mutable_elastic());
}

}  // namespace

void ApplyJobSpecDefaults(JobSpec* spec) {
  if (spec->name().empty()) spec->set_name(std::string(kDefaultJobName));
  if (spec->backend() == JobSpec::BACKEND_UNSPECIFIED) spec->set_backend(kDefaultBackend);
  if (spec->device() == JobSpec::DEVICE_UNSPECIFIED) spec->set_device(kDefaultDevice);
  if (spec->resume().empty()) spec->set_resume(std::string(kDefaultResume));
  if (spec->has_command()) {
    FillCommandJob(spec);
    return;
  }
  if (spec->has_model()) FillModel(spec->mutable_model());
  if (spec->has_data()) FillData(spec->mutable_data());

  if (spec->has_optimizer()) {
    OptimizerSpec* optimizer = spec->mutable_optimizer();
    if (optimizer->has_adamw()) FillAdam(optimizer->mutable_adamw(), kDefaultAdamWEps);
    if (optimizer->has_lamb()) FillAdam(optimizer->mutable_lamb(), kDefaultLambEps);
  }

  ScheduleSpec* schedule = spec->mutable_schedule();
  if (schedule->decay() == ScheduleSpec::DECAY_UNSPECIFIED) schedule->set_decay(kDefaultDecay);

  ParallelismSpec* parallelism = spec->mutable_parallelism();
  FillPrecision(parallelism->zero_stage(), spec->mutable_precision());
  if (!parallelism->has_bucket_mb()) parallelism->set_bucket_mb(kDefaultBucketMb);
  if (!parallelism->has_overlap()) parallelism->set_overlap(kDefaultOverlap);
  if (parallelism->zero_stage() == 3) FillFsdp(parallelism->mutable_fsdp());
  FillMesh(parallelism->mutable_mesh());
  if (parallelism->mesh().pp() > 1) {
    FillPipeline(parallelism->mesh().pp(), parallelism->mutable_pipeline());
  }

  if (!spec->checkpoint().dir().empty()) FillCheckpoint(spec->mutable_checkpoint());

  DiagnosticsSpec* diagnostics = spec->mutable_diagnostics();
  if (!diagnostics->has_fingerprint_every()) {
    diagnostics->set_fingerprint_every(kDefaultFingerprintEvery);
  }
  if (!diagnostics->has_log_every()) diagnostics->set_log_every(kDefaultLogEvery);

  FillElastic(spec->mutable_elastic());
}

}  // namespace ringmaster::spec
