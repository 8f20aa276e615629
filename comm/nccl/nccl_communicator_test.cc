// Tests of NcclCommunicator on one GPU (world size 1: NCCL refuses two ranks on one GPU).
// Results are checked against a host reference computed from the inputs alone. Without
// a GPU, the tests that need one skip; the option checks run everywhere.
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/communicator.h"
#include "comm/nccl/nccl_test_util.h"
#include "comm/store.h"
#include "common/dtype.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using testing::Encode;
using testing::Input;
using testing::ReduceReference;

constexpr size_t kCounts[] = {0, 1, 7, 1000, 1 << 20};

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU()                                                        \
  if (!HaveGpu()) {                                                               \
    GTEST_SKIP() << "no CUDA GPU on this machine: NCCL tests need one (run with " \
                    "--config=cuda where a GPU is present)";                      \
  }

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

std::unique_ptr<FileStore> MakeStore() {
  FileStoreOptions options;
  options.directory = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store-",
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  auto store = FileStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

// ---- Device buffers. ----

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)), cudaSuccess);
    Fill(0x5a);  // a sentinel: an operation that writes nothing is caught
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  char* at(size_t offset) const { return static_cast<char*>(ptr_) + offset; }
  void Fill(int byte) {
    ASSERT_EQ(cudaMemset(ptr_, byte, std::max<size_t>(bytes_, 1)), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Copies `host` to offset 0 and waits until it is on the device: the communicator's
  // stream does not wait for the legacy default stream.
  void Upload(const std::vector<uint8_t>& host, size_t offset = 0) {
    ASSERT_EQ(cudaMemcpy(at(offset), host.data(), host.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<uint8_t> Download(size_t bytes, size_t offset = 0) const {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), at(offset), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

// Reports the first mismatch and how many there are, instead of one failure per element.
void ExpectValues(DataType type, const std::vector<uint8_t>& got_bytes,
                  const std::vector<double>& want) {
  EXPECT_EQ(testing::Mismatch(type, got_bytes, want), "");
}

// ---- Option checks: these need no GPU. ----

TEST(NcclCommunicatorOptions, CreateRejectsBadOptionsNamingTheField) {
  auto store = MakeStore();
  const NcclCommunicatorOptions good = {.rank = 0,
                                        .size = 1,
                                        .store = store.get(),
                                        .prefix = "job/epoch1/nccl",
                                        .device = -1,
                                        .init_timeout = absl::Seconds(5)};
  struct Case {
    std::string field;
    NcclCommunicatorOptions options;
  };
  std::vector<Case> cases;
  cases.push_back({"size", good});
  cases.back().options.size = 0;
  cases.push_back({"rank", good});
  cases.back().options.rank = 1;
  cases.push_back({"rank", good});
  cases.back().options.rank = -1;
  cases.push_back({"store", good});
  cases.back().options.store = nullptr;
  cases.push_back({"prefix", good});
  cases.back().options.prefix = "";
  cases.push_back({"prefix", good});
  cases.back().options.prefix = "has space";
  cases.push_back({"device", good});
  cases.back().options.device = -2;
  cases.push_back({"init_timeout", good});
  cases.back().options.init_timeout = absl::ZeroDuration();
  for (const Case& c : cases) {
    auto comm = NcclCommunicator::Create(c.options);
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(comm.status().message().find(c.field), std::string::npos) << comm.status();
  }
}

TEST(NcclCommunicatorOptions, PeerTimesOutWaitingForTheUniqueId) {
  auto store = MakeStore();
  const absl::Time start = absl::Now();
  auto comm = NcclCommunicator::Create({.rank = 1,
                                        .size = 2,
                                        .store = store.get(),
                                        .prefix = "job/epoch1/nccl",
                                        .init_timeout = absl::Milliseconds(200)});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("job/epoch1/nccl/unique_id"), std::string::npos)
      << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// ---- One rank on one GPU. ----

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    store_ = MakeStore();
    auto comm = NcclCommunicator::Create({.rank = 0,
                                          .size = 1,
                                          .store = store_.get(),
                                          .prefix = "job/epoch1/nccl",
                                          .device = 0,
                                          .init_timeout = absl::Seconds(60)});
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(comm).value();
  }

  std::unique_ptr<FileStore> store_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclCommunicatorTest, Identity) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->device(), 0);
  EXPECT_TRUE(comm_->GetAsyncError().ok());
  EXPECT_TRUE(comm_->Barrier(Soon()).ok());
}

TEST_F(NcclCommunicatorTest, AllReduceMatchesReference) {
  for (DataType type : kAllDataTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DataTypeName(type), " ", ReduceOpName(op), " count ", count,
                                    in_place ? " in place" : ""));
          const size_t bytes = count * DataTypeSize(type);
          const std::vector<double> input = Input(type, count, 0);
          DeviceBuffer send(bytes), recv(bytes);
          send.Upload(Encode(type, input));
          void* out = in_place ? send.get() : recv.get();
          ASSERT_TRUE(comm_->AllReduce(send.get(), out, count, type, op, Soon()).ok());
          ExpectValues(type, (in_place ? send : recv).Download(bytes),
                       ReduceReference(type, op, {input}));
        }
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, AllGatherMatchesReference) {
  const int n = comm_->size();
  for (DataType type : kAllDataTypes) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(
            absl::StrCat(DataTypeName(type), " count ", count, in_place ? " in place" : ""));
        const size_t bytes = count * DataTypeSize(type);
        const std::vector<double> input = Input(type, count, comm_->rank());
        DeviceBuffer send(bytes), recv(bytes * n);
        // In place: the input is recv's first block.
        (in_place ? recv : send).Upload(Encode(type, input));
        const void* in = in_place ? recv.get() : send.get();
        ASSERT_TRUE(comm_->AllGather(in, recv.get(), count, type, Soon()).ok());
        std::vector<double> want;
        for (int r = 0; r < n; ++r) {
          const std::vector<double> block = Input(type, count, r);
          want.insert(want.end(), block.begin(), block.end());
        }
        ExpectValues(type, recv.Download(bytes * n), want);
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, ReduceScatterMatchesReference) {
  const int n = comm_->size();
  const int rank = comm_->rank();
  for (DataType type : kAllDataTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DataTypeName(type), " ", ReduceOpName(op), " count ", count,
                                    in_place ? " in place" : ""));
          const size_t bytes = count * DataTypeSize(type);
          // Every rank's input is count * n elements.
          std::vector<std::vector<double>> inputs;
          for (int r = 0; r < n; ++r) inputs.push_back(Input(type, count * n, r));
          DeviceBuffer send(bytes * n), recv(bytes);
          send.Upload(Encode(type, inputs[rank]));
          void* out = in_place ? send.get() : recv.get();
          ASSERT_TRUE(comm_->ReduceScatter(send.get(), out, count, type, op, Soon()).ok());
          const std::vector<double> all = ReduceReference(type, op, inputs);
          ExpectValues(
              type, (in_place ? send : recv).Download(bytes),
              std::vector<double>(all.begin() + rank * count, all.begin() + (rank + 1) * count));
        }
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, BroadcastFromRootZero) {
  for (DataType type : kAllDataTypes) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(
            absl::StrCat(DataTypeName(type), " count ", count, in_place ? " in place" : ""));
        const size_t bytes = count * DataTypeSize(type);
        const std::vector<double> input = Input(type, count, 0);
        DeviceBuffer send(bytes), recv(bytes);
        send.Upload(Encode(type, input));
        void* out = in_place ? send.get() : recv.get();
        ASSERT_TRUE(comm_->Broadcast(send.get(), out, count, type, /*root=*/0, Soon()).ok());
        ExpectValues(type, (in_place ? send : recv).Download(bytes), input);
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, CountZeroIsANoOp) {
  const DataType f32 = DataType::kFloat32;
  EXPECT_TRUE(comm_->AllReduce(nullptr, nullptr, 0, f32, ReduceOp::kSum, Soon()).ok());
  EXPECT_TRUE(comm_->AllGather(nullptr, nullptr, 0, f32, Soon()).ok());
  EXPECT_TRUE(comm_->ReduceScatter(nullptr, nullptr, 0, f32, ReduceOp::kMax, Soon()).ok());
  EXPECT_TRUE(comm_->Broadcast(nullptr, nullptr, 0, f32, 0, Soon()).ok());
  // Even host memory: nothing is touched.
  std::vector<float> host(4);
  EXPECT_TRUE(comm_->AllReduce(host.data(), host.data(), 0, f32, ReduceOp::kSum, Soon()).ok());
  EXPECT_EQ(comm_->counters().of(OpKind::kAllReduce).calls, 2u);
  EXPECT_EQ(comm_->counters().of(OpKind::kAllReduce).errors, 0u);
}

