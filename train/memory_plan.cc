#include "train/memory_plan.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "state/tensor.h"
#include "train/data/partition.h"
#include "train/device.h"
#include "train/fsdp.h"
#include "train/grad_sync.h"
#include "train/model_factory.h"
#include "train/nn/gpt.h"

namespace ringmaster::train {
namespace {

constexpr int64_t kFloatBytes = 4;
constexpr int64_t kHalfBytes = 2;
// Fashion-MNIST's test split (train/data/fashion_mnist.h, FashionMnistSplit::kTest).
constexpr int64_t kFashionMnistTestSamples = 10000;
// The trainer's smallest evaluation batch (Trainer::State::Evaluate).
constexpr int64_t kEvaluationBatch = 256;


// The most units that one segment of `checkpoint_every` consecutive blocks touches: they
// stay gathered from the segment's recomputation to its backward (train/fsdp.h).
int64_t UnitsPerSegment(const FsdpLayout& layout, const std::vector<ParameterGroup>& groups,
                        int64_t checkpoint_every) {
  if (checkpoint_every <= 0 || groups.empty()) return 1;
  int64_t most = 1;
  const int last_block = groups.back().block;
  for (int first = 0; first <= last_block; ++first) {
    int64_t units = 0;
    int previous = -1;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].block < first || groups[g].block >= first + checkpoint_every) continue;
      if (layout.unit_of_group[g] != previous) ++units;
      previous = layout.unit_of_group[g];
    }
    most = std::max(most, units);
  }
  return most;
}

// How many unit buffers the strategy's pool holds at once (see memory_plan.h for why): up to
// `gathered` for gathered parameters (or ZeRO-2's buckets) and up to `gradients` for
// gradients written apart from them.
struct UnitBufferCount {
  int64_t gathered = 0;
  int64_t gradients = 0;
  int64_t largest = 0;  // buffers of the largest unit's size, whichever unit they serve
};

UnitBufferCount UnitBuffers(const TrainConfig& config, const FsdpLayout& layout,
                            const std::vector<ParameterGroup>& groups, int zero_stage) {
  const int64_t units = static_cast<int64_t>(layout.units.size());
  const int64_t two = std::min<int64_t>(units, 2);
  // The gradient buffers: the one written and the reductions still queued (fsdp.h); the
  // gathers of the whole model after the optimizer step take a buffer of the largest unit,
  // which may then serve any bucket: each counts as the largest.
  if (zero_stage == 2) return {0, 0, 2};
  const FsdpConfig& f = config.fsdp;
  const int64_t ahead = f.prefetch == FsdpConfig::Prefetch::kNone ? 0 : f.prefetch_limit;
  if (!f.reshard_after_forward) return {units, two};
  const int64_t segment = config.model.kind == ModelConfig::Kind::kGpt
                              ? UnitsPerSegment(layout, groups, config.model.gpt.checkpoint_every)
                              : 1;
  // A tied LM head's embeddings unit stays gathered through the pass (fsdp_layout.h).
  const bool kept = std::any_of(layout.units.begin(), layout.units.end(),
                                [](const FsdpUnit& u) { return u.kept_through_pass; });
  // On the CPU, when every unit backward gathers writes its gradients over its parameters
  // (fsdp.h), no unit needs a second buffer for them: backward holds the units in use and
  // those prefetched, the one being reduced giving its buffer to the next gather; a unit
  // backward does not gather (the embeddings) takes one while the last reduction runs. A
  // GPU (device: cuda, or auto with one) writes them apart, as does a tied head's
  // embeddings unit (kept through the pass). Never more gathered buffers than units.
  const bool in_place =
      PlannedDevice(config) == TrainConfig::Device::kCpu &&
      std::all_of(layout.units.begin(), layout.units.end(), [](const FsdpUnit& u) {
        return u.gradients_in_place || !u.backward_reads_parameters;
      });
  if (in_place) return {std::min(units, std::max<int64_t>(segment + ahead, 2)), 0};
  return {std::min(units, segment + ahead + (kept ? 1 : 0)), two};
}

// The elements of the `count` largest units (each unit's padded size, as the pool is asked
// for it): a pool holding `count` buffers holds at most these.
int64_t LargestUnits(const FsdpLayout& layout, int64_t count) {
  std::vector<int64_t> sizes;
  for (const FsdpUnit& u : layout.units) sizes.push_back(u.padded);
  std::sort(sizes.begin(), sizes.end(), std::greater<int64_t>());
  int64_t sum = 0;
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(sizes.size()); ++i) sum += sizes[i];
  return sum;
}

