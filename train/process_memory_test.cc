#include "train/process_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/fsdp.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"
#include "train/optim/optimizer.h"
#include "train/parallel_strategy.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ExpectOkOnRanks;

constexpr int64_t kMiB = 1 << 20;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

TrainConfig Mlp(std::vector<int64_t> hidden, OptimizerOptions optimizer, int zero_stage) {
  TrainConfig c;
  c.data.kind = DataConfig::Kind::kFashionMnist;
  c.data.fashion_mnist_dir = "/nonexistent";  // described, never read
  c.model.kind = ModelConfig::Kind::kMlp;
  c.model.mlp_hidden = std::move(hidden);
  c.optimizer = std::move(optimizer);
  c.zero_stage = zero_stage;
  return c;
}

// The strategy the trainer makes for `config` on `comm` (the CPU), as train/trainer.cc does.
absl::StatusOr<std::unique_ptr<ParallelStrategy>> StrategyFor(const TrainConfig& config,
                                                              const Model& model,
                                                              comm::Communicator& comm) {
  if (UsesShardedStrategy(config)) {
    return CreateShardedDataParallel(&comm, &comm, ShardedOptionsFor(config, model));
  }
  DataParallelOptions dp;
  dp.elements = model.table().total_elements();
  dp.zero_stage = config.zero_stage;
  return CreateDataParallel(&comm, &comm, dp);
}

// On `world` ranks: the plan against what the trainer allocates for the same strategy (its
// step buffers' elements, the optimizer's state as created) and the unit bound.
void ExpectPlanIsWhatIsAllocated(const TrainConfig& config, int world) {
  ExpectOkOnRanks(world, [&](comm::TcpCommunicator& comm) -> absl::Status {
    RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        CreateModel(config.model, DescribeJobData(config)));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                        StrategyFor(config, *model, comm));
    RM_ASSIGN_OR_RETURN(RankStateBytes plan,
                        PlanRankState({&config, model.get(), strategy.get(), world, true}));
    const int64_t local = strategy->local_elements();
    RM_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                        CreateOptimizer(model->table(), strategy->update_pieces(),
                                        strategy->update_window().size(), config.optimizer));
    const std::string what = absl::StrCat("zero_stage ", config.zero_stage, ", world ", world);
    if (plan.parameters != local * 4 || plan.gradients != local * 4) {
      return Fail(absl::StrCat(what, ": parameters ", plan.parameters, ", gradients ",
                               plan.gradients, " for ", local, " local elements"));
    }
    if (plan.optimizer != optimizer->state_bytes()) {
      return Fail(absl::StrCat(what, ": optimizer ", plan.optimizer, " planned, ",
                               optimizer->state_bytes(), " allocated"));
    }
    const int64_t total = model->table().total_elements();
    if (config.zero_stage == 3) {
      // A quarter of the state, give or take the units' padding.
      if (local * world < total || local * world > total + 64 * world * 8) {
        return Fail(absl::StrCat(what, ": ", local, " local elements of ", total));
      }
      RM_ASSIGN_OR_RETURN(FsdpLayout layout,
                          ShardedLayout({.table = &model->table(),
                                         .groups = model->parameter_groups(),
                                         .fsdp = config.fsdp},
                                        world));
      // The bound train/memory_plan.h plans (fsdp.h's: the units in use and prefetched, the
      // 1 + prefetch_limit largest, and the two largest gradient buffers being written and
      // reduced; no staging in fp32).
      RM_ASSIGN_OR_RETURN(const RankMemoryPlan planned,
                          train::PlanRankState(config, *model, world, 3, config.fsdp.wrap));
      const int ahead =
          config.fsdp.prefetch == FsdpConfig::Prefetch::kNone ? 0 : config.fsdp.prefetch_limit;
      std::vector<int64_t> sizes;
      for (const FsdpUnit& u : layout.units) sizes.push_back(u.padded);
      std::sort(sizes.rbegin(), sizes.rend());
      auto largest = [&sizes](size_t n) {
        int64_t sum = 0;
        for (size_t i = 0; i < n && i < sizes.size(); ++i) sum += sizes[i];
        return sum;
      };
      const int64_t bound = (largest(ahead + 1) + largest(2)) * 4;
      if (plan.unit_buffers != planned.unit_buffer_bytes || plan.unit_buffers != bound ||
          plan.compute_copy != 0) {
        return Fail(absl::StrCat(what, ": unit buffers ", plan.unit_buffers, " (planned ",
                                 planned.unit_buffer_bytes, ") for units of ",
                                 layout.largest_unit));
      }
    } else if (config.zero_stage == 2) {
      if (plan.compute_copy != total * 4 || plan.unit_buffers <= 0) {
        return Fail(absl::StrCat(what, ": compute copy ", plan.compute_copy));
      }
    } else if (plan.unit_buffers != 0 || plan.compute_copy != 0) {
      return Fail(absl::StrCat(what, ": unit buffers without units"));
    }
    return absl::OkStatus();
  });
}

