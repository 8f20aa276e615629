#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "comm/tcp/tcp_communicator.h"
#include "gtest/gtest.h"
#include "train/data/text_dataset.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"
#include "train/testing.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::ExpectOkOnRanks;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// The trainer's measured numbers (its memory line: parameters, gradients, optimizer state,
// activations peak, unit buffers) are the plan's for that rank, for a GPT over text on 2
// ranks at every stage, bf16 with checkpointing; the unit buffers stay within the plan's
// bound.
TEST(PlanRankMemory, HeldToTheTrainersMeasurements) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("ZeRO-", stage));
    TrainConfig config;
    config.model.kind = ModelConfig::Kind::kGpt;
    config.model.gpt = {.layers = 3, .heads = 2, .width = 16, .context = 8, .vocab = 256};
    config.data.kind = DataConfig::Kind::kText;
    config.optimizer = AdamWOptions{};
    config.name = "plan";
    config.steps = 2;
    config.global_batch = 10;
    config.micro_max = 3;
    config.precision = Precision::kBFloat16;
    config.model.gpt.checkpoint_every = 2;
    config.zero_stage = stage;
    config.data.eval_every_epoch = false;
    absl::StatusOr<RankMemoryPlan> measured =
        PlanRankMemory(config, 2, stage, FsdpConfig::Wrap::kBlock);
    ASSERT_TRUE(measured.ok()) << measured.status();
    // Each rank against its own plan (ZeRO-1's last rank keeps less optimizer state).
    absl::StatusOr<std::unique_ptr<Model>> model =
        CreateModel(config.model, DescribeJobData(config));
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<RankMemoryPlan> plans;
    for (int rank : {0, 1}) {
      absl::StatusOr<RankMemoryPlan> plan =
          PlanRankState(config, **model, 2, rank, stage, FsdpConfig::Wrap::kBlock);
      ASSERT_TRUE(plan.ok()) << plan.status();
      plan->activation_bytes = measured->activation_bytes;
      plans.push_back(*plan);
    }
    if (stage == 1) {
      EXPECT_LT(plans[1].optimizer_bytes, plans[0].optimizer_bytes);
    }
    ExpectOkOnRanks(2, [&](TcpCommunicator& comm) -> absl::Status {
      std::string text;
      while (text.size() < 600) text += "every rank holds a part of the state; ";
      RM_ASSIGN_OR_RETURN(std::unique_ptr<data::TextDataset> data,
                          data::TextDataset::Create("text", text, config.model.gpt.context));
      TrainerOptions o;
      o.config = config;
      o.comm = &comm;
      o.local_ranks = 2;
      o.op_timeout = absl::Seconds(30);
      o.train_data = data.get();
      RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
      const RankMemoryPlan* plan = &plans[comm.rank()];
      if (result.activation_bytes_peak() != static_cast<double>(plan->activation_bytes)) {
        return Fail(absl::StrCat("the trainer's activations peaked at ",
                                 result.activation_bytes_peak(), " bytes; planned ",
                                 plan->activation_bytes));
      }
      if (result.optimizer_state_bytes() != static_cast<double>(plan->optimizer_bytes)) {
        return Fail(absl::StrCat("the trainer's optimizer state is ",
                                 result.optimizer_state_bytes(), " bytes; planned ",
                                 plan->optimizer_bytes));
      }
      // The result counts ZeRO-2's whole compute copy with the parameters; the plan apart.
      const int64_t parameters =
          plan->parameter_bytes + (stage == 2 ? plan->compute_copy_bytes : 0);
      if (result.parameter_bytes() != static_cast<double>(parameters) ||
          result.gradient_bytes() != static_cast<double>(plan->gradient_bytes)) {
        return Fail(absl::StrCat("the trainer holds ", result.parameter_bytes(),
                                 " bytes of parameters and ", result.gradient_bytes(),
                                 " of gradients; planned ", parameters, " and ",
                                 plan->gradient_bytes));
      }
      if (result.unit_buffer_bytes() > static_cast<double>(plan->unit_buffer_bytes) ||
          (stage >= 2) != (result.unit_buffer_bytes() > 0)) {
        return Fail(absl::StrCat("the unit buffers peaked at ", result.unit_buffer_bytes(),
                                 " bytes; planned at most ", plan->unit_buffer_bytes));
      }
      return absl::OkStatus();
    });
  }
}

