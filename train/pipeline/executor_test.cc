// The pipeline executor on forked ranks (TCP communicator): every schedule over a range of
// (P, m, v) gives each stage's parameter gradients bit for bit those of running the same
// stages one after the other on one process (the schedules accumulate each stage's
// micro-batches in micro-batch order, as the reference does), and a message larger than the
// transport's buffers (4 MiB: the shared-memory rings hold 1 MiB) moves without deadlock.
#include "train/pipeline/executor.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/tcp/tcp_communicator.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "train/pipeline/testing.h"

namespace ringmaster::train::pipeline {
namespace {

// Model stage s: y = tanh(a ⊙ x + c) over `width` floats a micro-batch, its parameters a and c
// per element; the first stage's input is micro-batch i's data, the last stage's loss is
// ½ Σ y². Element-wise, so that a wide message costs little compute.
class ToyStage final : public PipelineStage {
 public:
  ToyStage(int stage, int stages, int64_t width)
      : first_(stage == 0),
        last_(stage == stages - 1),
        width_(width),
        a_(width),
        c_(width),
        da_(width, 0.0f),
        dc_(width, 0.0f) {
    for (int64_t j = 0; j < width; ++j) {
      a_[j] = 0.5f + 0.1f * static_cast<float>((j + 7 * stage) % 5);
      c_[j] = 0.01f * static_cast<float>((j * 3 + stage) % 7) - 0.03f;
    }
  }
  static float Data(int micro, int64_t j) { return std::sin(0.01f * j + micro); }

  int64_t input_elements(int) const override { return first_ ? 0 : width_; }
  int64_t output_elements(int) const override { return last_ ? 0 : width_; }

  absl::Status Forward(int micro, absl::Span<const float> input,
                       absl::Span<float> output) override {
    if (static_cast<int64_t>(input.size()) != input_elements(micro) ||
        static_cast<int64_t>(output.size()) != output_elements(micro)) {
      return absl::InternalError("Forward: wrong buffer sizes");
    }
    std::vector<float>& x = x_[micro];
    std::vector<float>& y = y_[micro];
    x.resize(width_);
    y.resize(width_);
    for (int64_t j = 0; j < width_; ++j) {
      x[j] = first_ ? Data(micro, j) : input[j];
      y[j] = std::tanh(a_[j] * x[j] + c_[j]);
      if (!last_) output[j] = y[j];
    }
    return absl::OkStatus();
  }
  absl::Status Backward(int micro, absl::Span<const float> output_grad,
                        absl::Span<float> input_grad) override {
    RM_RETURN_IF_ERROR(BackwardInput(micro, output_grad, input_grad));
    return BackwardWeight(micro);
  }
  absl::Status BackwardInput(int micro, absl::Span<const float> output_grad,
                             absl::Span<float> input_grad) override {
    if (!x_.count(micro)) return absl::InternalError("BackwardInput before Forward");
    if (static_cast<int64_t>(output_grad.size()) != output_elements(micro) ||
        static_cast<int64_t>(input_grad.size()) != input_elements(micro)) {
      return absl::InternalError("BackwardInput: wrong buffer sizes");
    }
    const std::vector<float>& y = y_[micro];
    std::vector<float>& dz = dz_[micro];
    dz.resize(width_);
    for (int64_t j = 0; j < width_; ++j) {
      const float dy = last_ ? y[j] : output_grad[j];
      dz[j] = dy * (1 - y[j] * y[j]);
      if (!first_) input_grad[j] = dz[j] * a_[j];
    }
    return absl::OkStatus();
  }
  absl::Status BackwardWeight(int micro) override {
    if (!dz_.count(micro)) return absl::InternalError("BackwardWeight before BackwardInput");
    const std::vector<float>& x = x_[micro];
    const std::vector<float>& dz = dz_[micro];
    for (int64_t j = 0; j < width_; ++j) {
      da_[j] += dz[j] * x[j];
      dc_[j] += dz[j];
    }
    x_.erase(micro);
    y_.erase(micro);
    dz_.erase(micro);
    return absl::OkStatus();
  }

  const std::vector<float>& da() const { return da_; }
  const std::vector<float>& dc() const { return dc_; }