TEST(PlanRankState, DataParallelKeepsTheWholeState) {
  ExpectPlanIsWhatIsAllocated(Mlp({100}, AdamWOptions{}, 0), 4);
  ExpectPlanIsWhatIsAllocated(Mlp({100}, AdamWOptions{}, 1), 4);
}

TEST(PlanRankState, MomentsByOptimizer) {
  ExpectPlanIsWhatIsAllocated(Mlp({100}, SgdOptions{}, 0), 2);
  ExpectPlanIsWhatIsAllocated(Mlp({100}, SgdOptions{0.9}, 0), 2);
  ExpectPlanIsWhatIsAllocated(Mlp({100}, LambOptions{}, 3), 2);
}

TEST(PlanRankState, ZeroThreeShardsTheStateAndCountsItsUnits) {
  TrainConfig config = Mlp({100, 50}, AdamWOptions{}, 3);
  ExpectPlanIsWhatIsAllocated(config, 4);
  config.fsdp.prefetch_limit = 2;
  ExpectPlanIsWhatIsAllocated(config, 4);
  config.fsdp.prefetch = FsdpConfig::Prefetch::kNone;
  config.fsdp.wrap = FsdpConfig::Wrap::kLayer;
  ExpectPlanIsWhatIsAllocated(config, 4);
}

TEST(PlanRankState, ZeroTwoKeepsAComputeCopy) {
  ExpectPlanIsWhatIsAllocated(Mlp({100}, AdamWOptions{}, 2), 2);
}

TEST(PlanRankState, OnAGpuOnlyTheParametersAreOnTheHost) {
  ExpectOkOnRanks(1, [&](comm::TcpCommunicator& comm) -> absl::Status {
    const TrainConfig config = Mlp({100}, AdamWOptions{}, 0);
    RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        CreateModel(config.model, DescribeJobData(config)));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                        StrategyFor(config, *model, comm));
    RM_ASSIGN_OR_RETURN(RankStateBytes plan,
                        PlanRankState({&config, model.get(), strategy.get(), 1, false}));
    if (plan.total() != plan.parameters || plan.parameters <= 0) {
      return Fail(absl::StrCat("on the host: ", plan.total(), ", parameters ", plan.parameters));
    }
    return absl::OkStatus();
  });
}

// With checkpoints, a save's staging of the rank's snapshot: its saved pieces' parameters and
// optimizer moments, in 2 MiB pages and one more (checkpoint/writer.cc); none without.
TEST(PlanRankState, CheckpointsCountTheirStaging) {
  ExpectOkOnRanks(4, [&](comm::TcpCommunicator& comm) -> absl::Status {
    TrainConfig config = Mlp({300}, AdamWOptions{}, 0);
    RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        CreateModel(config.model, DescribeJobData(config)));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                        StrategyFor(config, *model, comm));
    RM_ASSIGN_OR_RETURN(RankStateBytes none,
                        PlanRankState({&config, model.get(), strategy.get(), 4, true}));
    config.checkpoint.dir = "/somewhere";
    RM_ASSIGN_OR_RETURN(RankStateBytes with,
                        PlanRankState({&config, model.get(), strategy.get(), 4, true}));
    int64_t saved = 0;
    for (const state::PlacedRange& p : strategy->saved_pieces()) saved += p.range.size();
    const int64_t page = 2 << 20;
    const int64_t expected = ((saved * 4 * 3 + page - 1) / page + 1) * page;
    if (none.checkpoint_staging != 0 || with.checkpoint_staging != expected ||
        with.total() != none.total() + expected || saved <= 0) {
      return Fail(absl::StrCat("staging ", none.checkpoint_staging, " without, ",
                               with.checkpoint_staging, " with checkpoints; expected ", expected,
                               " for ", saved, " saved elements"));
    }
    return absl::OkStatus();
  });
}