// A job like examples/tiny_gpt.yaml (a GPT of 4 blocks, 128 wide, over text; AdamW; 32
// sequences a step in micro-batches of at most 16) under ZeRO-3 on 2 ranks.
TrainConfig TinyGpt(int layers, int checkpoint_every, Precision precision, FsdpConfig::Wrap wrap) {
  TrainConfig config;
  config.model.kind = ModelConfig::Kind::kGpt;
  config.model.gpt = {.layers = layers, .heads = 4, .width = 128, .context = 128, .vocab = 256};
  config.model.gpt.checkpoint_every = checkpoint_every;
  config.data.kind = DataConfig::Kind::kText;
  config.optimizer = AdamWOptions{};
  config.name = "tiny_gpt";
  config.steps = 2;
  config.global_batch = 32;
  config.micro_max = 16;
  config.precision = precision;
  config.zero_stage = 3;
  config.fsdp.wrap = wrap;
  config.data.eval_every_epoch = false;
  return config;
}

// The unit buffers `ringctl estimate memory` prints (PlanEveryConfiguration for the spec as
// written, device auto: the CPU here), what the trainer plans on its memory line (PlanRankState
// for a CPU rank) and what the strategy's pool holds at peak with its staging
// (TrainResult.unit_buffer_bytes) are one figure for every wrapping. The plan is a bound
// (fsdp.h): with checkpointing it counts a recomputed segment's units and those prefetched
// past it, which 4 blocks in segments of 2 never reach (their only recomputed segment is
// the first, and what it would prefetch is the embeddings, which backward does not read);
// 6 blocks do. With layer wrapping the units differ in size, and which of them share a
// buffer depends on when the communication thread gives buffers back: the pool holds the
// largest ones or a little less (526848 or 528384 bytes in fp32), never more.
TEST(PlanRankMemory, UnitBuffersAreWhatTheEstimateSaysAndThePoolHolds) {
  using Wrap = FsdpConfig::Wrap;
  struct Case {
    int layers, checkpoint_every;
    Precision precision;
    Wrap wrap;
    bool exact;  // the pool reaches the plan
  };
  const Case cases[] = {
      {4, 0, Precision::kFloat32, Wrap::kLayer, false},
      {4, 0, Precision::kFloat32, Wrap::kBlock, true},
      {4, 0, Precision::kFloat32, Wrap::kModel, true},
      {4, 2, Precision::kBFloat16, Wrap::kLayer, false},
      {4, 2, Precision::kBFloat16, Wrap::kBlock, false},
      {4, 2, Precision::kBFloat16, Wrap::kModel, true},
      {6, 2, Precision::kBFloat16, Wrap::kBlock, true},
  };
  for (const Case& c : cases) {
    TrainConfig config = TinyGpt(c.layers, c.checkpoint_every, c.precision, c.wrap);
    SCOPED_TRACE(absl::StrCat(c.layers, " blocks, checkpointing every ", c.checkpoint_every, ", ",
                              PrecisionName(c.precision), ", wrap ", WrapName(c.wrap)));
    ASSERT_EQ(config.device, TrainConfig::Device::kAuto);  // the examples' default
    // Under --config=cudaemu this process sees an emulated GPU that the forked ranks below
    // cannot use (CUDA initialised before fork): they train on the CPU, so plan for it there.
    if (PlannedDevice(config) != TrainConfig::Device::kCpu) {
      config.device = TrainConfig::Device::kCpu;
    }
    absl::StatusOr<std::vector<RankMemoryPlan>> estimate = PlanEveryConfiguration(config, 2);
    ASSERT_TRUE(estimate.ok()) << estimate.status();
    const auto row = std::find_if(estimate->begin(), estimate->end(), [&](const RankMemoryPlan& p) {
      return p.zero_stage == 3 && p.wrap == c.wrap;
    });
    ASSERT_NE(row, estimate->end());
    // The trainer's: PlanRankState for the CPU it runs on (trainer.cc, its memory line).
    TrainConfig on_cpu = config;
    on_cpu.device = TrainConfig::Device::kCpu;
    absl::StatusOr<std::unique_ptr<Model>> model =
        CreateModel(config.model, DescribeJobData(config));
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<RankMemoryPlan> trainers = PlanRankState(on_cpu, **model, 2, 0, 3, c.wrap);
    ASSERT_TRUE(trainers.ok()) << trainers.status();
    EXPECT_EQ(row->unit_buffer_bytes, trainers->unit_buffer_bytes);
    ExpectOkOnRanks(2, [&](TcpCommunicator& comm) -> absl::Status {
      std::string text;
      while (text.size() < 20000) text += "every rank holds a part of the state; ";
      RM_ASSIGN_OR_RETURN(std::unique_ptr<data::TextDataset> data,
                          data::TextDataset::Create("text", text, config.model.gpt.context));
      TrainerOptions o;
      o.config = config;
      o.comm = &comm;
      o.local_ranks = 2;
      o.op_timeout = absl::Seconds(30);
      o.train_data = data.get();
      RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
      const double held = result.unit_buffer_bytes(), planned = row->unit_buffer_bytes;
      if (c.exact ? held != planned : held > planned) {
        return Fail(absl::StrCat("rank ", comm.rank(), ": the pool and its staging peaked at ",
                                 held, " bytes; the estimate says ", c.exact ? "" : "at most ",
                                 planned));
      }
      return absl::OkStatus();
    });
  }
}