TEST_F(NcclCommunicatorTest, BadArgumentsAreInvalidAndLeaveItUsable) {
  const DataType f32 = DataType::kFloat32;
  DeviceBuffer a(4096), b(4096);
  auto expect_invalid = [](const absl::Status& s, absl::string_view names) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(names), std::string::npos) << s << " should name " << names;
  };
  expect_invalid(comm_->AllReduce(nullptr, b.get(), 4, f32, ReduceOp::kSum, Soon()), "send");
  expect_invalid(comm_->AllReduce(a.get(), nullptr, 4, f32, ReduceOp::kSum, Soon()), "recv");
  expect_invalid(
      comm_->AllReduce(a.get(), b.get(), 4, static_cast<DataType>(99), ReduceOp::kSum, Soon()),
      "type");
  expect_invalid(comm_->AllReduce(a.get(), b.get(), 4, f32, static_cast<ReduceOp>(99), Soon()),
                 "op");
  expect_invalid(comm_->AllReduce(a.get(), a.at(4), 4, f32, ReduceOp::kSum, Soon()), "overlap");
  expect_invalid(comm_->Broadcast(a.get(), b.get(), 4, f32, /*root=*/1, Soon()), "root");
  expect_invalid(comm_->Broadcast(a.get(), b.get(), 4, f32, /*root=*/-1, Soon()), "root");
  expect_invalid(comm_->Send(a.get(), 4, f32, /*peer=*/0, Soon()), "peer");
  expect_invalid(comm_->Recv(a.get(), 4, f32, /*peer=*/1, Soon()), "peer");
  expect_invalid(comm_->AllGather(a.at(4), a.get(), 4, f32, Soon()), "overlap");
  EXPECT_EQ(comm_->counters().of(OpKind::kAllReduce).errors, 5u);

  EXPECT_TRUE(comm_->GetAsyncError().ok());
  b.Upload(Encode(f32, {1, 2, 3, 4}));
  ASSERT_TRUE(comm_->AllReduce(b.get(), a.get(), 4, f32, ReduceOp::kSum, Soon()).ok());
  ExpectValues(f32, a.Download(16), {1, 2, 3, 4});
}

