#include "train/rank_memory.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;

// An MLP on Fashion-MNIST: weights and biases of 784-100-10.
constexpr int64_t kSmallMlpParameters = 784 * 100 + 100 + 100 * 10 + 10;

TrainConfig SmallMlp(OptimizerOptions optimizer, int zero_stage) {
  TrainConfig c;
  c.data.kind = DataConfig::Kind::kFashionMnist;
  c.data.fashion_mnist_dir = "/nonexistent";  // described, never read
  c.model.kind = ModelConfig::Kind::kMlp;
  c.model.mlp_hidden = {100};
  c.optimizer = std::move(optimizer);
  c.zero_stage = zero_stage;
  return c;
}

std::unique_ptr<Model> ModelOf(const TrainConfig& config) {
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(config.model, DescribeJobData(config));
  CHECK(m.ok()) << m.status();
  return *std::move(m);
}

// fp32 training keeps 4 bytes of parameters and 4 of gradients per parameter, and the
// optimizer 4 (SGD's momentum) or 8 (Adam's two moments), which ZeRO divides by the ranks.
TEST(RankMemory, EstimateIsTheFormulaForAKnownModel) {
  constexpr double kPsi = kSmallMlpParameters;
  absl::StatusOr<int64_t> sgd = EstimateRankStateBytes(SmallMlp(SgdOptions{0.9}, 0), 4);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(*sgd, static_cast<int64_t>(12 * kPsi));
  absl::StatusOr<int64_t> adam = EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 0), 4);
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ(*adam, static_cast<int64_t>(16 * kPsi));
  // World sizes below 1 count as one rank.
  EXPECT_EQ(*EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 1), 0), *adam);
}

// (Was ZeroShrinksTheOptimizerStateButNotTheGradientsOnTheCpu: ZeRO-2 kept whole gradients on
// the CPU until the sharded strategy, train/fsdp.h, which keeps a rank's gradient shard.)
TEST(RankMemory, ZeroShrinksTheOptimizerStateThenTheGradientsThenTheParameters) {
  constexpr double kPsi = kSmallMlpParameters;
  absl::StatusOr<int64_t> zero1 = EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 1), 4);
  ASSERT_TRUE(zero1.ok()) << zero1.status();
  EXPECT_EQ(*zero1, static_cast<int64_t>(4 * kPsi + 4 * kPsi + 8 * kPsi / 4));
  EXPECT_LT(*zero1, *EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 0), 4));
  // ZeRO-2 keeps a shard of the gradients, ZeRO-3 of the parameters too.
  EXPECT_EQ(*EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 2), 4),
            static_cast<int64_t>(4 * kPsi + 4 * kPsi / 4 + 8 * kPsi / 4));
  EXPECT_EQ(*EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 3), 4),
            static_cast<int64_t>(16 * kPsi / 4));
  // One rank has nothing to share.
  EXPECT_EQ(*EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 1), 1),
            *EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 0), 1));
}

TEST(RankMemory, OptionsDescribeTheModelAndTheOptimizer) {
  const TrainConfig config = SmallMlp(LambOptions{}, 2);
  std::unique_ptr<Model> model = ModelOf(config);
  MemoryEstimateOptions o = RankMemoryOptions(config, model->table(), 3);
  EXPECT_EQ(o.parameters, kSmallMlpParameters);
  EXPECT_EQ(o.world_size, 3);
  EXPECT_EQ(o.zero_stage, 2);  // was 1 while ZeRO-2 kept whole gradients on the CPU
  EXPECT_FALSE(o.mixed_precision);
  EXPECT_EQ(o.optimizer, MemoryEstimateOptions::Optimizer::kAdam);  // LAMB keeps Adam's moments
  EXPECT_EQ(RankMemoryOptions(SmallMlp(SgdOptions{}, 0), model->table(), 3).optimizer,
            MemoryEstimateOptions::Optimizer::kSgdMomentum);
}

TEST(RankMemory, EstimateOfAModelThatDoesNotFitItsDataNamesTheField) {
  TrainConfig config = SmallMlp(SgdOptions{}, 0);
  config.data.kind = DataConfig::Kind::kText;
  absl::StatusOr<int64_t> e = EstimateRankStateBytes(config, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("model.mlp"));
}

TEST(RankMemory, ASmallModelFitsThisMachine) {
  const TrainConfig config = SmallMlp(AdamWOptions{}, 0);
  std::unique_ptr<Model> model = ModelOf(config);
  EXPECT_TRUE(CheckHostMemory(config, model->table(), 1, /*gradients_on_host=*/true, 1).ok());
}

