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
  enum class Kind { kMlp, kCnn, kGpt };
  Kind kind = Kind::kMlp;
  std::vector<int64_t> mlp_hidden = {512, 512};
  std::vector<int64_t> cnn_channels = {16, 32};
  int64_t cnn_fc = 128;
  // layers, heads, width, context, vocab and checkpoint_every (activation checkpointing).
  nn::GptOptions gpt;
};

struct DataConfig {
  enum class Kind { kFashionMnist, kText };
  Kind kind = Kind::kFashionMnist;
  std::string fashion_mnist_dir = data::kDefaultFashionMnistDir;
  bool normalize = true;  // standardise the pixels (false: scale to [0, 1] only)
  std::string text_path;  // kText: the corpus file; samples are gpt.context + 1 bytes
  bool eval_every_epoch = true;
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
  int zero_stage = 0;
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
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_CONFIG_H_
