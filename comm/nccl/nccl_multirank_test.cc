// NcclCommunicator with 2 and 4 ranks in forked processes, one GPU each, the NCCL unique id
// travelling through a Store: every collective, type and op against a host reference
// computed from every rank's inputs alone; point to point; groups made with ncclCommSplit;
// and the failures the backend must turn into errors within its deadline: a peer that dies,
// a peer that stops, Abort() from another thread.
//
// Under --config=cudaemu every rank has its own emulated GPU (gpu_per_rank.h); with
// --config=cuda the tests need as many GPUs as ranks and skip otherwise. This process never
// initialises CUDA (its forked ranks could not use it).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_test_util.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using testing::Encode;
using testing::Mismatch;
using testing::MultiProcOptions;
using testing::RankResult;
using testing::ReduceReference;
using testing::SmallInput;
using ::ringmaster::comm::Mesh;
using ::ringmaster::comm::MeshDim;

#ifdef RINGMASTER_CUDA_EMU
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

#define SKIP_WITHOUT_GPUS(n)                                                              \
  if (!testing::GpuPerRankAvailable(n)) {                                                 \
    GTEST_SKIP() << "fewer than " << (n) << " CUDA GPUs here: the multi-rank NCCL tests " \
                 << "need one per rank (or run them on the CPU with --config=cudaemu)";   \
  }

absl::Time In(absl::Duration d) { return absl::Now() + d; }

absl::Status Check(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// Device memory, filled with a sentinel so that an operation that writes nothing is caught.
class DeviceBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceBuffer>> Create(size_t bytes) {
    auto b = std::unique_ptr<DeviceBuffer>(new DeviceBuffer(bytes));
    RM_RETURN_IF_ERROR(
        Check(cudaMalloc(&b->ptr_, std::max<size_t>(bytes, 1)) == cudaSuccess, "cudaMalloc"));
    RM_RETURN_IF_ERROR(Check(cudaMemset(b->ptr_, 0x5a, std::max<size_t>(bytes, 1)) == cudaSuccess &&
                                 cudaDeviceSynchronize() == cudaSuccess,
                             "cudaMemset"));
    return b;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }

  char* at(size_t offset = 0) const { return static_cast<char*>(ptr_) + offset; }
  // Waits until the data is on the device: the communicator's stream does not wait for the
  // legacy default stream.
  absl::Status Upload(const std::vector<uint8_t>& host, size_t offset = 0) {
    return Check(
        cudaMemcpy(at(offset), host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaDeviceSynchronize() == cudaSuccess,
        "upload");
  }
  absl::StatusOr<std::vector<uint8_t>> Download(size_t bytes, size_t offset = 0) const {
    std::vector<uint8_t> host(bytes);
    RM_RETURN_IF_ERROR(
        Check(cudaMemcpy(host.data(), at(offset), bytes, cudaMemcpyDeviceToHost) == cudaSuccess,
              "download"));
    return host;
  }

 private:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {}
  size_t bytes_;
  void* ptr_ = nullptr;
};

// OK when `bytes` at `buffer` decode to `want`.
absl::Status ExpectValues(const DeviceBuffer& buffer, DataType type,
                          const std::vector<double>& want, absl::string_view what,
                          size_t offset = 0) {
  RM_ASSIGN_OR_RETURN(std::vector<uint8_t> got,
                      buffer.Download(want.size() * DataTypeSize(type), offset));
  const std::string bad = Mismatch(type, got, want);
  return Check(bad.empty(), absl::StrCat(what, ": ", bad));
}

using NcclRankFn =
    std::function<absl::Status(NcclCommunicator& nccl, Store& store, absl::Duration* elapsed)>;

// Runs `fn` on `n` forked ranks, each with its own GPU and an NcclCommunicator bootstrapped
// through a FileStore they share. `victims` may die or stop (comm/testing/multiproc.h).
std::vector<RankResult> RunNcclRanks(int n, const NcclRankFn& fn, std::set<int> victims = {}) {
  const std::string dir = testing::FreshStoreDir();
  MultiProcOptions options;
  options.world_size = n;
  options.victims = std::move(victims);
  options.timeout = absl::Seconds(120);
  return testing::RunRanks(options, [&](TcpCommunicator& tcp, absl::Duration* elapsed) {
    const int device = testing::UseOwnGpu(tcp.rank());
    RM_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Create({dir}));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                        NcclCommunicator::Create({.rank = tcp.rank(),
                                                  .size = n,
                                                  .store = store.get(),
                                                  .prefix = "job/epoch1/nccl",
                                                  .device = device,
                                                  .init_timeout = absl::Seconds(60)}));
    return fn(*nccl, *store, elapsed);
  });
}

