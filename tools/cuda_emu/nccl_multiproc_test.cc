// Tests of the emulated NCCL with N ranks in N forked processes (nccl.cc): every collective
// and point to point against a host reference computed from every rank's inputs, with
// 2 and 4 ranks; ncclCommSplit's groups; and what NCCL would hang on or report: a dead peer,
// ncclCommAbort under a waiting operation, ranks calling different operations, two ranks on
// one GPU, a unique id used twice. This process never touches CUDA (a forked child could not
// use it); each rank sees its own GPU through CUDA_VISIBLE_DEVICES.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tools/cuda_emu/nccl_reduce.h"

namespace {

using rm_emu::nccl::Bf16ToFloat;
using rm_emu::nccl::FloatToBf16;
using rm_emu::nccl::FloatToHalf;
using rm_emu::nccl::HalfToFloat;

template <typename... Args>
std::string Cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// In a rank: returns a failure text from the rank's function.
#define RANK_CHECK(cond)                                                       \
  if (!(cond)) {                                                               \
    return Cat(__FILE__, ":", __LINE__, ": rank ", rank, ": failed: ", #cond); \
  }
#define RANK_CHECK_NCCL(call)                                                            \
  if (const ncclResult_t res_ = (call); res_ != ncclSuccess) {                           \
    return Cat(__FILE__, ":", __LINE__, ": rank ", rank, ": ", #call, " = ", res_, " (", \
               ncclGetLastError(nullptr), ")");                                          \
  }

struct RankOptions {
  bool own_gpu = true;  // rank r sees GPU r; else every rank sees GPU 0
  std::chrono::seconds timeout{60};
};

// Runs fn(rank) in `n` forked processes; returns what each reported ("" = passed, or why
// not). A rank that dies or does not report in time says so.
std::vector<std::string> RunRanks(int n, const std::function<std::string(int)>& fn,
                                  RankOptions options = {}) {
  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int rank = 0; rank < n; ++rank) {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pids[rank] = fork();
    if (pids[rank] == 0) {
      close(p[0]);
      if (options.own_gpu) setenv("CUDA_VISIBLE_DEVICES", std::to_string(rank).c_str(), 1);
      const std::string result = fn(rank);
      (void)!write(p[1], result.data(), result.size());
      close(p[1]);
      _exit(0);
    }
    close(p[1]);
    fds[rank] = p[0];
  }
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  std::vector<std::string> results(n);
  for (int rank = 0; rank < n; ++rank) {
    std::string text;
    bool ended = false;
    while (!ended) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd = {fds[rank], POLLIN, 0};
      if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
        text = Cat("rank ", rank, " did not finish in time");
        break;
      }
      char buf[4096];
      const ssize_t r = read(fds[rank], buf, sizeof(buf));
      if (r <= 0) {
        ended = true;
      } else {
        text.append(buf, r);
      }
    }
    close(fds[rank]);
    int status = 0;
    if (!ended) kill(pids[rank], SIGKILL);
    waitpid(pids[rank], &status, 0);
    if (ended && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      text += Cat(" (rank ", rank, " ended abnormally, status ", status, ")");
    }
    results[rank] = text;
  }
  return results;
}

void ExpectAllPassed(const std::vector<std::string>& results) {
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

ncclUniqueId NewId() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

// ---- Element values, encoded per type, and the host reference. ----

struct Type {
  ncclDataType_t nccl;
  size_t bytes;
  bool floating;
  bool is_unsigned;
};

const Type kTypes[] = {
    {ncclFloat32, 4, true, false},  {ncclFloat64, 8, true, false}, {ncclFloat16, 2, true, false},
    {ncclBfloat16, 2, true, false}, {ncclInt32, 4, false, false},  {ncclInt64, 8, false, false},
    {ncclUint8, 1, false, true},    {ncclInt8, 1, false, false},   {ncclUint32, 4, false, true},
};

void Encode(const Type& t, double v, void* out) {
  switch (t.nccl) {
    case ncclFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      break;
    }
    case ncclFloat64:
      std::memcpy(out, &v, 8);
      break;
    case ncclFloat16: {
      const uint16_t h = FloatToHalf(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      break;
    }
    case ncclBfloat16: {
      const uint16_t b = FloatToBf16(static_cast<float>(v));
      std::memcpy(out, &b, 2);
      break;
    }
    case ncclInt32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(out, &i, 4);
      break;
    }
    case ncclUint32: {
      const uint32_t i = static_cast<uint32_t>(v);
      std::memcpy(out, &i, 4);
      break;
    }
    case ncclInt64: {
      const int64_t i = static_cast<int64_t>(v);
      std::memcpy(out, &i, 8);
      break;
    }
    case ncclInt8: {
      const int8_t i = static_cast<int8_t>(v);
      std::memcpy(out, &i, 1);
      break;
    }
    default: {
      const uint8_t i = static_cast<uint8_t>(v);
      std::memcpy(out, &i, 1);
      break;
    }
  }
}

