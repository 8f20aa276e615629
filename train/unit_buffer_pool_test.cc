// UnitBufferPool (train/unit_buffer_pool.h): reuse of the smallest fitting free buffer, the bound on
// buffers held (never more than were in use at once), misuse as INTERNAL, and the release
// tokens, over host memory; in builds with CUDA (--config=cuda, or cudaemu on the CPU) also
// over CudaVectorOps, where a buffer given back with a mark of a stream that still reads it
// is written by another stream only after that read (the emulator's jitter makes a missing
// wait show as a wrong value).
#include "train/unit_buffer_pool.h"

#include <vector>

#include "gtest/gtest.h"
#include "train/optim/vector_ops.h"

#ifdef RINGMASTER_UNIT_BUFFER_POOL_TEST_GPU
#include <cuda_runtime_api.h>

#include "kernels/cuda/testing.h"
#include "train/optim/cuda_vector_ops.h"
#endif

namespace ringmaster::train {
namespace {

TEST(UnitBufferPool, ReusesTheSmallestFreeBufferThatFits) {
  UnitBufferPool pool(HostVectorOps());
  auto a = pool.Take(100);
  auto b = pool.Take(300);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token, UnitBufferPool::kNoToken);
  ASSERT_TRUE(pool.Give(a->data, 7).ok());
  ASSERT_TRUE(pool.Give(b->data).ok());
  // 80 fits both: the smaller (a) serves it, with a's token.
  auto c = pool.Take(80);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data, a->data);
  EXPECT_EQ(c->token, 7);
  // 200 fits only b.
  auto d = pool.Take(200);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data, b->data);
  EXPECT_EQ(pool.held(), 2);
  EXPECT_EQ(pool.in_use(), 2);
  EXPECT_EQ(pool.peak_bytes(), (100 + 300) * 4);
}

TEST(UnitBufferPool, HoldsNoMoreBuffersThanWereInUseAtOnce) {
  UnitBufferPool pool(HostVectorOps());
  // Two in use at once, then growing requests one at a time: the small free ones are freed
  // before a larger one is allocated.
  auto a = pool.Take(10);
  auto b = pool.Take(10);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(pool.Give(a->data).ok());
  ASSERT_TRUE(pool.Give(b->data).ok());
  for (int64_t n : {20, 40, 80}) {
    auto x = pool.Take(n);
    ASSERT_TRUE(x.ok());
    EXPECT_EQ(pool.held(), 1) << n;
    ASSERT_TRUE(pool.Give(x->data).ok());
  }
  // Peak: the two of 10, then at most one buffer (80 the largest).
  EXPECT_EQ(pool.peak_bytes(), 80 * 4);
  // A new buffer is zero.
  auto z = pool.Take(1000);
  ASSERT_TRUE(z.ok());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(z->data[i], 0.0f) << i;
}

TEST(UnitBufferPool, MisuseIsInternal) {
  UnitBufferPool pool(HostVectorOps());
  auto a = pool.Take(10);
  ASSERT_TRUE(a.ok());
  float other = 0;
  EXPECT_EQ(pool.Give(&other).code(), absl::StatusCode::kInternal);
  ASSERT_TRUE(pool.Give(a->data).ok());
  EXPECT_EQ(pool.Give(a->data).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(pool.Take(0).status().code(), absl::StatusCode::kInvalidArgument);
}

#ifdef RINGMASTER_UNIT_BUFFER_POOL_TEST_GPU
TEST(UnitBufferPoolOnDevice, ATokenOrdersTheNextWriterAfterTheLastReader) {
  RM_SKIP_WITHOUT_GPU("the device unit buffer pool test");
  cudaStream_t compute = nullptr, comm = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&comm), cudaSuccess);
  {
    auto compute_ops = CudaVectorOps::Create(compute);
    auto comm_ops = CudaVectorOps::Create(comm);
    ASSERT_TRUE(compute_ops.ok() && comm_ops.ok());
    UnitBufferPool pool(comm_ops->get());
    constexpr int64_t kN = 1 << 16;
    constexpr int kRounds = 20;
    std::vector<OpsBuffer> outs;
    for (int round = 0; round < kRounds; ++round) {
      auto out = (*compute_ops)->Allocate(kN);
      ASSERT_TRUE(out.ok());
      outs.push_back(*std::move(out));
    }
    for (int round = 0; round < kRounds; ++round) {
      auto unit = pool.Take(kN);
      ASSERT_TRUE(unit.ok());
      // The comm side fills the unit (as a gather would) once its last reader is done.
      if (unit->token != UnitBufferPool::kNoToken) {
        ASSERT_TRUE((*compute_ops)->Wait(unit->token).ok());
      }
      const std::vector<float> value(kN, static_cast<float>(round + 1));
      ASSERT_TRUE((*comm_ops)->CopyFromHost(value.data(), {unit->data, kN}).ok());
      // The compute stream reads it (enqueued only: it runs behind the host), then the unit
      // goes back with a mark; nothing here waits for the read.
      ASSERT_TRUE((*compute_ops)->Copy({unit->data, kN}, outs[round].span()).ok());
      ASSERT_TRUE(pool.Give(unit->data, (*compute_ops)->Mark()).ok());
    }
    std::vector<float> back(kN);
    for (int round = 0; round < kRounds; ++round) {
      ASSERT_TRUE((*compute_ops)->CopyToHost(outs[round].span(), back.data()).ok());
      for (int64_t i = 0; i < kN; i += 997) {
        ASSERT_EQ(back[i], static_cast<float>(round + 1)) << "round " << round << " [" << i << "]";
      }
    }
    EXPECT_EQ(pool.held(), 1);
  }
  cudaStreamDestroy(compute);
  cudaStreamDestroy(comm);
}
#endif

}  // namespace
}  // namespace ringmaster::train