void ExpectAllOk(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

// ---- The collectives against the host reference. ----

constexpr size_t kCounts[] = {0, 1, 7, 1000};

absl::Status AllReduces(NcclCommunicator& comm, DataType type, size_t count) {
  const int n = comm.size();
  const size_t bytes = count * DataTypeSize(type);
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(SmallInput(type, count, r));
  for (ReduceOp op : kAllReduceOps) {
    for (bool in_place : {false, true}) {
      const std::string what =
          absl::StrCat("all_reduce ", DataTypeName(type), " ", ReduceOpName(op), " count ", count,
                       in_place ? " in place" : "");
      RM_ASSIGN_OR_RETURN(auto send, DeviceBuffer::Create(bytes));
      RM_ASSIGN_OR_RETURN(auto recv, DeviceBuffer::Create(bytes));
      RM_RETURN_IF_ERROR(send->Upload(Encode(type, inputs[comm.rank()])));
      DeviceBuffer& out = in_place ? *send : *recv;
      RM_RETURN_IF_ERROR(
          comm.AllReduce(send->at(), out.at(), count, type, op, In(absl::Seconds(30))));
      RM_RETURN_IF_ERROR(ExpectValues(out, type, ReduceReference(type, op, inputs), what));
    }
  }
  return absl::OkStatus();
}

absl::Status AllGathers(NcclCommunicator& comm, DataType type, size_t count) {
  const int n = comm.size(), rank = comm.rank();
  const size_t bytes = count * DataTypeSize(type);
  std::vector<double> want;
  for (int r = 0; r < n; ++r) {
    const std::vector<double> block = SmallInput(type, count, r);
    want.insert(want.end(), block.begin(), block.end());
  }
  // Apart; in place as send == recv (the input is recv's first block); NCCL's in place
  // (the input is recv's block of this rank).
  for (int form = 0; form < 3; ++form) {
    const std::string what =
        absl::StrCat("all_gather ", DataTypeName(type), " count ", count, " form ", form);
    RM_ASSIGN_OR_RETURN(auto send, DeviceBuffer::Create(bytes));
    RM_ASSIGN_OR_RETURN(auto recv, DeviceBuffer::Create(bytes * n));
    const std::vector<uint8_t> mine = Encode(type, SmallInput(type, count, rank));
    const char* in = form == 0 ? send->at() : form == 1 ? recv->at() : recv->at(rank * bytes);
    if (form == 0) RM_RETURN_IF_ERROR(send->Upload(mine));
    if (form == 1) RM_RETURN_IF_ERROR(recv->Upload(mine));
    if (form == 2) RM_RETURN_IF_ERROR(recv->Upload(mine, rank * bytes));
    RM_RETURN_IF_ERROR(comm.AllGather(in, recv->at(), count, type, In(absl::Seconds(30))));
    RM_RETURN_IF_ERROR(ExpectValues(*recv, type, want, what));
  }
  return absl::OkStatus();
}

absl::Status ReduceScatters(NcclCommunicator& comm, DataType type, size_t count) {
  const int n = comm.size(), rank = comm.rank();
  const size_t bytes = count * DataTypeSize(type);
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(SmallInput(type, count * n, r));
  for (ReduceOp op : kAllReduceOps) {
    const std::vector<double> all = ReduceReference(type, op, inputs);
    const std::vector<double> want(all.begin() + rank * count, all.begin() + (rank + 1) * count);
    // Apart; in place as recv == send (the result lands in send's first block); NCCL's in
    // place (recv is send's block of this rank).
    for (int form = 0; form < 3; ++form) {
      const std::string what = absl::StrCat("reduce_scatter ", DataTypeName(type), " ",
                                            ReduceOpName(op), " count ", count, " form ", form);
      RM_ASSIGN_OR_RETURN(auto send, DeviceBuffer::Create(bytes * n));
      RM_ASSIGN_OR_RETURN(auto recv, DeviceBuffer::Create(bytes));
      RM_RETURN_IF_ERROR(send->Upload(Encode(type, inputs[rank])));
      const size_t at = form == 2 ? rank * bytes : 0;
      DeviceBuffer& out = form == 0 ? *recv : *send;
      RM_RETURN_IF_ERROR(
          comm.ReduceScatter(send->at(), out.at(at), count, type, op, In(absl::Seconds(30))));
      RM_RETURN_IF_ERROR(ExpectValues(out, type, want, what, at));
    }
  }
  return absl::OkStatus();
}

absl::Status Broadcasts(NcclCommunicator& comm, DataType type, size_t count) {
  const size_t bytes = count * DataTypeSize(type);
  for (int root = 0; root < comm.size(); ++root) {
    for (bool in_place : {false, true}) {
      const std::string what = absl::StrCat("broadcast ", DataTypeName(type), " count ", count,
                                            " root ", root, in_place ? " in place" : "");
      RM_ASSIGN_OR_RETURN(auto send, DeviceBuffer::Create(bytes));
      RM_ASSIGN_OR_RETURN(auto recv, DeviceBuffer::Create(bytes));
      RM_RETURN_IF_ERROR(send->Upload(Encode(type, SmallInput(type, count, comm.rank()))));
      DeviceBuffer& out = in_place ? *send : *recv;
      RM_RETURN_IF_ERROR(
          comm.Broadcast(send->at(), out.at(), count, type, root, In(absl::Seconds(30))));
      RM_RETURN_IF_ERROR(ExpectValues(out, type, SmallInput(type, count, root), what));
    }
  }
  return absl::OkStatus();
}

// A ring: even ranks send to the next rank first, odd ranks receive first (Send blocks
// until the peer receives).
absl::Status SendRecvRing(NcclCommunicator& comm) {
  const int n = comm.size(), rank = comm.rank();
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const DataType type = DataType::kFloat32;
  constexpr size_t kCount = 1000;
  RM_ASSIGN_OR_RETURN(auto out, DeviceBuffer::Create(kCount * 4));
  RM_ASSIGN_OR_RETURN(auto in, DeviceBuffer::Create(kCount * 4));
  RM_RETURN_IF_ERROR(out->Upload(Encode(type, SmallInput(type, kCount, rank))));
  auto send = [&] { return comm.Send(out->at(), kCount, type, next, In(absl::Seconds(30))); };
  auto recv = [&] { return comm.Recv(in->at(), kCount, type, prev, In(absl::Seconds(30))); };
  if (rank % 2 == 0) {
    RM_RETURN_IF_ERROR(send());
    RM_RETURN_IF_ERROR(recv());
  } else {
    RM_RETURN_IF_ERROR(recv());
    RM_RETURN_IF_ERROR(send());
  }
  return ExpectValues(*in, type, SmallInput(type, kCount, prev), "send/recv ring");
}

absl::Status AllCollectives(NcclCommunicator& comm) {
  for (DataType type : kAllDataTypes) {
    for (size_t count : kCounts) {
      RM_RETURN_IF_ERROR(AllReduces(comm, type, count));
      RM_RETURN_IF_ERROR(AllGathers(comm, type, count));
      RM_RETURN_IF_ERROR(ReduceScatters(comm, type, count));
      RM_RETURN_IF_ERROR(Broadcasts(comm, type, count));
    }
  }
  RM_RETURN_IF_ERROR(SendRecvRing(comm));
  RM_RETURN_IF_ERROR(comm.Barrier(In(absl::Seconds(30))));
  RM_RETURN_IF_ERROR(comm.GetAsyncError());
  // Nominal ring volumes (nccl_communicator.h): one f32 all-reduce of 1000 elements.
  const Counters before = comm.counters();
  RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4000));
  RM_RETURN_IF_ERROR(comm.AllReduce(buf->at(), buf->at(), 1000, DataType::kFloat32, ReduceOp::kSum,
                                    In(absl::Seconds(30))));
  const OpCounters after = comm.counters().of(OpKind::kAllReduce);
  const uint64_t sent = after.bytes_sent - before.of(OpKind::kAllReduce).bytes_sent;
  const uint64_t want = 2 * (comm.size() - 1) * 4000 / comm.size();
  RM_RETURN_IF_ERROR(
      Check(sent == want, absl::StrCat("all_reduce bytes_sent ", sent, ", want ", want)));
  // The formula beside it is NCCL's ring volume too, and the payload the buffer.
  const uint64_t formula =
      after.formula_bytes_sent - before.of(OpKind::kAllReduce).formula_bytes_sent;
  const uint64_t payload = after.payload_bytes - before.of(OpKind::kAllReduce).payload_bytes;
  return Check(formula == want && payload == 4000,
               absl::StrCat("all_reduce formula_bytes_sent ", formula, ", payload_bytes ", payload,
                            ", want ", want, " and 4000"));
}