double Decode(const Type& t, const void* in) {
  switch (t.nccl) {
    case ncclFloat32: {
      float f;
      std::memcpy(&f, in, 4);
      return f;
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, in, 8);
      return d;
    }
    case ncclFloat16: {
      uint16_t h;
      std::memcpy(&h, in, 2);
      return HalfToFloat(h);
    }
    case ncclBfloat16: {
      uint16_t b;
      std::memcpy(&b, in, 2);
      return Bf16ToFloat(b);
    }
    case ncclInt32: {
      int32_t i;
      std::memcpy(&i, in, 4);
      return i;
    }
    case ncclUint32: {
      uint32_t i;
      std::memcpy(&i, in, 4);
      return i;
    }
    case ncclInt64: {
      int64_t i;
      std::memcpy(&i, in, 8);
      return static_cast<double>(i);
    }
    case ncclInt8: {
      int8_t i;
      std::memcpy(&i, in, 1);
      return i;
    }
    default: {
      uint8_t i;
      std::memcpy(&i, in, 1);
      return i;
    }
  }
}

// Small integers, exact in every type, different per rank and element: -3..3, or 0..3 for
// unsigned types (a product of four stays below 128).
double Value(const Type& t, size_t i, int rank) {
  const size_t x = i * 7 + rank * 5;
  return t.is_unsigned ? static_cast<double>(x % 4) : static_cast<double>(x % 7) - 3;
}

std::vector<char> Inputs(const Type& t, size_t count, int rank) {
  std::vector<char> out(count * t.bytes);
  for (size_t i = 0; i < count; ++i) Encode(t, Value(t, i, rank), out.data() + i * t.bytes);
  return out;
}

// Element i of the reduction over `n` ranks' inputs at offset `first`.
double Reference(const Type& t, ncclRedOp_t op, int n, size_t i) {
  double acc = Value(t, i, 0);
  for (int r = 1; r < n; ++r) {
    const double x = Value(t, i, r);
    switch (op) {
      case ncclProd:
        acc *= x;
        break;
      case ncclMin:
        acc = std::min(acc, x);
        break;
      case ncclMax:
        acc = std::max(acc, x);
        break;
      default:
        acc += x;
    }
  }
  if (op == ncclAvg) acc = t.floating ? acc / n : std::trunc(acc / n);
  return acc;
}

// "" when `got` (count elements of t) equals want(i) for every i.
std::string Compare(const Type& t, const void* got, size_t count,
                    const std::function<double(size_t)>& want, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const double g = Decode(t, static_cast<const char*>(got) + i * t.bytes);
    if (g != want(i)) {
      return Cat(what, ": element ", i, " is ", g, ", want ", want(i));
    }
  }
  return "";
}

// A non-blocking communicator, polled until connected, as comm/nccl makes it.
ncclResult_t Connect(ncclComm_t* comm, int n, const ncclUniqueId& id, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(comm, n, id, rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) return res;
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(*comm, &state) != ncclSuccess) return ncclInternalError;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

// ncclCommSplit, polled until the new communicator is connected (the parent is
// non-blocking, and so is the child without a config).
ncclResult_t Split(ncclComm_t parent, int color, int key, ncclComm_t* comm) {
  ncclResult_t res = ncclCommSplit(parent, color, key, comm, nullptr);
  if (res != ncclSuccess && res != ncclInProgress) return res;
  ncclResult_t state = *comm == nullptr ? ncclSuccess : ncclInProgress;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(*comm, &state) != ncclSuccess) return ncclInternalError;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