// The unit buffers and the strategy's staging (see memory_plan.h).
int64_t UnitBufferBytes(const TrainConfig& config, const FsdpLayout& layout,
                        const std::vector<ParameterGroup>& groups, int zero_stage,
                        int accumulation_steps) {
  const int64_t unit = layout.largest_unit;
  const int64_t shard = unit / layout.world;
  int64_t staging = accumulation_steps > 1 ? kFloatBytes * shard : 0;
  if (IsHalf(config.precision) || IsHalf(config.reduce_precision)) {
    staging += kHalfBytes * (unit + shard);
  }
  const UnitBufferCount count = UnitBuffers(config, layout, groups, zero_stage);
  return (LargestUnits(layout, count.gathered) + LargestUnits(layout, count.gradients) +
          count.largest * unit) *
             kFloatBytes +
         staging;
}

// A ParameterStore for measuring: every group's parameters (zero) and gradients in one
// buffer each, as large as the largest group.
class MeasuringStore final : public ParameterStore {
 public:
  MeasuringStore(const state::TensorTable& table, const std::vector<ParameterGroup>& groups) {
    int64_t largest = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t begin = table.tensor(groups[g].first_tensor).offset;
      const int64_t end = g + 1 < groups.size() ? table.tensor(groups[g + 1].first_tensor).offset
                                                : table.total_elements();
      begin_.push_back(begin);
      largest = std::max(largest, end - begin);
    }
    params_ = state::FlatBuffer(largest);
    grads_ = state::FlatBuffer(largest);
  }
  const float* Parameters(int group) override { return params_.data() - begin_[group]; }
  void BeginBackward() override {}
  float* Gradients(int group) override { return grads_.data() - begin_[group]; }
  void GradientsDone(int) override {}

 private:
  std::vector<int64_t> begin_;  // per group: its first element in the flat space
  state::FlatBuffer params_, grads_;
};

// `samples` of the data's shape, all zero (the first class, the first token).
Batch SyntheticBatch(const data::DatasetInfo& info, int64_t samples) {
  Batch b;
  b.size = samples;
  if (info.context > 0) {
    b.context = info.context;
    b.tokens.assign(samples * (info.context + 1), 0);
  } else {
    b.feature_dim = info.feature_dim;
    b.features.assign(samples * info.feature_dim, 0.0f);
    b.labels.assign(samples, 0);
  }
  return b;
}

absl::StatusOr<int64_t> Measure(const TrainConfig& config, int world, int64_t evaluation_samples) {
  RM_ASSIGN_OR_RETURN(const data::BatchPlan plan, PlanRankBatches(config, world));
  const data::DatasetInfo info = DescribeJobData(config);
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(config.model, info));
  MeasuringStore measuring(model->table(), model->parameter_groups());
  // A model with buffers (BatchNorm running statistics: ResNet-18) runs on whole flat buffers
  // only; it is small enough to allocate them.
  const bool whole = model->buffer_range().size() > 0;
  ParameterStore* store = whole ? nullptr : &measuring;
  state::FlatBuffer params, grads;
  if (whole) {
    params = state::FlatBuffer(model->table().total_elements());
    grads = state::FlatBuffer(model->table().total_elements());
    model->Init(config.seed, params);
  }
  ForwardBackwardOptions fb;
  fb.loss_divisor = static_cast<double>(plan.max_micro_batch * model->LossTermsPerSample());
  fb.precision = config.precision;
  fb.store = store;
  RM_RETURN_IF_ERROR(
      model->ForwardBackward(SyntheticBatch(info, plan.max_micro_batch), params, grads, fb)
          .status());
  if (evaluation_samples > 0) {
    int64_t largest = 0;
    const int64_t batch = EvaluationBatchSamples(config, plan);
    for (const data::Range& r : data::EvaluationBatches(evaluation_samples, batch, world, 0)) {
      largest = std::max(largest, r.end - r.begin);
    }
    if (largest > 0) {
      RM_RETURN_IF_ERROR(
          model->Evaluate(SyntheticBatch(info, largest), params, config.precision, store).status());
    }
  }
  return model->memory().activation_bytes_peak;
}

