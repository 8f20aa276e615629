#include "train/memory_plan.h"

#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "comm/tcp/tcp_communicator.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/fsdp.h"
#include "train/grad_sync.h"
#include "train/model_factory.h"
#include "train/optim/optimizer.h"
#include "train/parallel_strategy.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::ExpectOkOnRanks;
using ::testing::HasSubstr;
using Wrap = FsdpConfig::Wrap;
using Prefetch = FsdpConfig::Prefetch;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// A small GPT over text (described: no file is read) and a small MLP over Fashion-MNIST's
// shape.
TrainConfig Gpt(OptimizerOptions optimizer = AdamWOptions{}) {
  TrainConfig c;
  c.model.kind = ModelConfig::Kind::kGpt;
  c.model.gpt.layers = 3;
  c.model.gpt.heads = 2;
  c.model.gpt.width = 16;
  c.model.gpt.context = 8;
  c.model.gpt.vocab = 32;
  c.data.kind = DataConfig::Kind::kText;
  c.data.text_path = "/nonexistent";
  c.optimizer = std::move(optimizer);
  c.global_batch = 12;
  c.bucket_mb = 0.002;  // ZeRO-2: several buckets
  c.device = TrainConfig::Device::kCpu;  // the strategies here are in host memory
  return c;
}

TrainConfig Mlp(OptimizerOptions optimizer = SgdOptions{0.9}) {
  TrainConfig c;
  c.model.kind = ModelConfig::Kind::kMlp;
  c.model.mlp_hidden = {20, 12};
  c.data.kind = DataConfig::Kind::kFashionMnist;
  c.data.fashion_mnist_dir = "/nonexistent";
  c.optimizer = std::move(optimizer);
  c.global_batch = 12;
  c.bucket_mb = 0.01;
  return c;
}

std::unique_ptr<Model> ModelOf(const TrainConfig& config) {
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(config.model, DescribeJobData(config));
  CHECK(m.ok()) << m.status();
  return *std::move(m);
}

// `samples` of the config's data: varied tokens, or pixels and labels.
Batch SomeBatch(const TrainConfig& config, int64_t samples, int seed) {
  Batch b;
  b.size = samples;
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  if (config.model.kind == ModelConfig::Kind::kGpt) {
    b.context = config.model.gpt.context;
    for (int64_t i = 0; i < samples * (b.context + 1); ++i) {
      b.tokens.push_back(static_cast<int32_t>(next() % config.model.gpt.vocab));
    }
  } else {
    b.feature_dim = 784;
    for (int64_t i = 0; i < samples * 784; ++i) {
      b.features.push_back(static_cast<float>(next() % 1000) / 500.0f - 1.0f);
    }
    for (int64_t i = 0; i < samples; ++i) b.labels.push_back(static_cast<int32_t>(next() % 10));
  }
  return b;
}

// Stages 0 and 1: the plan's buffers are those CreateDataParallel and CreateOptimizer
// allocate on this rank (rank 0's optimizer state is the largest, and the plan's).
absl::Status DataParallelMatchesPlan(TcpCommunicator& comm, const TrainConfig& config,
                                     int stage) {
  std::unique_ptr<Model> model = ModelOf(config);
  RM_ASSIGN_OR_RETURN(RankMemoryPlan plan,
                      PlanRankState(config, *model, comm.size(), stage, Wrap::kBlock));
  DataParallelOptions dp;
  dp.elements = model->table().total_elements();
  dp.zero_stage = stage;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> s, CreateDataParallel(&comm, &comm, dp));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                      CreateOptimizer(model->table(), s->update_window(), config.optimizer));
  const int64_t buffer = s->local_elements() * 4;
  if (plan.parameter_bytes != buffer || plan.gradient_bytes != buffer) {
    return Fail(absl::StrCat("ZeRO-", stage, ": planned ", plan.parameter_bytes, " + ",
                             plan.gradient_bytes, " bytes of parameters and gradients; the "
                             "strategy's buffers are ", buffer, " each"));
  }
  const bool largest = comm.rank() == 0;
  if (largest ? opt->state_bytes() != plan.optimizer_bytes
              : opt->state_bytes() > plan.optimizer_bytes) {
    return Fail(absl::StrCat("ZeRO-", stage, " rank ", comm.rank(), ": optimizer state ",
                             opt->state_bytes(), " bytes, planned ", plan.optimizer_bytes));
  }
  if (plan.unit_buffer_bytes != 0) return Fail("unit buffers without units");
  return absl::OkStatus();
}