// RunRanks, each rank given its communicator of a fresh id, connected; fn must destroy or
// abort it.
std::vector<std::string> RunConnected(int n,
                                      const std::function<std::string(int, ncclComm_t)>& fn) {
  const ncclUniqueId id = NewId();
  return RunRanks(n, [&](int rank) -> std::string {
    ncclComm_t comm = nullptr;
    RANK_CHECK_NCCL(Connect(&comm, n, id, rank));
    return fn(rank, comm);
  });
}

// Waits for `stream`, then returns the communicator's asynchronous state.
ncclResult_t Settle(ncclComm_t comm, cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return ncclUnhandledCudaError;
  ncclResult_t state = ncclInternalError;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
  return state;
}

// Every collective, type and op on `n` ranks, in place and not, on a stream.
std::string Collectives(int n, int rank, ncclComm_t comm) {
  cudaStream_t stream;
  RANK_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (const Type& t : kTypes) {
    for (size_t count : {size_t{1}, size_t{37}, size_t{70000}}) {
      const std::string what = Cat("type ", t.nccl, " count ", count);
      const std::vector<char> mine = Inputs(t, count, rank);
      std::vector<char> send, recv;
      for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg}) {
        for (bool in_place : {false, true}) {
          send = mine;
          recv.assign(count * t.bytes, 0x5a);
          void* out = in_place ? send.data() : recv.data();
          RANK_CHECK_NCCL(ncclAllReduce(send.data(), out, count, t.nccl, op, comm, stream));
          RANK_CHECK_NCCL(Settle(comm, stream));
          const std::string bad = Compare(
              t, out, count, [&](size_t i) { return Reference(t, op, n, i); },
              Cat("AllReduce op ", op, " ", what, in_place ? " in place" : ""));
          if (!bad.empty()) return bad;
        }
      }
      // AllGather: in place is this rank's block of recv.
      for (bool in_place : {false, true}) {
        recv.assign(n * count * t.bytes, 0x5a);
        if (in_place) std::memcpy(recv.data() + rank * count * t.bytes, mine.data(), mine.size());
        const void* in = in_place ? recv.data() + rank * count * t.bytes : mine.data();
        RANK_CHECK_NCCL(ncclAllGather(in, recv.data(), count, t.nccl, comm, stream));
        RANK_CHECK_NCCL(Settle(comm, stream));
        const std::string bad = Compare(
            t, recv.data(), n * count,
            [&](size_t i) { return Value(t, i % count, static_cast<int>(i / count)); },
            Cat("AllGather ", what));
        if (!bad.empty()) return bad;
      }
      // ReduceScatter of n blocks: block r of the sum is rank r's.
      // Block b holds the inputs shifted by b elements.
      std::vector<char> all(n * count * t.bytes);
      for (int b = 0; b < n; ++b) {
        for (size_t i = 0; i < count; ++i) {
          Encode(t, Value(t, i + b, rank), all.data() + (b * count + i) * t.bytes);
        }
      }
      for (bool in_place : {false, true}) {
        send = all;
        recv.assign(count * t.bytes, 0x5a);
        void* out = in_place ? send.data() + rank * count * t.bytes : recv.data();
        RANK_CHECK_NCCL(ncclReduceScatter(send.data(), out, count, t.nccl, ncclSum, comm, stream));
        RANK_CHECK_NCCL(Settle(comm, stream));
        const std::string bad = Compare(
            t, out, count, [&](size_t i) { return Reference(t, ncclSum, n, i + rank); },
            Cat("ReduceScatter ", what));
        if (!bad.empty()) return bad;
      }
      // Broadcast from the last rank.
      const int root = n - 1;
      for (bool in_place : {false, true}) {
        send = mine;
        recv.assign(count * t.bytes, 0x5a);
        void* out = in_place ? send.data() : recv.data();
        RANK_CHECK_NCCL(ncclBroadcast(send.data(), out, count, t.nccl, root, comm, stream));
        RANK_CHECK_NCCL(Settle(comm, stream));
        const std::string bad = Compare(
            t, out, count, [&](size_t i) { return Value(t, i, root); }, Cat("Broadcast ", what));
        if (!bad.empty()) return bad;
      }
    }
  }
  RANK_CHECK_NCCL(ncclCommFinalize(comm));
  RANK_CHECK_NCCL(ncclCommDestroy(comm));
  return "";
}

