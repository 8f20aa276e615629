#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "comm/tcp/tcp_communicator.h"
#include "gtest/gtest.h"
#include "train/data/text_dataset.h"
#include "train/memory_plan.h"
#include "train/testing.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::ExpectOkOnRanks;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// The trainer's measured numbers (its memory line: parameters, gradients, optimizer state,
// activations peak, unit buffers) are the plan's, for a GPT over text on 2 ranks at every
// stage, bf16 with checkpointing; the unit buffers stay within the plan's bound.
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
    absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(config, 2, stage, FsdpConfig::Wrap::kBlock);
    ASSERT_TRUE(plan.ok()) << plan.status();
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
      if (result.activation_bytes_peak() != static_cast<double>(plan->activation_bytes)) {
        return Fail(absl::StrCat("the trainer's activations peaked at ",
                                 result.activation_bytes_peak(), " bytes; planned ",
                                 plan->activation_bytes));
      }
      if (comm.rank() != 0) return absl::OkStatus();  // the plan is rank 0's
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

}  // namespace
}  // namespace ringmaster::train
