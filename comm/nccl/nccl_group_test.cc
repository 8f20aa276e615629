// Groups (ncclCommSplit), non-blocking operations and family-wide aborts of
// NcclCommunicator, at world size 1 (one GPU: NCCL refuses two ranks on one). Multi-rank
// splits need one GPU per rank, or the N-process CPU emulation (--config=cudaemu).
// Without a GPU the tests skip.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Device memory holding `values` (float).
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& values) : n_(values.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, n_ * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, values.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceFloats() { (void)cudaFree(ptr_); }
  float* get() { return static_cast<float*>(ptr_); }
  std::vector<float> Read() const {
    std::vector<float> out(n_);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  size_t n_;
  void* ptr_ = nullptr;
};

class NcclGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA GPU on this machine: NCCL tests need one (run with "
                      "--config=cuda where a GPU is present, or --config=cudaemu)";
    }
    FileStoreOptions options;
    options.directory =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/store-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto store = FileStore::Create(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto comm = NcclCommunicator::Create(
        {.rank = 0, .size = 1, .store = store_.get(), .prefix = "job/epoch1/nccl", .device = 0});
    ASSERT_TRUE(comm.ok()) << comm.status();
    world_ = std::move(comm).value();
  }

  std::unique_ptr<Communicator> SplitOrDie(int color, int key) {
    auto group = world_->Split(color, key, Soon());
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? std::move(group).value() : nullptr;
  }

  std::unique_ptr<FileStore> store_;
  std::unique_ptr<NcclCommunicator> world_;
};

TEST_F(NcclGroupTest, SplitMakesAWorkingGroupAndNegativeColorNone) {
  std::unique_ptr<Communicator> group = SplitOrDie(7, 3);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->backend(), "nccl");
  DeviceFloats send({1, 2, 3}), recv({0, 0, 0});
  ASSERT_TRUE(group->AllReduce(send.get(), recv.get(), 3, DataType::kFloat32, ReduceOp::kMax,
                               Soon())
                  .ok());
  EXPECT_EQ(recv.Read(), (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(group->Barrier(Soon()).ok());
  EXPECT_EQ(group->counters().of(OpKind::kAllReduce).calls, 1u);
  EXPECT_EQ(world_->counters().of(OpKind::kAllReduce).calls, 0u);  // counters are per group

  auto none = world_->Split(-1, 0, Soon());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  // Groups of groups; the child may outlive its parent.
  std::unique_ptr<Communicator> grandchild;
  {
    auto g = group->Split(0, 0, Soon());
    ASSERT_TRUE(g.ok()) << g.status();
    grandchild = std::move(g).value();
  }
  group.reset();
  EXPECT_TRUE(grandchild->Barrier(Soon()).ok());
}

TEST_F(NcclGroupTest, NonBlockingOperationsRunInIssueOrder) {
  DeviceFloats a({1, 2}), b({0, 0}), c({0, 0, 0, 0});
  Work copy = world_->AllReduceAsync(a.get(), b.get(), 2, DataType::kFloat32, ReduceOp::kSum,
                                     Soon());
  // Reads b, which the first operation writes: right only if it ran first.
  Work gather = world_->AllGatherAsync(b.get(), c.get(), 2, DataType::kFloat32, Soon());
  EXPECT_TRUE(gather.Wait(Soon()).ok());
  EXPECT_TRUE(copy.done());
  EXPECT_TRUE(copy.Wait(Soon()).ok());
  EXPECT_EQ(c.Read(), (std::vector<float>({1, 2, 0, 0})));
  // A blocking call after queued work waits for it.
  Work bcast = world_->BroadcastAsync(a.get(), c.get(), 2, DataType::kFloat32, 0, Soon());
  EXPECT_TRUE(world_->Barrier(Soon()).ok());
  EXPECT_TRUE(bcast.Wait(Soon()).ok());
}

TEST_F(NcclGroupTest, AbortOfAnyMemberBreaksTheFamily) {
  std::unique_ptr<Communicator> group = SplitOrDie(0, 0);
  ASSERT_NE(group, nullptr);
  std::unique_ptr<Communicator> sibling = SplitOrDie(1, 0);
  ASSERT_NE(sibling, nullptr);
  group->Abort();
  EXPECT_EQ(world_->GetAsyncError().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(world_->Barrier(Soon()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(sibling->Barrier(Soon()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(group->Barrier(Soon()).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(world_->Split(0, 0, Soon()).ok());  // a broken communicator cannot split
}

}  // namespace
}  // namespace ringmaster::comm