TEST(NcclEmuMultiProcess, CollectivesWithTwoRanksMatchTheReference) {
  ExpectAllPassed(
      RunConnected(2, [](int rank, ncclComm_t comm) { return Collectives(2, rank, comm); }));
}

TEST(NcclEmuMultiProcess, CollectivesWithFourRanksMatchTheReference) {
  ExpectAllPassed(
      RunConnected(4, [](int rank, ncclComm_t comm) { return Collectives(4, rank, comm); }));
}

// fp16 sums round to the type after each addition, in rank order: 2048 + 1 + 1 is 2048 in
// binary16 (2049 is not representable and ties to even), however a float sum would round.
TEST(NcclEmuMultiProcess, HalfSumsRoundAfterEveryAddition) {
  ExpectAllPassed(RunConnected(3, [&](int rank, ncclComm_t comm) -> std::string {
    uint16_t x = FloatToHalf(rank == 0 ? 2048.0f : 1.0f);
    RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat16, ncclSum, comm, nullptr));
    RANK_CHECK_NCCL(Settle(comm, nullptr));
    RANK_CHECK(HalfToFloat(x) == 2048.0f);
    RANK_CHECK_NCCL(ncclCommDestroy(comm));
    return "";
  }));
}

// A ring exchange in one group (each rank sends to the next and receives from the one
// before, which needs the group to progress), then plain pairs, and a send to self.
TEST(NcclEmuMultiProcess, SendAndRecv) {
  constexpr int kRanks = 4;
  ExpectAllPassed(RunConnected(kRanks, [&](int rank, ncclComm_t comm) -> std::string {
    const int next = (rank + 1) % kRanks, prev = (rank + kRanks - 1) % kRanks;
    std::vector<int64_t> out(1000, rank), in(1000, -1), self_in(3, -1), self_out(3, 40 + rank);
    RANK_CHECK_NCCL(ncclGroupStart());
    RANK_CHECK_NCCL(ncclSend(out.data(), out.size(), ncclInt64, next, comm, nullptr));
    RANK_CHECK_NCCL(ncclRecv(in.data(), in.size(), ncclInt64, prev, comm, nullptr));
    RANK_CHECK_NCCL(ncclSend(self_out.data(), 3, ncclInt64, rank, comm, nullptr));
    RANK_CHECK_NCCL(ncclRecv(self_in.data(), 3, ncclInt64, rank, comm, nullptr));
    RANK_CHECK_NCCL(ncclGroupEnd());
    RANK_CHECK_NCCL(Settle(comm, nullptr));
    RANK_CHECK(in == std::vector<int64_t>(1000, prev));
    RANK_CHECK(self_in == self_out);
    // Outside a group: even ranks send first, odd ones receive first.
    float value = static_cast<float>(rank), got = -1;
    const int partner = rank ^ 1;
    if (rank % 2 == 0) {
      RANK_CHECK_NCCL(ncclSend(&value, 1, ncclFloat32, partner, comm, nullptr));
      RANK_CHECK_NCCL(ncclRecv(&got, 1, ncclFloat32, partner, comm, nullptr));
    } else {
      RANK_CHECK_NCCL(ncclRecv(&got, 1, ncclFloat32, partner, comm, nullptr));
      RANK_CHECK_NCCL(ncclSend(&value, 1, ncclFloat32, partner, comm, nullptr));
    }
    RANK_CHECK_NCCL(Settle(comm, nullptr));
    RANK_CHECK(got == static_cast<float>(partner));
    RANK_CHECK_NCCL(ncclCommDestroy(comm));
    return "";
  }));
}

