// The GPT as pipeline stages on forked ranks (TCP communicator): every schedule over P = 1, 2
// and 4 ranks and several micro-batch counts gives each stage's gradients, and the last
// stage's loss, bit for bit those of one whole GptModel accumulating the same micro-batches.
#include "train/pipeline/gpt_stage.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "train/nn/gpt_testing.h"
#include "train/pipeline/schedule.h"
#include "train/pipeline/testing.h"

namespace ringmaster::train::pipeline {
namespace {

nn::GptOptions Whole() { return {.layers = 4, .heads = 2, .width = 16, .context = 6, .vocab = 13}; }

// Micro-batch i holds 1 + i % 2 samples (sizes differ, as a global batch's last one may).
std::vector<Batch> MicroBatches(int m) {
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i) out.push_back(nn::RandomTokens(1 + i % 2, Whole(), 100 + i));
  return out;
}

int64_t Tokens(const std::vector<Batch>& batches) {
  int64_t n = 0;
  for (const Batch& b : batches) n += b.size * b.context;
  return n;
}

// One whole model over the micro-batches with accumulation: the reference gradients by
// tensor name, and the loss.
struct Reference {
  std::map<std::string, std::vector<float>> grads;
  double loss = 0;
};

Reference RunWhole(const std::vector<Batch>& batches, const ForwardBackwardOptions& base) {
  std::unique_ptr<nn::GptModel> model = *nn::GptModel::Create(Whole());
  state::FlatBuffer params(model->table().total_elements());
  state::FlatBuffer grads(model->table().total_elements());
  model->Init(9, params);
  Reference ref;
  ForwardBackwardOptions o = base;
  for (size_t i = 0; i < batches.size(); ++i) {
    o.accumulate = i > 0;
    absl::StatusOr<StepStats> s = model->ForwardBackward(batches[i], params, grads, o);
    CHECK(s.ok()) << s.status();
    ref.loss += s->loss_sum;
  }
  for (const state::TensorSpec& t : model->table().tensors()) {
    ref.grads[t.name].assign(grads.data() + t.offset, grads.data() + t.offset + t.numel);
  }
  return ref;
}

// Runs `o` on P forked ranks, each comparing its stages with the reference.
// `discarded`: micro-batches that run as stand-ins and count for nothing (the reference
// leaves them out).
void ExpectMatchesTheWholeModel(const ScheduleOptions& o, Precision precision,
                                const std::vector<bool>& discarded = {}) {
  const std::vector<Batch> batches = MicroBatches(o.micro_batches);
  ForwardBackwardOptions fb;
  fb.precision = precision;
  fb.loss_divisor = static_cast<double>(Tokens(batches));
  fb.loss_scale = 2;
  testing::RunOnRanks(
      o, [&](comm::TcpCommunicator& comm, const Schedule& schedule) -> absl::Status {
        const int rank = comm.rank(), stages = schedule.stages();
        RM_ASSIGN_OR_RETURN(auto blocks, SplitBlocks(Whole().layers, stages));
        struct Mine {
          std::unique_ptr<GptStage> stage;
          state::FlatBuffer params, grads;
        };
        std::map<int, Mine> mine;
        PipelineExecutorOptions eo{&schedule, rank, &comm, {}, absl::Seconds(60)};
        for (int st = rank; st < stages; st += o.ranks) {
          const nn::GptOptions slice = StageOptions(Whole(), blocks, st);
          Mine& m = mine[st];
          RM_ASSIGN_OR_RETURN(m.stage, GptStage::Create(slice));
          const int64_t n = m.stage->model().table().total_elements();
          m.params = state::FlatBuffer(n);
          m.grads = state::FlatBuffer(n);
          m.stage->model().Init(9, m.params);
          for (float& g : m.grads.span()) g = 77;  // BeginStep zeroes them
          RM_RETURN_IF_ERROR(
              m.stage->BeginStep(batches, m.params.span(), m.grads.span(), fb, discarded));
          eo.stages[st] = m.stage.get();
        }
        RM_ASSIGN_OR_RETURN(PipelineRunStats stats, RunPipeline(eo));
        std::vector<Batch> counted;
        for (size_t i = 0; i < batches.size(); ++i) {
          if (discarded.empty() || !discarded[i]) counted.push_back(batches[i]);
        }
        const Reference ref = RunWhole(counted, fb);
        for (const auto& [st, m] : mine) {
          for (const state::TensorSpec& t : m.stage->model().table().tensors()) {
            const std::vector<float>& want = ref.grads.at(t.name);
            if (std::memcmp(want.data(), m.grads.data() + t.offset, t.numel * sizeof(float)) != 0) {
              return absl::InternalError(
                  absl::StrCat("stage ", st, ": the gradient of ", t.name, " differs"));
            }
          }
          if (st == stages - 1 && m.stage->stats().loss_sum != ref.loss) {
            return absl::InternalError(absl::StrCat("the loss is ", m.stage->stats().loss_sum,
                                                    "; the whole model's ", ref.loss));
          }
          if (m.stage->peak_in_flight() > o.micro_batches) {
            return absl::InternalError(
                absl::StrCat("stage ", st, " held ", m.stage->peak_in_flight(), " micro-batches"));
          }
        }
        if (stats.batches == 0 && o.ranks > 1) return absl::InternalError("no message batch ran");
        return absl::OkStatus();
      });
}

TEST(GptStage, EveryScheduleGivesTheWholeModelsGradientsBitForBit) {
  testing::ForEachLayout({1, 2, 4}, {1, 2, 4}, Whole().layers, [](const ScheduleOptions& o) {
    ExpectMatchesTheWholeModel(o, Precision::kFloat32);
  });
}

// A stand-in micro-batch (a replica short of samples) runs through every stage and adds
// nothing: the gradients and the loss are those of the others alone, bit for bit.
TEST(GptStage, DiscardedMicroBatchesCountForNothing) {
  ExpectMatchesTheWholeModel({ScheduleKind::kOneFOneB, 2, 3, 1}, Precision::kFloat32,
                             {false, true, false});
  ExpectMatchesTheWholeModel({ScheduleKind::kZeroBubble, 2, 3, 1}, Precision::kBFloat16,
                             {false, false, true});
}

TEST(GptStage, HalfPrecisionStagesToo) {
  ExpectMatchesTheWholeModel({ScheduleKind::kOneFOneB, 2, 3, 1}, Precision::kBFloat16);
  ExpectMatchesTheWholeModel({ScheduleKind::kZeroBubble, 2, 3, 1}, Precision::kFloat16);
}

// 1F1B keeps at most P - s micro-batches in flight on stage s; GPipe all m.
TEST(GptStage, InFlightMicroBatchesFollowTheSchedule) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    const int p = 2, m = 6;
    const Schedule schedule = *MakeSchedule({kind, p, m, 1});
    const std::vector<Batch> batches = MicroBatches(m);
    ForwardBackwardOptions fb;
    fb.loss_divisor = static_cast<double>(Tokens(batches));
    comm::testing::MultiProcOptions mp;
    mp.world_size = p;
    auto results = comm::testing::RunRanks(
        mp, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
          const int rank = comm.rank();
          RM_ASSIGN_OR_RETURN(auto blocks, SplitBlocks(Whole().layers, p));
          const nn::GptOptions slice = StageOptions(Whole(), blocks, rank);
          RM_ASSIGN_OR_RETURN(std::unique_ptr<GptStage> stage, GptStage::Create(slice));
          state::FlatBuffer params(stage->model().table().total_elements());
          state::FlatBuffer grads(params.size());
          stage->model().Init(1, params);
          RM_RETURN_IF_ERROR(stage->BeginStep(batches, params.span(), grads.span(), fb));
          PipelineExecutorOptions eo{&schedule, rank, &comm, {{rank, stage.get()}}};
          RM_RETURN_IF_ERROR(RunPipeline(eo).status());
          const int want = kind == ScheduleKind::kGPipe ? m : p - rank;
          if (stage->peak_in_flight() != want) {
            return absl::InternalError(absl::StrCat("stage ", rank, " held ",
                                                    stage->peak_in_flight(),
                                                    " micro-batches at once; want ", want));
          }
          return absl::OkStatus();
        });
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].status.ok())
          << ScheduleName(kind) << " rank " << r << ": " << results[r].status;
    }
  }
}

