// The sharded strategy (train/fsdp.h) in GPU memory, driven through its ParameterStore the
// way a CUDA model drives it (train/nn/gpt_cuda.h's contract: the model's calls come once its
// work is ENQUEUED on its stream, not run), on 2 forked ranks, each with its own GPU (an
// emulated one under --config=cudaemu) and an NcclCommunicator. 50 ms of work (a sleeping host
// function) is queued on the model's stream before each reader or writer the strategy must
// wait for, so that a collective that does not wait runs first and the test fails:
//   - the first gather reads the pieces the model's stream wrote before MaterializeParameters
//     (without the wait for that mark it gathers the zeros that were there);
//   - moving to the next unit in forward frees the first; the next gather reuses its buffer
//     and must wait for the model's last reader (which would otherwise see the second unit);
//   - a unit's reduce-scatter reads the gradients the model's stream wrote before
//     GradientsDone (otherwise it reduces the zeros Gradients gave);
//   - a second micro-batch adds to the shard (VectorOps::Add on the communication stream).
// In fp32 and with 16-bit wires (bf16 gathers and reduce-scatters: ToHalf/FromHalf on the
// device); the values are exact in bf16, so the expectations are exact too.
// This process never initialises CUDA (its forked ranks could not use it).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "train/fsdp.h"
#include "train/optim/cuda_vector_ops.h"

namespace ringmaster::train {
namespace {

constexpr int kRanks = 2;

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// Parameter j of the flat space in step `step` (0 or 1), and rank p's gradient of it: exact
// in bf16, and so are the sums of two gradients.
float Weight(int64_t j, int step) {
  return static_cast<float>(step + 1) *
         (0.25f * static_cast<float>(j % 64) + static_cast<float>(j / 1000));
}
float Gradient(int p, int64_t j) { return static_cast<float>(p + 1) + 0.5f * static_cast<float>(j % 8); }

struct Rank {
  cudaStream_t compute = nullptr, comm = nullptr;
  std::unique_ptr<CudaVectorOps> compute_ops, comm_ops;
  ~Rank() {
    compute_ops.reset();
    comm_ops.reset();
    if (compute != nullptr) cudaStreamDestroy(compute);
    if (comm != nullptr) cudaStreamDestroy(comm);
  }
};

absl::Status Check(Precision precision, comm::NcclCommunicator& nccl, comm::Communicator& sums) {
  Rank r;
  if (cudaStreamCreate(&r.compute) != cudaSuccess || cudaStreamCreate(&r.comm) != cudaSuccess) {
    return absl::InternalError("cudaStreamCreate");
  }
  RM_ASSIGN_OR_RETURN(r.compute_ops, CudaVectorOps::Create(r.compute));
  RM_ASSIGN_OR_RETURN(r.comm_ops, CudaVectorOps::Create(r.comm));
  VectorOps& ops = *r.compute_ops;
  const int rank = nccl.rank();

  // Two tensors, one group and one unit each (wrap: layer); the second unit is smaller, so
  // its gather reuses the first one's buffer once that is freed.
  state::TensorTable table;
  table.Add("a", {3000});
  table.Add("b", {2000});
  ShardedOptions so;
  so.table = &table;
  so.groups = {{"a", 0, 1, 0, "a"}, {"b", 1, 2, 1, "b"}};
  so.fsdp.wrap = FsdpConfig::Wrap::kLayer;
  so.fsdp.prefetch = FsdpConfig::Prefetch::kNone;
  so.compute = precision;
  so.reduce = precision;
  so.op_timeout = absl::Seconds(60);
  so.ops = r.compute_ops.get();
  so.comm_ops = r.comm_ops.get();
  RM_ASSIGN_OR_RETURN(FsdpLayout layout, ShardedLayout(so, kRanks));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                      CreateShardedDataParallel(&nccl, &sums, so));
  ParameterStore* store = strategy->store();
  const int64_t local = strategy->local_elements();
  const std::vector<state::PlacedRange> pieces = strategy->update_pieces();

