// SendRecv, the batched point-to-point operation of the TCP backend, on 2-4 forked ranks over
// both transports (shared-memory rings and TCP alone): exchanges that deadlock with blocking
// Send/Recv, the pipeline's exchange between neighbouring stages, the order of several
// messages on one link and of batches mixed with plain Send/Recv, bad ops, the counters, and
// a peer that dies in the middle of a batch.
//
// Payloads are bytes computed from (sender, receiver, message tag, index), so a receiver
// checks what it got without trusting anything the backend says.
#include <signal.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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

// 8 MiB: more than a shared-memory ring (1 MiB) and than loopback's socket buffers hold, so
// a blocking Send of it returns only once the peer is receiving.
constexpr size_t kLarge = 8 << 20;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// The byte at `i` of message `tag` from `from` to `to`.
uint8_t PayloadByte(int from, int to, int tag, size_t i) {
  const uint64_t x = (static_cast<uint64_t>(from) * 1000003u + to * 10007u + tag * 101u) ^
                     (i * 2654435761u) ^ (i >> 13);
  return static_cast<uint8_t>(x ^ (x >> 8));
}

std::vector<uint8_t> Payload(int from, int to, int tag, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = PayloadByte(from, to, tag, i);
  return out;
}

// OK when `got` is message `tag` from `from` to `to`.
absl::Status ExpectPayload(const std::vector<uint8_t>& got, int from, int to, int tag,
                           absl::string_view what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != PayloadByte(from, to, tag, i)) {
      return absl::InternalError(absl::StrCat(
          what, ": byte ", i, " of ", got.size(), " from rank ", from, " to rank ", to, " is ",
          got[i], ", expected ", PayloadByte(from, to, tag, i), " (message ", tag, ")"));
    }
  }
  return absl::OkStatus();
}

size_t Elements(size_t bytes, DataType type) { return bytes / DataTypeSize(type); }

PointToPoint SendOf(const std::vector<uint8_t>& buf, DataType type, int peer) {
  return PointToPoint::Send(buf.data(), Elements(buf.size(), type), type, peer);
}
PointToPoint RecvInto(std::vector<uint8_t>& buf, DataType type, int peer) {
  return PointToPoint::Recv(buf.data(), Elements(buf.size(), type), type, peer);
}

void ExpectAllOk(const std::vector<RankResult>& results, absl::string_view what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << what << ", rank " << r << ": " << results[r].status;
  }
}

// (world size, shared memory).
class SendRecvTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  MultiProcOptions Options() const {
    MultiProcOptions options;
    options.world_size = std::get<0>(GetParam());
    options.comm.shared_memory = std::get<1>(GetParam());
    return options;
  }
};

// Every rank sends 8 MiB to the next rank and receives 8 MiB from the previous one. With
// blocking calls, `Send(next); Recv(prev);` on every rank deadlocks: each Send waits for
// its receiver to drain what the ring or socket cannot hold, and every receiver is itself
// still inside its Send. One batch per rank moves both messages at once.
TEST_P(SendRecvTest, RingExchangeOfLargeMessagesInOneBatch) {
  ExpectAllOk(RunRanks(Options(),
                       [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                         const int r = comm.rank(), n = comm.size();
                         const int next = (r + 1) % n, prev = (r + n - 1) % n;
                         for (int round = 0; round < 3; ++round) {
                           const std::vector<uint8_t> out = Payload(r, next, round, kLarge);
                           std::vector<uint8_t> in(kLarge);
                           const PointToPoint ops[] = {SendOf(out, DataType::kFloat32, next),
                                                       RecvInto(in, DataType::kFloat32, prev)};
                           RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(60))));
                           RM_RETURN_IF_ERROR(ExpectPayload(in, prev, r, round, "ring exchange"));
                         }
                         return absl::OkStatus();
                       }),
              "ring exchange");
}

