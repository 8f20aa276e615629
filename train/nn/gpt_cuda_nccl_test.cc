// GptCuda's tensor parallelism and pipeline slices over NCCL, as the trainer will run them:
// 4 forked ranks, one GPU each (an emulated one per process under --config=cudaemu), on a
// tp 2 x pp 2 mesh (rank = 2 pp + tp). One NcclCommunicator over the 4; ncclCommSplit makes
// each rank's tensor-parallel group (same pp) and pipeline pair (same tp). Each rank holds
// its tp shard of its stage's slice (stage pp: block pp of 2); the tensor-parallel sum is
// an NCCL all-reduce of the group (after the model's stream is synchronised); the boundary
// activation goes forward and its gradient back by NCCL send/receive between the stages.
// Each rank then checks, against the whole model's GptCuda run in its own process on the
// same parameters and batch: the last stage's loss within 1e-5 relative, its gradients
// (the whole model's cut to its shard and slice) per tensor within 1e-4 relative (the
// partial products are summed in another order: gpt_cuda_tp_test's bound), and 2 + 2 sums
// for its block. This process never initialises CUDA (its forked ranks could not use it).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
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

namespace ringmaster::train::nn {
namespace {

constexpr int kTp = 2, kPp = 2, kRanks = kTp * kPp;

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

absl::Status CudaCheck(cudaError_t e, absl::string_view what) {
  return e == cudaSuccess ? absl::OkStatus()
                          : absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Device memory for n floats, freed at the end of the scope.
class DeviceFloats {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceFloats>> Create(const std::vector<float>& host) {
    auto d = std::unique_ptr<DeviceFloats>(new DeviceFloats(host.size()));
    RM_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&d->ptr_, host.size() * 4 + 4), "cudaMalloc"));
    RM_RETURN_IF_ERROR(CudaCheck(
        cudaMemcpy(d->ptr_, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "upload"));
    return d;
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  float* get() { return static_cast<float*>(ptr_); }
  absl::StatusOr<std::vector<float>> Host() const {
    std::vector<float> out(n_);
    RM_RETURN_IF_ERROR(CudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    RM_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpy(out.data(), ptr_, n_ * 4, cudaMemcpyDeviceToHost), "download"));
    return out;
  }

 private:
  explicit DeviceFloats(size_t n) : n_(n) {}
  size_t n_;
  void* ptr_ = nullptr;
};

// Per tensor: ||got - want|| <= tol ||want|| + 1e-12, else an error naming the tensor.
absl::Status CheckClose(const state::TensorTable& table, const std::vector<float>& got,
                        const std::vector<float>& want, double tol, const std::string& what) {
  for (const state::TensorSpec& t : table.tensors()) {
    double diff = 0, ref = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      ref += double{want[i]} * want[i];
    }
    if (std::sqrt(diff) > tol * std::sqrt(ref) + 1e-12) {
      return absl::InternalError(absl::StrCat(what, " ", t.name, ": error ", std::sqrt(diff),
                                              " against norm ", std::sqrt(ref)));
    }
  }
  return absl::OkStatus();
}

