// GptCudaStages run by the pipeline executor on forked ranks, one GPU each (an emulated one
// per process under --config=cudaemu), the messages in device memory (CudaVectorOps) moved
// by NCCL send/receive over the pipeline group:
//   - P = 2 (2 ranks), 1F1B and zero-bubble, m = 2, 3, 4 micro-batches of 1 or 2 samples, and
//     m = 3 with a discarded stand-in micro-batch (it runs and adds nothing);
//   - P = 2 x tp 2 (4 ranks, rank = 2 pp + tp; ncclCommSplit makes each rank's tensor-parallel
//     group and pipeline pair; the tensor-parallel sums are NCCL all-reduces), the same.
// Each rank runs the steps one after another with the same stage (its models reused), and
// compares its stage's gradients and, on the last stage, the step's loss, with one whole
// GptCuda's ForwardBackward over the same micro-batches with accumulation, in its own process
// on the same parameters (fp32; and a bf16 case on one rank: the micro-batches in flight share
// one 16-bit parameter copy). Tolerances, per tensor ||g_stage - g_whole|| <= tol ||g_whole||:
// 1e-5 without tensor parallelism (gpt_cuda_slice_test's bound for slices against the whole
// model; the products see other shapes, so their sums may round differently), 1e-4 with it
// (the partial products are summed in another order: gpt_cuda_tp_test's bound); the loss
// within 1e-6 (1e-5 with tp) relative. Each rank prints its largest measured error and how many
// tensors came out bit-equal. This process never initialises CUDA (its forked ranks could not
// use it).
#include "train/pipeline/gpt_cuda_stage.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/communicator.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_cuda.h"
#include "train/nn/gpt_cuda_testing.h"
#include "train/nn/gpt_testing.h"
#include "train/optim/cuda_vector_ops.h"
#include "train/optim/vector_ops.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/gpt_stage.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::train::pipeline {
namespace {

constexpr int kPp = 2;

nn::GptOptions Whole() { return {.layers = 4, .heads = 4, .width = 32, .context = 8, .vocab = 37}; }

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

absl::Status CudaCheck(cudaError_t e, absl::string_view what) {
  return e == cudaSuccess ? absl::OkStatus()
                          : absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Micro-batch i of a step holds 1 + i % 2 samples (sizes differ, as a global batch's last
// one may); `seed` makes each step's tokens its own.
std::vector<Batch> MicroBatches(int m, uint64_t seed) {
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i) out.push_back(nn::RandomTokens(1 + i % 2, Whole(), seed + i));
  return out;
}

// n floats of the ops' memory holding `host`.
absl::StatusOr<OpsBuffer> Upload(VectorOps& ops, const std::vector<float>& host) {
  RM_ASSIGN_OR_RETURN(OpsBuffer b, ops.Allocate(static_cast<int64_t>(host.size())));
  RM_RETURN_IF_ERROR(ops.CopyFromHost(host.data(), b.span()));
  return b;
}

absl::StatusOr<std::vector<float>> Download(VectorOps& ops, OpsBuffer& b) {
  std::vector<float> host(static_cast<size_t>(b.size()));
  RM_RETURN_IF_ERROR(ops.CopyToHost(b.span(), host.data()));
  return host;
}

// Per tensor: ||got - want|| <= tol ||want|| + 1e-12, else an error naming the tensor. Adds
// the largest relative error to `worst` and counts the bit-equal tensors in `equal`.
absl::Status CheckClose(const state::TensorTable& table, const std::vector<float>& got,
                        const std::vector<float>& want, double tol, const std::string& what,
                        double& worst, int& equal) {
  for (const state::TensorSpec& t : table.tensors()) {
    double diff = 0, ref = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      ref += double{want[i]} * want[i];
    }
    if (std::sqrt(diff) > tol * std::sqrt(ref) + 1e-12) {
      return absl::InternalError(absl::StrCat(what, ": the gradient of ", t.name, " is off by ",
                                              std::sqrt(diff), " against its norm ",
                                              std::sqrt(ref)));
    }
    if (ref > 0) worst = std::max(worst, std::sqrt(diff / ref));
    equal +=
        std::memcmp(got.data() + t.offset, want.data() + t.offset, t.numel * sizeof(float)) == 0;
  }
  return absl::OkStatus();
}

// Misuse of a stage: named errors, nothing run.
absl::Status CheckMisuse(GptCudaStage& stage, VectorOps& ops, OpsBuffer& params, OpsBuffer& grads,
                         const std::vector<Batch>& batches) {
  if (!absl::IsFailedPrecondition(stage.Forward(0, {}, {}))) {
    return absl::InternalError("Forward before BeginStep is not FAILED_PRECONDITION");
  }
  ForwardBackwardOptions fb;
  if (!absl::IsInvalidArgument(
          stage.BeginStep(batches, params.span().subspan(0, 3), grads.span(), fb))) {
    return absl::InternalError("short parameters are not INVALID_ARGUMENT");
  }
  fb.precision = Precision::kBFloat16;
  if (!absl::IsInvalidArgument(stage.BeginStep(batches, params.span(), grads.span(), fb))) {
    return absl::InternalError("a precision other than the model's is not INVALID_ARGUMENT");
  }
  fb.precision = Precision::kFloat32;
  if (!absl::IsInvalidArgument(stage.BeginStep(batches, params.span(), grads.span(), fb, {true}))) {
    return absl::InternalError("discard marks of another length are not INVALID_ARGUMENT");
  }
  RM_RETURN_IF_ERROR(stage.BeginStep(batches, params.span(), grads.span(), fb));
  RM_ASSIGN_OR_RETURN(OpsBuffer small, ops.Allocate(5));
  absl::Status s = stage.Forward(0, small.span(), small.span());
  if (!absl::IsInvalidArgument(s) || s.message().find("floats; want") == absl::string_view::npos) {
    return absl::InternalError(absl::StrCat("a boundary of the wrong size: ", s.ToString()));
  }
  if (!absl::IsFailedPrecondition(stage.BackwardWeight(0))) {
    return absl::InternalError("BackwardWeight without a forward is not FAILED_PRECONDITION");
  }
  return absl::OkStatus();
}

// Rank `world.rank()` of a tp_size x kPp mesh (rank = tp_size * pp + tp).
absl::Status RunRank(comm::NcclCommunicator& world, int tp_size) {
  const int rank = world.rank(), tp = rank % tp_size, pp = rank / tp_size;
  std::unique_ptr<comm::Communicator> tp_group, pp_split;
  comm::Communicator* pp_group = &world;
  if (tp_size > 1) {
    RM_ASSIGN_OR_RETURN(tp_group, world.Split(/*color=*/pp, /*key=*/tp, Soon()));
    RM_ASSIGN_OR_RETURN(pp_split, world.Split(/*color=*/kPp + tp, /*key=*/pp, Soon()));
    pp_group = pp_split.get();
  }
  if (pp_group->rank() != pp || pp_group->size() != kPp) {
    return absl::InternalError("the pipeline group's ranks are not the mesh's coordinates");
  }
  const nn::GptOptions o = Whole();
  std::unique_ptr<nn::GptModel> whole_cpu = *nn::GptModel::Create(o);
  const std::vector<float> params = nn::testing::WholeParams(*whole_cpu);

  cudaStream_t stream = nullptr, ops_stream = nullptr;
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate"));
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamCreate(&ops_stream), "cudaStreamCreate"));
  // The executor's messages, and the test's buffers, in this GPU's memory.
  RM_ASSIGN_OR_RETURN(std::unique_ptr<CudaVectorOps> ops, CudaVectorOps::Create(ops_stream));

  // The whole model, unsplit, on this rank's GPU.
  RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptCuda> whole, nn::GptCuda::Create(o, {}, nullptr));
  RM_ASSIGN_OR_RETURN(OpsBuffer whole_params, Upload(*ops, params));
  RM_ASSIGN_OR_RETURN(OpsBuffer whole_grads, ops->Allocate(whole->total_elements()));

  // This rank's stage: tp shard `tp` of stage `pp`'s blocks.
  RM_ASSIGN_OR_RETURN(auto blocks, SplitBlocks(o.layers, kPp));
  nn::GptOptions mine = StageOptions(o, blocks, pp);
  mine.tp_size = tp_size;
  mine.tp_rank = tp;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptCudaStage> stage, GptCudaStage::Create(mine, {}, stream));
  if (tp_size > 1) {
    stage->set_tensor_parallel_sum([&](float* data, int64_t count, cudaStream_t s) {
      // The communicator's stream does not wait for the model's: the partials first.
      RM_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      return tp_group->AllReduce(data, data, count, DataType::kFloat32, comm::ReduceOp::kSum,
                                 Soon());
    });
  }
  const nn::GptModel& part = stage->model().cpu_model();
  RM_ASSIGN_OR_RETURN(OpsBuffer my_params,
                      Upload(*ops, nn::testing::CutFlat(part, *whole_cpu, params.data())));
  RM_ASSIGN_OR_RETURN(
      OpsBuffer my_grads,
      Upload(*ops, std::vector<float>(stage->model().total_elements(), 77.0f)));  // zeroed later

  RM_RETURN_IF_ERROR(CheckMisuse(*stage, *ops, my_params, my_grads, MicroBatches(2, 1)));

  const double tol = tp_size > 1 ? 1e-4 : 1e-5, loss_tol = tp_size > 1 ? 1e-5 : 1e-6;
  double worst = 0;
  int equal = 0, tensors = 0;
  uint64_t seed = 100;
  // 1F1B and zero-bubble at m = 2, 3, 4; then m = 3 with a stand-in micro-batch (discarded:
  // it runs, adds nothing; the reference leaves it out).
  struct Step {
    ScheduleKind kind;
    int m;
    std::vector<bool> discarded;
  };
  std::vector<Step> steps;
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    for (int m = 2; m <= 4; ++m) steps.push_back({kind, m, {}});
  }
  steps.push_back({ScheduleKind::kOneFOneB, 3, {false, true, false}});
  steps.push_back({ScheduleKind::kZeroBubble, 3, {false, false, true}});
  for (const auto& [kind, m, discarded] : steps) {
    const std::string what =
        absl::StrCat(ScheduleName(kind), " m=", m, " tp=", tp_size,
                     discarded.empty() ? "" : " (one discarded)", " rank ", rank);
    const std::vector<Batch> batches = MicroBatches(m, seed += 10);
    ForwardBackwardOptions fb;
    for (const Batch& b : batches) fb.loss_divisor += static_cast<double>(b.size * b.context);
    fb.loss_scale = 2;

    // The reference: the whole model over the micro-batches with accumulation.
    double want_loss = 0;
    bool accumulate = false;
    for (int i = 0; i < m; ++i) {
      if (!discarded.empty() && discarded[i]) continue;
      ForwardBackwardOptions acc = fb;
      acc.accumulate = accumulate;
      accumulate = true;
      RM_ASSIGN_OR_RETURN(StepStats s, whole->ForwardBackward(batches[i], whole_params.data(),
                                                              whole_grads.data(), acc));
      want_loss += s.loss_sum;
    }
    RM_ASSIGN_OR_RETURN(std::vector<float> want_grads, Download(*ops, whole_grads));

    // The pipeline.
    RM_ASSIGN_OR_RETURN(Schedule schedule, MakeSchedule({kind, kPp, m, 1}));
    RM_RETURN_IF_ERROR(CheckSchedule(schedule));
    RM_RETURN_IF_ERROR(stage->BeginStep(batches, my_params.span(), my_grads.span(), fb, discarded));
    PipelineExecutorOptions eo;
    eo.schedule = &schedule;
    eo.rank = pp;
    eo.comm = pp_group;
    eo.stages[pp] = stage.get();
    eo.op_timeout = absl::Seconds(60);
    eo.ops = ops.get();  // the messages in this GPU's memory
    const absl::Time start = absl::Now();
    absl::StatusOr<PipelineRunStats> run = RunPipeline(eo);
    if (!run.ok())
      return absl::Status(run.status().code(), absl::StrCat(what, ": ", run.status().message()));
    RM_RETURN_IF_ERROR(stage->Synchronize());
    std::printf("%s: step %.0f ms, %d message batches, peak %lld message bytes\n", what.c_str(),
                absl::ToDoubleMilliseconds(absl::Now() - start), run->batches,
                static_cast<long long>(run->peak_buffer_bytes));
    if (run->batches == 0 || run->peak_buffer_bytes == 0) {
      return absl::InternalError(what + ": no message moved");
    }
    RM_ASSIGN_OR_RETURN(std::vector<float> got, Download(*ops, my_grads));
    RM_RETURN_IF_ERROR(CheckClose(part.table(), got,
                                  nn::testing::CutFlat(part, *whole_cpu, want_grads.data()), tol,
                                  what, worst, equal));
    tensors += part.table().size();
    const StepStats& got_stats = stage->stats();
    if (pp == kPp - 1) {
      if (std::abs(got_stats.loss_sum - want_loss) > loss_tol * std::abs(want_loss)) {
        return absl::InternalError(
            absl::StrCat(what, ": loss ", got_stats.loss_sum, "; the whole model's ", want_loss));
      }
    } else if (got_stats.loss_sum != 0) {
      return absl::InternalError(what + ": a loss on the first stage");
    }
    // After the 1F1B steps, stage s has held at most P - s micro-batches at once.
    if (kind == ScheduleKind::kOneFOneB && m == 4 && stage->peak_in_flight() != kPp - pp) {
      return absl::InternalError(absl::StrCat(what, ": ", stage->peak_in_flight(),
                                              " micro-batches in flight at once; want ", kPp - pp));
    }
    if (stage->peak_in_flight() > 4 || stage->activation_bytes() <= 0) {
      return absl::InternalError(absl::StrCat(what, ": ", stage->peak_in_flight(),
                                              " micro-batches in flight, ",
                                              stage->activation_bytes(), " activation bytes"));
    }
  }
  // Evaluation outside a step: the stages' forward passes, the boundary sent by NCCL, give
  // the last stage the whole model's loss.
  {
    const Batch batch = nn::RandomTokens(2, o, 999);
    ForwardBackwardOptions fb;
    fb.loss_divisor = static_cast<double>(batch.size * batch.context);
    RM_ASSIGN_OR_RETURN(StepStats want,
                        whole->ForwardBackward(batch, whole_params.data(), whole_grads.data(), fb));
    RM_ASSIGN_OR_RETURN(OpsBuffer boundary, ops->Allocate(batch.size * o.context * o.width));
    StepStats got;
    if (pp == 0) {
      RM_ASSIGN_OR_RETURN(got, stage->Evaluate(batch, my_params.span(), {}, boundary.span()));
      RM_RETURN_IF_ERROR(pp_group->Send(boundary.data(), boundary.size(), DataType::kFloat32,
                                        /*peer=*/1, Soon()));
    } else {
      RM_RETURN_IF_ERROR(pp_group->Recv(boundary.data(), boundary.size(), DataType::kFloat32,
                                        /*peer=*/0, Soon()));
      RM_ASSIGN_OR_RETURN(got, stage->Evaluate(batch, my_params.span(), boundary.span(), {}));
    }
    const double want_loss = pp == kPp - 1 ? want.loss_sum : 0;
    if (std::abs(got.loss_sum - want_loss) > loss_tol * std::abs(want_loss)) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, ": Evaluate's loss ", got.loss_sum, "; want ", want_loss));
    }
  }
  std::printf(
      "tp=%d rank %d: largest per-tensor relative error %.3g (bound %.3g), %d of %d "
      "tensors bit-equal\n",
      tp_size, rank, worst, tol, equal, tensors);
  std::fflush(stdout);
  stage.reset();
  whole.reset();
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamDestroy(stream), "cudaStreamDestroy"));
  return absl::OkStatus();
}