TEST(NcclMultiRank, CollectivesWithTwoRanksMatchTheReference) {
  SKIP_WITHOUT_GPUS(2);
  ExpectAllOk(RunNcclRanks(
      2, [](NcclCommunicator& comm, Store&, absl::Duration*) { return AllCollectives(comm); }));
}

TEST(NcclMultiRank, CollectivesWithFourRanksMatchTheReference) {
  SKIP_WITHOUT_GPUS(4);
  ExpectAllOk(RunNcclRanks(
      4, [](NcclCommunicator& comm, Store&, absl::Duration*) { return AllCollectives(comm); }));
}

// ---- SendRecv: one NCCL group of ncclSend / ncclRecv per batch. ----

using testing::Input;

// What `from` sends to anyone as its message `tag` (tag < 4): distinct for every (from, tag)
// of a 4-rank test.
std::vector<double> Message(DataType type, size_t count, int from, int tag) {
  return Input(type, count, from * 4 + tag);
}

// Every rank sends 1 MiB to the next rank and receives from the previous one in one batch.
// With blocking calls, `Send(next); Recv(prev);` on every rank deadlocks: NCCL's Send waits
// for the matching Recv, which every peer posts only after its own Send (SendRecvRing above
// orders even and odd ranks to avoid it). `async`: through SendRecvAsync and Wait.
absl::Status BatchedRing(NcclCommunicator& comm, bool async) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const DataType type = DataType::kFloat32;
  constexpr size_t kCount = 256 * 1024;
  RM_ASSIGN_OR_RETURN(auto out, DeviceBuffer::Create(kCount * 4));
  RM_ASSIGN_OR_RETURN(auto in, DeviceBuffer::Create(kCount * 4));
  RM_RETURN_IF_ERROR(out->Upload(Encode(type, Message(type, kCount, r, 0))));
  const PointToPoint ops[] = {PointToPoint::Send(out->at(), kCount, type, next),
                              PointToPoint::Recv(in->at(), kCount, type, prev)};
  const Counters before = comm.counters();
  if (async) {
    const Work work = comm.SendRecvAsync(ops, In(absl::Seconds(30)));
    RM_RETURN_IF_ERROR(work.Wait(In(absl::Seconds(30))));
  } else {
    RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(30))));
  }
  RM_RETURN_IF_ERROR(ExpectValues(*in, type, Message(type, kCount, prev, 0), "batched ring"));
  const Counters after = comm.counters();
  const OpCounters& was = before.of(OpKind::kSendRecv);
  const OpCounters& is = after.of(OpKind::kSendRecv);
  return Check(is.calls == was.calls + 1 && is.bytes_sent == was.bytes_sent + kCount * 4 &&
                   is.bytes_received == was.bytes_received + kCount * 4,
               absl::StrCat("send_recv counters: ", is.calls, " calls, ", is.bytes_sent,
                            " bytes sent, ", is.bytes_received, " received"));
}

