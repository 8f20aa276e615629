#include "train/data/sampler.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/partition.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

GlobalBatchSampler MakeSampler(int64_t n, const SamplerOptions& options) {
  auto sampler = GlobalBatchSampler::Create(n, options);
  CHECK(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

// The next `steps` global batches from `state`, which is advanced.
std::vector<GlobalBatch> Take(GlobalBatchSampler& sampler, state::SamplerState& state,
                              int64_t batch, int steps) {
  std::vector<GlobalBatch> out;
  for (int i = 0; i < steps; ++i) {
    auto next = sampler.NextGlobalBatch(state, batch);
    CHECK(next.ok()) << next.status();
    state = next->next;
    out.push_back(*std::move(next));
  }
  return out;
}

std::vector<std::vector<int64_t>> IndicesOf(const std::vector<GlobalBatch>& batches) {
  std::vector<std::vector<int64_t>> out;
  for (const GlobalBatch& b : batches) out.push_back(b.indices);
  return out;
}

TEST(GlobalBatchSamplerTest, EverySampleOncePerEpochWithShortLastBatch) {
  constexpr int64_t kN = 103, kBatch = 10;
  GlobalBatchSampler sampler = MakeSampler(kN, {.seed = 1});
  EXPECT_EQ(sampler.BatchesPerEpoch(kBatch), 11);
  state::SamplerState state;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> seen;
    for (const GlobalBatch& b : Take(sampler, state, kBatch, 11)) {
      EXPECT_EQ(b.start.epoch, epoch);
      EXPECT_EQ(b.start.cursor, static_cast<int64_t>(seen.size()));
      EXPECT_EQ(b.indices.size(), seen.size() == 100 ? 3u : 10u);
      seen.insert(seen.end(), b.indices.begin(), b.indices.end());
    }
    EXPECT_EQ(state, (state::SamplerState{epoch + 1, 0})) << "the state moves on by itself";
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), static_cast<size_t>(kN));
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(seen[i], i) << "epoch " << epoch;
  }
}

TEST(GlobalBatchSamplerTest, DropLastSkipsTheShortBatch) {
  constexpr int64_t kN = 103, kBatch = 10;
  GlobalBatchSampler sampler = MakeSampler(kN, {.seed = 1, .drop_last = true});
  EXPECT_EQ(sampler.BatchesPerEpoch(kBatch), 10);
  EXPECT_EQ(sampler.EpochLength(kBatch), 100);
  state::SamplerState state;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (const GlobalBatch& b : Take(sampler, state, kBatch, 10)) {
      EXPECT_EQ(b.start.epoch, epoch);
      ASSERT_EQ(b.indices.size(), 10u);
      seen.insert(b.indices.begin(), b.indices.end());
    }
    EXPECT_EQ(seen.size(), 100u) << "no sample twice in an epoch";
    EXPECT_EQ(state, (state::SamplerState{epoch + 1, 0}));
    // The samples left out are the last three of the epoch's order.
    absl::Span<const int64_t> order = sampler.EpochOrder(epoch);
    for (int64_t i = 100; i < kN; ++i) EXPECT_FALSE(seen.contains(order[i]));
  }
}

TEST(GlobalBatchSamplerTest, EachEpochHasItsOwnOrder) {
  GlobalBatchSampler sampler = MakeSampler(50, {.seed = 3});
  std::set<std::vector<int64_t>> orders;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    absl::Span<const int64_t> order = sampler.EpochOrder(epoch);
    orders.emplace(order.begin(), order.end());
  }
  EXPECT_EQ(orders.size(), 8u);
  // And the epochs' batches follow those orders.
  state::SamplerState state;
  std::vector<GlobalBatch> batches = Take(sampler, state, 25, 4);
  std::vector<int64_t> epoch1(batches[2].indices);
  epoch1.insert(epoch1.end(), batches[3].indices.begin(), batches[3].indices.end());
  absl::Span<const int64_t> order1 = sampler.EpochOrder(1);
  EXPECT_EQ(epoch1, std::vector<int64_t>(order1.begin(), order1.end()));
  EXPECT_NE(batches[0].indices, batches[2].indices);
}

