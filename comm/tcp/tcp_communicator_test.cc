// Correctness of every operation x dtype x size, on 1-8 forked ranks over loopback. Each
// rank computes the expected result itself, in double precision, from every rank's
// input (which is a deterministic function of rank and index): an oracle that shares no
// code with the backend's reductions.
#include "comm/tcp/tcp_communicator.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/testing/multiproc.h"
#include "comm/testing/reference.h"
#include "gtest/gtest.h"
#include "kernels/half.h"

namespace ringmaster::comm {
namespace {

using testing::MultiProcOptions;
using testing::RankResult;
using testing::RunRanks;

// A buffer of `type` elements read and written as doubles.
class Buffer {
 public:
  Buffer(DataType type, size_t count) : type_(type), bytes_(count * DataTypeSize(type) + 1) {}
  void* data() { return bytes_.data(); }
  double Get(size_t i) const {
    const char* p = bytes_.data() + i * DataTypeSize(type_);
    switch (type_) {
      case DataType::kFloat32: {
        float v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case DataType::kFloat64: {
        double v;
        std::memcpy(&v, p, 8);
        return v;
      }
      case DataType::kInt32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case DataType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        return static_cast<double>(v);
      }
      case DataType::kUint8:
        return static_cast<uint8_t>(*p);
      case DataType::kBFloat16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return kernels::BFloat16ToFloat(v);
      }
      case DataType::kFloat16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return kernels::Float16ToFloat(v);
      }
    }
    return 0;
  }
  void Set(size_t i, double x) {
    char* p = bytes_.data() + i * DataTypeSize(type_);
    switch (type_) {
      case DataType::kFloat32: {
        float v = static_cast<float>(x);
        std::memcpy(p, &v, 4);
        return;
      }
      case DataType::kFloat64:
        std::memcpy(p, &x, 8);
        return;
      case DataType::kInt32: {
        int32_t v = static_cast<int32_t>(x);
        std::memcpy(p, &v, 4);
        return;
      }
      case DataType::kInt64: {
        int64_t v = static_cast<int64_t>(x);
        std::memcpy(p, &v, 8);
        return;
      }
      case DataType::kUint8:
        *p = static_cast<char>(static_cast<uint8_t>(static_cast<int64_t>(x) & 0xff));
        return;
      case DataType::kBFloat16: {
        uint16_t v = kernels::FloatToBFloat16(static_cast<float>(x));
        std::memcpy(p, &v, 2);
        return;
      }
      case DataType::kFloat16: {
        uint16_t v = kernels::FloatToFloat16(static_cast<float>(x));
        std::memcpy(p, &v, 2);
        return;
      }
    }
  }

 private:
  DataType type_;
  std::vector<char> bytes_;
};

// Small integers (exact in every type, sums of 8 ranks exact even in bf16). Products use
// factors whose products stay exact (powers of two, signs).
double Input(int rank, size_t i, ReduceOp op, DataType type) {
  if (op == ReduceOp::kProd) {
    int v = static_cast<int>((rank + i) % 3);
    if (type == DataType::kUint8) return v == 0 ? 1 : v == 1 ? 2 : 3;
    return v == 0 ? 1 : v == 1 ? 2 : -1;
  }
  int v = static_cast<int>((rank * 7 + i * 13) % 10);
  return type == DataType::kUint8 ? v : v - 4;
}

double Expected(int world, size_t i, ReduceOp op, DataType type) {
  double acc = Input(0, i, op, type);
  int64_t iacc = static_cast<int64_t>(acc);
  for (int r = 1; r < world; ++r) {
    double x = Input(r, i, op, type);
    acc = testing::ReduceStep(op, acc, x);
    if (op == ReduceOp::kProd) iacc *= static_cast<int64_t>(x);
  }
  if (type == DataType::kUint8 && op == ReduceOp::kProd) return static_cast<double>(iacc & 0xff);
  if (op == ReduceOp::kAvg) {
    if (IsFloatingPoint(type)) return acc / world;
    return std::trunc(acc / world);
  }
  return acc;
}

