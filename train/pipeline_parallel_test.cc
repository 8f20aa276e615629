// PipelineParallel on forked ranks laid out on a mesh (pp outermost, dp): a few SGD steps
// through RunStep, ReduceGradients and the strategy's pieces give each stage's parameters
// those of one whole GptModel trained on the same global batches; the pieces place every
// tensor of the whole model exactly once; a forward-only Evaluate gives the whole model's
// loss.
#include "train/pipeline_parallel.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mesh.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "train/nn/gpt_testing.h"

namespace ringmaster::train {
namespace {

nn::GptOptions Gpt() { return {.layers = 4, .heads = 2, .width = 16, .context = 6, .vocab = 13}; }

constexpr float kLr = 0.05f;
constexpr int kSteps = 3;

// Global batch `step`: 2 samples per micro-batch per replica.
std::vector<Batch> ReplicaMicroBatches(int step, int replica, int m) {
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i)
    out.push_back(nn::RandomTokens(2, Gpt(), 1000 * step + 10 * replica + i));
  return out;
}

struct Layout {
  int pp = 1, dp = 1, m = 2, v = 1;
  pipeline::ScheduleKind kind = pipeline::ScheduleKind::kOneFOneB;
  int zero_stage = 0;
  std::string Name() const {
    return absl::StrCat(pipeline::ScheduleName(kind), " pp", pp, " dp", dp, " m", m, " v", v,
                        " ZeRO-", zero_stage);
  }
};

// The whole model after kSteps of SGD on every replica's micro-batches (the mean over the
// global batch), and its loss on an evaluation batch.
struct Reference {
  std::map<std::string, std::vector<float>> params;
  double eval_loss = 0;
};

Reference Whole(const Layout& l) {
  std::unique_ptr<nn::GptModel> model = *nn::GptModel::Create(Gpt());
  state::FlatBuffer params(model->table().total_elements()), grads(params.size());
  model->Init(5, params);
  for (int step = 0; step < kSteps; ++step) {
    ForwardBackwardOptions fb;
    fb.loss_divisor = 2.0 * Gpt().context * l.m * l.dp;
    bool first = true;
    for (int r = 0; r < l.dp; ++r) {
      for (const Batch& b : ReplicaMicroBatches(step, r, l.m)) {
        fb.accumulate = !first;
        first = false;
        CHECK(model->ForwardBackward(b, params, grads, fb).ok());
      }
    }
    for (int64_t i = 0; i < params.size(); ++i) params.data()[i] -= kLr * grads.data()[i];
  }
  Reference ref;
  for (const state::TensorSpec& t : model->table().tensors()) {
    ref.params[t.name].assign(params.data() + t.offset, params.data() + t.offset + t.numel);
  }
  ref.eval_loss =
      model->Evaluate(nn::RandomTokens(3, Gpt(), 7), params, Precision::kFloat32)->loss_sum;
  return ref;
}

// A rank's mesh groups, the whole model and its strategy for layout `l`.
struct Ranks {
  comm::Mesh mesh;
  std::unique_ptr<comm::Communicator> pp, dp;
  std::unique_ptr<nn::GptModel> whole;
  std::unique_ptr<PipelineParallel> strategy;
};

absl::StatusOr<Ranks> MakeRanks(comm::Communicator& world, const Layout& l) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  RM_ASSIGN_OR_RETURN(comm::Mesh mesh,
                      comm::Mesh::Create(world.size(), {{"pp", l.pp}, {"dp", l.dp}}));
  Ranks r{mesh};
  RM_ASSIGN_OR_RETURN(r.pp, mesh.Group(world, comm::MeshDim::kPp, deadline));
  RM_ASSIGN_OR_RETURN(r.dp, mesh.Group(world, comm::MeshDim::kDp, deadline));
  r.whole = *nn::GptModel::Create(Gpt());
  PipelineParallelOptions o;
  o.gpt = Gpt();
  o.whole_table = &r.whole->table();
  o.schedule = {l.kind, l.pp, l.m, l.v};
  o.pp_comm = r.pp.get();
  o.dp_comm = r.dp.get();
  o.world_comm = &world;
  o.dp.zero_stage = l.zero_stage;
  o.dp.bucket_mb = 0.001;  // several buckets
  RM_ASSIGN_OR_RETURN(r.strategy, PipelineParallel::Create(o));
  return r;
}