// The pipeline's steady state: stage r sends its activation to r+1 and receives the
// gradient of its previous micro-batch from r+1, while r+1 sends that gradient and receives
// the activation; a middle stage does both sides in one batch. Activations f32, gradients
// bf16 (a batch may mix types); each micro-batch's messages differ.
TEST_P(SendRecvTest, PipelineStagesExchangeActivationsAndGradients) {
  ExpectAllOk(RunRanks(Options(),
                       [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                         const int r = comm.rank(), n = comm.size();
                         constexpr size_t kActivation = 6 << 20, kGradient = 4 << 20;
                         for (int micro = 0; micro < 4; ++micro) {
                           const int act = 2 * micro, grad = 2 * micro + 1;  // message tags
                           std::vector<uint8_t> act_out, grad_out, act_in, grad_in;
                           std::vector<PointToPoint> ops;
                           if (r + 1 < n) {
                             act_out = Payload(r, r + 1, act, kActivation);
                             grad_in.resize(kGradient);
                             ops.push_back(SendOf(act_out, DataType::kFloat32, r + 1));
                             ops.push_back(RecvInto(grad_in, DataType::kBFloat16, r + 1));
                           }
                           if (r > 0) {
                             act_in.resize(kActivation);
                             grad_out = Payload(r, r - 1, grad, kGradient);
                             ops.push_back(RecvInto(act_in, DataType::kFloat32, r - 1));
                             ops.push_back(SendOf(grad_out, DataType::kBFloat16, r - 1));
                           }
                           RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(60))));
                           if (r + 1 < n) {
                             RM_RETURN_IF_ERROR(ExpectPayload(grad_in, r + 1, r, grad, "gradient"));
                           }
                           if (r > 0) {
                             RM_RETURN_IF_ERROR(ExpectPayload(act_in, r - 1, r, act, "activation"));
                           }
                         }
                         return absl::OkStatus();
                       }),
              "pipeline");
}

// Rank 0 sends three messages to rank 1 in one batch (large, small, empty: the engine must
// not start one before the previous one is through) while receiving two from it; rank 1
// receives them in one batch, in order, with types that match the sender's.
TEST_P(SendRecvTest, SeveralMessagesOnOneLinkKeepTheBatchOrder) {
  ExpectAllOk(
      RunRanks(Options(),
               [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                 const int r = comm.rank();
                 if (r > 1) return absl::OkStatus();
                 const int peer = 1 - r;
                 const size_t sizes[] = {kLarge, 1000, 0};
                 const DataType types[] = {DataType::kFloat32, DataType::kInt64, DataType::kUint8};
                 std::vector<std::vector<uint8_t>> out, in;
                 std::vector<PointToPoint> ops;
                 const int sends = r == 0 ? 3 : 2, recvs = r == 0 ? 2 : 3;
                 out.reserve(sends);
                 in.reserve(recvs);
                 for (int t = 0; t < sends; ++t) {
                   out.push_back(Payload(r, peer, t, sizes[t]));
                   ops.push_back(SendOf(out.back(), types[t], peer));
                 }
                 for (int t = 0; t < recvs; ++t) {
                   in.emplace_back(sizes[t]);
                   ops.push_back(RecvInto(in.back(), types[t], peer));
                 }
                 RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(60))));
                 for (int t = 0; t < recvs; ++t) {
                   RM_RETURN_IF_ERROR(
                       ExpectPayload(in[t], peer, r, t, absl::StrCat("message ", t)));
                 }
                 return absl::OkStatus();
               }),
      "several messages on one link");
}