absl::Status CheckWorld(int world) {
  if (world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world: ", world, " ranks; a job needs at least 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<data::BatchPlan> PlanRankBatches(const TrainConfig& config, int world) {
  data::BatchPlanOptions po;
  po.global_batch = config.global_batch;
  po.world_size = world;
  const char* field = "batch.global";
  if (config.accumulation > 0) {
    po.accumulation_steps = static_cast<int>(config.accumulation);
    field = "batch.accumulation";
  } else if (config.micro_max > 0) {
    po.max_micro_batch = config.micro_max;
    field = "batch.micro_max";
  } else {
    po.accumulation_steps = 1;
  }
  absl::StatusOr<data::BatchPlan> plan = data::PlanBatches(po);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(field, ": ", plan.status().message()));
  }
  return plan;
}

const char* ActivationMethodName(ActivationMethod method) {
  return method == ActivationMethod::kComputed ? "computed" : "measured";
}

std::string RankMemoryPlan::Name() const {
  return zero_stage == 3 ? absl::StrCat("ZeRO-3 ", WrapName(wrap)) : absl::StrCat("ZeRO-", zero_stage);
}

int OptimizerMoments(const OptimizerOptions& options) {
  if (const auto* sgd = std::get_if<SgdOptions>(&options)) return sgd->momentum > 0 ? 1 : 0;
  return 2;  // AdamW, LAMB: exp_avg and exp_avg_sq
}

TrainConfig::Device PlannedDevice(const TrainConfig& config) {
  if (config.device != TrainConfig::Device::kAuto) return config.device;
  return CudaDeviceAvailable() ? TrainConfig::Device::kCuda : TrainConfig::Device::kCpu;
}

absl::StatusOr<RankMemoryPlan> PlanRankState(const TrainConfig& config, const Model& model,
                                             int world, int zero_stage, FsdpConfig::Wrap wrap) {
  return PlanRankState(config, model, world, /*rank=*/0, zero_stage, wrap);
}

absl::StatusOr<RankMemoryPlan> PlanRankState(const TrainConfig& config, const Model& model,
                                             int world, int rank, int zero_stage,
                                             FsdpConfig::Wrap wrap) {
  RM_RETURN_IF_ERROR(CheckWorld(world));
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is not a rank of a world of ", world, " (0..", world - 1,
                     ")"));
  }
  if (zero_stage < 0 || zero_stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.zero_stage: ", zero_stage, " is not 0, 1, 2 or 3"));
  }
  if (config.fsdp.prefetch_limit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.fsdp.prefetch_limit: ",
                                                   config.fsdp.prefetch_limit, " < 1"));
  }
  const state::TensorTable& table = model.table();
  RankMemoryPlan plan;
  plan.world = world;
  plan.rank = rank;
  plan.zero_stage = zero_stage;
  plan.wrap = wrap;
  const int64_t moments = OptimizerMoments(config.optimizer);
  if (zero_stage <= 1) {
    const int64_t padded = PaddedElements(table.total_elements(), world);
    plan.parameter_bytes = plan.gradient_bytes = padded * kFloatBytes;
    if (IsHalf(config.precision)) plan.compute_copy_bytes = padded * kFloatBytes;
    // ZeRO-1: the rank's shard of the padded space cut back to the tensors (the last
    // ranks' hold the padding, which has no state: parallel_strategy.cc).
    const int64_t shard = padded / world;
    const int64_t total = table.total_elements();
    const int64_t kept = zero_stage == 0 ? total
                                         : std::min((rank + 1) * shard, total) -
                                               std::min(rank * shard, total);
    plan.optimizer_bytes = moments * kept * kFloatBytes;
    return plan;
  }
  ShardedOptions so = ShardedOptionsFor(config, model);
  so.zero_stage = zero_stage;
  so.fsdp.wrap = wrap;
  RM_ASSIGN_OR_RETURN(const FsdpLayout layout, ShardedLayout(so, world));
  RM_ASSIGN_OR_RETURN(const data::BatchPlan batches, PlanRankBatches(config, world));
  plan.parameter_bytes = plan.gradient_bytes = layout.local_elements * kFloatBytes;
  if (zero_stage == 2) plan.compute_copy_bytes = table.total_elements() * kFloatBytes;
  plan.optimizer_bytes = moments * layout.local_elements * kFloatBytes;
  TrainConfig wrapped = config;
  wrapped.fsdp.wrap = wrap;
  plan.unit_buffer_bytes =
      UnitBufferBytes(wrapped, layout, so.groups, zero_stage, batches.accumulation_steps);
  return plan;
}