void ExpectTrainsLikeTheWholeModel(const Layout& l) {
  const Reference ref = Whole(l);
  comm::testing::MultiProcOptions mp;
  mp.world_size = l.pp * l.dp;
  auto results = comm::testing::RunRanks(
      mp, [&](comm::TcpCommunicator& world, absl::Duration*) -> absl::Status {
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        RM_ASSIGN_OR_RETURN(Ranks ranks, MakeRanks(world, l));
        const comm::Mesh& mesh = ranks.mesh;
        comm::Communicator* pp = ranks.pp.get();
        const std::unique_ptr<nn::GptModel>& whole = ranks.whole;
        const std::unique_ptr<PipelineParallel>& s = ranks.strategy;
        if (s->pipeline() != s.get()) return absl::InternalError("pipeline() is not itself");

        state::FlatBuffer params(s->local_elements()), grads(s->local_elements());
        whole->InitPieces(5, s->held_pieces(), params.span());
        const int replica = mesh.Coordinates(world.rank())[static_cast<int>(comm::MeshDim::kDp)];
        for (int step = 0; step < kSteps; ++step) {
          const std::vector<Batch> batches = ReplicaMicroBatches(step, replica, l.m);
          ForwardBackwardOptions fb;
          fb.loss_divisor = 2.0 * Gpt().context * l.m * l.dp;
          s->BeginGradients(grads.data(), false);
          RM_RETURN_IF_ERROR(s->RunStep(batches, params.span(), grads.span(), fb).status());
          RM_RETURN_IF_ERROR(s->ReduceGradients());
          const state::FlatRange w = s->update_window();
          for (int64_t i = w.begin; i < w.end; ++i) params.data()[i] -= kLr * grads.data()[i];
          RM_RETURN_IF_ERROR(s->AfterOptimizerStep(params.span()));
        }
        // Every held tensor as the whole model's, to float rounding (the data-parallel sum
        // adds the replicas' gradients in another order).
        for (const state::PlacedRange& p : s->held_pieces()) {
          for (const state::TensorSpec& t : whole->table().tensors()) {
            if (t.offset != p.range.begin) continue;
            const std::vector<float>& want = ref.params.at(t.name);
            for (int64_t i = 0; i < t.numel; ++i) {
              const float got = params.data()[p.at + i];
              if (std::abs(got - want[i]) > 1e-5f + 1e-4f * std::abs(want[i])) {
                return absl::InternalError(
                    absl::StrCat(t.name, "[", i, "] is ", got, "; the whole model's ", want[i]));
              }
            }
          }
        }
        // The bubble as this rank saw it: some (P > 1 ranks wait), never all; the formula
        // is the schedule's; the micro-batches in flight as the schedule keeps them.
        if (!(s->measured_bubble() > 0 && s->measured_bubble() < 1)) {
          return absl::InternalError(absl::StrCat("measured bubble ", s->measured_bubble()));
        }
        if (s->formula_bubble() != pipeline::FormulaBubble(s->schedule().options)) {
          return absl::InternalError("formula_bubble is not the schedule's");
        }
        const int in_flight_bound = l.kind == pipeline::ScheduleKind::kGPipe ? l.m : l.m * l.v;
        if (s->peak_in_flight() < 1 || s->peak_in_flight() > in_flight_bound ||
            (l.kind == pipeline::ScheduleKind::kGPipe && s->peak_in_flight() != l.m)) {
          return absl::InternalError(absl::StrCat("peak in flight ", s->peak_in_flight()));
        }
        // The whole parameters, gathered, and a forward-only pass.
        state::FlatBuffer gathered(whole->table().total_elements());
        RM_RETURN_IF_ERROR(s->WholeParameters(params.span(), gathered.span()));
        RM_ASSIGN_OR_RETURN(StepStats eval, s->Evaluate(nn::RandomTokens(3, Gpt(), 7),
                                                        params.span(), Precision::kFloat32));
        double loss = eval.loss_sum;
        RM_RETURN_IF_ERROR(
            pp->AllReduce(&loss, &loss, 1, DataType::kFloat64, comm::ReduceOp::kSum, deadline));
        if (std::abs(loss - ref.eval_loss) > 1e-4 * std::abs(ref.eval_loss)) {
          return absl::InternalError(
              absl::StrCat("evaluation loss ", loss, "; the whole model's ", ref.eval_loss));
        }
        RM_ASSIGN_OR_RETURN(StepStats again, whole->Evaluate(nn::RandomTokens(3, Gpt(), 7),
                                                             gathered, Precision::kFloat32));
        if (std::abs(again.loss_sum - ref.eval_loss) > 1e-4 * std::abs(ref.eval_loss)) {
          return absl::InternalError("the gathered whole parameters are not the trained ones");
        }
        return absl::OkStatus();
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << l.Name() << " rank " << r << ": " << results[r].status;
  }
}

TEST(PipelineParallel, TrainsLikeTheWholeModel) {
  ExpectTrainsLikeTheWholeModel({.pp = 2, .dp = 1, .m = 3});
  ExpectTrainsLikeTheWholeModel({.pp = 2, .dp = 2, .m = 2});
  ExpectTrainsLikeTheWholeModel(
      {.pp = 2, .dp = 2, .m = 2, .kind = pipeline::ScheduleKind::kZeroBubble, .zero_stage = 1});
  ExpectTrainsLikeTheWholeModel(
      {.pp = 2, .dp = 1, .m = 4, .v = 2, .kind = pipeline::ScheduleKind::kInterleaved1F1B});
  ExpectTrainsLikeTheWholeModel({.pp = 4, .dp = 1, .m = 4, .kind = pipeline::ScheduleKind::kGPipe});
}

// The pieces of all ranks place every tensor of the whole model: each exactly once among the
// saved pieces of a stage's replicas, and in full among each rank's held pieces.
TEST(PipelineParallel, PiecesTileTheWholeModel) {
  for (int zero : {0, 1}) {
    const int pp = 2, dp = 2;
    comm::testing::MultiProcOptions mp;
    mp.world_size = pp * dp;
    auto results = comm::testing::RunRanks(
        mp, [&](comm::TcpCommunicator& world, absl::Duration*) -> absl::Status {
          const absl::Time deadline = absl::Now() + absl::Seconds(60);
          RM_ASSIGN_OR_RETURN(Ranks ranks,
                              MakeRanks(world, {.pp = pp, .dp = dp, .zero_stage = zero}));
          const std::unique_ptr<nn::GptModel>& whole = ranks.whole;
          const std::unique_ptr<PipelineParallel>& s = ranks.strategy;
          const int64_t total = whole->table().total_elements();
          std::vector<double> saved(total, 0), held(total, 0);
          for (const state::PlacedRange& p : s->saved_pieces()) {
            for (int64_t i = p.range.begin; i < p.range.end; ++i) saved[i] += 1;
          }
          for (const state::PlacedRange& p : s->held_pieces()) {
            for (int64_t i = p.range.begin; i < p.range.end; ++i) held[i] += 1;
          }
          RM_RETURN_IF_ERROR(
              state::CheckPlacement(whole->table(), s->held_pieces(), s->local_elements()));
          RM_RETURN_IF_ERROR(world.AllReduce(saved.data(), saved.data(), total, DataType::kFloat64,
                                             comm::ReduceOp::kSum, deadline));
          RM_RETURN_IF_ERROR(world.AllReduce(held.data(), held.data(), total, DataType::kFloat64,
                                             comm::ReduceOp::kSum, deadline));
          for (const state::TensorSpec& t : whole->table().tensors()) {
            for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
              if (saved[i] != 1)
                return absl::InternalError(absl::StrCat(t.name, " saved ", saved[i], " times"));
              if (held[i] != dp)
                return absl::InternalError(absl::StrCat(t.name, " held ", held[i], " times"));
            }
          }
          return absl::OkStatus();
        });
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].status.ok())
          << "ZeRO-" << zero << " rank " << r << ": " << results[r].status;
    }
  }
}

TEST(PipelineParallel, BadOptionsAreNamed) {
  std::unique_ptr<nn::GptModel> whole = *nn::GptModel::Create(Gpt());
  PipelineParallelOptions o;
  o.gpt = Gpt();
  o.whole_table = &whole->table();
  absl::Status s = PipelineParallel::Create(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

}  // namespace
}  // namespace ringmaster::train