TEST(GlobalBatchSamplerTest, DeterministicAndSeedDependent) {
  GlobalBatchSampler a = MakeSampler(97, {.seed = 7}), b = MakeSampler(97, {.seed = 7}),
                     c = MakeSampler(97, {.seed = 8});
  state::SamplerState sa, sb, sc;
  auto run_a = IndicesOf(Take(a, sa, 16, 30));
  EXPECT_EQ(run_a, IndicesOf(Take(b, sb, 16, 30)));
  EXPECT_NE(run_a, IndicesOf(Take(c, sc, 16, 30)));
}

TEST(GlobalBatchSamplerTest, ResumingFromASavedStateContinuesIdentically) {
  constexpr int64_t kN = 61, kBatch = 8;
  GlobalBatchSampler reference = MakeSampler(kN, {.seed = 11});
  state::SamplerState state;
  std::vector<GlobalBatch> full = Take(reference, state, kBatch, 40);  // ~5 epochs
  for (size_t saved_after = 0; saved_after < 30; ++saved_after) {
    // A new process: a fresh sampler, only the checkpointed state.
    state::SamplerState restored = full[saved_after].next;
    GlobalBatchSampler resumed = MakeSampler(kN, {.seed = 11});
    std::vector<GlobalBatch> rest = Take(resumed, restored, kBatch, 10);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].indices, full[saved_after + 1 + i].indices)
          << "saved after batch " << saved_after << ", batch " << i;
      EXPECT_EQ(rest[i].start, full[saved_after + 1 + i].start);
    }
  }
}

TEST(GlobalBatchSamplerTest, CursorAtTheEndOfAnEpochStartsTheNext) {
  GlobalBatchSampler sampler = MakeSampler(20, {.seed = 2, .drop_last = true});
  // Saved with batch 10 at cursor 10; resumed with batch 15: epoch length 15, so the state
  // at cursor 15 rolls over; cursor 20 (the full data set) too.
  for (int64_t cursor : {15, 20}) {
    auto batch = sampler.NextGlobalBatch(state::SamplerState{4, cursor}, 15);
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(batch->start, (state::SamplerState{5, 0}));
    EXPECT_EQ(batch->next, (state::SamplerState{6, 0}));
  }
}