// Batches mixed with plain and non-blocking calls: every message lands in the order its
// sender issued it to that receiver.
//   rank 0: Send(m0) | batch {Send(m1), Send(m2), Recv(a)} | SendRecvAsync {Send(m3)};
//           Send(m4); Wait
//   rank 1: batch {Recv(m0), Recv(m1)} | Send(a) | Recv(m2) | batch {Recv(m3), Recv(m4)}
// Rank 0's batch is still sending m2 while rank 1 has finished its batch with m1.
TEST_P(SendRecvTest, BatchesMixedWithPlainCallsKeepPerPairOrder) {
  ExpectAllOk(
      RunRanks(Options(),
               [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                 const int r = comm.rank();
                 if (r > 1) return absl::OkStatus();
                 const absl::Time deadline = In(absl::Seconds(60));
                 const DataType f32 = DataType::kFloat32;
                 const size_t sizes[] = {4000, kLarge, 4 << 20, 1 << 20, 4096};
                 if (r == 0) {
                   std::vector<std::vector<uint8_t>> m;
                   for (int t = 0; t < 5; ++t) m.push_back(Payload(0, 1, t, sizes[t]));
                   std::vector<uint8_t> a(2000);
                   RM_RETURN_IF_ERROR(comm.Send(m[0].data(), 1000, f32, 1, deadline));
                   const PointToPoint batch[] = {SendOf(m[1], f32, 1), SendOf(m[2], f32, 1),
                                                 RecvInto(a, f32, 1)};
                   RM_RETURN_IF_ERROR(comm.SendRecv(batch, deadline));
                   RM_RETURN_IF_ERROR(ExpectPayload(a, 1, 0, 9, "a"));
                   const PointToPoint later[] = {SendOf(m[3], f32, 1)};
                   Work work = comm.SendRecvAsync(later, deadline);
                   RM_RETURN_IF_ERROR(comm.Send(m[4].data(), 1024, f32, 1, deadline));
                   return work.Wait(deadline);
                 }
                 std::vector<std::vector<uint8_t>> m;
                 for (int t = 0; t < 5; ++t) m.emplace_back(sizes[t]);
                 const PointToPoint first[] = {RecvInto(m[0], f32, 0), RecvInto(m[1], f32, 0)};
                 RM_RETURN_IF_ERROR(comm.SendRecv(first, deadline));
                 const std::vector<uint8_t> a = Payload(1, 0, 9, 2000);
                 RM_RETURN_IF_ERROR(comm.Send(a.data(), 500, f32, 0, deadline));
                 RM_RETURN_IF_ERROR(comm.Recv(m[2].data(), (4 << 20) / 4, f32, 0, deadline));
                 const PointToPoint last[] = {RecvInto(m[3], f32, 0), RecvInto(m[4], f32, 0)};
                 RM_RETURN_IF_ERROR(comm.SendRecv(last, deadline));
                 for (int t = 0; t < 5; ++t) {
                   RM_RETURN_IF_ERROR(ExpectPayload(m[t], 0, 1, t, absl::StrCat("m", t)));
                 }
                 return absl::OkStatus();
               }),
      "mixed");
}

// The messages of a batch progress together, not in rounds: rank 0's first receive (from
// rank 2) can only complete after its second send to rank 1 has arrived, because rank 1
// forwards to rank 2 only after both, and rank 2 answers rank 0 only after that.
//   rank 0: batch {Recv(c) from 2, Send(x) to 1, Send(y) to 1}
//   rank 1: Recv(x); Recv(y); Send(z) to 2
//   rank 2: Recv(z) from 1; Send(c) to 0
TEST(SendRecv, EveryMessageOfABatchProgressesAtOnce) {
  for (bool shared_memory : {true, false}) {
    MultiProcOptions options;
    options.world_size = 3;
    options.comm.shared_memory = shared_memory;
    ExpectAllOk(RunRanks(options,
                         [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                           const absl::Time deadline = In(absl::Seconds(60));
                           const DataType u8 = DataType::kUint8;
                           std::vector<uint8_t> in(kLarge);
                           switch (comm.rank()) {
                             case 0: {
                               const auto x = Payload(0, 1, 0, kLarge),
                                          y = Payload(0, 1, 1, kLarge);
                               const PointToPoint ops[] = {RecvInto(in, u8, 2), SendOf(x, u8, 1),
                                                           SendOf(y, u8, 1)};
                               RM_RETURN_IF_ERROR(comm.SendRecv(ops, deadline));
                               return ExpectPayload(in, 2, 0, 0, "c");
                             }
                             case 1: {
                               RM_RETURN_IF_ERROR(comm.Recv(in.data(), kLarge, u8, 0, deadline));
                               RM_RETURN_IF_ERROR(ExpectPayload(in, 0, 1, 0, "x"));
                               RM_RETURN_IF_ERROR(comm.Recv(in.data(), kLarge, u8, 0, deadline));
                               RM_RETURN_IF_ERROR(ExpectPayload(in, 0, 1, 1, "y"));
                               const auto z = Payload(1, 2, 0, kLarge);
                               return comm.Send(z.data(), kLarge, u8, 2, deadline);
                             }
                             case 2: {
                               RM_RETURN_IF_ERROR(comm.Recv(in.data(), kLarge, u8, 1, deadline));
                               RM_RETURN_IF_ERROR(ExpectPayload(in, 1, 2, 0, "z"));
                               const auto c = Payload(2, 0, 0, kLarge);
                               return comm.Send(c.data(), kLarge, u8, 0, deadline);
                             }
                             default:
                               return absl::OkStatus();
                           }
                         }),
                shared_memory ? "progress, shm" : "progress, tcp");
  }
}