void RunMesh(int tp_size) {
  const int ranks = tp_size * kPp;
  if (!comm::testing::GpuPerRankAvailable(ranks)) {
    GTEST_SKIP() << "fewer than " << ranks
                 << " CUDA GPUs here: one per rank (or run with --config=cudaemu)";
  }
  const std::vector<comm::testing::RankResult> results = comm::testing::RunNcclRanks(
      ranks, "gpt_cuda_stage/nccl", absl::Seconds(600),
      [&](comm::NcclCommunicator& nccl, comm::TcpCommunicator&) { return RunRank(nccl, tp_size); });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].reported) << "rank " << r << ": " << results[r].exit_detail;
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

// bf16 on one rank under GPipe (all m = 3 micro-batches in flight at once): the models in
// flight read one 16-bit copy of the stage's parameters, cast once a step by BeginStep; a
// second step on changed parameters (as after an optimizer step) and an evaluation read the
// new values. Against the whole GptCuda in bf16 over the same micro-batches with
// accumulation, which casts at every call: the same 16-bit values, so per tensor within 1e-3
// relative (the slices' and the whole model's kernels may order sums differently) and the
// loss within 1e-4.
absl::Status RunBf16Rank(comm::NcclCommunicator& world) {
  const nn::GptOptions o{.layers = 2, .heads = 2, .width = 128, .context = 8, .vocab = 37};
  std::unique_ptr<nn::GptModel> cpu = *nn::GptModel::Create(o);
  std::vector<float> params = nn::testing::WholeParams(*cpu);
  cudaStream_t stream = nullptr, ops_stream = nullptr;
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate"));
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamCreate(&ops_stream), "cudaStreamCreate"));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<CudaVectorOps> ops, CudaVectorOps::Create(ops_stream));
  nn::GptCudaOptions c;
  c.matmul = kernels::cuda::MatMulType::kBFloat16;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptCuda> whole, nn::GptCuda::Create(o, c, stream));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptCudaStage> stage, GptCudaStage::Create(o, c, stream));
  RM_ASSIGN_OR_RETURN(OpsBuffer grads, ops->Allocate(whole->total_elements()));
  RM_ASSIGN_OR_RETURN(OpsBuffer whole_grads, ops->Allocate(whole->total_elements()));
  constexpr int kMicro = 3;
  RM_ASSIGN_OR_RETURN(Schedule schedule, MakeSchedule({ScheduleKind::kGPipe, 1, kMicro, 1}));
  double worst = 0;
  int equal = 0;
  OpsBuffer device_params;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {
      for (float& p : params) p *= 1.5f;
    }
    RM_ASSIGN_OR_RETURN(device_params, Upload(*ops, params));
    std::vector<Batch> batches;
    for (int i = 0; i < kMicro; ++i) batches.push_back(nn::RandomTokens(2, o, 40 + 10 * step + i));
    ForwardBackwardOptions fb;
    fb.precision = Precision::kBFloat16;
    fb.loss_divisor = kMicro * 2.0 * o.context;
    double want_loss = 0;
    for (int i = 0; i < kMicro; ++i) {
      ForwardBackwardOptions acc = fb;
      acc.accumulate = i > 0;
      RM_ASSIGN_OR_RETURN(StepStats st, whole->ForwardBackward(batches[i], device_params.data(),
                                                               whole_grads.data(), acc));
      want_loss += st.loss_sum;
    }
    RM_RETURN_IF_ERROR(stage->BeginStep(batches, device_params.span(), grads.span(), fb));
    PipelineExecutorOptions eo;
    eo.schedule = &schedule;
    eo.comm = &world;
    eo.stages[0] = stage.get();
    eo.ops = ops.get();
    RM_RETURN_IF_ERROR(RunPipeline(eo).status());
    RM_RETURN_IF_ERROR(stage->Synchronize());
    const std::string what = absl::StrCat("bf16 step ", step);
    RM_ASSIGN_OR_RETURN(std::vector<float> got, Download(*ops, grads));
    RM_ASSIGN_OR_RETURN(std::vector<float> want, Download(*ops, whole_grads));
    RM_RETURN_IF_ERROR(CheckClose(cpu->table(), got, want, 1e-3, what, worst, equal));
    if (std::abs(stage->stats().loss_sum - want_loss) > 1e-4 * std::abs(want_loss)) {
      return absl::InternalError(absl::StrCat(what, ": loss ", stage->stats().loss_sum,
                                              "; the whole model's ", want_loss));
    }
  }
  // Three micro-batches in flight, one copy: the first model's.
  if (stage->peak_in_flight() != kMicro || stage->model().parameter_copy_bytes() <= 0 ||
      stage->parameter_copy_bytes() != stage->model().parameter_copy_bytes()) {
    return absl::InternalError(absl::StrCat(
        stage->peak_in_flight(), " micro-batches in flight hold ", stage->parameter_copy_bytes(),
        " bytes of 16-bit parameters; one copy is ", stage->model().parameter_copy_bytes()));
  }
  const Batch batch = nn::RandomTokens(2, o, 999);
  ForwardBackwardOptions fb;
  fb.precision = Precision::kBFloat16;
  fb.loss_divisor = 2.0 * o.context;
  RM_ASSIGN_OR_RETURN(StepStats want,
                      whole->ForwardBackward(batch, device_params.data(), whole_grads.data(), fb));
  RM_ASSIGN_OR_RETURN(StepStats got,
                      stage->Evaluate(batch, device_params.span(), Precision::kBFloat16, {}, {}));
  if (std::abs(got.loss_sum - want.loss_sum) > 1e-4 * std::abs(want.loss_sum)) {
    return absl::InternalError(
        absl::StrCat("bf16 Evaluate's loss ", got.loss_sum, "; want ", want.loss_sum));
  }
  std::printf(
      "bf16: largest per-tensor relative error %.3g, %d tensors bit-equal, %lld bytes "
      "of 16-bit parameters for %d micro-batches in flight\n",
      worst, equal, static_cast<long long>(stage->parameter_copy_bytes()), stage->peak_in_flight());
  std::fflush(stdout);
  stage.reset();
  whole.reset();
  return CudaCheck(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST(GptCudaStage, Bf16MicroBatchesInFlightShareOneParameterCopy) {
  if (!comm::testing::GpuPerRankAvailable(1)) {
    GTEST_SKIP() << "no CUDA GPU here (or run with --config=cudaemu)";
  }
  const std::vector<comm::testing::RankResult> results = comm::testing::RunNcclRanks(
      1, "gpt_cuda_stage/bf16", absl::Seconds(600),
      [&](comm::NcclCommunicator& nccl, comm::TcpCommunicator&) { return RunBf16Rank(nccl); });
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].reported) << results[0].exit_detail;
  EXPECT_TRUE(results[0].status.ok()) << results[0].status;
}

TEST(GptCudaStage, PipelineOverNcclGivesTheWholeModelsGradients) { RunMesh(1); }

TEST(GptCudaStage, TensorParallelPipelineOverNcclGivesTheWholeModelsGradients) { RunMesh(2); }

}  // namespace
}  // namespace ringmaster::train::pipeline
