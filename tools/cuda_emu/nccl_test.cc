// Tests of the NCCL emulation with one rank (nccl_multiproc_test.cc has N): the call sequence
// of comm/nccl/nccl_communicator.cc (unique id, non-blocking init polled with
// ncclCommGetAsyncError, collectives, finalize, destroy), the collectives as copies, and the
// rejection of what NCCL leaves undefined. Device memory is host memory in the emulation.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

ncclUniqueId NewId() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

// A one-rank communicator made as nccl_communicator.cc makes it: non-blocking, polled.
ncclComm_t NonBlockingComm() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t res = ncclCommInitRankConfig(&comm, 1, NewId(), 0, &config);
  EXPECT_TRUE(res == ncclSuccess || res == ncclInProgress) << res;
  ncclResult_t state = ncclInProgress;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  return comm;
}

TEST(NcclEmuTest, NonBlockingLifecycle) {
  ncclComm_t comm = NonBlockingComm();
  ASSERT_NE(comm, nullptr);
  const ncclResult_t res = ncclCommFinalize(comm);
  EXPECT_TRUE(res == ncclSuccess || res == ncclInProgress) << res;
  ncclResult_t state = ncclInProgress;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  // Finalized: no more collectives.
  int32_t x = 1;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclEmuTest, BlockingInitAndAbort) {
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, NewId(), 0, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  // Destroyed and aborted communicators are gone: using one is reported, not undefined.
  ncclResult_t state;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
}

// A send to self completes with its receive in one group; alone it is refused (on a GPU it
// would never complete).
TEST(NcclEmuTest, SendToSelfNeedsAGroup) {
  ncclComm_t comm = NonBlockingComm();
  std::vector<int32_t> out = {1, 2, 3}, in(3, 0);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclRecv(in.data(), 3, ncclInt32, 0, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclSend(out.data(), 3, ncclInt32, 0, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  cudaDeviceSynchronize();  // the group runs on the stream
  EXPECT_EQ(in, out);
  // A receive without its send in the group.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclRecv(in.data(), 3, ncclInt32, 0, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group open
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclEmuTest, BadArgumentsAtInit) {
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, NewId(), 1, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 0, NewId(), 0, nullptr), ncclInvalidArgument);
  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));  // never made by ncclGetUniqueId
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, zero, 0, nullptr), ncclInvalidArgument);
  ncclConfig_t raw = {};  // not NCCL_CONFIG_INITIALIZER
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, NewId(), 0, &raw), ncclInvalidArgument);
}

TEST(NcclEmuTest, CollectivesCopyAtOneRank) {
  ncclComm_t comm = NonBlockingComm();
  std::vector<float> send(37), recv(37, -1.0f);
  std::iota(send.begin(), send.end(), 0.5f);
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg}) {
    std::fill(recv.begin(), recv.end(), -1.0f);
    ASSERT_EQ(ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat32, op, comm, nullptr),
              ncclSuccess);
    cudaDeviceSynchronize();  // the collective runs on the stream
    EXPECT_EQ(recv, send) << "op " << op;
  }
  std::fill(recv.begin(), recv.end(), -1.0f);
  ASSERT_EQ(ncclBroadcast(send.data(), recv.data(), send.size(), ncclFloat32, 0, comm, nullptr),
            ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), -1.0f);
  ASSERT_EQ(ncclAllGather(send.data(), recv.data(), send.size(), ncclFloat32, comm, nullptr),
            ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), -1.0f);
  ASSERT_EQ(
      ncclReduceScatter(send.data(), recv.data(), send.size(), ncclFloat32, ncclSum, comm, nullptr),
      ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(recv, send);

  // count is in elements of the datatype: 9 int64s are 72 bytes, the rest untouched.
  std::vector<int64_t> s64(10, 7), r64(10, 0);
  ASSERT_EQ(ncclAllReduce(s64.data(), r64.data(), 9, ncclInt64, ncclSum, comm, nullptr),
            ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(r64[8], 7);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(r64[9], 0);
  std::vector<uint16_t> s16(5, 0x3f80), r16(6, 0);
  ASSERT_EQ(ncclAllGather(s16.data(), r16.data(), 5, ncclBfloat16, comm, nullptr), ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(r16[4], 0x3f80);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(r16[5], 0);

  // In place, and the barrier of nccl_communicator.cc.
  int32_t barrier = 0;
  ASSERT_EQ(ncclAllReduce(&barrier, &barrier, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(barrier, 0);
  ASSERT_EQ(
      ncclAllReduce(recv.data(), recv.data(), recv.size(), ncclFloat32, ncclAvg, comm, nullptr),
      ncclSuccess);
  cudaDeviceSynchronize();  // the collective runs on the stream
  EXPECT_EQ(recv, send);
  // count 0 needs no buffers.
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclEmuTest, CollectiveMisuseIsRejected) {
  ncclComm_t comm = NonBlockingComm();
  std::vector<float> buf(16);
  // Partly overlapping buffers.
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data() + 1, 8, ncclFloat32, ncclSum, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, buf.data(), 8, ncclFloat32, ncclSum, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 8, ncclNumTypes, ncclSum, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 8, ncclFloat32, ncclNumOps, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buf.data(), buf.data(), 8, ncclFloat32, 1, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 8, ncclFloat32, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  // Point to point at one rank: the only peer is self, which needs a group.
  EXPECT_EQ(ncclSend(buf.data(), 8, ncclFloat32, 1, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf.data(), 8, ncclFloat32, 0, comm, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclRecv(buf.data(), 8, ncclFloat32, 0, comm, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclEmuTest, ErrorStrings) {
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidUsage)), "");
  EXPECT_NE(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))), "");
}

}  // namespace