// Stages 2 and 3: the strategy's step buffers and the optimizer over its pieces are the
// plan's; after a step of `micro` micro-batches its unit buffers peaked within the plan's
// bound, and (where the bound is tight: no prefetch, nothing kept) within one unit of it.
absl::Status ShardedMatchesPlan(TcpCommunicator& comm, const TrainConfig& config, int stage,
                                int micro) {
  const int world = comm.size();
  std::unique_ptr<Model> model = ModelOf(config);
  const state::TensorTable& table = model->table();
  RM_ASSIGN_OR_RETURN(RankMemoryPlan plan,
                      PlanRankState(config, *model, world, stage, config.fsdp.wrap));
  ShardedOptions so;
  so.table = &table;
  so.groups = model->parameter_groups();
  so.zero_stage = stage;
  so.fsdp = config.fsdp;
  so.bucket_mb = config.bucket_mb;
  so.compute = config.precision;
  so.reduce = config.reduce_precision;
  so.op_timeout = absl::Seconds(30);
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> s,
                      CreateShardedDataParallel(&comm, &comm, so));
  RM_ASSIGN_OR_RETURN(FsdpLayout layout, ShardedLayout(so, world));
  RM_ASSIGN_OR_RETURN(
      std::unique_ptr<Optimizer> opt,
      CreateOptimizer(table, s->update_pieces(), s->local_elements(), config.optimizer));
  const int64_t buffer = s->local_elements() * 4;
  if (plan.parameter_bytes != buffer || plan.gradient_bytes != buffer) {
    return Fail(absl::StrCat(plan.Name(), ": planned ", plan.parameter_bytes, " + ",
                             plan.gradient_bytes, " bytes of parameters and gradients; the "
                             "strategy's buffers are ", buffer, " each"));
  }
  if (opt->state_bytes() != plan.optimizer_bytes) {
    return Fail(absl::StrCat(plan.Name(), ": optimizer state ", opt->state_bytes(),
                             " bytes, planned ", plan.optimizer_bytes));
  }
  const int64_t copy = stage == 2 ? table.total_elements() * 4 : 0;
  if (plan.compute_copy_bytes != copy) {
    return Fail(absl::StrCat(plan.Name(), ": compute copy ", plan.compute_copy_bytes));
  }

  state::FlatBuffer full(table.total_elements()), master(s->local_elements()),
      grads(s->local_elements());
  model->Init(3, full);
  for (const state::PlacedRange& p : s->update_pieces()) {
    std::copy_n(full.data() + p.range.begin, p.range.size(), master.data() + p.at);
  }
  RM_RETURN_IF_ERROR(s->AfterOptimizerStep(master.span()));
  RM_RETURN_IF_ERROR(s->MaterializeParameters(master.span()));
  s->BeginGradients(grads.data(), /*measure_local_norm=*/false);
  for (int k = 0; k < micro; ++k) {
    s->BeginPass(ParallelStrategy::Pass::kTrain);
    ForwardBackwardOptions fb;
    fb.precision = config.precision;
    fb.loss_divisor = 4.0 * world * micro * model->LossTermsPerSample();
    fb.store = s->store();
    state::FlatBuffer none;
    RM_RETURN_IF_ERROR(
        model->ForwardBackward(SomeBatch(config, 4, 10 * comm.rank() + k), none, none, fb)
            .status());
  }
  RM_RETURN_IF_ERROR(s->ReduceGradients());
  RM_RETURN_IF_ERROR(s->AfterOptimizerStep(master.span()));
  const int64_t peak = s->unit_buffer_bytes_peak();
  if (peak > plan.unit_buffer_bytes) {
    return Fail(absl::StrCat(plan.Name(), ": unit buffers peaked at ", peak,
                             " bytes, above the planned ", plan.unit_buffer_bytes, " (",
                             layout.Describe(), ")"));
  }
  // The GPT on the CPU writes a unit's gradients over its parameters: ZeRO-3 holds the
  // units in use and prefetched, the one being reduced handing its buffer to the next
  // gather, and the embeddings' gradients beside the last reduction: 2 buffers planned, with
  // prefetch or without, of which it uses more than one.
  const bool tight = stage == 3 && config.model.kind == ModelConfig::Kind::kGpt &&
                    config.fsdp.reshard_after_forward && config.model.gpt.checkpoint_every == 0;
  const int64_t slack = layout.largest_unit * 4;
  if (tight && plan.unit_buffer_bytes > peak + slack) {
    return Fail(absl::StrCat(plan.Name(), ": planned ", plan.unit_buffer_bytes,
                             " bytes of unit buffers; they peaked at ", peak, ", more than ",
                             slack, " below (", layout.Describe(), ")"));
  }
  return absl::OkStatus();
}