int64_t EvaluationSamples(const TrainConfig& config) {
  return config.data.kind == DataConfig::Kind::kFashionMnist ||
                 config.data.kind == DataConfig::Kind::kMnist
             ? kFashionMnistTestSamples
             : 0;
}

int64_t EvaluationBatchSamples(const TrainConfig& config, const data::BatchPlan& plan) {
  if (config.model.kind == ModelConfig::Kind::kGpt) return plan.max_micro_batch;
  return std::max(kEvaluationBatch, plan.max_micro_batch);
}

absl::StatusOr<int64_t> MeasureActivationBytes(const TrainConfig& config, int world,
                                               int64_t evaluation_samples) {
  RM_RETURN_IF_ERROR(CheckWorld(world));
  try {
    return Measure(config, world, evaluation_samples);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("the activations of one micro-batch, to measure them");
  }
}

absl::StatusOr<PlannedActivations> PlanActivationBytes(const TrainConfig& config, int world) {
  RM_RETURN_IF_ERROR(CheckWorld(world));
  RM_ASSIGN_OR_RETURN(const data::BatchPlan plan, PlanRankBatches(config, world));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      CreateModel(config.model, DescribeJobData(config)));
  const int64_t evaluation_samples = EvaluationSamples(config);
  int64_t evaluated = 0;  // the largest evaluation batch a rank runs
  if (evaluation_samples > 0) {
    const int64_t batch = EvaluationBatchSamples(config, plan);
    for (const data::Range& r : data::EvaluationBatches(evaluation_samples, batch, world, 0)) {
      evaluated = std::max(evaluated, r.end - r.begin);
    }
  }
  const auto* gpt = dynamic_cast<const nn::GptModel*>(model.get());
  if (gpt != nullptr && evaluated <= plan.max_micro_batch) {
    return PlannedActivations{gpt->ActivationBytesFor(plan.max_micro_batch),
                              ActivationMethod::kComputed};
  }
  RM_ASSIGN_OR_RETURN(const int64_t bytes,
                      MeasureActivationBytes(config, world, evaluation_samples));
  return PlannedActivations{bytes, ActivationMethod::kMeasured};
}

absl::StatusOr<RankMemoryPlan> PlanRankMemory(const TrainConfig& config, int world,
                                              int zero_stage, FsdpConfig::Wrap wrap) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      CreateModel(config.model, DescribeJobData(config)));
  RM_ASSIGN_OR_RETURN(RankMemoryPlan plan, PlanRankState(config, *model, world, zero_stage, wrap));
  RM_ASSIGN_OR_RETURN(const PlannedActivations activations, PlanActivationBytes(config, world));
  plan.activation_bytes = activations.bytes;
  plan.activation_method = activations.method;
  return plan;
}

absl::StatusOr<std::vector<RankMemoryPlan>> PlanEveryConfiguration(const TrainConfig& config,
                                                                   int world) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      CreateModel(config.model, DescribeJobData(config)));
  const std::pair<int, FsdpConfig::Wrap> configurations[] = {
      {0, config.fsdp.wrap},         {1, config.fsdp.wrap},
      {2, config.fsdp.wrap},         {3, FsdpConfig::Wrap::kLayer},
      {3, FsdpConfig::Wrap::kBlock}, {3, FsdpConfig::Wrap::kModel},
  };
  std::vector<RankMemoryPlan> plans;
  // A model with buffers (BatchNorm's running statistics) keeps them in whole flat buffers:
  // stages 0 and 1 only (spec/validate.cc refuses the others).
  const bool buffers = model->buffer_range().size() > 0;
  for (const auto& [stage, wrap] : configurations) {
    if (buffers && stage >= 2) continue;
    RM_ASSIGN_OR_RETURN(RankMemoryPlan plan, PlanRankState(config, *model, world, stage, wrap));
    plans.push_back(plan);
  }
  RM_ASSIGN_OR_RETURN(const PlannedActivations activations, PlanActivationBytes(config, world));
  for (RankMemoryPlan& plan : plans) {
    plan.activation_bytes = activations.bytes;
    plan.activation_method = activations.method;
  }
  return plans;
}

}  // namespace ringmaster::train
