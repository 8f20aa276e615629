// The device strategy's collectives (train/fsdp_cuda.h) on 2 forked ranks, each with its own
// GPU (an emulated one under --config=cudaemu, where every stream operation first sleeps a
// random while) and an NcclCommunicator; 50 ms of work (a sleeping host function) queued on
// the model's stream before each reader or writer, so that a collective that does not wait
// for it runs first:
//   - GatherUnitOnDevice gives every rank the unit's pieces in rank order and waits for the
//     token of its buffer's last reader (that reader still sees the old values: fails
//     without the wait); with the pieces written on the model's stream before a mark, the
//     values gathered are the new ones (fails without the wait for that mark);
//   - ReduceScatterUnitOnDevice waits for the mark after the gradients' writer (the values
//     reduced are the new ones: fails without the wait), writes the sum to this rank's
//     piece, and with accumulate adds to it.
// This process never initialises CUDA (its forked ranks could not use it).
#include "train/fsdp_cuda.h"

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
#include "train/optim/cuda_vector_ops.h"

namespace ringmaster::train {
namespace {

constexpr int kRanks = 2;

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// The first mismatch of `got` against `want`, or "".
std::string Mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return absl::StrCat("[", i, "] ", got[i], ", want ", want[i]);
  }
  return "";
}

// A unit of 3000 elements padded to 3008 (a multiple of 2 × 16), its pieces at offset 32 of
// each rank's shard buffer.
FsdpUnit TestUnit() {
  FsdpUnit u;
  u.name = "test";
  u.range = {0, 3000};
  u.padded = 3008;
  u.shard = u.padded / kRanks;
  u.local = 32;
  return u;
}

// What rank r's piece (or gradient) holds at i.
float Value(int rank, int64_t i, float scale) { return scale * (rank + 1) + 0.25f * (i % 64); }

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

enum Case { kGatherAfterReader, kGatherAfterWriter, kReduceScatter };

