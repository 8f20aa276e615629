// The memory one CPU rank of a job holds, planned without training it (seed exercise 26.14,
// `ringctl estimate memory`): per ZeRO stage and wrapping, the bytes of each buffer the
// trainer's parts allocate, computed from the model's table and parameter groups and the
// layout the strategy would use (train/fsdp.h ShardedLayout), not from the ZeRO paper's
// formula (train/memory_estimate.h) — so padding, buckets and unit buffers are in it.
//
// The terms, for rank 0 (whose share is the largest) unless a rank is given, 4 bytes a float:
//   parameters     the step's fp32 parameter buffer: the whole padded flat space
//                  (PaddedElements(total elements, world)) for stages 0 and 1, the rank's
//                  piece of every unit (FsdpLayout::local_elements) for stages 2 and 3.
//   compute copy   the whole model as forward reads it: ZeRO-2's compute copy in the
//                  strategy (the table's total elements, any precision), or under bf16/fp16
//                  for stages 0 and 1 the model's rounded copy of the parameter buffer (see
//                  train/nn/gpt.h, "Not counted in the peak"); none for ZeRO-3, whose
//                  gathered units are the unit buffers.
//   gradients      the step's gradient buffer: as the parameters, whole or the shard.
//   optimizer      moments (SGD with momentum 1, without 0; AdamW and LAMB 2) × the elements
//                  the optimizer keeps state for: the table's total elements (stage 0), the
//                  rank's shard of the padded space cut back to the tensors (stage 1), or
//                  local_elements (stages 2 and 3). Optimizer::state_bytes() of the real one.
//   unit buffers   the bytes of the most buffers the strategy's pool can hold at once
//                  (train/unit_buffer_pool.h: each the size of a unit it served, no more
//                  buffers than were in use at once): the sum of that many of the largest
//                  padded units, "top(n)", U being the largest, p = prefetch_limit (0 with
//                  prefetch: none), s the most units one segment of activation checkpointing
//                  keeps gathered from its recomputation to its backward (1 without
//                  checkpointing; one more with a tied LM head, whose embeddings unit stays
//                  gathered through the pass). ZeRO-3 with reshard_after_forward:
//                  top(min(units, max(s + p, 2))) when every unit backward gathers writes its
//                  gradients over its parameters (the GPT on the CPU: device cpu, or auto
//                  without a GPU, PlannedDevice; fsdp.h), else top(min(units, s + p)) for the
//                  gathered units plus top(min(units, 2)) for the gradients, the one written
//                  and the one reduction the strategy lets queue (fsdp.h's bound: on a GPU,
//                  other models). ZeRO-3 without resharding top(units) + top(min(units, 2))
//                  (every unit gathered from forward to backward). ZeRO-2 2 × U (one bucket
//                  written while the one before is reduced; the gathers after the optimizer
//                  step take a buffer of U that may then serve any bucket). The pool reaches
//                  this figure with equal units (block wrapping, a GPT deep enough that a
//                  recomputed segment prefetches past itself) and with one unit; with layer
//                  wrapping it may hold a little less, depending on when the communication
//                  thread gives buffers back (memory_plan_trainer_test).
//                  On top the staging: with gradient accumulation one fp32 shard of U, and
//                  with bf16/fp16 gathers or a bf16 reduction one unit and one shard in 16
//                  bits. 0 for stages 0 and 1.
//   activations    what the model reports as MemoryStats.activation_bytes_peak after what
//                  the trainer runs (the number the trainer's memory line prints for the
//                  CPU): for a GPT computed from its buffers' sizes (ActivationBytesFor, the
//                  arena's layout checked against the one it allocates at every pass), for
//                  the other models measured on one micro-batch (MeasureActivationBytes;
//                  cheap for their sizes). PlanActivationBytes; the plan says which.
// Not counted: the half-precision staging of one layer's gradients under accumulation
// (stages 0 and 1), batches, the data set, the allocator's overhead. On a GPU the
// activations are the device's arena (GptCuda, SequentialCuda) and differ.
//
// Thread-safety: the functions are pure (MeasureActivationBytes runs a model of its own).
#ifndef RINGMASTER_TRAIN_MEMORY_PLAN_H_
#define RINGMASTER_TRAIN_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/config.h"
#include "train/data/partition.h"
#include "train/model.h"

namespace ringmaster::train {

// Where a plan's activation figure came from.
enum class ActivationMethod {
  kMeasured,  // a model of the job's shape run on one micro-batch (MeasureActivationBytes)
  kComputed,  // the GPT's buffer sizes (nn::GptModel::ActivationBytesFor), nothing run
};
// "measured", "computed".
const char* ActivationMethodName(ActivationMethod method);

struct RankMemoryPlan {
  int world = 1;
  int rank = 0;  // the rank planned for (0: the largest share)
  int zero_stage = 0;
  FsdpConfig::Wrap wrap = FsdpConfig::Wrap::kBlock;  // stage 3's units; unused otherwise
  int64_t parameter_bytes = 0;
  int64_t compute_copy_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t unit_buffer_bytes = 0;
  int64_t activation_bytes = 0;  // 0 until planned (PlanRankState leaves it so)
  ActivationMethod activation_method = ActivationMethod::kMeasured;