// The pipeline's steady state: stage r sends its activation (f32) to r+1 and receives a
// gradient (bf16) from r+1 while r+1 does the mirror batch; middle stages do both in one
// batch. Three micro-batches, each with its own messages.
absl::Status PipelineExchange(NcclCommunicator& comm) {
  const int n = comm.size(), r = comm.rank();
  const DataType f32 = DataType::kFloat32, bf16 = DataType::kBFloat16;
  constexpr size_t kActivation = 3000, kGradient = 2000;
  RM_ASSIGN_OR_RETURN(auto act_out, DeviceBuffer::Create(kActivation * 4));
  RM_ASSIGN_OR_RETURN(auto act_in, DeviceBuffer::Create(kActivation * 4));
  RM_ASSIGN_OR_RETURN(auto grad_out, DeviceBuffer::Create(kGradient * 2));
  RM_ASSIGN_OR_RETURN(auto grad_in, DeviceBuffer::Create(kGradient * 2));
  for (int micro = 0; micro < 3; ++micro) {
    std::vector<PointToPoint> ops;
    if (r + 1 < n) {
      RM_RETURN_IF_ERROR(act_out->Upload(Encode(f32, Message(f32, kActivation, r, micro))));
      ops.push_back(PointToPoint::Send(act_out->at(), kActivation, f32, r + 1));
      ops.push_back(PointToPoint::Recv(grad_in->at(), kGradient, bf16, r + 1));
    }
    if (r > 0) {
      RM_RETURN_IF_ERROR(grad_out->Upload(Encode(bf16, Message(bf16, kGradient, r, micro))));
      ops.push_back(PointToPoint::Recv(act_in->at(), kActivation, f32, r - 1));
      ops.push_back(PointToPoint::Send(grad_out->at(), kGradient, bf16, r - 1));
    }
    RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(30))));
    if (r + 1 < n) {
      RM_RETURN_IF_ERROR(ExpectValues(*grad_in, bf16, Message(bf16, kGradient, r + 1, micro),
                                      absl::StrCat("gradient of micro-batch ", micro)));
    }
    if (r > 0) {
      RM_RETURN_IF_ERROR(ExpectValues(*act_in, f32, Message(f32, kActivation, r - 1, micro),
                                      absl::StrCat("activation of micro-batch ", micro)));
    }
  }
  return absl::OkStatus();
}

