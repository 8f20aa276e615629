// The TCP backend with CUDA device buffers (--config=cuda): several ranks share one GPU,
// which NCCL refuses, and the backend stages through host memory. Every operation, in
// place and out of place, device-only and mixed host/device, against a reference each rank
// computes on the host from every rank's input. Skips where no GPU is present.
//
// CUDA is touched only inside the forked ranks and a forked probe: a CUDA context does not
// survive fork, so the test process itself never initialises the driver.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using testing::MultiProcOptions;
using testing::RankResult;
using testing::RunRanks;

// Number of CUDA devices, asked in a child process (testing::RunInChild) so that this
// process stays CUDA-free for the forks that follow; -1 with `why` set when the runtime
// cannot say.
int CountDevicesInChild(std::string* why) {
  const int code = testing::RunInChild([] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    return e == cudaSuccess ? (n > 100 ? 100 : n) : 101 + (static_cast<int>(e) % 100);
  });
  if (code < 0) {
    *why = "the probe process failed";
    return -1;
  }
  if (code > 100) {
    *why = absl::StrCat("cudaGetDeviceCount failed with CUDA error ", code - 101,
                        " (no driver or no device)");
    return -1;
  }
  return code;
}

class TcpCudaTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string why;
    const int devices = CountDevicesInChild(&why);
    if (devices <= 0) {
      GTEST_SKIP() << "no CUDA device: " << (devices == 0 ? "the runtime reports 0 devices" : why)
                   << "; the TCP backend's device-buffer staging is tested only on a GPU machine";
    }
  }
};

// Rank r's element i: small integers, exact in f32 sums.
float In(int rank, size_t i) { return static_cast<float>((rank * 5 + i * 3) % 11) - 5.0f; }

absl::Status Check(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  if (got.size() != want.size()) return absl::InternalError(what + ": size mismatch");
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::InternalError(
          absl::StrCat(what, ": element ", i, " is ", got[i], ", want ", want[i]));
    }
  }
  return absl::OkStatus();
}

