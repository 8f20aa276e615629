// Resume equivalence at the library level: AdamW (train/optim) trains k steps sharded over N
// ranks, the ranks save (parameters, the moments from Optimizer::state_buffers, the step),
// M ranks load their new ranges, restore the step and train k more. AdamW is element-wise,
// so the result must equal 2k uninterrupted steps on one rank bit for bit, whatever N and
// M. (The trainer-level test with data and the sampler belongs to the trainer's wiring.)
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/testing.h"
#include "checkpoint/writer.h"
#include "gtest/gtest.h"
#include "train/optim/optimizer.h"

namespace ringmaster::checkpoint {
namespace {

constexpr int kSteps = 4;  // k

// The gradient of step `step`: the same on any world size (the ranks' reduced gradient).
std::vector<float> Gradient(int64_t step, int64_t elements) {
  std::vector<float> g(elements);
  for (int64_t i = 0; i < elements; ++i) {
    g[i] = static_cast<float>((static_cast<int64_t>(i * 2654435761u + step * 97) % 2001) - 1000) *
           1e-4f;
  }
  return g;
}

std::unique_ptr<train::Optimizer> AdamW(const state::TensorTable& table, state::FlatRange range) {
  auto opt = train::CreateOptimizer(table, range, train::AdamWOptions{});
  EXPECT_TRUE(opt.ok()) << opt.status();
  return *std::move(opt);
}

// `steps` AdamW steps from step `first` on, the flat space cut into the optimizers' ranges.
void Train(std::vector<std::unique_ptr<train::Optimizer>>& ranks, int64_t first, int steps,
           std::vector<float>& params) {
  for (int64_t s = first; s < first + steps; ++s) {
    const std::vector<float> grads = Gradient(s, params.size());
    for (auto& opt : ranks) {
      const state::FlatRange r = opt->range();
      ASSERT_TRUE(opt->Step(1e-2, absl::MakeSpan(params).subspan(r.begin, r.size()),
                            absl::MakeConstSpan(grads).subspan(r.begin, r.size()),
                            train::SumOnOneRank)
                      .ok());
    }
  }
}

std::vector<std::unique_ptr<train::Optimizer>> Shards(const state::TensorTable& table, int world) {
  std::vector<std::unique_ptr<train::Optimizer>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(AdamW(table, SaveSlice(table.total_elements(), r, world)));
  }
  return ranks;
}

TEST(Resume, ShardedAdamWContinuesBitForBitAcrossWorldSizes) {
  const state::TensorTable table = testing::TestTable(3);
  const int64_t elements = table.total_elements();
  const std::vector<float> init = testing::PatternBuffer("init", 0, elements, elements);

  std::vector<float> straight = init;
  std::vector<std::unique_ptr<train::Optimizer>> one = Shards(table, 1);
  Train(one, 0, 2 * kSteps, straight);

  for (const auto& [n, m] : std::vector<std::pair<int, int>>{{1, 3}, {4, 2}, {3, 5}, {5, 1}}) {
    SCOPED_TRACE(absl::StrCat(n, " -> ", m, " ranks"));
    const std::string root = testing::FreshDir("resume");
    std::vector<float> params = init;
    std::vector<std::unique_ptr<train::Optimizer>> before = Shards(table, n);
    Train(before, 0, kSteps, params);

    // Save: every rank its range of the parameters and its moments, on its own thread. The
    // writers are created first: rank 0's removes temporaries, so it must exist before any
    // rank saves.
    std::vector<std::unique_ptr<CheckpointWriter>> writers;
    for (int r = 0; r < n; ++r) {
      CheckpointWriterOptions o;
      o.root = root;
      o.job = "job";
      o.rank = r;
      o.world_size = n;
      o.zero_stage = 1;
      o.table = &table;
      o.poll_interval = absl::Milliseconds(1);
      absl::StatusOr<std::unique_ptr<CheckpointWriter>> w = CheckpointWriter::Create(o);
      ASSERT_TRUE(w.ok()) << w.status();
      writers.push_back(*std::move(w));
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> saved(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        SaveRequest request;
        request.step = kSteps;
        request.state.step = kSteps;
        request.state.optimizer_step = before[r]->step();
        request.state.schedule_step = kSteps;
        const state::FlatRange range = before[r]->range();
        request.buffers.push_back({"params", elements, range,
                                   absl::MakeConstSpan(params).subspan(range.begin, range.size())});
        for (const train::StateBuffer& b : before[r]->state_buffers()) {
          request.buffers.push_back({b.name, elements, b.range, b.data});
        }
        saved[r] = writers[r]->SaveSync(request, absl::InfiniteFuture());
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : saved) ASSERT_TRUE(s.ok()) << s;

    // Resume at M: fresh optimizers and parameters, filled from the checkpoint.
    std::vector<float> resumed(elements, -1.0f);
    std::vector<std::unique_ptr<train::Optimizer>> after = Shards(table, m);
    for (auto& opt : after) {
      std::vector<LoadTarget> targets = {{"params", {0, elements}, absl::MakeSpan(resumed)}};
      for (const train::StateBuffer& b : opt->state_buffers()) {
        targets.push_back({b.name, b.range, b.data});
      }
      LoadOptions load;
      load.root = root;
      load.job = "job";
      load.table = &table;
      absl::StatusOr<LoadResult> loaded = LoadCheckpoint(load, targets);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ASSERT_TRUE(opt->RestoreStep(loaded->checkpoint.state.optimizer_step).ok());
      EXPECT_EQ(loaded->checkpoint.state.schedule_step, kSteps);
    }
    Train(after, kSteps, kSteps, resumed);
    EXPECT_EQ(std::memcmp(resumed.data(), straight.data(), elements * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace ringmaster::checkpoint