// A mesh of tensor parallelism alone (pp 1) has no pipeline: the trainer's lines say
// nothing of one (no schedule, stage-ranks or bubble), while pp 2 still does.
TEST(TrainerLines, ATensorParallelMeshWithoutPipelineStagesSaysNoPipeline) {
  for (const int pp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("pp ", pp));
    TrainConfig config = TinyGpt(2, 0, Precision::kFloat32, FsdpConfig::Wrap::kBlock);
    config.zero_stage = 0;
    config.mesh.tp = 3 - pp;  // tp 2 alone, or pp 2 alone: 2 ranks either way
    config.mesh.pp = pp;
    config.model.gpt.width = 32;
    config.model.gpt.context = 16;
    config.global_batch = 8;
    config.micro_max = 0;
    ExpectOkOnRanks(2, [&](TcpCommunicator& comm) -> absl::Status {  // forked ranks
      std::vector<std::string> lines;
      std::string text;
      while (text.size() < 4000) text += "every rank holds a part of the state; ";
      RM_ASSIGN_OR_RETURN(std::unique_ptr<data::TextDataset> data,
                          data::TextDataset::Create("text", text, config.model.gpt.context));
      TrainerOptions o;
      o.config = config;
      o.comm = &comm;
      o.local_ranks = 2;
      o.op_timeout = absl::Seconds(30);
      o.train_data = data.get();
      o.progress = [&lines](const std::string& line) { lines.push_back(line); };
      RM_RETURN_IF_ERROR(RunTraining(o).status());
      if (comm.rank() != 0) return absl::OkStatus();  // rank 0 prints the lines
      const bool said = std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
        return absl::StrContains(line, "pipeline") || absl::StrContains(line, "bubble");
      });
      if (said == (pp > 1)) return absl::OkStatus();
      return Fail(absl::StrCat(said ? "a pipeline told of in:\n" : "no pipeline told of in:\n",
                               absl::StrJoin(lines, "\n")));
    });
  }
}

}  // namespace
}  // namespace ringmaster::train