// AdamW's state for `parameter_mib` MiB of fp32 parameters.
RankStateBytes AdamState(int64_t parameter_mib) {
  RankStateBytes state;
  state.parameters = state.gradients = parameter_mib * kMiB;
  state.optimizer = 2 * parameter_mib * kMiB;
  state.moments = 2;
  return state;
}

TEST(CheckRankStateFits, WhatFitsExactlyIsAccepted) {
  const RankStateBytes state = AdamState(10);
  const ProcessMemoryLimit limit{100 * kMiB, "RLIMIT_DATA, a test's"};
  EXPECT_TRUE(CheckRankStateFits(state, 60 * kMiB, 0, limit, 4, 0).ok());
  EXPECT_TRUE(CheckRankStateFits(state, 30 * kMiB, 30 * kMiB, limit, 4, 0).ok());
  absl::Status over = CheckRankStateFits(state, 60 * kMiB + 1, 0, limit, 4, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
}

TEST(CheckRankStateFits, TheRefusalSaysWhatIsNeededTheLimitAndWhatToDo) {
  const RankStateBytes state = AdamState(55);
  const ProcessMemoryLimit limit{300 * kMiB, "RLIMIT_DATA, a test's"};
  absl::Status s = CheckRankStateFits(state, 200 * kMiB, 128 * kMiB, limit, 4, 0);
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(IsPermanent(s)) << "no restart can fix it: " << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("memory limit of 300.0 MiB (RLIMIT_DATA, a test's)"),
                    HasSubstr("it needs 220.0 MiB (parameters 55.0 MiB, gradients 55.0 MiB, "
                              "optimizer state 110.0 MiB for 2 moment(s), unit buffers 0.0 MiB)"),
                    HasSubstr("200.0 MiB the process has mapped already"),
                    HasSubstr("128.0 MiB the BLAS library maps"), HasSubstr("548.0 MiB in all"),
                    HasSubstr("parallelism.zero_stage: 3"), HasSubstr("raise the limit")));
  // Already sharded: more ranks.
  s = CheckRankStateFits(state, 200 * kMiB, 0, limit, 4, 3);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("run on more ranks"), HasSubstr("this is 4")));
}

TEST(CheckProcessMemoryLimit, UnderARealDataLimit) {
  ExpectOkOnRanks(1, [&](comm::TcpCommunicator& comm) -> absl::Status {
    if (ReadProcessMemoryLimit().has_value()) return Fail("a limit before the test set one");
    const int64_t data = ProcessMappedBytes({.counted = "VmData"});
    if (data <= 0 || ProcessMappedBytes({.counted = "VmSize"}) < data) {
      return Fail(absl::StrCat("VmData ", data));
    }
    // Room for the BLAS workspace and 64 MiB more.
    const int64_t limit = data + kBlasWorkspaceBytes + 64 * kMiB;
    struct rlimit r = {static_cast<rlim_t>(limit), RLIM_INFINITY};
    if (setrlimit(RLIMIT_DATA, &r) != 0) return Fail("setrlimit");
    std::optional<ProcessMemoryLimit> read = ReadProcessMemoryLimit();
    if (!read || read->bytes != limit || !absl::StartsWith(read->source, "RLIMIT_DATA") ||
        read->counted != "VmData") {
      return Fail(absl::StrCat("read ", read ? read->bytes : -1, " of ", limit));
    }
    for (const auto& [hidden, fits] : {std::pair{std::vector<int64_t>{100}, true},
                                       // 784·4000 + 4000·4000 parameters × 16 bytes.
                                       std::pair{std::vector<int64_t>{4000, 4000}, false}}) {
      const TrainConfig config = Mlp(hidden, AdamWOptions{}, 0);
      RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          CreateModel(config.model, DescribeJobData(config)));
      RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                          StrategyFor(config, *model, comm));
      absl::Status s = CheckProcessMemoryLimit({&config, model.get(), strategy.get(), 1, true});
      if (fits != s.ok() || (!fits && !absl::StrContains(s.message(), "RLIMIT_DATA"))) {
        return Fail(absl::StrCat(hidden.size(), " hidden layer(s): ", s.ToString()));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace ringmaster::train