TEST(PlanRankState, Stages0And1AreWhatDataParallelismAllocates) {
  for (const TrainConfig& config :
       {Gpt(), Gpt(SgdOptions{0.9}), Gpt(SgdOptions{}), Mlp(), Mlp(LambOptions{})}) {
    for (int world : {1, 2, 3}) {
      for (int stage : {0, 1}) {
        SCOPED_TRACE(absl::StrCat("world ", world, " stage ", stage));
        ExpectOkOnRanks(world, [&](TcpCommunicator& comm) {
          return DataParallelMatchesPlan(comm, config, stage);
        });
      }
    }
  }
}

TEST(PlanRankState, Stages2And3AreWhatTheShardedStrategyAllocates) {
  for (Wrap wrap : {Wrap::kLayer, Wrap::kBlock, Wrap::kModel}) {
    for (Prefetch prefetch : {Prefetch::kNone, Prefetch::kBoth}) {
      TrainConfig config = Gpt();
      config.fsdp.wrap = wrap;
      config.fsdp.prefetch = prefetch;
      for (int world : {1, 2, 3}) {
        SCOPED_TRACE(absl::StrCat("world ", world, " wrap ", WrapName(wrap), " prefetch ",
                                  PrefetchName(prefetch)));
        ExpectOkOnRanks(world, [&](TcpCommunicator& comm) {
          return ShardedMatchesPlan(comm, config, 3, 1);
        });
      }
    }
  }
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("ZeRO-2, world ", world));
    ExpectOkOnRanks(world, [](TcpCommunicator& comm) {
      return ShardedMatchesPlan(comm, Gpt(), 2, 1);
    });
  }
}

TEST(PlanRankState, UnitBuffersWithHalfPrecisionCheckpointingAndKeptUnits) {
  struct Variant {
    std::string name;
    TrainConfig config;
    int stage = 3;
    int micro = 1;
  };
  std::vector<Variant> variants;
  {
    TrainConfig c = Gpt();
    c.precision = Precision::kBFloat16;
    c.fsdp.prefetch = Prefetch::kNone;
    variants.push_back({"bf16 gathers", c});
    c.reduce_precision = Precision::kBFloat16;
    variants.push_back({"bf16 gathers and reductions", c});
    c.fsdp.prefetch = Prefetch::kBoth;
    c.accumulation = 2;
    variants.push_back({"bf16 ZeRO-2, 2 micro-batches", c, 2, 2});
  }
  {
    TrainConfig c = Gpt();
    c.model.gpt.checkpoint_every = 2;
    c.fsdp.wrap = Wrap::kLayer;
    variants.push_back({"checkpointing, layer", c});
    c.fsdp.wrap = Wrap::kBlock;
    c.fsdp.prefetch_limit = 2;
    variants.push_back({"checkpointing, block, 2 ahead", c});
  }
  {
    TrainConfig c = Gpt(LambOptions{});
    c.fsdp.reshard_after_forward = false;
    c.fsdp.wrap = Wrap::kLayer;
    c.accumulation = 2;
    variants.push_back({"kept from forward to backward, 2 micro-batches", c, 3, 2});
  }
  {
    TrainConfig c = Mlp();
    c.fsdp.wrap = Wrap::kLayer;
    c.fsdp.prefetch = Prefetch::kNone;
    variants.push_back({"mlp", c});
    variants.push_back({"mlp ZeRO-2", c, 2});
  }
  for (const Variant& v : variants) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(v.name, ", world ", world));
      ExpectOkOnRanks(world, [&v](TcpCommunicator& comm) {
        return ShardedMatchesPlan(comm, v.config, v.stage, v.micro);
      });
    }
  }
}