// Rank 0's plain Send, then a batch with a second message to rank 1, are received by one
// batch of rank 1 in that order; rank 1's plain Send answers rank 0's batch. (Rank 1's
// answer could be in its batch on a GPU; the emulated NCCL takes a message that arrives
// before its receive is posted for a mismatch.)
absl::Status BatchAfterPlainSend(NcclCommunicator& comm) {
  const int r = comm.rank();
  if (r > 1) return absl::OkStatus();
  const DataType i32 = DataType::kInt32;
  constexpr size_t kCount = 500;
  RM_ASSIGN_OR_RETURN(auto x, DeviceBuffer::Create(kCount * 4));
  RM_ASSIGN_OR_RETURN(auto y, DeviceBuffer::Create(kCount * 4));
  RM_ASSIGN_OR_RETURN(auto z, DeviceBuffer::Create(kCount * 4));
  const absl::Time deadline = In(absl::Seconds(30));
  if (r == 0) {
    RM_RETURN_IF_ERROR(x->Upload(Encode(i32, Message(i32, kCount, 0, 0))));
    RM_RETURN_IF_ERROR(y->Upload(Encode(i32, Message(i32, kCount, 0, 1))));
    RM_RETURN_IF_ERROR(comm.Send(x->at(), kCount, i32, 1, deadline));
    const PointToPoint ops[] = {PointToPoint::Send(y->at(), kCount, i32, 1),
                                PointToPoint::Recv(z->at(), kCount, i32, 1)};
    RM_RETURN_IF_ERROR(comm.SendRecv(ops, deadline));
    return ExpectValues(*z, i32, Message(i32, kCount, 1, 2), "z");
  }
  RM_RETURN_IF_ERROR(z->Upload(Encode(i32, Message(i32, kCount, 1, 2))));
  const PointToPoint ops[] = {PointToPoint::Recv(x->at(), kCount, i32, 0),
                              PointToPoint::Recv(y->at(), kCount, i32, 0)};
  RM_RETURN_IF_ERROR(comm.SendRecv(ops, deadline));
  RM_RETURN_IF_ERROR(ExpectValues(*x, i32, Message(i32, kCount, 0, 0), "x"));
  RM_RETURN_IF_ERROR(ExpectValues(*y, i32, Message(i32, kCount, 0, 1), "y"));
  return comm.Send(z->at(), kCount, i32, 0, deadline);
}

// Bad ops are INVALID_ARGUMENT naming the op's index; host memory too (the NCCL backend
// needs device buffers). The communicator stays healthy.
absl::Status BadBatches(NcclCommunicator& comm) {
  const int peer = (comm.rank() + 1) % comm.size();
  RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(400));
  std::vector<float> host(100);
  const DataType f32 = DataType::kFloat32;
  const std::pair<std::vector<PointToPoint>, std::string> cases[] = {
      {{PointToPoint::Send(buf->at(), 100, f32, peer), PointToPoint::Recv(buf->at(), 1, f32, -1)},
       "SendRecv ops[1]: peer -1"},
      {{PointToPoint::Recv(nullptr, 1, f32, peer)}, "SendRecv ops[0]: recv is null"},
      {{PointToPoint::Send(buf->at(), 100, f32, peer), PointToPoint::Recv(host.data(), 100, f32, peer)},
       "SendRecv ops[1]: recv buffer is host memory"},
  };
  for (const auto& [ops, want] : cases) {
    const absl::Status s = comm.SendRecv(ops, In(absl::Seconds(30)));
    RM_RETURN_IF_ERROR(
        Check(absl::IsInvalidArgument(s) && s.message().find(want) != std::string::npos,
              absl::StrCat("want INVALID_ARGUMENT with \"", want, "\", got ", s.ToString())));
  }
  RM_RETURN_IF_ERROR(comm.SendRecv({}, In(absl::Seconds(30))));
  return comm.GetAsyncError();
}