  RM_ASSIGN_OR_RETURN(OpsBuffer shard, ops.Allocate(local));
  RM_ASSIGN_OR_RETURN(OpsBuffer grads, ops.Allocate(local));
  RM_ASSIGN_OR_RETURN(OpsBuffer staged, ops.Allocate(local));
  RM_ASSIGN_OR_RETURN(OpsBuffer seen, ops.Allocate(table.tensor(0).numel));
  RM_ASSIGN_OR_RETURN(OpsBuffer source_a, ops.Allocate(table.tensor(0).numel));
  RM_ASSIGN_OR_RETURN(OpsBuffer source_b, ops.Allocate(table.tensor(1).numel));
  for (int t = 0; t < 2; ++t) {
    std::vector<float> g(table.tensor(t).numel);
    for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
      g[i] = Gradient(rank, table.tensor(t).offset + i);
    }
    RM_RETURN_IF_ERROR(ops.CopyFromHost(g.data(), (t == 0 ? source_a : source_b).span()));
  }

  auto keep_busy = [&]() -> absl::Status {
    const cudaError_t e = cudaLaunchHostFunc(
        r.compute, [](void*) { absl::SleepFor(absl::Milliseconds(50)); }, nullptr);
    return Expect(e == cudaSuccess, "cudaLaunchHostFunc");
  };
  auto tensor_of = [&](const float* base, int t) {
    return absl::Span<const float>(base + table.tensor(t).offset,
                                   static_cast<size_t>(table.tensor(t).numel));
  };
  // The host's copy of device span `x` (after the model's stream's work so far).
  auto read = [&](absl::Span<const float> x) -> absl::StatusOr<std::vector<float>> {
    std::vector<float> v(x.size());
    RM_RETURN_IF_ERROR(ops.CopyToHost(x, v.data()));
    return v;
  };
  int step = 0;
  // The first index where `got` is not tensor t's weights of this step, or -1.
  auto first_wrong_weight = [&](const std::vector<float>& got, int t) -> int64_t {
    for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
      if (got[i] != Weight(table.tensor(t).offset + i, step)) return i;
    }
    return -1;
  };

  // Two steps: the first allocates the pool's buffers (cudaMalloc's zeroing synchronizes the
  // model's stream, which would hide a missing wait) and measures the local norm; the second
  // reuses the buffers and measures nothing, so only the strategy's own waits order its work
  // after the model's (each of them shown necessary by removing it).
  for (step = 0; step < 2; ++step) {
    std::vector<float> host(local);
    for (const state::PlacedRange& p : pieces) {
      for (int64_t k = 0; k < p.range.size(); ++k) {
        host[p.at + k] = Weight(p.range.begin + k, step);
      }
    }
    RM_RETURN_IF_ERROR(ops.CopyFromHost(host.data(), staged.span()));
    const std::string what = absl::StrCat(PrecisionName(precision), " step ", step);
    // The model's stream writes the pieces (as an optimizer step does: enqueued only).
    RM_RETURN_IF_ERROR(keep_busy());
    RM_RETURN_IF_ERROR(ops.Copy(staged.span(), shard.span()));
    RM_RETURN_IF_ERROR(strategy->MaterializeParameters(shard.span()));
    strategy->BeginGradients(grads.data(), /*measure_local_norm=*/step == 0);
    for (int micro = 0; micro < 2; ++micro) {
      strategy->BeginPass(ParallelStrategy::Pass::kTrain);
      const float* a = store->Parameters(0);
      // The model reads unit a late (its stream is busy), after the store moved on to b.
      RM_RETURN_IF_ERROR(keep_busy());
      RM_RETURN_IF_ERROR(ops.Copy(tensor_of(a, 0), seen.span()));
      const float* b = store->Parameters(1);
      RM_ASSIGN_OR_RETURN(std::vector<float> seen_a, read(seen.span()));
      const int64_t wrong_a = first_wrong_weight(seen_a, 0);
      RM_RETURN_IF_ERROR(Expect(wrong_a < 0, absl::StrCat(what, " micro ", micro, ": a[", wrong_a,
                                                          "] read by the model is ",
                                                          seen_a[std::max<int64_t>(wrong_a, 0)])));
      RM_ASSIGN_OR_RETURN(std::vector<float> got_b, read(tensor_of(b, 1)));
      const int64_t wrong_b = first_wrong_weight(got_b, 1);
      RM_RETURN_IF_ERROR(Expect(wrong_b < 0, absl::StrCat(what, " micro ", micro, ": b[", wrong_b,
                                                          "] gathered is ",
                                                          got_b[std::max<int64_t>(wrong_b, 0)])));
      // Backward, b then a: the model's stream writes each gradient late.
      store->BeginBackward();
      for (int t : {1, 0}) {
        float* g = store->Gradients(t);
        RM_RETURN_IF_ERROR(keep_busy());
        RM_RETURN_IF_ERROR(ops.Copy((t == 0 ? source_a : source_b).span(),
                                    {g + table.tensor(t).offset,
                                     static_cast<size_t>(table.tensor(t).numel)}));
        store->GradientsDone(t);
      }
    }
    RM_RETURN_IF_ERROR(strategy->ReduceGradients());
    RM_ASSIGN_OR_RETURN(std::vector<float> reduced, read(grads.span()));
    for (const state::PlacedRange& p : pieces) {
      for (int64_t k = 0; k < p.range.size(); ++k) {
        const int64_t j = p.range.begin + k;
        bool in_tensor = false;
        for (int t = 0; t < 2; ++t) {
          in_tensor |= j >= table.tensor(t).offset && j < table.tensor(t).offset + table.tensor(t).numel;
        }
        const float want = in_tensor ? 2 * (Gradient(0, j) + Gradient(1, j)) : 0.0f;
        RM_RETURN_IF_ERROR(Expect(reduced[p.at + k] == want,
                                  absl::StrCat(what, ": the reduced gradient of ", j, " is ",
                                               reduced[p.at + k], ", want ", want,
                                               " (two micro-batches of two ranks)")));
      }
    }
    RM_RETURN_IF_ERROR(Expect((strategy->last_step().local_grad_norm > 0) == (step == 0),
                              what + ": the local gradient norm is measured when asked"));
    // The whole model on the host, from the device pieces.
    std::vector<float> whole(table.total_elements());
    RM_RETURN_IF_ERROR(strategy->WholeParameters(shard.span(), absl::MakeSpan(whole)));
    for (int t = 0; t < 2; ++t) {
      std::vector<float> got(whole.begin() + table.tensor(t).offset,
                             whole.begin() + table.tensor(t).offset + table.tensor(t).numel);
      const int64_t wrong = first_wrong_weight(got, t);
      RM_RETURN_IF_ERROR(Expect(wrong < 0, absl::StrCat(what, ": WholeParameters' tensor ", t,
                                                        " wrong at ", wrong)));
    }
  }
  return absl::OkStatus();
}

void RunOnRanks(Precision precision) {
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {
    GTEST_SKIP() << "fewer than 2 CUDA GPUs here (or run with --config=cudaemu)";
  }
  const std::vector<comm::testing::RankResult> results =
      comm::testing::RunNcclRanks(kRanks, "fsdp_cuda/nccl", absl::Seconds(120),
                                  [&](comm::NcclCommunicator& nccl, comm::TcpCommunicator& tcp) {
                                    return Check(precision, nccl, tcp);
                                  });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].reported) << "rank " << r << ": " << results[r].exit_detail;
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

TEST(ShardedOnDevice, OrdersItsWorkWithTheModelsStreamInFp32) { RunOnRanks(Precision::kFloat32); }
TEST(ShardedOnDevice, OrdersItsWorkWithTheModelsStreamWithBf16Wires) {
  RunOnRanks(Precision::kBFloat16);
}

}  // namespace
}  // namespace ringmaster::train