TEST_F(NcclCommunicatorTest, HostPointersAreRejected) {
  const DataType f32 = DataType::kFloat32;
  DeviceBuffer device(16);
  std::vector<float> pageable(4, 1.0f);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 16), cudaSuccess);
  for (float* host : {pageable.data(), pinned}) {
    absl::Status s = comm_->AllReduce(host, device.get(), 4, f32, ReduceOp::kSum, Soon());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("TCP backend"), std::string::npos) << s;
    s = comm_->Broadcast(device.get(), host, 4, f32, 0, Soon());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("recv"), std::string::npos) << s;
  }
  cudaFreeHost(pinned);
  EXPECT_TRUE(comm_->GetAsyncError().ok());
}

// Holds the communicator's stream with a host function, so that the next operation stays
// pending, until released. Released by a timer thread, independently of the operation's
// thread (ncclCommAbort waits for the stream's kernels to quit). The host function shares
// ownership of the notification: it may still be returning from WaitForNotification when
// the hold goes out of scope.
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) : release_(std::make_shared<absl::Notification>()) {
    auto* held = new std::shared_ptr<absl::Notification>(release_);
    const cudaError_t err = cudaLaunchHostFunc(
        stream,
        [](void* p) {
          std::unique_ptr<std::shared_ptr<absl::Notification>> n(
              static_cast<std::shared_ptr<absl::Notification>*>(p));
          (*n)->WaitForNotification();
        },
        held);
    EXPECT_EQ(err, cudaSuccess);
    if (err != cudaSuccess) delete held;
    releaser_ = std::thread([release = release_] {
      absl::SleepFor(absl::Seconds(1));
      release->Notify();
    });
  }
  ~StreamHold() { releaser_.join(); }

 private:
  std::shared_ptr<absl::Notification> release_;
  std::thread releaser_;
};