absl::Status Batches(NcclCommunicator& comm) {
  RM_RETURN_IF_ERROR(BadBatches(comm));
  RM_RETURN_IF_ERROR(BatchedRing(comm, /*async=*/false));
  RM_RETURN_IF_ERROR(BatchedRing(comm, /*async=*/true));
  RM_RETURN_IF_ERROR(PipelineExchange(comm));
  RM_RETURN_IF_ERROR(BatchAfterPlainSend(comm));
  return comm.Barrier(In(absl::Seconds(30)));
}

TEST(NcclMultiRank, SendRecvBatchesOnTwoThreeAndFourRanks) {
  for (int n : {2, 3, 4}) {
    SKIP_WITHOUT_GPUS(n);
    ExpectAllOk(RunNcclRanks(
        n, [](NcclCommunicator& comm, Store&, absl::Duration*) { return Batches(comm); }));
  }
}

// ---- ncclCommSplit groups (called directly: a 2x2 mesh, then a group without rank 3). ----

#define RETURN_IF_NCCL_ERROR(call)                                                       \
  if (const ncclResult_t res_ = (call); res_ != ncclSuccess) {                           \
    return absl::InternalError(absl::StrCat(#call, ": ", ncclGetErrorString(res_), " (", \
                                            ncclGetLastError(nullptr), ")"));            \
  }

// Sums `value` over `comm` and gathers it, on `stream`; returns {sum, gathered...}.
absl::StatusOr<std::vector<int32_t>> SumAndGather(ncclComm_t comm, int32_t value,
                                                  cudaStream_t stream) {
  int n = 0;
  RETURN_IF_NCCL_ERROR(ncclCommCount(comm, &n));
  RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4 * (n + 1)));
  RM_RETURN_IF_ERROR(
      Check(cudaMemcpy(buf->at(), &value, 4, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy"));
  RETURN_IF_NCCL_ERROR(ncclAllGather(buf->at(), buf->at(4), 1, ncclInt32, comm, stream));
  RETURN_IF_NCCL_ERROR(ncclAllReduce(buf->at(), buf->at(), 1, ncclInt32, ncclSum, comm, stream));
  RM_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream) == cudaSuccess, "sync"));
  std::vector<int32_t> out(n + 1);
  RM_RETURN_IF_ERROR(
      Check(cudaMemcpy(out.data(), buf->at(), 4 * (n + 1), cudaMemcpyDeviceToHost) == cudaSuccess,
            "cudaMemcpy"));
  return out;
}