  // Parameters with the compute copy, gradients and optimizer state: what the trainer
  // allocates before its first step.
  int64_t state_bytes() const {
    return parameter_bytes + compute_copy_bytes + gradient_bytes + optimizer_bytes;
  }
  int64_t total_bytes() const { return state_bytes() + unit_buffer_bytes + activation_bytes; }
  // "ZeRO-0", "ZeRO-2", "ZeRO-3 block".
  std::string Name() const;
};

// State buffers the optimizer keeps per element it updates (train/optim/optimizer.h): SGD
// 1 with momentum, 0 without; AdamW and LAMB 2.
int OptimizerMoments(const OptimizerOptions& options);

// The state and unit-buffer terms (activation_bytes 0) for `model` (the job's, described:
// only its table and groups are read) on `world` ranks under `zero_stage` and, for stage 3,
// `wrap`; the rest (optimizer, precision, reduce precision, bucket_mb, fsdp prefetch and
// resharding, gpt.checkpoint_every) from `config`. INVALID_ARGUMENT naming the flag or field
// for world < 1, a stage outside 0..3, parallelism.fsdp.prefetch_limit < 1.
absl::StatusOr<RankMemoryPlan> PlanRankState(const TrainConfig& config, const Model& model,
                                             int world, int zero_stage, FsdpConfig::Wrap wrap);
// The same for rank `rank` of `world` (0 <= rank < world, else INVALID_ARGUMENT naming it):
// every term is rank 0's but ZeRO-1's optimizer state, smaller on the last ranks, whose
// shards of the padded space hold the padding (no state) or nothing of the tensors.
absl::StatusOr<RankMemoryPlan> PlanRankState(const TrainConfig& config, const Model& model,
                                             int world, int rank, int zero_stage,
                                             FsdpConfig::Wrap wrap);

// Where the plan's ranks train, which decides how many unit buffers ZeRO-3 needs (below):
// config.device, with `auto` resolved as the trainer resolves it (train/trainer.cc,
// ChooseDevice): a CUDA GPU when this build and machine have one, else the CPU. (A trainer
// whose model has no CUDA path falls back to the CPU; it plans with kCpu itself.)
TrainConfig::Device PlannedDevice(const TrainConfig& config);

// How each rank of `world` splits config.global_batch into micro-batches: the trainer's
// plan (data::PlanBatches from batch.accumulation, else batch.micro_max, else one). Errors
// PlanBatches's, after the spec's batch field that made them ("batch.accumulation: ...").
absl::StatusOr<data::BatchPlan> PlanRankBatches(const TrainConfig& config, int world);

// Test samples the trainer evaluates for `config`'s data: the test split of Fashion-MNIST or
// MNIST (10000 samples); 0 for text, which has no test set, and for token files, whose
// validation batches are no larger than a training micro-batch (EvaluationBatchSamples).
int64_t EvaluationSamples(const TrainConfig& config);

// The samples of one evaluation batch: a language model's micro-batch (its logits are
// micro-batch x context x vocabulary floats), else max(256, micro-batch).
int64_t EvaluationBatchSamples(const TrainConfig& config, const data::BatchPlan& plan);

// The model's MemoryStats.activation_bytes_peak after what a CPU rank of `world` runs: one
// forward and backward of the largest micro-batch (data::PlanBatches from config.global_batch,
// accumulation, micro_max) in config.precision and, when `evaluation_samples` > 0, one
// evaluation of the trainer's largest evaluation batch (EvaluationBatchSamples, at most rank
// 0's share). A fresh model of the job's shape on synthetic data; its parameters and
// gradients go through a ParameterStore with one buffer of the largest parameter group each,
// so a model larger than this machine can be measured if one group and the activations fit
// (a model with buffers, Model::buffer_range, gets whole flat buffers instead).
// Errors: the batch plan's (INVALID_ARGUMENT naming batch.*), the model's, RESOURCE_EXHAUSTED
// when the activations do not fit this machine.
absl::StatusOr<int64_t> MeasureActivationBytes(const TrainConfig& config, int world,
                                               int64_t evaluation_samples);

// A rank's activations for `config` on `world` ranks, and how they were found: for a GPT
// (whose evaluation batches are no larger than its micro-batches) computed from its buffer
// sizes, exact and immediate at any size (a 350M-parameter model in milliseconds, where
// running one micro-batch took minutes and gigabytes); for the other models (MLP, ResNet-18,
// whose activations are small) measured by MeasureActivationBytes. Errors as
// MeasureActivationBytes's.
struct PlannedActivations {
  int64_t bytes = 0;
  ActivationMethod method = ActivationMethod::kMeasured;
};
absl::StatusOr<PlannedActivations> PlanActivationBytes(const TrainConfig& config, int world);

// PlanRankState for the job's model with its activations (PlanActivationBytes).
absl::StatusOr<RankMemoryPlan> PlanRankMemory(const TrainConfig& config, int world,
                                              int zero_stage, FsdpConfig::Wrap wrap);

// Every configuration `ringctl estimate memory` prints, in this order: stages 0, 1, 2, then
// 3 with layer, block and model wrapping (a model with buffers, model.resnet18: 0 and 1
// only, the stages it can run); the activations planned once (PlanActivationBytes).
absl::StatusOr<std::vector<RankMemoryPlan>> PlanEveryConfiguration(const TrainConfig& config,
                                                                   int world);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MEMORY_PLAN_H_
