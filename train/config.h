// What the trainer is asked to do, as plain options: the model, the data, the length, the
// batch, the optimizer and its schedule, precision, parallelism, device, checkpoints and
// diagnostics of one job. train/ never reads the wire types (proto/, spec/): turning a
// validated JobSpec into a TrainConfig is config/train_config.h's job, which also fills
// every default. Error messages still name the spec fields a user writes (optimizer.lr,
// checkpoint.dir, ...), since that is where a user changes them.
#ifndef RINGMASTER_TRAIN_CONFIG_H_
#define RINGMASTER_TRAIN_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/data/fashion_mnist.h"
#include "train/model.h"
#include "train/nn/classifiers.h"
#include "train/nn/gpt.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"

namespace ringmaster::train {

// The model, described apart from the data it meets (the inputs and classes of an MLP come
// from the data set; train/model_factory.h puts the two together).
struct ModelConfig {
  enum class Kind { kMlp, kCnn, kGpt, kResnet18 };
  Kind kind = Kind::kMlp;
  std::vector<int64_t> mlp_hidden = {512, 512};
  std::vector<int64_t> cnn_channels = {16, 32};
  int64_t cnn_fc = 128;
  int64_t resnet18_width = 64;
  // BatchNorm statistics over every data-parallel rank's batch (the trainer passes the sums
  // to the model and turns gradient overlap off).
  bool resnet18_sync_batchnorm = false;
  // layers, heads, width, context, vocab and checkpoint_every (activation checkpointing).
  nn::GptOptions gpt;
};

struct DataConfig {
  enum class Kind { kFashionMnist, kText, kTokens, kMnist };
  Kind kind = Kind::kFashionMnist;
  std::string fashion_mnist_dir = data::kDefaultFashionMnistDir;
  std::string mnist_dir = data::kDefaultMnistDir;  // kMnist
  bool normalize = true;  // standardise the pixels (false: scale to [0, 1] only)
  std::string text_path;  // kText: the corpus file; samples are gpt.context + 1 bytes
  // kText with model.gpt2: the file is read as GPT-2's tokens (its byte-level BPE, after an
  // <|endoftext|>, as `ringctl data prepare FILE` writes them), not as bytes.
  bool text_as_gpt2_tokens = false;
  // kTokens: token files (train/data/token_file.h); samples are gpt.context + 1 tokens, each
  // below gpt.vocab. An empty validation path: no evaluation.
  std::string tokens_train_path, tokens_validation_path;
  bool eval_every_epoch = true;
  // Evaluate every this many steps too (and after the last step with final_eval); 0: not
  // by steps.
  int64_t eval_every_steps = 0;
  // Evaluate the final parameters after the last step (data.final_eval), unless the last
  // evaluation is of them already.
  bool final_eval = true;
  // Evaluate on this many samples spread evenly over the evaluation data; 0: all of it.
  int64_t eval_samples = 0;
};

// Where to resume from (checkpoint.resume).
struct ResumeConfig {
  enum class Kind { kAuto, kNever, kStep, kExtend };
  Kind kind = Kind::kAuto;
  int64_t step = 0;  // kStep
  std::string text = "auto";  // as the user wrote it, for messages
};

struct CheckpointConfig {
  std::string dir;  // empty: no checkpoints
  int64_t every_steps = 0;
  double every_seconds = 0;
  // checkpoint.every: auto: rank 0 saves when Young/Daly's interval sqrt(2·C/λ) has passed
  // (C: what a save measured costs the training loop; λ: the larger of
  // preemption_rate_per_hour and the rate the coordinator signals), at most every_seconds
  // when set, else an hour (train/checkpoint_policy.h).
  bool every_auto = false;
  double preemption_rate_per_hour = 0;
  int keep_last = 3;
  int64_t keep_every = 0;
  bool skip_when_busy = false;  // on_busy: skip (else wait)
  bool fail_on_failure = false;  // on_failure: fail (else continue)
  double drain_grace_seconds = 30;
  ResumeConfig resume;
  // The job's identity as a checkpoint records it: a hash and a canonical text of the spec's
  // training fields (a resume refuses another job's checkpoint), and the fields that may
  // differ under resume: extend (the length: steps, epochs).
  uint64_t spec_hash = 0;
  std::string training_spec;
  std::vector<std::string> length_fields;
};

// Fully sharded data parallelism (zero_stage 3; stage 2 shards only gradients, in units of
// bucket_mb): how the model is cut into units, each gathered whole (all-gather) just before
// its forward and its backward and its gradients reduce-scattered once final
// (train/fsdp_layout.h, train/fsdp.h).
struct FsdpConfig {
  // parallelism.fsdp.wrap: a unit per layer with parameters (a Linear, a LayerNorm, a
  // convolution, the embeddings), per block (a transformer block, the embeddings, the head;
  // a classifier's layers), or the whole model as one unit.
  enum class Wrap { kLayer, kBlock, kModel };
  Wrap wrap = Wrap::kBlock;
  // parallelism.fsdp.prefetch: start the next unit's all-gather while the current unit
  // computes, in forward (the next unit), backward (the one before), both or neither.
  enum class Prefetch { kNone, kForward, kBackward, kBoth };
  Prefetch prefetch = Prefetch::kBoth;
  // parallelism.fsdp.prefetch_limit: all-gathers in flight ahead of the unit in use (>= 1).
  int prefetch_limit = 1;
  // parallelism.fsdp.reshard_after_forward: free a unit's gathered parameters after its
  // forward (gathered again for backward); false keeps them from forward to backward.
  bool reshard_after_forward = true;
};

inline const char* WrapName(FsdpConfig::Wrap w) {
  return w == FsdpConfig::Wrap::kLayer ? "layer" : w == FsdpConfig::Wrap::kModel ? "model" : "block";
}
inline const char* PrefetchName(FsdpConfig::Prefetch p) {
  switch (p) {
    case FsdpConfig::Prefetch::kNone: return "none";
    case FsdpConfig::Prefetch::kForward: return "forward";
    case FsdpConfig::Prefetch::kBackward: return "backward";
    case FsdpConfig::Prefetch::kBoth: return "both";
  }
  return "both";
}

// parallelism.mesh: the model-parallel degrees of the rank mesh pp × dp × tp (tp innermost,
// pp outermost; ARCHITECTURE.md "Parallelism"); data parallelism takes the rest, dp = world
// size ÷ (tp · pp), which the trainer checks divides.
struct MeshConfig {
  int tp = 1;  // tensor parallelism: each GPT block's heads and MLP hidden units split tp ways
  int pp = 1;  // pipeline parallelism: the GPT's blocks cut into pp stages of contiguous blocks
};

// parallelism.pipeline.schedule: gpipe, 1f1b, interleaved_1f1b, zero_bubble. The trainer maps
// it onto train/pipeline/schedule.h's ScheduleKind (this header does not depend on it).
enum class PipelineScheduleKind { kGPipe, kOneFOneB, kInterleaved1F1B, kZeroBubble };

// parallelism.pipeline: how a mesh with pp > 1 runs a step (unused when pp is 1).
struct PipelineConfig {
  PipelineScheduleKind schedule = PipelineScheduleKind::kOneFOneB;
  // m: micro-batches a data-parallel replica's share of the global batch is cut into (>= 1).
  int micro_batches = 1;
  // v: model chunks per rank (>= 1; > 1 with kInterleaved1F1B only, whose m is a multiple
  // of pp).
  int virtual_stages = 1;
};

struct TrainConfig {
  std::string name;  // the job's name (checkpoints live in <checkpoint.dir>/<name>)
  uint64_t seed = 0;
  ModelConfig model;
  DataConfig data;
  // The length: `steps` when > 0, else `epochs` passes over the training data.
  int64_t steps = 0;
  int64_t epochs = 1;
  // batch.global, and how this rank's share is split: accumulation micro-batches when > 0,
  // else micro-batches of at most micro_max when > 0, else one.
  int64_t global_batch = 32;
  int64_t accumulation = 0;
  int64_t micro_max = 0;
  OptimizerOptions optimizer = SgdOptions{};
  double lr = 0.01;
  double clip_grad_norm = 0;  // 0: no clipping
  // The schedule's shape; base_lr, global_batch and total_steps are filled by the trainer.
  LrScheduleOptions schedule;
  Precision precision = Precision::kFloat32;
  bool tf32 = false;
  LossScalerOptions loss_scale;  // fp16 only
  // precision.reduce: the gradients' reduction under ZeRO-2/3 (kFloat32 or kBFloat16).
  Precision reduce_precision = Precision::kFloat32;
  // 0-3 without a mesh; 0-2 with one (along dp: ZeRO-2 there reduce-scatters the stages'
  // gradients and all-gathers the parameters, Megatron's distributed optimizer, while the
  // gradient buffer stays whole: the micro-batches accumulate into it).
  int zero_stage = 0;
  FsdpConfig fsdp;
  MeshConfig mesh;          // tp × pp; data parallelism over the rest of the world
  PipelineConfig pipeline;  // mesh.pp > 1 only
  double bucket_mb = 25;
  bool overlap = true;
  int threads = 0;  // BLAS threads per rank; 0: the host's cores shared among its ranks
  enum class Device { kAuto, kCpu, kCuda };
  Device device = Device::kAuto;
  enum class Backend { kAuto, kTcp, kNccl };
  Backend backend = Backend::kAuto;
  CheckpointConfig checkpoint;
  int64_t log_every = 20;
  int64_t fingerprint_every = 0;
  std::string metrics_jsonl;  // empty: no metrics file
  // Written in every metrics record, to tell runs apart: the run's name (metrics.run) and
  // the configuration's fingerprint (16 hex digits; config/train_config.h).
  std::string metrics_run;
  std::string config_fingerprint;
  // TensorBoard event files of rank 0's metrics (train/tensorboard_writer.h); empty: none.
  std::string metrics_tensorboard;
  // Weights to start from (JobSpec.init_from): a GPT-2 safetensors file or a checkpoint
  // directory (checkpoint/weights.h ReadWeights); read when no checkpoint of this job is
  // resumed. Empty: the seed's initialisation.
  std::string init_from;
};

// Whether `config` runs on a mesh (mesh.tp or mesh.pp > 1): the pipeline-parallel strategy
// (train/pipeline_parallel.h) with data parallelism along dp.
inline bool HasMesh(const TrainConfig& config) { return config.mesh.tp > 1 || config.mesh.pp > 1; }

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_CONFIG_H_