// The half-precision copy of the model's parameters (stages 0 and 1) and ZeRO-2's compute
// copy, which no API shows: the padded flat space, and the table.
TEST(PlanRankState, CopiesOfTheParameters) {
  TrainConfig config = Gpt();
  std::unique_ptr<Model> model = ModelOf(config);
  const int64_t total = model->table().total_elements();
  const int64_t padded = PaddedElements(total, 3);
  EXPECT_EQ(PlanRankState(config, *model, 3, 0, Wrap::kBlock)->compute_copy_bytes, 0);
  config.precision = Precision::kFloat16;
  for (int stage : {0, 1}) {
    EXPECT_EQ(PlanRankState(config, *model, 3, stage, Wrap::kBlock)->compute_copy_bytes,
              padded * 4);
  }
  EXPECT_EQ(PlanRankState(config, *model, 3, 2, Wrap::kBlock)->compute_copy_bytes, total * 4);
  EXPECT_EQ(PlanRankState(config, *model, 3, 3, Wrap::kBlock)->compute_copy_bytes, 0);
}

TEST(PlanRankState, ShardingShrinksEachTermByTheWorld) {
  const TrainConfig config = Gpt();
  std::unique_ptr<Model> model = ModelOf(config);
  const RankMemoryPlan one = *PlanRankState(config, *model, 1, 3, Wrap::kModel);
  const RankMemoryPlan four = *PlanRankState(config, *model, 4, 3, Wrap::kModel);
  // The whole model as one unit: a quarter each, up to the padding of one unit.
  EXPECT_NEAR(four.parameter_bytes, one.parameter_bytes / 4.0, 4 * 16);
  EXPECT_NEAR(four.optimizer_bytes, one.optimizer_bytes / 4.0, 2 * 4 * 16);
  const RankMemoryPlan dp = *PlanRankState(config, *model, 4, 0, Wrap::kModel);
  EXPECT_GT(dp.state_bytes(), 3 * four.state_bytes());
  EXPECT_EQ(one.Name(), "ZeRO-3 model");
  EXPECT_EQ(dp.Name(), "ZeRO-0");
}

TEST(PlanRankState, BadInputNamesTheField) {
  TrainConfig config = Gpt();
  std::unique_ptr<Model> model = ModelOf(config);
  absl::Status s = PlanRankState(config, *model, 0, 0, Wrap::kBlock).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("world"));
  s = PlanRankState(config, *model, 2, 4, Wrap::kBlock).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("parallelism.zero_stage"));
  config.fsdp.prefetch_limit = 0;
  s = PlanRankState(config, *model, 2, 3, Wrap::kBlock).status();
  EXPECT_THAT(s.message(), HasSubstr("parallelism.fsdp.prefetch_limit"));
  config = Gpt();
  config.accumulation = 100;  // more micro-batches than samples per rank
  s = MeasureActivationBytes(config, 2, 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("batch.accumulation: "));
}