// As on a GPU, a send completes only when the peer receives (a buffering emulation would
// let it finish at once), and two ranks that both send first, which would hang on a GPU,
// are told so.
TEST(NcclEmuMultiProcess, SendWaitsForTheMatchingRecv) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t comm) -> std::string {
    cudaStream_t stream;
    RANK_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    int32_t x = rank, y = -1;
    if (rank == 0) {
      RANK_CHECK_NCCL(ncclSend(&x, 1, ncclInt32, 1, comm, stream));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      RANK_CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      RANK_CHECK_NCCL(ncclRecv(&y, 1, ncclInt32, 0, comm, stream));
    }
    RANK_CHECK_NCCL(Settle(comm, stream));
    RANK_CHECK(rank == 0 || y == 0);

    RANK_CHECK_NCCL(ncclSend(&x, 1, ncclInt32, 1 - rank, comm, stream));
    RANK_CHECK_NCCL(ncclRecv(&y, 1, ncclInt32, 1 - rank, comm, stream));
    RANK_CHECK(Settle(comm, stream) == ncclInvalidUsage);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("expected the acknowledgement of a Send") !=
               std::string::npos);
    RANK_CHECK_NCCL(ncclCommAbort(comm));
    return "";
  }));
}

// A group that sends and receives meets a peer that sends (a group of its own), computes,
// then receives: fine on a GPU (the peer's send completes against the group's receive, the
// group's send once the peer's later receive is posted). The emulation keeps the early data
// for that receive; the first send completes only then.
TEST(NcclEmuMultiProcess, DataThatComesBeforeItsRecvIsKeptForIt) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t comm) -> std::string {
    cudaStream_t stream;
    RANK_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    int32_t x = 10 + rank, y = -1;
    if (rank == 0) {
      RANK_CHECK_NCCL(ncclGroupStart());
      RANK_CHECK_NCCL(ncclSend(&x, 1, ncclInt32, 1, comm, stream));
      RANK_CHECK_NCCL(ncclRecv(&y, 1, ncclInt32, 1, comm, stream));
      RANK_CHECK_NCCL(ncclGroupEnd());
      RANK_CHECK_NCCL(Settle(comm, stream));
      RANK_CHECK(y == 11);
    } else {
      RANK_CHECK_NCCL(ncclSend(&x, 1, ncclInt32, 0, comm, stream));
      RANK_CHECK_NCCL(Settle(comm, stream));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // "computes"
      RANK_CHECK_NCCL(ncclRecv(&y, 1, ncclInt32, 0, comm, stream));
      RANK_CHECK_NCCL(Settle(comm, stream));
      RANK_CHECK(y == 10);
    }
    // Then the communicator goes on as usual.
    int32_t sum = rank;
    RANK_CHECK_NCCL(ncclAllReduce(&sum, &sum, 1, ncclInt32, ncclSum, comm, stream));
    RANK_CHECK_NCCL(Settle(comm, stream));
    RANK_CHECK(sum == 1);
    return "";
  }));
}