absl::Status Check(Case what, comm::NcclCommunicator& nccl) {
  Rank r;
  if (cudaStreamCreate(&r.compute) != cudaSuccess || cudaStreamCreate(&r.comm) != cudaSuccess) {
    return absl::InternalError("cudaStreamCreate");
  }
  RM_ASSIGN_OR_RETURN(r.compute_ops, CudaVectorOps::Create(r.compute));
  RM_ASSIGN_OR_RETURN(r.comm_ops, CudaVectorOps::Create(r.comm));
  const FsdpUnit unit = TestUnit();
  const int rank = nccl.rank();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  RM_ASSIGN_OR_RETURN(OpsBuffer shards, r.compute_ops->Allocate(unit.local + unit.shard));
  std::vector<float> host(unit.local + unit.shard);

  // 50 ms of work on the model's stream before a reader or writer (a host function that
  // sleeps), so that a collective that does not wait for it runs first.
  auto keep_busy = [&]() -> absl::Status {
    const cudaError_t e = cudaLaunchHostFunc(
        r.compute, [](void*) { absl::SleepFor(absl::Milliseconds(50)); }, nullptr);
    return Expect(e == cudaSuccess, "cudaLaunchHostFunc");
  };

  if (what != kReduceScatter) {
    // This rank's piece is Value(rank, i, 100).
    for (int64_t i = 0; i < unit.shard; ++i) host[unit.local + i] = Value(rank, i, 100);
    UnitBufferPool pool(r.comm_ops.get());
    RM_ASSIGN_OR_RETURN(UnitBufferPool::Taken into, pool.Take(unit.padded));
    int written = UnitBufferPool::kNoToken;
    const std::vector<float> old(unit.padded, -7.0f);
    RM_ASSIGN_OR_RETURN(OpsBuffer seen, r.compute_ops->Allocate(unit.padded));
    // Lives until after the gather: freeing device memory (cudaFree) waits for the device.
    RM_ASSIGN_OR_RETURN(OpsBuffer staged, r.comm_ops->Allocate(unit.local + unit.shard));
    if (what == kGatherAfterReader) {
      // The piece is in place now. The buffer's last reader (the model) copies what it holds,
      // -7 everywhere, and gives it back with a mark; the gather must not overwrite it before
      // that copy ran.
      RM_RETURN_IF_ERROR(r.comm_ops->CopyFromHost(host.data(), shards.span()));
      RM_RETURN_IF_ERROR(r.comm_ops->CopyFromHost(old.data(), {into.data, size_t(unit.padded)}));
      RM_RETURN_IF_ERROR(keep_busy());
      RM_RETURN_IF_ERROR(r.compute_ops->Copy({into.data, size_t(unit.padded)}, seen.span()));
      RM_RETURN_IF_ERROR(pool.Give(into.data, r.compute_ops->Mark()));
      RM_ASSIGN_OR_RETURN(into, pool.Take(unit.padded));
      RM_RETURN_IF_ERROR(Expect(into.token != UnitBufferPool::kNoToken,
                                "the pool did not hand the buffer back with its token"));
    } else {
      // The model's stream writes the piece (as the optimizer step does: enqueued only)
      // before the mark `written`; the buffer is fresh. (Staged through the comm stream:
      // the ops' copies from the host return complete.)
      RM_RETURN_IF_ERROR(r.comm_ops->CopyFromHost(host.data(), staged.span()));
      RM_RETURN_IF_ERROR(keep_busy());
      RM_RETURN_IF_ERROR(r.compute_ops->Copy(staged.span(), shards.span()));
      written = r.compute_ops->Mark();
    }
    RM_RETURN_IF_ERROR(
        GatherUnitOnDevice(nccl, *r.compute_ops, unit, shards.data(), written, into, deadline));
    std::vector<float> got(unit.padded), want(unit.padded);
    for (int p = 0; p < kRanks; ++p) {
      for (int64_t i = 0; i < unit.shard; ++i) want[p * unit.shard + i] = Value(p, i, 100);
    }
    RM_RETURN_IF_ERROR(r.comm_ops->CopyToHost({into.data, size_t(unit.padded)}, got.data()));
    RM_RETURN_IF_ERROR(Expect(Mismatch(got, want).empty(), "gathered " + Mismatch(got, want)));
    if (what == kGatherAfterReader) {
      RM_RETURN_IF_ERROR(r.compute_ops->CopyToHost(seen.span(), got.data()));
      RM_RETURN_IF_ERROR(Expect(Mismatch(got, old).empty(),
                                "the last reader saw the gather: " + Mismatch(got, old)));
    }
    return absl::OkStatus();
  }

  // Reduce-scatter: rank p's gradients are Value(p, i, 10); the model's stream writes them
  // (from `source`, enqueued only) before the mark.
  RM_ASSIGN_OR_RETURN(OpsBuffer source, r.compute_ops->Allocate(unit.padded));
  RM_ASSIGN_OR_RETURN(OpsBuffer grads, r.compute_ops->Allocate(unit.padded));
  RM_ASSIGN_OR_RETURN(OpsBuffer scratch, r.comm_ops->Allocate(unit.shard));
  std::vector<float> g(unit.padded);
  for (int64_t i = 0; i < unit.padded; ++i) g[i] = Value(rank, i, 10);
  RM_RETURN_IF_ERROR(r.compute_ops->CopyFromHost(g.data(), source.span()));
  std::vector<float> want(unit.shard);
  for (int64_t i = 0; i < unit.shard; ++i) {
    for (int p = 0; p < kRanks; ++p) want[i] += Value(p, rank * unit.shard + i, 10);
  }
  for (bool accumulate : {false, true}) {
    RM_RETURN_IF_ERROR(r.compute_ops->Zero(grads.span()));
    RM_RETURN_IF_ERROR(keep_busy());
    RM_RETURN_IF_ERROR(r.compute_ops->Copy(source.span(), grads.span()));
    const int written = r.compute_ops->Mark();
    RM_RETURN_IF_ERROR(ReduceScatterUnitOnDevice(nccl, *r.compute_ops, *r.comm_ops, unit,
                                                 grads.data(), written, accumulate,
                                                 scratch.data(), shards.data(), deadline));
    RM_RETURN_IF_ERROR(r.compute_ops->CopyToHost(shards.span(), host.data()));
    std::vector<float> got(host.begin() + unit.local, host.end());
    std::vector<float> expected = want;
    if (accumulate) {
      for (float& x : expected) x *= 2;
    }
    RM_RETURN_IF_ERROR(Expect(Mismatch(got, expected).empty(),
                              absl::StrCat(accumulate ? "accumulated " : "reduced ",
                                           Mismatch(got, expected))));
  }
  return absl::OkStatus();
}

void RunOnRanks(Case what) {
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {
    GTEST_SKIP() << "fewer than 2 CUDA GPUs here (or run with --config=cudaemu)";
  }
  const std::string dir = comm::testing::FreshStoreDir();
  comm::testing::MultiProcOptions options;
  options.world_size = kRanks;
  const std::vector<comm::testing::RankResult> results = comm::testing::RunRanks(
      options, [&](comm::TcpCommunicator& tcp, absl::Duration*) -> absl::Status {
        const int device = comm::testing::UseOwnGpu(tcp.rank());
        RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileStore> store,
                            comm::FileStore::Create({dir}));
        RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> nccl,
                            comm::NcclCommunicator::Create({.rank = tcp.rank(),
                                                            .size = kRanks,
                                                            .store = store.get(),
                                                            .prefix = "fsdp_cuda/nccl",
                                                            .device = device}));
        return Check(what, *nccl);
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].reported) << "rank " << r << ": " << results[r].exit_detail;
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

TEST(FsdpCuda, GatherAfterTheBuffersLastReader) { RunOnRanks(kGatherAfterReader); }
TEST(FsdpCuda, GatherAfterThePiecesWriter) { RunOnRanks(kGatherAfterWriter); }
TEST(FsdpCuda, ReduceScatterAfterTheGradientsWriterAndAccumulate) { RunOnRanks(kReduceScatter); }

}  // namespace
}  // namespace ringmaster::train