bool Close(double got, double want, DataType type, ReduceOp op) {
  if (op != ReduceOp::kAvg || !IsFloatingPoint(type)) return got == want;
  double tol = (type == DataType::kFloat16 || type == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

std::string What(absl::string_view op, DataType type, size_t count, absl::string_view extra) {
  return absl::StrCat(op, " ", DataTypeName(type), " count ", count, " ", extra);
}

absl::Status CheckAllReduce(TcpCommunicator& comm, DataType type, ReduceOp op, size_t count,
                            TcpCommunicator::AllReduceAlgorithm algo, bool in_place,
                            absl::Time deadline) {
  const int n = comm.size(), r = comm.rank();
  Buffer in(type, count), out(type, count);
  for (size_t i = 0; i < count; ++i) in.Set(i, Input(r, i, op, type));
  Buffer& dst = in_place ? in : out;
  absl::Status s = comm.AllReduceWith(algo, in.data(), dst.data(), count, type, op, deadline);
  std::string what = What("AllReduce", type, count,
                          absl::StrCat(ReduceOpName(op), in_place ? " in place" : "", " algorithm ",
                                       static_cast<int>(algo)));
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  for (size_t i = 0; i < count; ++i) {
    double want = Expected(n, i, op, type);
    if (!Close(dst.Get(i), want, type, op)) {
      return absl::InternalError(absl::StrCat(what, ": element ", i, " is ", dst.Get(i),
                                              ", expected ", want, " (rank ", r, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(TcpCommunicator& comm, DataType type, ReduceOp op, size_t count,
                                bool in_place, absl::Time deadline) {
  const int n = comm.size(), r = comm.rank();
  Buffer in(type, count * n), out(type, count);
  for (size_t i = 0; i < count * n; ++i) in.Set(i, Input(r, i, op, type));
  Buffer* dst = &out;
  void* dst_ptr = out.data();
  if (in_place) dst_ptr = static_cast<char*>(in.data()) + r * count * DataTypeSize(type);
  absl::Status s = comm.ReduceScatter(in.data(), dst_ptr, count, type, op, deadline);
  std::string what = What("ReduceScatter", type, count,
                          absl::StrCat(ReduceOpName(op), in_place ? " in place" : ""));
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  for (size_t i = 0; i < count; ++i) {
    double want = Expected(n, r * count + i, op, type);
    double got = in_place ? in.Get(r * count + i) : dst->Get(i);
    if (!Close(got, want, type, op)) {
      return absl::InternalError(
          absl::StrCat(what, ": element ", i, " is ", got, ", expected ", want, " (rank ", r, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllGather(TcpCommunicator& comm, DataType type, size_t count, bool in_place,
                            absl::Time deadline) {
  const int n = comm.size(), r = comm.rank();
  Buffer in(type, count), out(type, count * n);
  for (size_t i = 0; i < count; ++i) in.Set(i, Input(r, i, ReduceOp::kSum, type));
  const void* src = in.data();
  if (in_place) {
    for (size_t i = 0; i < count; ++i) out.Set(r * count + i, Input(r, i, ReduceOp::kSum, type));
    src = static_cast<char*>(out.data()) + r * count * DataTypeSize(type);
  }
  absl::Status s = comm.AllGather(src, out.data(), count, type, deadline);
  std::string what = What("AllGather", type, count, in_place ? "in place" : "");
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < count; ++i) {
      Buffer one(type, 1);
      one.Set(0, Input(p, i, ReduceOp::kSum, type));
      if (out.Get(p * count + i) != one.Get(0)) {
        return absl::InternalError(absl::StrCat(what, ": block of rank ", p, " element ", i, " is ",
                                                out.Get(p * count + i), ", expected ", one.Get(0),
                                                " (rank ", r, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(TcpCommunicator& comm, DataType type, size_t count, int root,
                            bool in_place, absl::Time deadline) {
  const int r = comm.rank();
  Buffer in(type, count), out(type, count);
  for (size_t i = 0; i < count; ++i) {
    in.Set(i, r == root ? Input(root, i, ReduceOp::kSum, type) : 99);
    out.Set(i, 77);
  }
  Buffer& dst = in_place ? in : out;
  absl::Status s =
      comm.Broadcast(r == root ? in.data() : nullptr, dst.data(), count, type, root, deadline);
  std::string what =
      What("Broadcast", type, count, absl::StrCat("root ", root, in_place ? " in place" : ""));
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  for (size_t i = 0; i < count; ++i) {
    Buffer one(type, 1);
    one.Set(0, Input(root, i, ReduceOp::kSum, type));
    if (dst.Get(i) != one.Get(0)) {
      return absl::InternalError(absl::StrCat(what, ": element ", i, " is ", dst.Get(i),
                                              ", expected ", one.Get(0), " (rank ", r, ")"));
    }
  }
  return absl::OkStatus();
}

// Counts including the edge cases: 0, fewer elements than ranks, not divisible by the
// world size, and sizes on both sides of the small-message threshold.
std::vector<size_t> Counts(int n) {
  return {0,     1,     static_cast<size_t>(n > 1 ? n - 1 : 2), static_cast<size_t>(n + 1), 1000,
          40003, 150001};
}

absl::Status RunMatrix(TcpCommunicator& comm) {
  const int n = comm.size();
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  using Algo = TcpCommunicator::AllReduceAlgorithm;
  int variant = 0;
  for (DataType type : kAllDataTypes) {
    for (size_t count : Counts(n)) {
      bool in_place = (variant++ % 2) == 1;
      for (ReduceOp op : kAllReduceOps) {
        for (Algo algo : {Algo::kRing, Algo::kRecursiveDoubling}) {
          if (algo == Algo::kRecursiveDoubling && count > 40003) continue;
          absl::Status s = CheckAllReduce(comm, type, op, count, algo, in_place, deadline);
          if (!s.ok()) return s;
        }
        if (count <= 40003) {
          absl::Status s = CheckReduceScatter(comm, type, op, count, in_place, deadline);
          if (!s.ok()) return s;
        }
      }
      if (count <= 40003) {
        absl::Status s = CheckAllGather(comm, type, count, in_place, deadline);
        if (!s.ok()) return s;
      }
      for (int root : {0, n - 1}) {
        absl::Status s = CheckBroadcast(comm, type, count, root, in_place, deadline);
        if (!s.ok()) return s;
      }
    }
  }
  return comm.Barrier(deadline);
}

// Both transports: shared-memory rings between local ranks (the default) and TCP alone.
enum class Transport { kSharedMemory, kTcp };

std::string TransportName(Transport t) { return t == Transport::kTcp ? "tcp" : "shm"; }

MultiProcOptions OptionsFor(int world_size, Transport transport) {
  MultiProcOptions options;
  options.world_size = world_size;
  options.comm.shared_memory = transport == Transport::kSharedMemory;
  // Small rings, so that large messages wrap around them many times.
  options.comm.shm_ring_bytes = 64 * 1024;
  return options;
}

// Fails unless the communicator uses the transport the test asked for.
absl::Status CheckTransport(const TcpCommunicator& comm, Transport transport) {
  const int expected = transport == Transport::kTcp ? 0 : comm.size() - 1;
  if (comm.shared_memory_peers() != expected) {
    return absl::InternalError(absl::StrCat("rank ", comm.rank(), " reaches ",
                                            comm.shared_memory_peers(),
                                            " peers through shared memory, expected ", expected));
  }
  return absl::OkStatus();
}

class EveryOperation : public ::testing::TestWithParam<std::tuple<int, Transport>> {};

TEST_P(EveryOperation, MatchesIndependentReference) {
  const auto [world_size, transport] = GetParam();
  MultiProcOptions options = OptionsFor(world_size, transport);
  options.timeout = absl::Minutes(8);
  auto results = RunRanks(
      options, [transport = transport](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        absl::Status s = CheckTransport(comm, transport);
        if (!s.ok()) return s;
        return RunMatrix(comm);
      });
  for (int r = 0; r < world_size; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EveryOperation,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(Transport::kSharedMemory,
                                                              Transport::kTcp)),
                         [](const auto& info) {
                           return absl::StrCat("world", std::get<0>(info.param), "_",
                                               TransportName(std::get<1>(info.param)));
                         });

TEST(TcpCommunicator, SendRecvAndBarrier) {
  MultiProcOptions options;
  options.world_size = 3;
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const int r = comm.rank(), n = comm.size();
    // A token passed around the ring twice, growing at each hop.
    std::vector<int64_t> token(1000);
    for (int lap = 0; lap < 2; ++lap) {
      if (r != 0 || lap > 0) {
        absl::Status s =
            comm.Recv(token.data(), token.size(), DataType::kInt64, (r + n - 1) % n, deadline);
        if (!s.ok()) return s;
      }
      for (auto& t : token) t += r + 1;
      absl::Status s =
          comm.Send(token.data(), token.size(), DataType::kInt64, (r + 1) % n, deadline);
      if (!s.ok()) return s;
    }
    if (r == 0) {
      absl::Status s = comm.Recv(token.data(), token.size(), DataType::kInt64, n - 1, deadline);
      if (!s.ok()) return s;
      if (token[999] != 2 * (1 + 2 + 3)) {
        return absl::InternalError(absl::StrCat("token is ", token[999], ", expected 12"));
      }
    }
    for (int i = 0; i < 5; ++i) {
      absl::Status s = comm.Barrier(deadline);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
}

class RingBytes : public ::testing::TestWithParam<Transport> {};

TEST_P(RingBytes, RingAllReduceSendsTwoNMinusOneOverNOfTheBuffer) {
  for (int n : {2, 3, 4, 5}) {
    MultiProcOptions options = OptionsFor(n, GetParam());
    auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
      const int n = comm.size();
      const size_t count = (1 << 20) + 3;  // 4 MiB + 12 bytes of f32: chunks differ by one
      std::vector<float> buf(count, 1.0f);
      Counters before = comm.counters();
      absl::Status s = comm.AllReduceWith(TcpCommunicator::AllReduceAlgorithm::kRing, buf.data(),
                                          buf.data(), count, DataType::kFloat32, ReduceOp::kSum,
                                          absl::Now() + absl::Seconds(60));
      if (!s.ok()) return s;
      const Counters after = comm.counters();
      const OpCounters& c = after.of(OpKind::kAllReduce);
      double sent = static_cast<double>(c.bytes_sent - before.of(OpKind::kAllReduce).bytes_sent);
      double received = static_cast<double>(c.bytes_received);
      double ideal = 2.0 * (n - 1) / n * count * 4;
      // Chunk rounding: chunks differ by at most one element, two chunks are skipped.
      if (std::fabs(sent - ideal) > 2 * 4 || std::fabs(received - ideal) > 2 * 4) {
        return absl::InternalError(
            absl::StrCat("sent ", sent, " received ", received, " bytes, expected ", ideal));
      }
      if (c.calls != 1 || c.errors != 0 || c.time <= absl::ZeroDuration()) {
        return absl::InternalError("counters did not record the call");
      }
      if (buf[count - 1] != static_cast<float>(n)) return absl::InternalError("wrong sum");
      return absl::OkStatus();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(results[r].status.ok())
          << "world " << n << " rank " << r << ": " << results[r].status;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, RingBytes,
                         ::testing::Values(Transport::kSharedMemory, Transport::kTcp),
                         [](const auto& info) { return TransportName(info.param); });

// Exercise 35.2: the bytes each rank measurably sends, against the formulas of the
// algorithm that ran (tcp_communicator.h), summed over the ranks with an all-reduce.
// Tolerance: none where the buffer splits into N equal chunks (and for all-gather,
// reduce-scatter and broadcast, whose blocks are whole); for a ring all-reduce of a count N
// does not divide, one rank sends two chunks' worth less than 2B, chunks that differ by an
// element, so a rank is within two elements of 2(N-1)/N x B and the ranks' sum is exact.
class FormulaBytes : public ::testing::TestWithParam<std::tuple<int, Transport>> {};

// The change of `kind`'s counters across fn(), as (measured, formula, payload).
template <typename Fn>
absl::StatusOr<std::array<uint64_t, 3>> Sent(TcpCommunicator& comm, OpKind kind, Fn fn) {
  const OpCounters before = comm.counters().of(kind);
  absl::Status s = fn();
  if (!s.ok()) return s;
  const OpCounters after = comm.counters().of(kind);
  return std::array<uint64_t, 3>{after.bytes_sent - before.bytes_sent,
                                 after.formula_bytes_sent - before.formula_bytes_sent,
                                 after.payload_bytes - before.payload_bytes};
}

// The sum over the ranks of `mine`.
absl::StatusOr<int64_t> SumOverRanks(TcpCommunicator& comm, uint64_t mine) {
  int64_t v = static_cast<int64_t>(mine);
  absl::Status s =
      comm.AllReduce(&v, &v, 1, DataType::kInt64, ReduceOp::kSum, absl::Now() + absl::Seconds(30));
  if (!s.ok()) return s;
  return v;
}

absl::Status CheckFormulas(TcpCommunicator& comm) {
  const int n = comm.size(), r = comm.rank();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto fail = [&](absl::string_view what, const std::array<uint64_t, 3>& got, double expected) {
    return absl::InternalError(absl::StrCat(what, " on rank ", r, " of ", n, ": measured ", got[0],
                                            " bytes, formula ", got[1], ", payload ", got[2],
                                            ", expected ", expected));
  };
  // Ring all-reduce: a count n divides (1 MiB of f32 per rank) and one it does not.
  const size_t big = static_cast<size_t>(n) << 18;
  for (size_t count : {big, big + 1}) {
    std::vector<float> buf(count, 1.0f);
    const double payload = 4.0 * count, ideal = 2.0 * (n - 1) / n * payload;
    auto got = Sent(comm, OpKind::kAllReduce, [&] {
      return comm.AllReduceWith(TcpCommunicator::AllReduceAlgorithm::kRing, buf.data(), buf.data(),
                                count, DataType::kFloat32, ReduceOp::kSum, deadline);
    });
    if (!got.ok()) return got.status();
    const auto& g = *got;
    const bool divides = count % n == 0;
    if (g[2] != payload || g[1] != std::floor(ideal)) return fail("ring formula", g, ideal);
    if (divides ? g[0] != ideal : std::fabs(g[0] - ideal) >= 2 * 4) {
      return fail("ring all-reduce", g, ideal);
    }
    auto total = SumOverRanks(comm, g[0]);
    if (!total.ok()) return total.status();
    if (*total != 2 * (n - 1) * payload) return fail("ring all-reduce, all ranks", g, ideal * n);
  }
  // Recursive doubling (the default for small buffers): log2(N) x B per rank at a power of
  // two; otherwise 2(N - 2^k) folded ranks, even ones B, odd ones (k + 1) x B.
  {
    const size_t count = 1000;
    std::vector<float> buf(count, 1.0f);
    auto got = Sent(comm, OpKind::kAllReduce, [&] {
      return comm.AllReduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum,
                            deadline);
    });
    if (!got.ok()) return got.status();
    const int k = n >= 4 ? 2 : 1, folded = 2 * (n - (1 << k));
    const double b = 4.0 * count;
    const double expected = r >= folded ? k * b : r % 2 == 0 ? b : (k + 1) * b;
    if ((*got)[0] != expected || (*got)[1] != expected) {
      return fail("recursive doubling all-reduce", *got, expected);
    }
  }
  // All-gather and reduce-scatter, ring (large) and, at powers of two, recursive doubling
  // (small): (N-1)/N of the whole buffer, N x count elements.
  for (size_t count : {size_t{1}, size_t{1001}, size_t{(1 << 18) + 3}}) {
    std::vector<float> whole(count * n, 1.0f), part(count, 1.0f);
    const double payload = 4.0 * count * n, ideal = (n - 1) * 4.0 * count;
    auto got = Sent(comm, OpKind::kAllGather, [&] {
      return comm.AllGather(part.data(), whole.data(), count, DataType::kFloat32, deadline);
    });
    if (!got.ok()) return got.status();
    if ((*got)[0] != ideal || (*got)[1] != ideal || (*got)[2] != payload) {
      return fail(absl::StrCat("all-gather of ", count), *got, ideal);
    }
    got = Sent(comm, OpKind::kReduceScatter, [&] {
      return comm.ReduceScatter(whole.data(), part.data(), count, DataType::kFloat32,
                                ReduceOp::kSum, deadline);
    });
    if (!got.ok()) return got.status();
    if ((*got)[0] != ideal || (*got)[1] != ideal || (*got)[2] != payload) {
      return fail(absl::StrCat("reduce-scatter of ", count), *got, ideal);
    }
  }
  // Broadcast, binomial tree (small) and chain (large), from rank 1 % N: what one rank
  // sends depends on its place, the ranks' sum is (N-1) x B (every other rank gets B once).
  for (size_t count : {size_t{100}, size_t{(1 << 18) + 3}}) {
    std::vector<float> buf(count, 1.0f);
    auto got = Sent(comm, OpKind::kBroadcast, [&] {
      return comm.Broadcast(buf.data(), buf.data(), count, DataType::kFloat32, 1 % n, deadline);
    });
    if (!got.ok()) return got.status();
    if ((*got)[0] != (*got)[1]) return fail("broadcast", *got, (*got)[1]);
    auto total = SumOverRanks(comm, (*got)[0]);
    if (!total.ok()) return total.status();
    if (*total != (n - 1) * 4.0 * count) return fail("broadcast, all ranks", *got, *total);
  }
  return absl::OkStatus();
}

TEST_P(FormulaBytes, MeasuredBytesMatchTheAlgorithmsFormula) {
  const auto [world_size, transport] = GetParam();
  auto results =
      RunRanks(OptionsFor(world_size, transport),
               [](TcpCommunicator& comm, absl::Duration*) { return CheckFormulas(comm); });
  for (int r = 0; r < world_size; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FormulaBytes,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5),
                                            ::testing::Values(Transport::kSharedMemory,
                                                              Transport::kTcp)),
                         [](const auto& info) {
                           return absl::StrCat("world", std::get<0>(info.param), "_",
                                               TransportName(std::get<1>(info.param)));
                         });

TEST(TcpCommunicator, BadArgumentsNameTheArgumentAndDoNotBreakTheCommunicator) {
  MultiProcOptions options;
  options.world_size = 2;
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    float x = 1;
    absl::Status s = comm.AllReduce(nullptr, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
    if (!absl::IsInvalidArgument(s) || s.message().find("send buffer") == std::string::npos) {
      return absl::InternalError(absl::StrCat("null send: ", s.ToString()));
    }
    s = comm.Broadcast(&x, &x, 1, DataType::kFloat32, 5, deadline);
    if (!absl::IsInvalidArgument(s) || s.message().find("root 5") == std::string::npos) {
      return absl::InternalError(absl::StrCat("bad root: ", s.ToString()));
    }
    s = comm.Send(&x, 1, DataType::kFloat32, comm.rank(), deadline);
    if (!absl::IsInvalidArgument(s)) return absl::InternalError("send to self accepted");
    // Still healthy.
    return comm.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
}

TEST(TcpCommunicator, CreateRejectsBadOptions) {
  TcpCommunicatorOptions options;
  options.size = 2;
  options.rank = 2;
  EXPECT_EQ(TcpCommunicator::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  auto s = TcpCommunicator::Create(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("store"), std::string::npos) << s;
  options.size = 1;
  options.listen_host = "0.0.0.0";
  s = TcpCommunicator::Create(options).status();
  EXPECT_NE(s.message().find("advertise_host"), std::string::npos) << s;
}

}  // namespace
}  // namespace ringmaster::comm