// ncclCommSplit: colors make groups, keys order them (ties by parent rank), NOCOLOR gets no
// communicator; the groups' collectives see only their members; a group splits again.
TEST(NcclEmuMultiProcess, SplitMakesGroupsOrderedByKey) {
  constexpr int kRanks = 4;
  ExpectAllPassed(RunConnected(kRanks, [&](int rank, ncclComm_t world) -> std::string {
    // Even and odd ranks, each group in reverse order of parent rank.
    ncclComm_t half = nullptr;
    RANK_CHECK_NCCL(Split(world, rank % 2, -rank, &half));
    RANK_CHECK(half != nullptr);
    int count = 0, me = -1;
    RANK_CHECK_NCCL(ncclCommCount(half, &count));
    RANK_CHECK_NCCL(ncclCommUserRank(half, &me));
    RANK_CHECK(count == 2);
    RANK_CHECK(me == (rank < 2 ? 1 : 0));
    int32_t sum = rank;
    RANK_CHECK_NCCL(ncclAllReduce(&sum, &sum, 1, ncclInt32, ncclSum, half, nullptr));
    int32_t gathered[2] = {-1, -1};
    RANK_CHECK_NCCL(ncclAllGather(&rank, gathered, 1, ncclInt32, half, nullptr));
    RANK_CHECK_NCCL(Settle(half, nullptr));
    RANK_CHECK(sum == (rank % 2 == 0 ? 0 + 2 : 1 + 3));
    RANK_CHECK(gathered[0] == rank % 2 + 2 && gathered[1] == rank % 2);
    // The world still works beside its groups.
    int32_t total = rank;
    RANK_CHECK_NCCL(ncclAllReduce(&total, &total, 1, ncclInt32, ncclSum, world, nullptr));
    RANK_CHECK_NCCL(Settle(world, nullptr));
    RANK_CHECK(total == 6);
    // Rank 3 stays out; the same key everywhere orders by parent rank.
    ncclComm_t three = nullptr;
    RANK_CHECK_NCCL(Split(world, rank == 3 ? NCCL_SPLIT_NOCOLOR : 7, 0, &three));
    if (rank == 3) {
      RANK_CHECK(three == nullptr);
    } else {
      RANK_CHECK_NCCL(ncclCommUserRank(three, &me));
      RANK_CHECK(me == rank);
      int32_t x = 1;
      RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, three, nullptr));
      RANK_CHECK_NCCL(Settle(three, nullptr));
      RANK_CHECK(x == 3);
      // A group of a group: its own rank alone, blocking.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      ncclComm_t alone = nullptr;
      RANK_CHECK_NCCL(ncclCommSplit(three, me, 0, &alone, &config));
      RANK_CHECK_NCCL(ncclCommCount(alone, &count));
      RANK_CHECK(count == 1);
      RANK_CHECK_NCCL(ncclCommDestroy(alone));
      RANK_CHECK_NCCL(ncclCommDestroy(three));
    }
    // Groups outlive their parent.
    RANK_CHECK_NCCL(ncclCommDestroy(world));
    RANK_CHECK_NCCL(ncclBroadcast(&rank, &sum, 1, ncclInt32, 0, half, nullptr));
    RANK_CHECK_NCCL(Settle(half, nullptr));
    RANK_CHECK(sum == rank % 2 + 2);
    RANK_CHECK_NCCL(ncclCommDestroy(half));
    return "";
  }));
}

// A non-blocking split returns at once and stays in progress while a rank has not called
// it; aborting the new communicator ends the wait (and breaks the parent, whose exchange
// was cut short).
TEST(NcclEmuMultiProcess, AnAbortedSplitStopsWaiting) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t world) -> std::string {
    if (rank == 0) {
      ncclComm_t half = nullptr;
      RANK_CHECK(ncclCommSplit(world, 0, 0, &half, nullptr) == ncclInProgress);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ncclResult_t state = ncclSuccess;
      RANK_CHECK_NCCL(ncclCommGetAsyncError(half, &state));
      RANK_CHECK(state == ncclInProgress);
      int count = 0;
      RANK_CHECK(ncclCommCount(half, &count) == ncclInvalidUsage);
      const auto start = std::chrono::steady_clock::now();
      RANK_CHECK_NCCL(ncclCommAbort(half));
      RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
      RANK_CHECK_NCCL(ncclCommGetAsyncError(world, &state));
      RANK_CHECK(state == ncclInternalError);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    RANK_CHECK_NCCL(ncclCommAbort(world));
    return "";
  }));
}

// A peer whose process dies is noticed: the survivor's operation fails with an asynchronous
// ncclRemoteError, not a hang.
TEST(NcclEmuMultiProcess, ADeadPeerIsARemoteError) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t comm) -> std::string {
    if (rank == 1) _exit(0);  // dies with the communicator open
    float x = 1;
    RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr));
    RANK_CHECK(Settle(comm, nullptr) == ncclRemoteError);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("rank 1 closed") != std::string::npos);
    // Broken: further calls say so.
    RANK_CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr) == ncclRemoteError);
    RANK_CHECK_NCCL(ncclCommAbort(comm));
    return "";
  }));
}