// On groups made by Split (the pipeline's pp groups of a mesh): world 4 split into {0, 2}
// and {1, 3}; each group's ranks exchange large messages in one batch (the group's ranks,
// the group's message headers), then the world does a ring exchange.
TEST(SendRecv, BatchesOnSplitGroups) {
  for (bool shared_memory : {true, false}) {
    MultiProcOptions options;
    options.world_size = 4;
    options.comm.shared_memory = shared_memory;
    ExpectAllOk(
        RunRanks(options,
                 [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                   const absl::Time deadline = In(absl::Seconds(60));
                   const int r = comm.rank();
                   RM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                                       comm.Split(r % 2, r, deadline));
                   const int peer = 1 - group->rank();
                   const int world_peer = (r + 2) % 4;
                   const std::vector<uint8_t> out = Payload(r, world_peer, 0, kLarge);
                   std::vector<uint8_t> in(kLarge);
                   const PointToPoint ops[] = {SendOf(out, DataType::kFloat32, peer),
                                               RecvInto(in, DataType::kFloat32, peer)};
                   RM_RETURN_IF_ERROR(group->SendRecv(ops, deadline));
                   RM_RETURN_IF_ERROR(ExpectPayload(in, world_peer, r, 0, "group exchange"));
                   if (group->counters().of(OpKind::kSendRecv).bytes_received != kLarge) {
                     return absl::InternalError("the group's counters missed its batch");
                   }
                   const int next = (r + 1) % 4, prev = (r + 3) % 4;
                   const std::vector<uint8_t> ring_out = Payload(r, next, 1, kLarge);
                   const PointToPoint ring[] = {SendOf(ring_out, DataType::kFloat32, next),
                                                RecvInto(in, DataType::kFloat32, prev)};
                   RM_RETURN_IF_ERROR(comm.SendRecv(ring, deadline));
                   return ExpectPayload(in, prev, r, 1, "world ring after the groups");
                 }),
        shared_memory ? "split groups, shm" : "split groups, tcp");
  }
}