TEST(NcclMultiRank, SplitGroupsOfAMesh) {
  SKIP_WITHOUT_GPUS(4);
  ExpectAllOk(
      RunNcclRanks(4, [](NcclCommunicator& nccl, Store& store, absl::Duration*) -> absl::Status {
        const int rank = nccl.rank();
        // A raw NCCL communicator of the world, its id through the Store as the backend does.
        ncclUniqueId id;
        if (rank == 0) {
          RETURN_IF_NCCL_ERROR(ncclGetUniqueId(&id));
          RM_RETURN_IF_ERROR(store.Set(
              "split/unique_id", absl::BytesToHexString(absl::string_view(id.internal, 128))));
        } else {
          RM_ASSIGN_OR_RETURN(std::string hex, store.Get("split/unique_id", In(absl::Seconds(30))));
          const std::string raw = absl::HexStringToBytes(hex);
          std::copy(raw.begin(), raw.end(), id.internal);
        }
        ncclComm_t world = nullptr;
        RETURN_IF_NCCL_ERROR(ncclCommInitRank(&world, 4, id, rank));
        cudaStream_t stream;
        RM_RETURN_IF_ERROR(Check(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate"));
        const int32_t value = 10 * (rank + 1);
        // dp x tp = 2 x 2, tp innermost: a tp group is {2d, 2d+1}, a dp group {t, t+2}.
        ncclComm_t tp = nullptr, dp = nullptr;
        RETURN_IF_NCCL_ERROR(ncclCommSplit(world, rank / 2, rank, &tp, nullptr));
        RETURN_IF_NCCL_ERROR(ncclCommSplit(world, rank % 2, rank, &dp, nullptr));
        RM_ASSIGN_OR_RETURN(std::vector<int32_t> in_tp, SumAndGather(tp, value, stream));
        RM_ASSIGN_OR_RETURN(std::vector<int32_t> in_dp, SumAndGather(dp, value, stream));
        const int d = rank / 2, t = rank % 2;
        const std::vector<int32_t> want_tp = {10 * (2 * d + 1) + 10 * (2 * d + 2), 10 * (2 * d + 1),
                                              10 * (2 * d + 2)};
        const std::vector<int32_t> want_dp = {10 * (t + 1) + 10 * (t + 3), 10 * (t + 1),
                                              10 * (t + 3)};
        RM_RETURN_IF_ERROR(Check(in_tp == want_tp, absl::StrCat("tp group of rank ", rank)));
        RM_RETURN_IF_ERROR(Check(in_dp == want_dp, absl::StrCat("dp group of rank ", rank)));
        // Rank 3 stays out; the others ordered by descending key: new rank 0 is old rank 2.
        ncclComm_t three = nullptr;
        RETURN_IF_NCCL_ERROR(
            ncclCommSplit(world, rank == 3 ? NCCL_SPLIT_NOCOLOR : 0, -rank, &three, nullptr));
        if (rank == 3) {
          RM_RETURN_IF_ERROR(Check(three == nullptr, "NOCOLOR gave a communicator"));
        } else {
          int mine = -1;
          RETURN_IF_NCCL_ERROR(ncclCommUserRank(three, &mine));
          RM_RETURN_IF_ERROR(Check(mine == 2 - rank, absl::StrCat("rank ", rank, " is ", mine)));
          RM_ASSIGN_OR_RETURN(std::vector<int32_t> in_three, SumAndGather(three, value, stream));
          RM_RETURN_IF_ERROR(Check(in_three == std::vector<int32_t>{60, 30, 20, 10}, "three"));
          RETURN_IF_NCCL_ERROR(ncclCommDestroy(three));
        }
        // The world's own collectives go on beside its groups.
        RM_ASSIGN_OR_RETURN(std::vector<int32_t> in_world, SumAndGather(world, value, stream));
        RM_RETURN_IF_ERROR(Check(in_world[0] == 100, "world"));
        for (ncclComm_t c : {tp, dp, world}) RETURN_IF_NCCL_ERROR(ncclCommDestroy(c));
        cudaStreamDestroy(stream);
        // The backend's own communicator is still healthy.
        return nccl.Barrier(In(absl::Seconds(30)));
      }));
}

// The backend's own groups: NcclCommunicator::Split (ncclCommSplit) along the dimensions of a
// dp x tp = 2 x 2 mesh, a blocking all-reduce on each group and a non-blocking all-gather on
// the tp group, checked against sums computed from the ranks' inputs alone.
absl::StatusOr<std::vector<int32_t>> ToHost(const DeviceBuffer& b, size_t n) {
  std::vector<int32_t> out(n);
  RM_RETURN_IF_ERROR(Check(
      cudaMemcpy(out.data(), b.at(), 4 * n, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy"));
  return out;
}

TEST(NcclMultiRank, BackendSplitGivesTheGroupsOfAMesh) {
  SKIP_WITHOUT_GPUS(4);
  ExpectAllOk(
      RunNcclRanks(4, [](NcclCommunicator& world, Store&, absl::Duration*) -> absl::Status {
        RM_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create(4, {{"dp", 2}, {"tp", 2}}));
        const int rank = world.rank();
        const int32_t value = 10 * (rank + 1);
        for (MeshDim dim : {MeshDim::kTp, MeshDim::kDp}) {
          RM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                              mesh.Group(world, dim, In(absl::Seconds(30))));
          const std::vector<int> members = mesh.GroupRanks(dim, rank);
          RM_RETURN_IF_ERROR(Check(group->size() == static_cast<int>(members.size()),
                                   absl::StrCat(MeshDimName(dim), " group size")));
          RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4 * (1 + members.size())));
          RM_RETURN_IF_ERROR(Check(
              cudaMemcpy(buf->at(), &value, 4, cudaMemcpyHostToDevice) == cudaSuccess, "copy"));
          // Gather without waiting, then sum in place: the group's operations keep their order.
          Work gather = group->AllGatherAsync(buf->at(), buf->at(4), 1, DataType::kInt32,
                                              In(absl::Seconds(30)));
          RM_RETURN_IF_ERROR(gather.Wait(In(absl::Seconds(30))));
          RM_RETURN_IF_ERROR(group->AllReduce(buf->at(), buf->at(), 1, DataType::kInt32,
                                              ReduceOp::kSum, In(absl::Seconds(30))));
          RM_ASSIGN_OR_RETURN(std::vector<int32_t> got, ToHost(*buf, 1 + members.size()));
          std::vector<int32_t> want = {0};
          for (int m : members) {
            want[0] += 10 * (m + 1);
            want.push_back(10 * (m + 1));
          }
          RM_RETURN_IF_ERROR(Check(got == want, absl::StrCat(MeshDimName(dim), " group of rank ",
                                                             rank)));
        }
        // The world goes on beside its groups.
        return world.Barrier(In(absl::Seconds(30)));
      }));
}

// ---- Failures: each survivor fails within its deadline, never hangs. ----

// A peer's process dies: the survivors' next operation fails (UNAVAILABLE under cudaemu,
// where the emulation notices the closed connection; on a GPU NCCL may only see the
// deadline) and the communicator stays broken.
TEST(NcclMultiRank, ADeadPeerFailsTheOthers) {
  SKIP_WITHOUT_GPUS(4);
  const auto results = RunNcclRanks(
      4,
      [](NcclCommunicator& comm, Store&, absl::Duration* elapsed) -> absl::Status {
        if (comm.rank() == 2) raise(SIGKILL);
        RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4000));
        const absl::Time start = absl::Now();
        absl::Status s = comm.AllReduce(buf->at(), buf->at(), 1000, DataType::kFloat32,
                                        ReduceOp::kSum, In(absl::Seconds(10)));
        *elapsed = absl::Now() - start;
        if (s.ok()) return absl::InternalError("all_reduce without rank 2 succeeded");
        RM_RETURN_IF_ERROR(Check(comm.GetAsyncError().code() == s.code(), "GetAsyncError"));
        return s;
      },
      {2});
  for (int r : {0, 1, 3}) {
    const absl::StatusCode code = results[r].status.code();
    if (kEmulated) {
      EXPECT_EQ(code, absl::StatusCode::kUnavailable) << r << ": " << results[r].status;
      EXPECT_LT(results[r].elapsed, absl::Seconds(5)) << r;
    } else {
      EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                  code == absl::StatusCode::kDeadlineExceeded)
          << r << ": " << results[r].status;
    }
  }
}

