#include "train/rank_memory.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

TEST(RankMemory, ZeroShrinksTheOptimizerStateButNotTheGradientsOnTheCpu) {
  constexpr double kPsi = kSmallMlpParameters;
  absl::StatusOr<int64_t> zero1 = EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 1), 4);
  ASSERT_TRUE(zero1.ok()) << zero1.status();
  EXPECT_EQ(*zero1, static_cast<int64_t>(4 * kPsi + 4 * kPsi + 8 * kPsi / 4));
  EXPECT_LT(*zero1, *EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 0), 4));
  // Gradients stay whole on the CPU: ZeRO-2 keeps what ZeRO-1 does.
  EXPECT_EQ(*EstimateRankStateBytes(SmallMlp(AdamWOptions{}, 2), 4), *zero1);
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
  EXPECT_EQ(o.zero_stage, 1);
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