TEST_F(NcclCommunicatorTest, AbortFromAnotherThreadFailsThePendingAndLaterOps) {
  const DataType f32 = DataType::kFloat32;
  DeviceBuffer buf(4000);
  absl::Status status;
  absl::Duration took;
  {
    StreamHold hold(comm_->stream());
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(200));
      comm_->Abort();
    });
    const absl::Time start = absl::Now();
    status = comm_->AllReduce(buf.get(), buf.get(), 1000, f32, ReduceOp::kSum,
                              absl::Now() + absl::Seconds(60));
    took = absl::Now() - start;
    aborter.join();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(took, absl::Seconds(20));
  comm_->Abort();  // idempotent
  EXPECT_EQ(comm_->GetAsyncError().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(comm_->Barrier(Soon()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(comm_->AllReduce(nullptr, nullptr, 0, f32, ReduceOp::kSum, Soon()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(comm_->counters().of(OpKind::kBarrier).errors, 1u);
}

TEST_F(NcclCommunicatorTest, DeadlineAbortsAndBreaksTheCommunicator) {
  const DataType f32 = DataType::kFloat32;
  DeviceBuffer buf(4000);
  absl::Status status;
  absl::Duration took;
  {
    StreamHold hold(comm_->stream());
    const absl::Time start = absl::Now();
    status = comm_->AllReduce(buf.get(), buf.get(), 1000, f32, ReduceOp::kSum,
                              absl::Now() + absl::Milliseconds(200));
    took = absl::Now() - start;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ(comm_->GetAsyncError().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(comm_->Barrier(Soon()).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(NcclCommunicatorTest, CountersAreNominalRingVolumes) {
  const DataType f32 = DataType::kFloat32;
  DeviceBuffer buf(4000);
  ASSERT_TRUE(comm_->AllReduce(buf.get(), buf.get(), 1000, f32, ReduceOp::kSum, Soon()).ok());
  ASSERT_TRUE(comm_->Barrier(Soon()).ok());
  const Counters c = comm_->counters();
  EXPECT_EQ(c.of(OpKind::kAllReduce).calls, 1u);
  EXPECT_EQ(c.of(OpKind::kAllReduce).errors, 0u);
  // One rank: a ring moves nothing.
  EXPECT_EQ(c.of(OpKind::kAllReduce).bytes_sent, 0u);
  EXPECT_EQ(c.of(OpKind::kAllReduce).bytes_received, 0u);
  EXPECT_GT(c.of(OpKind::kAllReduce).time, absl::ZeroDuration());
  EXPECT_EQ(c.of(OpKind::kBarrier).calls, 1u);
}

}  // namespace
}  // namespace ringmaster::comm