// Device buffer of floats, freed on scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), (n + 1) * sizeof(float)) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  ~DeviceFloats() {
    if (p_ != nullptr) cudaFree(p_);
  }
  float* get() { return p_; }
  absl::Status Upload(const std::vector<float>& h, size_t offset = 0) {
    if (cudaMemcpy(p_ + offset, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice) !=
        cudaSuccess) {
      return absl::InternalError("cudaMemcpy H2D failed");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> Download(size_t count, size_t offset = 0) {
    std::vector<float> h(count);
    if (cudaMemcpy(h.data(), p_ + offset, count * sizeof(float), cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      return absl::InternalError("cudaMemcpy D2H failed");
    }
    return h;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

absl::Status RunAll(TcpCommunicator& comm) {
  const int rank = comm.rank();
  const int world = comm.size();
  if (cudaSetDevice(0) != cudaSuccess) return absl::InternalError("cudaSetDevice(0) failed");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 20}) {
    const std::string at = absl::StrCat("rank ", rank, " count ", count, ": ");
    std::vector<float> mine(count), sum(count, 0.0f);
    for (size_t i = 0; i < count; ++i) {
      mine[i] = In(rank, i);
      for (int r = 0; r < world; ++r) sum[i] += In(r, i);
    }
    // All-reduce, out of place (device → device) and in place.
    {
      DeviceFloats send(count), recv(count);
      if (send.get() == nullptr || recv.get() == nullptr) return absl::InternalError("cudaMalloc");
      RM_RETURN_IF_ERROR(send.Upload(mine));
      RM_RETURN_IF_ERROR(comm.AllReduce(send.get(), recv.get(), count, DataType::kFloat32,
                                        ReduceOp::kSum, deadline));
      RM_ASSIGN_OR_RETURN(auto got, recv.Download(count));
      RM_RETURN_IF_ERROR(Check(got, sum, at + "all-reduce out of place"));
      RM_RETURN_IF_ERROR(comm.AllReduce(send.get(), send.get(), count, DataType::kFloat32,
                                        ReduceOp::kSum, deadline));
      RM_ASSIGN_OR_RETURN(got, send.Download(count));
      RM_RETURN_IF_ERROR(Check(got, sum, at + "all-reduce in place"));
    }
    // Mixed: host send, device receive; device send, host receive.
    {
      DeviceFloats dev(count);
      RM_RETURN_IF_ERROR(comm.AllReduce(mine.data(), dev.get(), count, DataType::kFloat32,
                                        ReduceOp::kSum, deadline));
      RM_ASSIGN_OR_RETURN(auto got, dev.Download(count));
      RM_RETURN_IF_ERROR(Check(got, sum, at + "all-reduce host→device"));
      RM_RETURN_IF_ERROR(dev.Upload(mine));
      std::vector<float> host(count, -1.0f);
      RM_RETURN_IF_ERROR(comm.AllReduce(dev.get(), host.data(), count, DataType::kFloat32,
                                        ReduceOp::kSum, deadline));
      RM_RETURN_IF_ERROR(Check(host, sum, at + "all-reduce device→host"));
    }
    // All-gather: out of place, and in place (the send buffer is this rank's slot).
    {
      std::vector<float> gathered(count * world);
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) gathered[r * count + i] = In(r, i);
      }
      DeviceFloats send(count), recv(count * world);
      RM_RETURN_IF_ERROR(send.Upload(mine));
      RM_RETURN_IF_ERROR(
          comm.AllGather(send.get(), recv.get(), count, DataType::kFloat32, deadline));
      RM_ASSIGN_OR_RETURN(auto got, recv.Download(count * world));
      RM_RETURN_IF_ERROR(Check(got, gathered, at + "all-gather out of place"));
      DeviceFloats inplace(count * world);
      RM_RETURN_IF_ERROR(inplace.Upload(mine, rank * count));
      RM_RETURN_IF_ERROR(comm.AllGather(inplace.get() + rank * count, inplace.get(), count,
                                        DataType::kFloat32, deadline));
      RM_ASSIGN_OR_RETURN(got, inplace.Download(count * world));
      RM_RETURN_IF_ERROR(Check(got, gathered, at + "all-gather in place"));
    }
    // Reduce-scatter: each rank's input is world * count; rank r keeps block r of the sum.
    {
      std::vector<float> input(count * world), want(count, 0.0f);
      for (size_t i = 0; i < count * world; ++i) input[i] = In(rank, i);
      for (size_t i = 0; i < count; ++i) {
        for (int r = 0; r < world; ++r) want[i] += In(r, rank * count + i);
      }
      DeviceFloats send(count * world), recv(count);
      RM_RETURN_IF_ERROR(send.Upload(input));
      RM_RETURN_IF_ERROR(comm.ReduceScatter(send.get(), recv.get(), count, DataType::kFloat32,
                                            ReduceOp::kSum, deadline));
      RM_ASSIGN_OR_RETURN(auto got, recv.Download(count));
      RM_RETURN_IF_ERROR(Check(got, want, at + "reduce-scatter out of place"));
      RM_RETURN_IF_ERROR(comm.ReduceScatter(send.get(), send.get() + rank * count, count,
                                            DataType::kFloat32, ReduceOp::kSum, deadline));
      RM_ASSIGN_OR_RETURN(got, send.Download(count, rank * count));
      RM_RETURN_IF_ERROR(Check(got, want, at + "reduce-scatter in place"));
    }
    // Broadcast from the last rank, in place on device.
    {
      const int root = world - 1;
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = In(root, i);
      DeviceFloats buf(count);
      RM_RETURN_IF_ERROR(buf.Upload(mine));
      RM_RETURN_IF_ERROR(
          comm.Broadcast(buf.get(), buf.get(), count, DataType::kFloat32, root, deadline));
      RM_ASSIGN_OR_RETURN(auto got, buf.Download(count));
      RM_RETURN_IF_ERROR(Check(got, want, at + "broadcast"));
    }
    // Send/Recv around the ring, device buffers on both ends.
    if (world > 1) {
      const int next = (rank + 1) % world;
      const int prev = (rank + world - 1) % world;
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = In(prev, i);
      DeviceFloats send(count), recv(count);
      RM_RETURN_IF_ERROR(send.Upload(mine));
      if (rank % 2 == 0) {
        RM_RETURN_IF_ERROR(comm.Send(send.get(), count, DataType::kFloat32, next, deadline));
        RM_RETURN_IF_ERROR(comm.Recv(recv.get(), count, DataType::kFloat32, prev, deadline));
      } else {
        RM_RETURN_IF_ERROR(comm.Recv(recv.get(), count, DataType::kFloat32, prev, deadline));
        RM_RETURN_IF_ERROR(comm.Send(send.get(), count, DataType::kFloat32, next, deadline));
      }
      RM_ASSIGN_OR_RETURN(auto got, recv.Download(count));
      RM_RETURN_IF_ERROR(Check(got, want, at + "send/recv"));
    }
    // One SendRecv batch around the ring mixing device and host buffers: each device
    // buffer is staged on its own. Two messages each way: a device one, then a host one.
    if (world > 1) {
      const int next = (rank + 1) % world;
      const int prev = (rank + world - 1) % world;
      std::vector<float> want(count), want_host(count), host_out(count), host_in(count);
      for (size_t i = 0; i < count; ++i) {
        want[i] = In(prev, i);
        want_host[i] = -In(prev, i + 1);
        host_out[i] = -In(rank, i + 1);
      }
      DeviceFloats send(count), recv(count);
      RM_RETURN_IF_ERROR(send.Upload(mine));
      const DataType f32 = DataType::kFloat32;
      const PointToPoint ops[] = {PointToPoint::Send(send.get(), count, f32, next),
                                  PointToPoint::Recv(recv.get(), count, f32, prev),
                                  PointToPoint::Send(host_out.data(), count, f32, next),
                                  PointToPoint::Recv(host_in.data(), count, f32, prev)};
      RM_RETURN_IF_ERROR(comm.SendRecv(ops, deadline));
      RM_ASSIGN_OR_RETURN(auto got, recv.Download(count));
      RM_RETURN_IF_ERROR(Check(got, want, at + "batched send/recv, device buffer"));
      RM_RETURN_IF_ERROR(Check(host_in, want_host, at + "batched send/recv, host buffer"));
    }
  }
  return absl::OkStatus();
}

TEST_P(TcpCudaTest, EveryOperationWithDeviceBuffers) {
  MultiProcOptions options;
  options.world_size = GetParam();
  const std::vector<RankResult> results =
      RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) { return RunAll(comm); });
  ASSERT_EQ(results.size(), static_cast<size_t>(GetParam()));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].reported) << "rank " << r << ": " << results[r].exit_detail;
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, TcpCudaTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

}  // namespace
}  // namespace ringmaster::comm
