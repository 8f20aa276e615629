#include "config/train_config.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "spec/defaults.h"
#include "spec/job_spec.h"
#include "spec/yaml_proto.h"

namespace ringmaster::config {
namespace {

using train::TrainConfig;

train::Precision PrecisionOf(const PrecisionSpec& p) {
  switch (p.compute()) {
    case PrecisionSpec::DTYPE_BF16:
      return train::Precision::kBFloat16;
    case PrecisionSpec::DTYPE_FP16:
      return train::Precision::kFloat16;
    default:
      return train::Precision::kFloat32;
  }
}

// AdamW's and LAMB's shared fields (an AdamSpec each).
template <typename Options>
Options AdamOf(const AdamSpec& adam, double weight_decay) {
  Options a;
  a.beta1 = adam.beta1();
  a.beta2 = adam.beta2();
  a.eps = adam.eps();
  a.weight_decay = weight_decay;
  return a;
}

absl::StatusOr<train::OptimizerOptions> OptimizerOf(const OptimizerSpec& o) {
  switch (o.kind_case()) {
    case OptimizerSpec::kSgd: {
      train::SgdOptions s;
      s.momentum = o.sgd().momentum();
      s.nesterov = o.sgd().nesterov();
      s.weight_decay = o.weight_decay();
      return s;
    }
    case OptimizerSpec::kAdamw:
      return AdamOf<train::AdamWOptions>(o.adamw(), o.weight_decay());
    case OptimizerSpec::kLamb:
      return AdamOf<train::LambOptions>(o.lamb(), o.weight_decay());
    default:
      return absl::InvalidArgumentError("optimizer: set one of sgd, adamw or lamb");
  }
}

// precision.reduce: fp32 unless bf16 (validation refuses fp16; stages 0 and 1 leave it unset).
train::Precision ReducePrecisionOf(const PrecisionSpec& p) {
  return p.reduce() == PrecisionSpec::DTYPE_BF16 ? train::Precision::kBFloat16
                                                 : train::Precision::kFloat32;
}

// parallelism.fsdp, filled for zero_stage 3; under other stages it is unset and the options
// keep train::FsdpConfig's defaults (the same as spec/defaults.h's).
train::FsdpConfig FsdpOf(const FsdpSpec& f) {
  train::FsdpConfig c;
  switch (f.wrap()) {
    case FsdpSpec::WRAP_LAYER:
      c.wrap = train::FsdpConfig::Wrap::kLayer;
      break;
    case FsdpSpec::WRAP_MODEL:
      c.wrap = train::FsdpConfig::Wrap::kModel;
      break;
    case FsdpSpec::WRAP_BLOCK:
      c.wrap = train::FsdpConfig::Wrap::kBlock;
      break;
    default:
      break;
  }
  switch (f.prefetch()) {
    case FsdpSpec::PREFETCH_NONE:
      c.prefetch = train::FsdpConfig::Prefetch::kNone;
      break;
    case FsdpSpec::PREFETCH_FORWARD:
      c.prefetch = train::FsdpConfig::Prefetch::kForward;
      break;
    case FsdpSpec::PREFETCH_BACKWARD:
      c.prefetch = train::FsdpConfig::Prefetch::kBackward;
      break;
    case FsdpSpec::PREFETCH_BOTH:
      c.prefetch = train::FsdpConfig::Prefetch::kBoth;
      break;
    default:
      break;
  }
  if (f.has_prefetch_limit()) c.prefetch_limit = f.prefetch_limit();
  if (f.has_reshard_after_forward()) c.reshard_after_forward = f.reshard_after_forward();
  return c;
}

// parallelism.pipeline, filled for mesh.pp > 1; with pp 1 it is unset and the options keep
// train::PipelineConfig's defaults, unused.
train::PipelineConfig PipelineOf(const PipelineSpec& p) {
  train::PipelineConfig c;
  switch (p.schedule()) {
    case PipelineSpec::SCHEDULE_GPIPE:
      c.schedule = train::PipelineScheduleKind::kGPipe;
      break;
    case PipelineSpec::SCHEDULE_1F1B:
      c.schedule = train::PipelineScheduleKind::kOneFOneB;
      break;
    case PipelineSpec::SCHEDULE_INTERLEAVED_1F1B:
      c.schedule = train::PipelineScheduleKind::kInterleaved1F1B;
      break;
    case PipelineSpec::SCHEDULE_ZERO_BUBBLE:
      c.schedule = train::PipelineScheduleKind::kZeroBubble;
      break;
    default:
      break;
  }
  if (p.has_micro_batches()) c.micro_batches = p.micro_batches();
  if (p.has_virtual_stages()) c.virtual_stages = p.virtual_stages();
  return c;
}

train::LrScheduleOptions::Decay DecayOf(const ScheduleSpec& s) {
  switch (s.decay()) {
    case ScheduleSpec::DECAY_CONSTANT:
      return train::LrScheduleOptions::Decay::kConstant;
    case ScheduleSpec::DECAY_LINEAR:
      return train::LrScheduleOptions::Decay::kLinear;
    default:
      return train::LrScheduleOptions::Decay::kCosine;
  }
}

absl::StatusOr<train::ModelConfig> ModelOf(const JobSpec& spec) {
  const ModelSpec& m = spec.model();
  train::ModelConfig c;
  if (m.has_mlp()) {
    if (m.mlp().activation() == MlpSpec::ACTIVATION_GELU) {
      return absl::InvalidArgumentError(
          "model.mlp.activation: gelu is not available for the MLP yet; use relu");
    }
    c.kind = train::ModelConfig::Kind::kMlp;
    c.mlp_hidden.assign(m.mlp().hidden().begin(), m.mlp().hidden().end());
  } else if (m.has_cnn()) {
    c.kind = train::ModelConfig::Kind::kCnn;
    c.cnn_channels.assign(m.cnn().channels().begin(), m.cnn().channels().end());
    c.cnn_fc = m.cnn().fc();
  } else if (m.has_resnet18()) {
    c.kind = train::ModelConfig::Kind::kResnet18;
    c.resnet18_width = m.resnet18().width();
    c.resnet18_sync_batchnorm = m.resnet18().sync_batchnorm();
  } else if (m.has_gpt() || m.has_gpt2()) {
    const GptSpec& gpt = m.has_gpt() ? m.gpt() : m.gpt2();
    c.kind = train::ModelConfig::Kind::kGpt;
    c.gpt.layers = gpt.layers();
    c.gpt.heads = gpt.heads();
    c.gpt.width = gpt.width();
    c.gpt.context = gpt.context();
    c.gpt.vocab = m.has_gpt() ? gpt.vocab() : spec::kGpt2Vocab;
    c.gpt.tied_head = m.has_gpt2() || gpt.tied_head();
    c.gpt.checkpoint_every = spec.parallelism().activation_checkpointing_every();
  } else {
    return absl::InvalidArgumentError("model: set one of mlp, cnn, gpt, gpt2 or resnet18");
  }
  return c;
}

absl::StatusOr<train::DataConfig> DataOf(const DataSpec& d) {
  train::DataConfig c;
  c.eval_every_epoch = d.eval_every_epoch();
  c.final_eval = !d.has_final_eval() || d.final_eval();
  c.eval_every_steps = d.eval_every_steps();
  c.eval_samples = d.eval_samples();
  if (d.has_fashion_mnist()) {
    c.kind = train::DataConfig::Kind::kFashionMnist;
    if (!d.fashion_mnist().dir().empty()) c.fashion_mnist_dir = d.fashion_mnist().dir();
    c.normalize = !d.fashion_mnist().has_normalize() || d.fashion_mnist().normalize();
  } else if (d.has_text()) {
    c.kind = train::DataConfig::Kind::kText;
    c.text_path = d.text().path();
  } else if (d.has_tokens()) {
    c.kind = train::DataConfig::Kind::kTokens;
    c.tokens_train_path = d.tokens().train();
    c.tokens_validation_path = d.tokens().validation();
  } else if (d.has_mnist()) {
    c.kind = train::DataConfig::Kind::kMnist;
    if (!d.mnist().dir().empty()) c.mnist_dir = d.mnist().dir();
    c.normalize = !d.mnist().has_normalize() || d.mnist().normalize();
  } else {
    return absl::InvalidArgumentError("data: set fashion_mnist, mnist, text or tokens");
  }
  return c;
}

absl::StatusOr<train::CheckpointConfig> CheckpointOf(const JobSpec& spec) {
  const CheckpointSpec& cs = spec.checkpoint();
  train::CheckpointConfig c;
  c.dir = cs.dir();
  c.every_steps = cs.every_steps();
  c.every_seconds = cs.every_seconds();
  c.every_auto = cs.every() == "auto";
  c.preemption_rate_per_hour = cs.preemption_rate_per_hour();
  c.keep_last = cs.keep_last();
  c.keep_every = cs.keep_every();
  c.skip_when_busy = cs.on_busy() == CheckpointSpec::ON_BUSY_SKIP;
  c.fail_on_failure = cs.on_failure() == CheckpointSpec::ON_FAILURE_FAIL;
  c.drain_grace_seconds = cs.drain_grace_seconds();
  RM_ASSIGN_OR_RETURN(spec::ResumePoint resume, spec::ParseResume(spec.resume()));
  switch (resume.kind) {
    case spec::ResumePoint::Kind::kAuto:
      c.resume.kind = train::ResumeConfig::Kind::kAuto;
      break;
    case spec::ResumePoint::Kind::kNever:
      c.resume.kind = train::ResumeConfig::Kind::kNever;
      break;
    case spec::ResumePoint::Kind::kStep:
      c.resume.kind = train::ResumeConfig::Kind::kStep;
      break;
    case spec::ResumePoint::Kind::kExtend:
      c.resume.kind = train::ResumeConfig::Kind::kExtend;
      break;
  }
  c.resume.step = resume.step;
  c.resume.text = spec.resume();
  c.spec_hash = spec::TrainingSpecHash(spec);
  c.training_spec = spec::TrainingSpecText(spec);
  for (absl::string_view field : spec::kLengthFields) c.length_fields.emplace_back(field);
  return c;
}

}  // namespace

std::string ConfigFingerprint(const JobSpec& spec) {
  JobSpec training = spec;
  for (absl::string_view field : spec::kLengthFields) {
    const absl::Status cleared = spec::ClearFieldAtPath(&training, field);
    CHECK(cleared.ok()) << "kLengthFields names no field: " << cleared;
  }
  return absl::StrFormat("%016x", spec::TrainingSpecHash(training));
}

absl::StatusOr<TrainConfig> TrainConfigFromSpec(const JobSpec& spec) {
  TrainConfig c;
  c.name = spec.name();
  c.seed = spec.seed();
  c.init_from = spec.init_from();
  RM_ASSIGN_OR_RETURN(c.model, ModelOf(spec));
  RM_ASSIGN_OR_RETURN(c.data, DataOf(spec.data()));
  c.data.text_as_gpt2_tokens = spec.model().has_gpt2();
  if (spec.length_case() == JobSpec::kSteps) {
    c.steps = spec.steps();
    c.epochs = 0;
  } else {
    c.steps = 0;
    c.epochs = spec.epochs();
  }
  c.global_batch = spec.batch().global();
  c.accumulation = spec.batch().accumulation();
  c.micro_max = spec.batch().micro_max();
  RM_ASSIGN_OR_RETURN(c.optimizer, OptimizerOf(spec.optimizer()));
  c.lr = spec.optimizer().lr();
  c.clip_grad_norm = spec.optimizer().clip_grad_norm();
  c.schedule.base_batch = spec.schedule().base_batch();
  c.schedule.warmup_steps = spec.schedule().warmup_steps();
  c.schedule.decay = DecayOf(spec.schedule());
  c.schedule.min_lr_ratio = spec.schedule().min_lr_ratio();
  c.precision = PrecisionOf(spec.precision());
  c.tf32 = spec.precision().tf32();
  const LossScaleSpec& ls = spec.precision().loss_scale();
  c.loss_scale.mode = ls.mode() == LossScaleSpec::MODE_FIXED
                          ? train::LossScalerOptions::Mode::kFixed
                          : train::LossScalerOptions::Mode::kDynamic;
  c.loss_scale.initial_scale = ls.initial();
  c.loss_scale.growth_interval = ls.growth_interval();
  c.loss_scale.growth_factor = ls.growth_factor();
  c.loss_scale.backoff_factor = ls.backoff_factor();
  c.reduce_precision = ReducePrecisionOf(spec.precision());
  const ParallelismSpec& p = spec.parallelism();
  c.zero_stage = p.zero_stage();
  c.fsdp = FsdpOf(p.fsdp());
  if (p.mesh().has_tp()) c.mesh.tp = p.mesh().tp();
  if (p.mesh().has_pp()) c.mesh.pp = p.mesh().pp();
  c.pipeline = PipelineOf(p.pipeline());
  c.bucket_mb = p.bucket_mb();
  c.overlap = p.overlap();
  c.threads = p.threads();
  c.device = spec.device() == JobSpec::DEVICE_CPU    ? TrainConfig::Device::kCpu
             : spec.device() == JobSpec::DEVICE_CUDA ? TrainConfig::Device::kCuda
                                                     : TrainConfig::Device::kAuto;
  c.backend = spec.backend() == JobSpec::BACKEND_TCP    ? TrainConfig::Backend::kTcp
              : spec.backend() == JobSpec::BACKEND_NCCL ? TrainConfig::Backend::kNccl
                                                        : TrainConfig::Backend::kAuto;
  RM_ASSIGN_OR_RETURN(c.checkpoint, CheckpointOf(spec));
  c.log_every = spec.diagnostics().log_every();
  c.fingerprint_every = spec.diagnostics().fingerprint_every();
  c.metrics_jsonl = spec.metrics().jsonl();
  c.metrics_run = spec.metrics().run();
  c.config_fingerprint = ConfigFingerprint(spec);
  c.metrics_tensorboard = spec.metrics().tensorboard();
  return c;
}

}  // namespace ringmaster::config