// The measurement through its one-group store is what the model reports after the trainer's
// own calls on whole buffers: the largest micro-batch, then (with a test set) the largest
// evaluation batch.
TEST(MeasureActivationBytes, IsWhatTheTrainersCallsLeaveTheModelHolding) {
  struct Case {
    TrainConfig config;
    int world;
    int64_t micro;  // by hand: the largest micro-batch of the plan
    int64_t evaluation_samples, evaluation_batch;
  };
  std::vector<Case> cases;
  {
    TrainConfig c = Gpt();
    c.global_batch = 32;
    c.micro_max = 5;  // ceil(32/3) = 11 per rank: 3 micro-batches of <= 4
    c.precision = Precision::kBFloat16;
    c.model.gpt.checkpoint_every = 2;
    cases.push_back({c, 3, 4, 0, 0});
    c.accumulation = 2;  // 6 of 11
    cases.push_back({c, 3, 6, 0, 0});
  }
  {
    TrainConfig c = Mlp();
    c.global_batch = 24;
    cases.push_back({c, 2, 12, 1000, 256});
    cases.push_back({c, 8, 3, 1000, 125});  // rank 0's share of the test set: 125
  }
  {
    // ResNet-18 (running statistics: measured on whole flat buffers, not through a store).
    TrainConfig c = Mlp();
    c.model.kind = ModelConfig::Kind::kResnet18;
    c.model.resnet18_width = 2;
    c.global_batch = 8;
    cases.push_back({c, 2, 4, 100, 50});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(static_cast<int>(c.config.model.kind), " world ", c.world));
    absl::StatusOr<int64_t> measured =
        MeasureActivationBytes(c.config, c.world, c.evaluation_samples);
    ASSERT_TRUE(measured.ok()) << measured.status();
    std::unique_ptr<Model> model = ModelOf(c.config);
    state::FlatBuffer params(model->table().total_elements()), grads(params.size());
    model->Init(1, params);
    ForwardBackwardOptions fb;
    fb.precision = c.config.precision;
    fb.loss_divisor = 100;
    ASSERT_TRUE(model->ForwardBackward(SomeBatch(c.config, c.micro, 1), params, grads, fb).ok());
    if (c.evaluation_batch > 0) {
      ASSERT_TRUE(model
                      ->Evaluate(SomeBatch(c.config, c.evaluation_batch, 2), params,
                                 c.config.precision)
                      .ok());
    }
    EXPECT_EQ(*measured, model->memory().activation_bytes_peak);
    EXPECT_GT(*measured, 0);
  }
}

TEST(PlanEveryConfiguration, SixRowsWithTheActivationsOfOne) {
  const TrainConfig config = Gpt();
  absl::StatusOr<std::vector<RankMemoryPlan>> plans = PlanEveryConfiguration(config, 4);
  ASSERT_TRUE(plans.ok()) << plans.status();
  std::vector<std::string> names;
  for (const RankMemoryPlan& p : *plans) {
    names.push_back(p.Name());
    EXPECT_EQ(p.world, 4);
    EXPECT_EQ(p.activation_bytes, (*plans)[0].activation_bytes);
    EXPECT_EQ(p.total_bytes(), p.state_bytes() + p.unit_buffer_bytes + p.activation_bytes);
  }
  EXPECT_THAT(names, ::testing::ElementsAre("ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3 layer",
                                            "ZeRO-3 block", "ZeRO-3 model"));
  EXPECT_GT((*plans)[0].activation_bytes, 0);
  const absl::StatusOr<RankMemoryPlan> one = PlanRankMemory(config, 4, 3, Wrap::kBlock);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->total_bytes(), (*plans)[4].total_bytes());
}

// ResNet-18 keeps its BatchNorm running statistics in whole flat buffers: the stages it can
// run (0 and 1), not rows for the ones its spec refuses.
TEST(PlanEveryConfiguration, AModelWithBuffersGetsTheStagesItCanRun) {
  TrainConfig config = Mlp();
  config.model.kind = ModelConfig::Kind::kResnet18;
  config.model.resnet18_width = 2;
  config.global_batch = 8;
  absl::StatusOr<std::vector<RankMemoryPlan>> plans = PlanEveryConfiguration(config, 2);
  ASSERT_TRUE(plans.ok()) << plans.status();
  std::vector<std::string> names;
  for (const RankMemoryPlan& p : *plans) names.push_back(p.Name());
  EXPECT_THAT(names, ::testing::ElementsAre("ZeRO-0", "ZeRO-1"));
}