TEST(GlobalBatchSamplerTest, RejectsBadArguments) {
  EXPECT_EQ(GlobalBatchSampler::Create(0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  GlobalBatchSampler sampler = MakeSampler(10, {.seed = 0});
  EXPECT_EQ(sampler.NextGlobalBatch({}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_cursor = sampler.NextGlobalBatch(state::SamplerState{2, 11}, 4);
  EXPECT_EQ(bad_cursor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad_cursor.status().message(), HasSubstr("epoch 2 cursor 11"));
  EXPECT_EQ(sampler.NextGlobalBatch(state::SamplerState{0, -1}, 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  GlobalBatchSampler dropping = MakeSampler(10, {.seed = 0, .drop_last = true});
  EXPECT_EQ(dropping.NextGlobalBatch({}, 11).status().code(), absl::StatusCode::kInvalidArgument);
  // Without drop_last a batch larger than the data set is the whole epoch.
  auto whole = sampler.NextGlobalBatch({}, 11);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->indices.size(), 10u);
  EXPECT_EQ(whole->next, (state::SamplerState{1, 0}));
}

// What the ranks of a world of `world_size` consume in one step, each rank working on its
// own (its own sampler, its own copy of the state), concatenated in rank order.
struct WorldStep {
  std::vector<int64_t> concatenated;
  state::SamplerState next;
};

WorldStep StepWorld(int64_t n, uint64_t seed, const state::SamplerState& state,
                    const BatchPlan& plan) {
  WorldStep step;
  for (int rank = 0; rank < plan.world_size; ++rank) {
    GlobalBatchSampler sampler = MakeSampler(n, {.seed = seed});
    auto batch = sampler.NextGlobalBatch(state, plan.global_batch);
    CHECK(batch.ok()) << batch.status();
    const int64_t count = static_cast<int64_t>(batch->indices.size());
    for (int micro = 0; micro < plan.accumulation_steps; ++micro) {
      const Range r = plan.MicroBatch(count, rank, micro);
      CHECK_LE(r.size(), plan.max_micro_batch);
      step.concatenated.insert(step.concatenated.end(), batch->indices.begin() + r.begin,
                               batch->indices.begin() + r.end);
    }
    step.next = batch->next;
  }
  return step;
}

TEST(GlobalBatchSamplerTest, GlobalBatchesDoNotDependOnTheWorldSize) {
  constexpr int64_t kN = 237, kBatch = 50;
  GlobalBatchSampler single = MakeSampler(kN, {.seed = 5});
  state::SamplerState single_state;
  const std::vector<GlobalBatch> expected = Take(single, single_state, kBatch, 12);  // > 2 epochs
  for (int world = 1; world <= 8; ++world) {
    auto plan = PlanBatches({.global_batch = kBatch, .world_size = world, .max_micro_batch = 4});
    ASSERT_TRUE(plan.ok()) << plan.status();
    state::SamplerState state;
    for (size_t step = 0; step < expected.size(); ++step) {
      WorldStep got = StepWorld(kN, 5, state, *plan);
      ASSERT_EQ(got.concatenated, expected[step].indices) << "world " << world << " step " << step;
      state = got.next;
    }
  }
}

TEST(GlobalBatchSamplerTest, ShrinkingMidEpochLosesAndRepeatsNothing) {
  constexpr int64_t kN = 500, kBatch = 64;
  std::map<int64_t, int> seen;
  state::SamplerState state;
  // 3 steps on 4 ranks, checkpoint, 2 steps on 3 ranks, checkpoint, the rest on 7 ranks.
  for (auto [world, steps] : {std::pair{4, 3}, std::pair{3, 2}, std::pair{7, 3}}) {
    auto plan = PlanBatches({.global_batch = kBatch, .world_size = world, .max_micro_batch = 5});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int i = 0; i < steps; ++i) {
      WorldStep step = StepWorld(kN, 9, state, *plan);
      for (int64_t sample : step.concatenated) ++seen[sample];
      state = step.next;
    }
  }
  EXPECT_EQ(state, (state::SamplerState{1, 0}));  // 8 steps of 64 cover 500 samples exactly once
  ASSERT_EQ(seen.size(), static_cast<size_t>(kN));
  for (auto [sample, times] : seen) EXPECT_EQ(times, 1) << "sample " << sample;
}

// Issue 36 point 21: a job resumed on another (smaller) data set found it at its first step,
// INVALID_ARGUMENT, and restarted into it until its budget was spent.
TEST(GlobalBatchSamplerTest, AStateFromAnotherDataSetIsAPermanentMismatchNamedFirst) {
  auto sampler = GlobalBatchSampler::Create(100, {.seed = 1});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  absl::StatusOr<GlobalBatch> batch = sampler->NextGlobalBatch({0, 640}, 10);
  EXPECT_TRUE(absl::IsFailedPrecondition(batch.status())) << batch.status();
  EXPECT_TRUE(IsPermanent(batch.status())) << batch.status();
  EXPECT_THAT(std::string(batch.status().message()), StartsWith("data set mismatch: "));
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("[0, 100]"));
  EXPECT_TRUE(sampler->NextGlobalBatch({0, 100}, 10).ok()) << "at the end: the next epoch";
}

}  // namespace
}  // namespace ringmaster::train::data