// bytes_sent / bytes_received of OpKind::kSendRecv are the batch's payload, one call per
// batch; Send's and Recv's counters are untouched.
TEST_P(SendRecvTest, CountersCountTheBatchBytes) {
  ExpectAllOk(
      RunRanks(Options(),
               [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                 const int r = comm.rank(), n = comm.size();
                 const int next = (r + 1) % n, prev = (r + n - 1) % n;
                 // 3 MiB + 4 KiB out, in two messages; 3 MiB + 4 KiB in.
                 const auto a = Payload(r, next, 0, 3 << 20);
                 const auto b = Payload(r, next, 1, 4096);
                 std::vector<uint8_t> c(3 << 20), d(4096);
                 const PointToPoint ops[] = {
                     SendOf(a, DataType::kFloat16, next), RecvInto(c, DataType::kFloat16, prev),
                     SendOf(b, DataType::kInt32, next), RecvInto(d, DataType::kInt32, prev)};
                 const Counters before = comm.counters();
                 RM_RETURN_IF_ERROR(comm.SendRecv(ops, In(absl::Seconds(60))));
                 const Counters after = comm.counters();
                 const OpCounters& batch = after.of(OpKind::kSendRecv);
                 const uint64_t want = (3 << 20) + 4096;
                 if (batch.calls - before.of(OpKind::kSendRecv).calls != 1 ||
                     batch.bytes_sent - before.of(OpKind::kSendRecv).bytes_sent != want ||
                     batch.bytes_received - before.of(OpKind::kSendRecv).bytes_received != want ||
                     batch.errors != 0) {
                   return absl::InternalError(absl::StrCat(
                       "send_recv counters: ", batch.calls, " calls, ", batch.bytes_sent,
                       " bytes sent, ", batch.bytes_received, " received, ", batch.errors,
                       " errors; want 1 call and ", want, " each way"));
                 }
                 for (OpKind kind : {OpKind::kSend, OpKind::kRecv}) {
                   if (after.of(kind).calls != 0 || after.of(kind).bytes_sent != 0 ||
                       after.of(kind).bytes_received != 0) {
                     return absl::InternalError(absl::StrCat(OpKindName(kind), " counted a batch"));
                   }
                 }
                 return absl::OkStatus();
               }),
      "counters");
}

INSTANTIATE_TEST_SUITE_P(WorldsAndTransports, SendRecvTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("world", std::get<0>(info.param), "_",
                                               std::get<1>(info.param) ? "shm" : "tcp");
                         });

// Bad ops are INVALID_ARGUMENT naming the op and field; nothing of the batch is sent (a
// message sent before the bad op was found would put the next exchange out of step) and
// the communicator stays healthy.
TEST(SendRecv, BadOpsNameTheOpIndexAndDoNotBreakTheCommunicator) {
  MultiProcOptions options;
  options.world_size = 2;
  ExpectAllOk(
      RunRanks(
          options,
          [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
            const absl::Time deadline = In(absl::Seconds(30));
            const int peer = 1 - comm.rank();
            const DataType f32 = DataType::kFloat32;
            std::vector<float> a(64, 1.0f), b(64);
            struct Case {
              std::vector<PointToPoint> ops;
              std::string want;
            };
            PointToPoint bad_kind = PointToPoint::Send(a.data(), 64, f32, peer);
            bad_kind.kind = static_cast<PointToPoint::Kind>(7);
            const Case cases[] = {
                {{PointToPoint::Send(a.data(), 64, f32, peer),
                  PointToPoint::Recv(b.data(), 64, f32, 5)},
                 "SendRecv ops[1]: peer 5 is outside [0, 2)"},
                {{PointToPoint::Send(a.data(), 64, f32, comm.rank())}, "SendRecv ops[0]: peer"},
                {{PointToPoint::Send(a.data(), 64, f32, peer),
                  PointToPoint::Send(a.data(), 64, static_cast<DataType>(42), peer)},
                 "SendRecv ops[1]: type 42"},
                {{PointToPoint::Send(a.data(), 64, f32, peer),
                  PointToPoint::Recv(b.data(), 64, f32, peer),
                  PointToPoint::Recv(nullptr, 3, f32, peer)},
                 "SendRecv ops[2]: recv is null"},
                {{PointToPoint::Send(nullptr, 3, f32, peer)}, "SendRecv ops[0]: send is null"},
                {{bad_kind}, "SendRecv ops[0]: kind 7"},
                {{PointToPoint::Recv(b.data(), 64, f32, peer),
                  PointToPoint::Recv(b.data() + 32, 8, f32, peer)},
                 "SendRecv ops[0]: recv overlaps the recv buffer of ops[1]"},
                {{PointToPoint::Send(b.data(), 64, f32, peer),
                  PointToPoint::Recv(b.data() + 63, 1, f32, peer)},
                 "SendRecv ops[1]: recv overlaps the send buffer of ops[0]"},
            };
            for (const Case& c : cases) {
              const absl::Status s = comm.SendRecv(c.ops, deadline);
              if (!absl::IsInvalidArgument(s) || s.message().find(c.want) == std::string::npos) {
                return absl::InternalError(absl::StrCat("want INVALID_ARGUMENT with \"", c.want,
                                                        "\", got ", s.ToString()));
              }
            }
            // Two receives from one peer and a receive next to a send are fine.
            const PointToPoint good[] = {PointToPoint::Send(a.data(), 32, f32, peer),
                                         PointToPoint::Send(a.data() + 32, 32, f32, peer),
                                         PointToPoint::Recv(b.data(), 32, f32, peer),
                                         PointToPoint::Recv(b.data() + 32, 32, f32, peer)};
            RM_RETURN_IF_ERROR(comm.SendRecv(good, deadline));
            if (b[63] != 1.0f) return absl::InternalError("the good batch moved nothing");
            return comm.GetAsyncError();
          }),
      "bad ops");
}