TEST(GptStage, SplitBlocksAndMisuse) {
  EXPECT_EQ(*SplitBlocks(7, 3), (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(*SplitBlocks(4, 4).value().rbegin(), (std::pair<int64_t, int64_t>{3, 4}));
  absl::Status s = SplitBlocks(2, 3).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("want 1 <= stages <= gpt.layers"), std::string::npos) << s;

  nn::GptOptions slice = Whole();
  slice.first_block = 1;
  slice.end_block = 3;
  std::unique_ptr<GptStage> stage = *GptStage::Create(slice);
  EXPECT_EQ(stage->input_elements(0), 0) << "no step yet";
  std::vector<float> in(6 * 16), out(6 * 16);
  EXPECT_TRUE(absl::IsFailedPrecondition(stage->Forward(0, in, absl::MakeSpan(out))));
  state::FlatBuffer small(3);
  const std::vector<Batch> batches = MicroBatches(2);
  EXPECT_TRUE(absl::IsInvalidArgument(stage->BeginStep(batches, small.span(), small.span(), {})));
  state::FlatBuffer params(stage->model().table().total_elements()), grads(params.size());
  ASSERT_TRUE(stage->BeginStep(batches, params.span(), grads.span(), {}).ok());
  EXPECT_EQ(stage->input_elements(1), 2 * 6 * 16);
  EXPECT_TRUE(absl::IsInvalidArgument(stage->Forward(2, in, absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsFailedPrecondition(stage->Backward(0, out, absl::MakeSpan(in))))
      << "no forward in flight";
  ASSERT_TRUE(stage->Forward(0, in, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(stage->Forward(0, in, absl::MakeSpan(out))));
  // A new step drops what the failed one left in flight.
  ASSERT_TRUE(stage->BeginStep(batches, params.span(), grads.span(), {}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(stage->BackwardWeight(0)));
}

}  // namespace
}  // namespace ringmaster::train::pipeline