// A stopped peer looks like a slow one: DEADLINE_EXCEEDED at the deadline, not a hang.
TEST(NcclMultiRank, AStoppedPeerIsADeadline) {
  SKIP_WITHOUT_GPUS(2);
  const auto results =
      RunNcclRanks(2,
                   [](NcclCommunicator& comm, Store&, absl::Duration* elapsed) -> absl::Status {
                     if (comm.rank() == 1) raise(SIGSTOP);
                     RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4000));
                     const absl::Time start = absl::Now();
                     absl::Status s = comm.AllReduce(buf->at(), buf->at(), 1000, DataType::kFloat32,
                                                     ReduceOp::kSum, In(absl::Milliseconds(500)));
                     *elapsed = absl::Now() - start;
                     return s;
                   },
                   {1});
  EXPECT_EQ(results[0].status.code(), absl::StatusCode::kDeadlineExceeded) << results[0].status;
  EXPECT_GE(results[0].elapsed, absl::Milliseconds(500));
  EXPECT_LT(results[0].elapsed, absl::Seconds(5));
}

// Abort() from another thread ends an operation waiting for a peer; the peer, calling later,
// fails instead of waiting for a rank that has gone.
TEST(NcclMultiRank, AbortEndsAWaitingOperationAndThePeerNotices) {
  SKIP_WITHOUT_GPUS(2);
  const auto results =
      RunNcclRanks(2, [](NcclCommunicator& comm, Store&, absl::Duration* elapsed) -> absl::Status {
        RM_ASSIGN_OR_RETURN(auto buf, DeviceBuffer::Create(4000));
        const absl::Time start = absl::Now();
        if (comm.rank() == 0) {
          std::thread aborter([&] {
            absl::SleepFor(absl::Milliseconds(300));
            comm.Abort();
          });
          absl::Status s = comm.AllReduce(buf->at(), buf->at(), 1000, DataType::kFloat32,
                                          ReduceOp::kSum, In(absl::Seconds(60)));
          aborter.join();
          *elapsed = absl::Now() - start;
          return s;
        }
        absl::SleepFor(absl::Seconds(1));
        absl::Status s = comm.AllReduce(buf->at(), buf->at(), 1000, DataType::kFloat32,
                                        ReduceOp::kSum, In(absl::Seconds(5)));
        *elapsed = absl::Now() - start;
        return s;
      });
  EXPECT_EQ(results[0].status.code(), absl::StatusCode::kAborted) << results[0].status;
  EXPECT_LT(results[0].elapsed, absl::Seconds(5));
  if (kEmulated) {
    EXPECT_EQ(results[1].status.code(), absl::StatusCode::kUnavailable) << results[1].status;
  } else {
    EXPECT_FALSE(results[1].status.ok());
  }
}

}  // namespace
}  // namespace ringmaster::comm