// An empty batch returns at once, also with a peer that never calls anything; after
// Abort() it returns the communicator's error.
TEST(SendRecv, AnEmptyBatchReturnsAtOnce) {
  MultiProcOptions options;
  options.world_size = 2;
  ExpectAllOk(
      RunRanks(options,
               [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                 if (comm.rank() == 1) return absl::OkStatus();
                 const absl::Time start = absl::Now();
                 RM_RETURN_IF_ERROR(comm.SendRecv({}, In(absl::Seconds(30))));
                 RM_RETURN_IF_ERROR(
                     comm.SendRecvAsync({}, In(absl::Seconds(30))).Wait(In(absl::Seconds(30))));
                 if (absl::Now() - start > absl::Seconds(1)) {
                   return absl::InternalError("an empty batch waited");
                 }
                 comm.Abort();
                 const absl::Status s = comm.SendRecv({}, In(absl::Seconds(30)));
                 if (!absl::IsAborted(s)) {
                   return absl::InternalError(
                       absl::StrCat("empty batch after Abort: ", s.ToString()));
                 }
                 return absl::OkStatus();
               }),
      "empty");
}

constexpr absl::Duration kOpTimeout = absl::Seconds(3);

// A rank dies while its neighbours exchange large batches with it: each survivor's batch
// fails as the communicator's operations do (UNAVAILABLE from the closed connection, or
// ABORTED when a family member broke first), within twice its deadline, and the
// communicator stays broken.
TEST(SendRecv, ADeadPeerFailsTheBatchWithinTheDeadline) {
  for (bool shared_memory : {true, false}) {
    MultiProcOptions options;
    options.world_size = 3;
    options.comm.shared_memory = shared_memory;
    options.victims = {2};
    const auto results =
        RunRanks(options, [](TcpCommunicator& comm, absl::Duration* elapsed) -> absl::Status {
          const int r = comm.rank(), n = comm.size();
          const int next = (r + 1) % n, prev = (r + n - 1) % n;
          if (r == 2) {
            std::thread([] {
              absl::SleepFor(absl::Milliseconds(30));
              raise(SIGKILL);
            }).detach();
          }
          const std::vector<uint8_t> out(64 << 20, 1);
          std::vector<uint8_t> in(64 << 20);
          const PointToPoint ops[] = {SendOf(out, DataType::kUint8, next),
                                      RecvInto(in, DataType::kUint8, prev)};
          for (int i = 0; i < 1000; ++i) {
            const absl::Time start = absl::Now();
            const absl::Status s = comm.SendRecv(ops, start + kOpTimeout);
            *elapsed = absl::Now() - start;
            if (!s.ok()) {
              if (comm.GetAsyncError().code() != s.code()) {
                return absl::InternalError(absl::StrCat("not broken after ", s.ToString()));
              }
              return s;
            }
          }
          return absl::OkStatus();
        });
    for (int r : {0, 1}) {
      const RankResult& res = results[r];
      ASSERT_TRUE(res.reported) << "rank " << r << ": " << res.status;
      EXPECT_TRUE(absl::IsUnavailable(res.status) || absl::IsAborted(res.status))
          << (shared_memory ? "shm" : "tcp") << " rank " << r << ": " << res.status;
      EXPECT_LE(res.elapsed, 2 * kOpTimeout) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace ringmaster::comm