// ncclCommAbort from another thread ends an operation waiting for a peer that never calls,
// and that peer's own abort breaks nothing else; the survivor sees the aborted peer go.
TEST(NcclEmuMultiProcess, AbortEndsAWaitingOperation) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t comm) -> std::string {
    cudaStream_t stream;
    RANK_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    float x = 1;
    if (rank == 0) {
      RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, stream));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      RANK_CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);  // waits for rank 1
      const auto start = std::chrono::steady_clock::now();
      std::thread aborter([&] { ncclCommAbort(comm); });
      aborter.join();
      RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
      RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    } else {
      // Rank 1 calls the same operation after rank 0 has aborted: its peer is gone.
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, stream));
      RANK_CHECK(Settle(comm, stream) == ncclRemoteError);
      RANK_CHECK_NCCL(ncclCommAbort(comm));
    }
    return "";
  }));
}

// Ranks calling different operations: on a GPU a hang or garbage; here an asynchronous
// ncclInvalidUsage naming both.
TEST(NcclEmuMultiProcess, DifferentOperationsAreReported) {
  ExpectAllPassed(RunConnected(2, [&](int rank, ncclComm_t comm) -> std::string {
    float x[4] = {1, 2, 3, 4};
    if (rank == 0) {
      RANK_CHECK_NCCL(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, comm, nullptr));
    } else {
      RANK_CHECK_NCCL(ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, nullptr));
    }
    RANK_CHECK(Settle(comm, nullptr) == ncclInvalidUsage);
    const std::string why = ncclGetLastError(comm);
    RANK_CHECK(why.find("AllReduce of 2 elements") != std::string::npos);
    RANK_CHECK(why.find("AllReduce of 3 elements") != std::string::npos);
    RANK_CHECK_NCCL(ncclCommAbort(comm));
    return "";
  }));
}

// Initialization: a missing rank keeps a non-blocking init in progress until aborted; two
// ranks on one GPU and an id used for a second communicator are refused; ranks disagreeing
// about nranks are told.
TEST(NcclEmuMultiProcess, InitWaitsForEveryRankAndChecksThem) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(1, [&](int rank) -> std::string {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    RANK_CHECK(ncclCommInitRankConfig(&comm, 2, id, 0, &config) == ncclInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ncclResult_t state = ncclSuccess;
    RANK_CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
    RANK_CHECK(state == ncclInProgress);
    RANK_CHECK(ncclAllReduce(&state, &state, 1, ncclInt32, ncclSum, comm, nullptr) ==
               ncclInvalidUsage);
    RANK_CHECK_NCCL(ncclCommAbort(comm));
    return "";
  }));

  const ncclUniqueId shared = NewId();
  RankOptions one_gpu;
  one_gpu.own_gpu = false;
  ExpectAllPassed(RunRanks(
      2,
      [&](int rank) -> std::string {
        ncclComm_t comm = nullptr;
        RANK_CHECK(Connect(&comm, 2, shared, rank) == ncclInvalidUsage);
        RANK_CHECK(std::string(ncclGetLastError(comm)).find("same GPU") != std::string::npos);
        RANK_CHECK_NCCL(ncclCommAbort(comm));
        return "";
      },
      one_gpu));

  const ncclUniqueId twice = NewId();
  ExpectAllPassed(RunRanks(2, [&](int rank) -> std::string {
    ncclComm_t comm = nullptr;
    RANK_CHECK_NCCL(ncclCommInitRank(&comm, 2, twice, rank));
    // Both ranks are connected; the same id again is in use.
    ncclComm_t again = nullptr;
    if (rank == 0) {
      RANK_CHECK(ncclCommInitRank(&again, 2, twice, 0) == ncclInvalidUsage);
      RANK_CHECK(again == nullptr);
    }
    int32_t x = 0;
    RANK_CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr));
    RANK_CHECK_NCCL(Settle(comm, nullptr));
    RANK_CHECK_NCCL(ncclCommDestroy(comm));
    return "";
  }));

  const ncclUniqueId sizes = NewId();
  ExpectAllPassed(RunRanks(2, [&](int rank) -> std::string {
    ncclComm_t comm = nullptr;
    // Rank 1 thinks there are three ranks.
    const ncclResult_t res = Connect(&comm, 2 + rank, sizes, rank);
    RANK_CHECK(res == ncclInvalidUsage);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("nranks") != std::string::npos);
    RANK_CHECK_NCCL(ncclCommAbort(comm));
    return "";
  }));
}

}  // namespace