// A GPT's activations are computed (nothing run) and equal to what a run measures, to the
// byte: the shapes of examples/tiny_gpt.yaml (bf16, checkpointing every 2),
// larger_than_a_rank.yaml and sotu_bytes_gpt.yaml, a tied head, attention that keeps its
// probabilities, on 1 to 3 ranks.
TEST(PlanActivationBytes, AGptIsComputedAndEqualsTheMeasurement) {
  struct Variant {
    std::string name;
    TrainConfig config;
  };
  std::vector<Variant> variants;
  {
    TrainConfig c = Gpt();
    c.model.gpt = {.layers = 4, .heads = 4, .width = 128, .context = 128, .vocab = 256};
    c.model.gpt.checkpoint_every = 2;
    c.precision = Precision::kBFloat16;
    c.global_batch = 32;
    c.micro_max = 16;
    variants.push_back({"tiny_gpt", c});
    c.model.gpt = {.layers = 12, .heads = 8, .width = 512, .context = 64, .vocab = 256};
    c.precision = Precision::kFloat32;
    c.global_batch = 8;
    c.micro_max = 0;
    variants.push_back({"larger_than_a_rank", c});
    c.model.gpt = {.layers = 2, .heads = 4, .width = 64, .context = 64, .vocab = 256};
    c.global_batch = 32;
    variants.push_back({"sotu_bytes_gpt", c});
  }
  {
    TrainConfig c = Gpt();
    c.model.gpt.tied_head = true;
    c.model.gpt.checkpoint_every = 2;
    variants.push_back({"tied head, checkpointing", c});
    c.model.gpt.memory_efficient_attention = false;
    c.model.gpt.tied_head = false;
    variants.push_back({"attention probabilities", c});
  }
  for (const Variant& v : variants) {
    for (int world : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat(v.name, ", world ", world));
      absl::StatusOr<PlannedActivations> planned = PlanActivationBytes(v.config, world);
      ASSERT_TRUE(planned.ok()) << planned.status();
      EXPECT_EQ(planned->method, ActivationMethod::kComputed);
      absl::StatusOr<int64_t> measured =
          MeasureActivationBytes(v.config, world, EvaluationSamples(v.config));
      ASSERT_TRUE(measured.ok()) << measured.status();
      EXPECT_EQ(planned->bytes, *measured);
    }
  }
  // The other models are measured, and say so.
  absl::StatusOr<PlannedActivations> mlp = PlanActivationBytes(Mlp(), 2);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->method, ActivationMethod::kMeasured);
  EXPECT_EQ(mlp->bytes, *MeasureActivationBytes(Mlp(), 2, EvaluationSamples(Mlp())));
}

// A GPT of 350M parameters (24 blocks 1024 wide, context 1024, GPT-2's vocabulary) is
// planned in seconds without the gigabytes a run of one micro-batch takes (before: 3 min 39 s
// and ~16 GB to measure its activations).
TEST(PlanEveryConfiguration, ALargeGptIsPlannedQuicklyInLittleMemory) {
  TrainConfig config = Gpt();
  config.model.gpt = {.layers = 24, .heads = 16, .width = 1024, .context = 1024, .vocab = 50257};
  config.global_batch = 64;
  config.micro_max = 8;
  config.precision = Precision::kBFloat16;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<RankMemoryPlan>> plans = PlanEveryConfiguration(config, 8);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(plans.ok()) << plans.status();
  EXPECT_LT(took, absl::Seconds(5));
  struct rusage usage;
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  EXPECT_LT(usage.ru_maxrss, 1 << 20) << "KiB of peak RSS";  // under 1 GiB
  for (const RankMemoryPlan& p : *plans) {
    EXPECT_EQ(p.activation_method, ActivationMethod::kComputed);
    // Micro-batches of 8 x 1024 tokens: the logits alone are 8192 x 50257 floats.
    EXPECT_GT(p.activation_bytes, int64_t{8192} * 50257 * 4);
  }
}

}  // namespace
}  // namespace ringmaster::train