absl::Status RunRank(comm::NcclCommunicator& world) {
  const int rank = world.rank(), tp = rank % kTp, pp = rank / kTp;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> tp_group,
                      world.Split(/*color=*/pp, /*key=*/tp, Soon()));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> pp_group,
                      world.Split(/*color=*/kPp + tp, /*key=*/pp, Soon()));
  if (tp_group->rank() != tp || pp_group->rank() != pp) {
    return absl::InternalError("the groups' ranks are not the mesh's coordinates");
  }
  const GptOptions o{.layers = kPp, .heads = 4, .width = 32, .context = 8, .vocab = 37};
  std::unique_ptr<GptModel> whole = *GptModel::Create(o);
  const std::vector<float> params = testing::WholeParams(*whole);
  const Batch batch = RandomTokens(2, o, 31);
  const int64_t n = batch.size * o.context * o.width;
  ForwardBackwardOptions fb;
  fb.loss_divisor = batch.size * o.context;

  // The whole model, unsplit, on this rank's GPU.
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptCuda> unsplit, GptCuda::Create(o, {}, nullptr));
  RM_ASSIGN_OR_RETURN(auto whole_params, DeviceFloats::Create(params));
  RM_ASSIGN_OR_RETURN(auto whole_grads, DeviceFloats::Create(std::vector<float>(params.size())));
  RM_ASSIGN_OR_RETURN(StepStats want,
                      unsplit->ForwardBackward(batch, whole_params->get(), whole_grads->get(), fb));
  RM_ASSIGN_OR_RETURN(std::vector<float> want_grads, whole_grads->Host());

  // This rank's part: tp shard `tp` of block `pp`.
  GptOptions mine = o;
  mine.tp_size = kTp;
  mine.tp_rank = tp;
  mine.first_block = pp;
  mine.end_block = pp + 1;
  cudaStream_t stream = nullptr;
  RM_RETURN_IF_ERROR(CudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate"));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GptCuda> model, GptCuda::Create(mine, {}, stream));
  int sums = 0;
  model->set_tensor_parallel_sum([&](float* data, int64_t count, cudaStream_t s) {
    ++sums;
    // The communicator's stream does not wait for the model's: the partials first.
    RM_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
    return tp_group->AllReduce(data, data, count, DataType::kFloat32, comm::ReduceOp::kSum, Soon());
  });
  RM_ASSIGN_OR_RETURN(auto my_params, DeviceFloats::Create(testing::CutFlat(
                                          model->cpu_model(), *whole, params.data())));
  RM_ASSIGN_OR_RETURN(auto my_grads,
                      DeviceFloats::Create(std::vector<float>(model->total_elements(), 0.0f)));
  RM_ASSIGN_OR_RETURN(auto boundary, DeviceFloats::Create(std::vector<float>(n)));
  RM_ASSIGN_OR_RETURN(auto boundary_grad, DeviceFloats::Create(std::vector<float>(n)));
  const int next = 1, previous = 0;  // pp_group ranks
  StepStats got;
  if (pp == 0) {
    RM_RETURN_IF_ERROR(model->SliceForward(batch, my_params->get(), nullptr, boundary->get()));
    RM_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    RM_RETURN_IF_ERROR(pp_group->Send(boundary->get(), n, DataType::kFloat32, next, Soon()));
    RM_RETURN_IF_ERROR(pp_group->Recv(boundary_grad->get(), n, DataType::kFloat32, next, Soon()));
    RM_RETURN_IF_ERROR(
        model->SliceBackward(my_grads->get(), fb, boundary_grad->get(), nullptr, false).status());
  } else {
    RM_RETURN_IF_ERROR(pp_group->Recv(boundary->get(), n, DataType::kFloat32, previous, Soon()));
    RM_RETURN_IF_ERROR(model->SliceForward(batch, my_params->get(), boundary->get(), nullptr));
    RM_ASSIGN_OR_RETURN(
        got, model->SliceBackward(my_grads->get(), fb, nullptr, boundary_grad->get(), false));
    RM_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    RM_RETURN_IF_ERROR(
        pp_group->Send(boundary_grad->get(), n, DataType::kFloat32, previous, Soon()));
    if (std::abs(got.loss_sum - want.loss_sum) > 1e-5 * std::abs(want.loss_sum)) {
      return absl::InternalError(
          absl::StrCat("loss ", got.loss_sum, "; the whole model's ", want.loss_sum));
    }
  }
  if (sums != 4) return absl::InternalError(absl::StrCat(sums, " sums for one block; want 4"));
  RM_ASSIGN_OR_RETURN(std::vector<float> grads, my_grads->Host());
  RM_RETURN_IF_ERROR(CheckClose(model->cpu_model().table(), grads,
                                testing::CutFlat(model->cpu_model(), *whole, want_grads.data()),
                                1e-4, absl::StrCat("rank ", rank, " gradient")));
  model.reset();
  return CudaCheck(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST(GptCudaNccl, TensorParallelPipelineStagesGiveTheWholeModelsGradients) {
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {
    GTEST_SKIP() << "fewer than " << kRanks
                 << " CUDA GPUs here: one per rank (or run with --config=cudaemu)";
  }
  const std::vector<comm::testing::RankResult> results = comm::testing::RunNcclRanks(
      kRanks, "gpt_cuda_nccl/nccl", absl::Seconds(300),
      [&](comm::NcclCommunicator& nccl, comm::TcpCommunicator&) { return RunRank(nccl); });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].reported) << "rank " << r << ": " << results[r].exit_detail;
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

}  // namespace
}  // namespace ringmaster::train::nn