// (Adapted from trainer_test.cc's TrainerMemory test, which checks that the trainer asks
// this before it allocates the state.)
TEST(RankMemory, AModelTooBigForThisMachineIsPermanentlyResourceExhausted) {
  TrainConfig config = SmallMlp(SgdOptions{}, 0);
  config.model.mlp_hidden = {1000000, 1000000};
  std::unique_ptr<Model> model = ModelOf(config);  // described, not allocated
  absl::Status s = CheckHostMemory(config, model->table(), 1, /*gradients_on_host=*/true, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(IsPermanent(s)) << s;
  // 784·10^6 + 10^6 + 10^12 + 10^6 + 10·10^6 + 10: weights and biases of 784-10^6-10^6-10;
  // 12 bytes each (parameters, gradients, momentum): 1.1e13 bytes.
  EXPECT_THAT(s.message(), HasSubstr("out of memory: the model's 1000796000010 parameters need "
                                     "1.118e+04 GiB on each rank (parameters 3728 GiB, "
                                     "gradients 3728 GiB, optimizer state 3728 GiB)"));
  EXPECT_THAT(s.message(), HasSubstr("for the 1 rank(s) on this host, which has"));
  EXPECT_THAT(s.message(), HasSubstr("parallelism.zero_stage"));
}

TEST(RankMemory, GradientsOnADeviceAreNotCountedOnTheHost) {
  TrainConfig config = SmallMlp(SgdOptions{}, 0);
  config.model.mlp_hidden = {1000000, 1000000};
  std::unique_ptr<Model> model = ModelOf(config);
  absl::Status s = CheckHostMemory(config, model->table(), 1, /*gradients_on_host=*/false, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("need 7457 GiB on each rank (parameters 3728 GiB, "
                                     "gradients 0 GiB, optimizer state 3728 GiB)"));
}

// The formula and the plan of the buffers (train/memory_plan.h) shard the same terms: they
// differ by the padding, ZeRO-2's fp32 master shard (the formula's fp32 training has no
// master copy apart from the parameters it keeps whole) and the unit buffers.
TEST(RankMemory, TheFormulaAndThePlanShardTheSameTerms) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("ZeRO-", stage));
    const TrainConfig config = SmallMlp(AdamWOptions{}, stage);
    std::unique_ptr<Model> model = ModelOf(config);
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(RankMemoryOptions(config, model->table(), 4));
    absl::StatusOr<RankMemoryPlan> plan =
        PlanRankState(config, *model, 4, stage, config.fsdp.wrap);
    ASSERT_TRUE(e.ok() && plan.ok());
    const double padding = 4.0 * 16 * 4 * model->table().size();  // a few floats per tensor
    const double master = stage == 2 ? plan->parameter_bytes : 0;
    EXPECT_NEAR(plan->parameter_bytes + plan->compute_copy_bytes - master, e->parameter_bytes,
                padding);
    EXPECT_NEAR(plan->gradient_bytes, e->gradient_bytes, padding);
    EXPECT_NEAR(plan->optimizer_bytes, e->optimizer_bytes, 2 * padding);
  }
}

TEST(RankMemory, ThePlannedBuffersOfASmallModelFitThisMachine) {
  for (int stage : {0, 1, 2, 3}) {
    const TrainConfig config = SmallMlp(AdamWOptions{}, stage);
    std::unique_ptr<Model> model = ModelOf(config);
    EXPECT_TRUE(CheckHostMemory(config, *model, 2, /*gradients_on_host=*/true, 2).ok());
  }
}

// ZeRO-3 over a million ranks makes each rank's share of a 10^12-parameter model small, but
// a unit (the 10^6 x 10^6 layer) is still gathered whole: the plan counts its buffers.
TEST(RankMemory, ThePlanCountsTheUnitBuffersOfAModelTooBigForThisMachine) {
  TrainConfig config = SmallMlp(SgdOptions{0.9}, 3);
  config.model.mlp_hidden = {1000000, 1000000};
  std::unique_ptr<Model> model = ModelOf(config);  // described, not allocated
  absl::Status s = CheckHostMemory(config, *model, 1000000, /*gradients_on_host=*/true, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(IsPermanent(s)) << s;
  // The shards: 1000796000010 parameters × 4 bytes / 10^6 ranks, about 0.0037 GiB each.
  EXPECT_THAT(s.message(), HasSubstr("(parameters 0.003728 GiB, gradients 0.003728 GiB, "
                                     "optimizer state 0.003728 GiB, unit buffers "));
  // By the formula alone (the table's form) the same shards fit.
  EXPECT_TRUE(CheckHostMemory(config, model->table(), 1000000, true, 1).ok());
  // A bad stage is the plan's INVALID_ARGUMENT.
  config.zero_stage = 5;
  EXPECT_TRUE(absl::IsInvalidArgument(CheckHostMemory(config, *model, 4, true, 1)));
}

// What fits one rank does not fit ten million on the same host.
TEST(RankMemory, EveryRankOnTheHostIsCounted) {
  const TrainConfig config = SmallMlp(SgdOptions{}, 0);
  std::unique_ptr<Model> model = ModelOf(config);
  constexpr int kRanks = 10000000;  // 12 bytes × 79510 parameters each: 9.5 TB
  absl::Status s = CheckHostMemory(config, model->table(), 1, /*gradients_on_host=*/true, kRanks);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("for the ", kRanks, " rank(s) on this host")));
}

}  // namespace
}  // namespace ringmaster::train