 private:
  const bool first_, last_;
  const int64_t width_;
  std::vector<float> a_, c_, da_, dc_;
  std::map<int, std::vector<float>> x_, y_, dz_;
};

// Each stage's gradients from running the stages in order on one process, micro-batch after
// micro-batch.
std::vector<std::unique_ptr<ToyStage>> Reference(int stages, int m, int64_t width) {
  std::vector<std::unique_ptr<ToyStage>> s;
  for (int st = 0; st < stages; ++st) s.push_back(std::make_unique<ToyStage>(st, stages, width));
  for (int i = 0; i < m; ++i) {
    std::vector<std::vector<float>> act(stages + 1, std::vector<float>(width));
    for (int st = 0; st < stages; ++st) {
      const bool first = st == 0, last = st == stages - 1;
      (void)s[st]->Forward(i, first ? absl::Span<const float>() : act[st],
                           last ? absl::Span<float>() : absl::MakeSpan(act[st + 1]));
    }
    std::vector<std::vector<float>> grad(stages + 1, std::vector<float>(width));
    for (int st = stages - 1; st >= 0; --st) {
      const bool first = st == 0, last = st == stages - 1;
      (void)s[st]->Backward(i, last ? absl::Span<const float>() : grad[st + 1],
                            first ? absl::Span<float>() : absl::MakeSpan(grad[st]));
    }
  }
  return s;
}

// Runs `o` on P forked ranks, each comparing its stages' gradients with the reference. With
// `pooled`, three runs (fresh stages each) share a MessagePool: the later ones take their
// messages from what the earlier ones freed, former contents and all.
void ExpectMatchesTheReference(const ScheduleOptions& o, int64_t width, bool pooled = false) {
  testing::RunOnRanks(
      o, [&](comm::TcpCommunicator& comm, const Schedule& schedule) -> absl::Status {
        const int rank = comm.rank(), stages = schedule.stages();
        MessagePool pool;
        for (int run = 0; run < (pooled ? 3 : 1); ++run) {
          std::map<int, std::unique_ptr<ToyStage>> mine;
          PipelineExecutorOptions eo;
          eo.schedule = &schedule;
          eo.rank = rank;
          eo.comm = &comm;
          eo.op_timeout = absl::Seconds(60);
          if (pooled) eo.pool = &pool;
          for (int st = rank; st < stages; st += o.ranks) {
            mine[st] = std::make_unique<ToyStage>(st, stages, width);
            eo.stages[st] = mine[st].get();
          }
          absl::StatusOr<PipelineRunStats> stats = RunPipeline(eo);
          if (!stats.ok()) return stats.status();
          const std::vector<std::unique_ptr<ToyStage>> ref =
              Reference(stages, o.micro_batches, width);
          for (const auto& [st, stage] : mine) {
            if (stage->da() != ref[st]->da() || stage->dc() != ref[st]->dc()) {
              return absl::InternalError(
                  absl::StrCat("run ", run, ": stage ", st, "'s gradients differ"));
            }
          }
          if (stats->batches == 0 && o.ranks > 1) {
            return absl::InternalError("no message batch ran");
          }
          // Every message a run made went back to the pool: at least its peak is kept.
          if (pooled && pool.bytes() < stats->peak_buffer_bytes) {
            return absl::InternalError(absl::StrCat("run ", run, ": the pool keeps ", pool.bytes(),
                                                    " bytes, the run held ",
                                                    stats->peak_buffer_bytes, " at once"));
          }
        }
        return absl::OkStatus();
      });
}

TEST(PipelineExecutor, EveryScheduleMatchesRunningTheStagesInOrder) {
  testing::ForEachLayout({1, 2, 3, 4}, {1, 2, 4, 6}, 8,
                         [](const ScheduleOptions& o) { ExpectMatchesTheReference(o, 64); });
}

// 4 MiB messages, beyond what the transport buffers: both neighbours of a rank send to it
// while it sends to them; the batches move them together.
TEST(PipelineExecutor, MessagesLargerThanTheTransportsBuffers) {
  ExpectMatchesTheReference({ScheduleKind::kOneFOneB, 2, 4, 1}, int64_t{1} << 20);
  ExpectMatchesTheReference({ScheduleKind::kInterleaved1F1B, 2, 2, 2}, int64_t{1} << 20);
  ExpectMatchesTheReference({ScheduleKind::kZeroBubble, 3, 3, 1}, int64_t{1} << 20);
}

// Messages reused across runs through a MessagePool (a GPU's allocations are slow): the same
// gradients every run.
TEST(PipelineExecutor, PooledMessagesAcrossRuns) {
  ExpectMatchesTheReference({ScheduleKind::kOneFOneB, 2, 4, 1}, 64, /*pooled=*/true);
  ExpectMatchesTheReference({ScheduleKind::kInterleaved1F1B, 2, 4, 2}, 64, /*pooled=*/true);
  ExpectMatchesTheReference({ScheduleKind::kZeroBubble, 3, 3, 1}, 64, /*pooled=*/true);
  ExpectMatchesTheReference({ScheduleKind::kGPipe, 1, 3, 1}, 0, /*pooled=*/true);
}

// Stages whose messages hold no elements (empty spans, no memory) still run every schedule.
TEST(PipelineExecutor, ZeroElementMessages) {
  ExpectMatchesTheReference({ScheduleKind::kOneFOneB, 2, 3, 1}, 0);
  ExpectMatchesTheReference({ScheduleKind::kZeroBubble, 3, 3, 1}, 0);
}

TEST(PipelineExecutor, BadOptionsAreNamed) {
  const Schedule s = *MakeSchedule({ScheduleKind::kOneFOneB, 2, 2, 1});
  PipelineExecutorOptions o;
  EXPECT_TRUE(absl::IsInvalidArgument(RunPipeline(o).status()));
  o.schedule = &s;
  o.rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(RunPipeline(o).status()));
  comm::testing::MultiProcOptions mp;
  mp.world_size = 2;
  auto results = comm::testing::RunRanks(
      mp, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        PipelineExecutorOptions eo;
        eo.schedule = &s;
        eo.rank = comm.rank();
        eo.comm = &comm;
        eo.ops = nullptr;
        absl::Status st = RunPipeline(eo).status();
        if (!absl::IsInvalidArgument(st) ||
            st.message().find("PipelineExecutorOptions.ops") == absl::string_view::npos) {
          return absl::InternalError(absl::StrCat("want the null ops named, got ", st.ToString()));
        }
        eo.ops = HostVectorOps();  // but no stages
        st = RunPipeline(eo).status();
        if (!absl::IsInvalidArgument(st) ||
            st.message().find("was given no stage") == absl::string_view::npos) {
          return absl::InternalError(
              absl::StrCat("want the missing stage named, got ", st.ToString()));
        }
        return absl::OkStatus();
      });
  for (const auto& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
}

}  // namespace
}  // namespace ringmaster::train::pipeline
