// Groups (Split) and meshes on the TCP backend, on forked ranks over loopback: every
// operation on every group of 2x2 and 2x2x2 meshes and of a 4-rank split, groups of
// groups, non-blocking operations, and failures that must break every group of a family.
//
// Expected results are computed by each rank in double precision from the inputs of the
// group's members, which come from Mesh::GroupRanks (or a list written here), not from the
// communicator: a group with the wrong members or order fails.
#include <signal.h>

#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "comm/testing/reference.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

using testing::MultiProcOptions;
using testing::RankResult;
using testing::RunRanks;

// Small integers, exact in f32 for sums of up to 8 ranks; products of {1, 2, -1}.
double Input(int world_rank, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProd) {
    const int v = static_cast<int>((world_rank + i) % 3);
    return v == 0 ? 1 : v == 1 ? 2 : -1;
  }
  return static_cast<double>(static_cast<int>((world_rank * 7 + i * 13) % 10) - 4);
}

double Reduce(const std::vector<int>& members, size_t i, ReduceOp op) {
  double acc = Input(members[0], i, op);
  for (size_t m = 1; m < members.size(); ++m) {
    acc = testing::ReduceStep(op, acc, Input(members[m], i, op));
  }
  return op == ReduceOp::kAvg ? acc / members.size() : acc;
}

absl::Status Mismatch(absl::string_view what, size_t i, double got, double want) {
  return absl::InternalError(
      absl::StrCat(what, ": element ", i, " is ", got, ", expected ", want));
}

std::vector<float> Inputs(int world_rank, size_t count, ReduceOp op) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(Input(world_rank, i, op));
  return v;
}

// Counts on both sides of the small-message threshold (recursive doubling / ring).
constexpr size_t kCounts[] = {1, 1001, 70001};

// Every operation on `group`, whose members (world ranks, in group rank order) are
// `members`; `me` is this rank's world rank.
absl::Status CheckEveryOperation(Communicator& group, const std::vector<int>& members, int me,
                                 absl::string_view name) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const int n = group.size(), r = group.rank();
  if (n != static_cast<int>(members.size()) || members[r] != me) {
    return absl::InternalError(absl::StrCat(name, ": rank ", r, " of ", n, ", expected world rank ",
                                            me, " at that position of [",
                                            absl::StrJoin(members, ","), "]"));
  }
  for (size_t count : kCounts) {
    const std::string at = absl::StrCat(name, " count ", count);
    for (ReduceOp op : kAllReduceOps) {
      std::vector<float> buf = Inputs(me, count, op);
      const std::string what = absl::StrCat(at, " all_reduce ", ReduceOpName(op));
      absl::Status s =
          group.AllReduce(buf.data(), buf.data(), count, DataType::kFloat32, op, deadline);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      for (size_t i = 0; i < count; ++i) {
        const double want = Reduce(members, i, op);
        if (std::fabs(buf[i] - want) > 1e-6) return Mismatch(what, i, buf[i], want);
      }
      // Reduce-scatter: block b of the result is the reduction of everyone's block b.
      std::vector<float> in = Inputs(me, count * n, op), out(count);
      s = group.ReduceScatter(in.data(), out.data(), count, DataType::kFloat32, op, deadline);
      const std::string rs = absl::StrCat(at, " reduce_scatter ", ReduceOpName(op));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(rs, ": ", s.message()));
      for (size_t i = 0; i < count; ++i) {
        const double want = Reduce(members, r * count + i, op);
        if (std::fabs(out[i] - want) > 1e-6) return Mismatch(rs, i, out[i], want);
      }
    }
    std::vector<float> mine = Inputs(me, count, ReduceOp::kSum), all(count * n);
    absl::Status s = group.AllGather(mine.data(), all.data(), count, DataType::kFloat32, deadline);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(at, " all_gather: ", s.message()));
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < count; ++i) {
        const double want = Input(members[p], i, ReduceOp::kSum);
        if (all[p * count + i] != want) {
          return Mismatch(absl::StrCat(at, " all_gather block ", p), i, all[p * count + i], want);
        }
      }
    }
    for (int root = 0; root < n; ++root) {
      std::vector<float> buf = r == root ? Inputs(me, count, ReduceOp::kSum)
                                         : std::vector<float>(count, 99.0f);
      const std::string what = absl::StrCat(at, " broadcast from ", root);
      s = group.Broadcast(buf.data(), buf.data(), count, DataType::kFloat32, root, deadline);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      for (size_t i = 0; i < count; ++i) {
        const double want = Input(members[root], i, ReduceOp::kSum);
        if (buf[i] != want) return Mismatch(what, i, buf[i], want);
      }
    }
    // Send/Recv around the group's ring: even ranks send first, odd ones receive first.
    if (n > 1) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<float> out = Inputs(me, count, ReduceOp::kSum), in(count, 99.0f);
      auto send = [&] { return group.Send(out.data(), count, DataType::kFloat32, next, deadline); };
      auto recv = [&] { return group.Recv(in.data(), count, DataType::kFloat32, prev, deadline); };
      s = r % 2 == 0 ? send() : recv();
      if (s.ok()) s = r % 2 == 0 ? recv() : send();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(at, " send/recv: ", s.message()));
      for (size_t i = 0; i < count; ++i) {
        const double want = Input(members[prev], i, ReduceOp::kSum);
        if (in[i] != want) return Mismatch(absl::StrCat(at, " recv"), i, in[i], want);
      }
    }
  }
  absl::Status s = group.Barrier(deadline);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name, " barrier: ", s.message()));
  return absl::OkStatus();
}

using Dims = std::vector<std::pair<std::string, int>>;
const Dims k2x2 = {{"dp", 2}, {"tp", 2}};
const Dims k2x2x2 = {{"pp", 2}, {"dp", 2}, {"tp", 2}};

// A mesh over `world` and this rank's group along each of its dimensions.
struct MeshGroups {
  std::optional<Mesh> mesh;
  std::unique_ptr<Communicator> group[kNumMeshDims];  // by MeshDim
  Communicator& of(MeshDim d) { return *group[static_cast<int>(d)]; }
};

absl::StatusOr<MeshGroups> MakeGroups(Communicator& world, const Dims& dims) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  MeshGroups groups;
  auto mesh = Mesh::Create(world.size(), dims);
  if (!mesh.ok()) return mesh.status();
  groups.mesh = *mesh;
  for (MeshDim d : kMeshDims) {
    auto group = mesh->Group(world, d, deadline);
    if (!group.ok()) return group.status();
    if (*group == nullptr) return absl::InternalError("mesh group is null");
    groups.group[static_cast<int>(d)] = std::move(group).value();
  }
  return groups;
}

// Every operation on each group of the mesh, then on the world again (the groups' traffic
// left the shared links in step).
absl::Status CheckMesh(TcpCommunicator& world, const Dims& dims) {
  auto groups = MakeGroups(world, dims);
  if (!groups.ok()) return groups.status();
  const Mesh& mesh = *groups->mesh;
  const int me = world.rank();
  for (MeshDim d : kMeshDims) {
    absl::Status s = CheckEveryOperation(groups->of(d), mesh.GroupRanks(d, me), me,
                                         absl::StrCat(mesh.ToString(), " ", MeshDimName(d)));
    if (!s.ok()) return s;
  }
  std::vector<int> everyone(world.size());
  for (int p = 0; p < world.size(); ++p) everyone[p] = p;
  // Fewer counts on the world: it is covered by tcp_communicator_test.
  float x = static_cast<float>(me);
  absl::Status s = world.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum,
                                   absl::Now() + absl::Seconds(30));
  const float want = world.size() * (world.size() - 1) / 2.0f;
  if (s.ok() && x != want) return Mismatch("world all_reduce after the groups", 0, x, want);
  return s;
}

void ExpectAllOk(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

class MeshGroupsTest : public ::testing::TestWithParam<bool> {};  // shared memory on/off

TEST_P(MeshGroupsTest, EveryOperationOnEveryGroupOf2x2) {
  MultiProcOptions options;
  options.world_size = 4;
  options.comm.shared_memory = GetParam();
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    return CheckMesh(world, k2x2);
  }));
}

TEST_P(MeshGroupsTest, EveryOperationOnEveryGroupOf2x2x2) {
  MultiProcOptions options;
  options.world_size = 8;
  options.comm.shared_memory = GetParam();
  options.timeout = absl::Minutes(5);
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    return CheckMesh(world, k2x2x2);
  }));
}

INSTANTIATE_TEST_SUITE_P(Transports, MeshGroupsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

// Splits by explicit colors and keys: a 4-rank group ordered backwards by key, then groups
// of that group (groups of groups); a negative color gets no group.
TEST(Split, GroupsOfGroupsFollowColorsAndKeys) {
  MultiProcOptions options;
  options.world_size = 8;
  options.timeout = absl::Minutes(5);
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    const int me = world.rank();
    // Ranks 0-6: colour by parity, key = -rank (so the group runs backwards); rank 7: none.
    auto half = world.Split(me == 7 ? -1 : me % 2, -me, deadline);
    if (!half.ok()) return half.status();
    if (me == 7) {
      if (*half != nullptr) return absl::InternalError("a negative color made a group");
      return absl::OkStatus();
    }
    const std::vector<int> members = me % 2 == 0 ? std::vector<int>{6, 4, 2, 0}
                                                 : std::vector<int>{5, 3, 1};
    Communicator& h = **half;
    absl::Status s = CheckEveryOperation(h, members, me, absl::StrCat("parity ", me % 2));
    if (!s.ok()) return s;
    // Split the group again: its first two ranks and the rest, in group order.
    auto quarter = h.Split(h.rank() < 2 ? 0 : 1, h.rank(), deadline);
    if (!quarter.ok()) return quarter.status();
    const std::vector<int> sub =
        h.rank() < 2 ? std::vector<int>(members.begin(), members.begin() + 2)
                     : std::vector<int>(members.begin() + 2, members.end());
    s = CheckEveryOperation(**quarter, sub, me, absl::StrCat("quarter of parity ", me % 2));
    if (!s.ok()) return s;
    // The parent still works, and so does the world, after the grandchildren.
    s = CheckEveryOperation(h, members, me, absl::StrCat("parity ", me % 2, " again"));
    if (!s.ok()) return s;
    auto ids_differ = static_cast<TcpCommunicator&>(h).group_id() !=
                      static_cast<TcpCommunicator&>(**quarter).group_id();
    if (!ids_differ) return absl::InternalError("a group and its child share an id");
    return absl::OkStatus();
  }));
}

// A group and its parent over the same two ranks share both links: rank 0 using the group
// while rank 1 uses the world is detected from the header, not mistaken for data.
TEST(Split, MessagesOfAnotherGroupAreAMismatchNotData) {
  MultiProcOptions options;
  options.world_size = 2;
  auto results = RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    auto group = world.Split(0, 0, deadline);
    if (!group.ok()) return group.status();
    float x = 1;
    Communicator& c = world.rank() == 0 ? **group : world;
    return c.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
  });
  for (const RankResult& r : results) {
    EXPECT_TRUE(absl::IsInternal(r.status) || absl::IsUnavailable(r.status)) << r.status;
  }
  const bool named = results[0].status.message().find("group mismatch") != std::string::npos ||
                     results[1].status.message().find("group mismatch") != std::string::npos;
  EXPECT_TRUE(named) << results[0].status << " / " << results[1].status;
}

// --- Non-blocking operations -------------------------------------------------------------

// A computation the compiler cannot drop: about `ms` of arithmetic.
double Compute(absl::Duration d) {
  double acc = 0;
  const absl::Time until = absl::Now() + d;
  for (int i = 1; absl::Now() < until; ++i) {
    for (int j = 0; j < 1000; ++j) acc += std::sqrt(static_cast<double>(i + j));
  }
  return acc;
}

// On a 2x2 mesh: an all-gather on the dp group is started, then the rank computes while
// it runs, and a tp all-reduce runs on the main thread meanwhile; the all-gather completes
// without the caller's thread (done() before any Wait), queued operations keep their
// order, and every result equals the blocking operations'.
TEST(Async, OperationsOverlapComputeAndMatchTheBlockingResults) {
  MultiProcOptions options;
  options.world_size = 4;
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    auto groups = MakeGroups(world, k2x2);
    if (!groups.ok()) return groups.status();
    const Mesh& mesh = *groups->mesh;
    Communicator& dp = groups->of(MeshDim::kDp);
    Communicator& tp = groups->of(MeshDim::kTp);
    const int me = world.rank();
    const size_t count = 1 << 20;  // 4 MiB per rank: the ring path
    const std::vector<float> shard = Inputs(me, count, ReduceOp::kSum);

    std::vector<float> blocking(2 * count);
    absl::Status s = dp.AllGather(shard.data(), blocking.data(), count, DataType::kFloat32,
                                  deadline);
    if (!s.ok()) return s;

    std::vector<float> gathered(2 * count), sum = shard, scattered(count / 2);
    Work gather = dp.AllGatherAsync(shard.data(), gathered.data(), count, DataType::kFloat32,
                                    deadline);
    // Queued behind the gather on the same group: must run after it, in order.
    Work reduce = dp.AllReduceAsync(sum.data(), sum.data(), count, DataType::kFloat32,
                                    ReduceOp::kSum, deadline);
    Work scatter = dp.ReduceScatterAsync(shard.data(), scattered.data(), count / 2,
                                         DataType::kFloat32, ReduceOp::kMax, deadline);
    // Meanwhile the main thread uses the tp group (disjoint links) and computes.
    float t = static_cast<float>(me);
    s = tp.AllReduce(&t, &t, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
    if (!s.ok()) return s;
    const std::vector<int> tp_members = mesh.GroupRanks(MeshDim::kTp, me);
    if (t != tp_members[0] + tp_members[1]) return Mismatch("tp all_reduce", 0, t, -1);
    Compute(absl::Milliseconds(50));
    // The operations finish on their own, without a Wait from this thread.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!scatter.done() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    if (!gather.done() || !reduce.done() || !scatter.done()) {
      return absl::InternalError("non-blocking operations did not finish without a Wait");
    }
    for (Work* w : {&gather, &reduce, &scatter}) {
      s = w->Wait(deadline);
      if (!s.ok()) return s;
    }
    if (gathered != blocking) return absl::InternalError("async all_gather != blocking");
    const std::vector<int> members = mesh.GroupRanks(MeshDim::kDp, me);
    for (size_t i = 0; i < count; ++i) {
      const double want = Reduce(members, i, ReduceOp::kSum);
      if (sum[i] != want) return Mismatch("async all_reduce", i, sum[i], want);
    }
    for (size_t i = 0; i < count / 2; ++i) {
      const double want = Reduce(members, dp.rank() * (count / 2) + i, ReduceOp::kMax);
      if (scattered[i] != want) return Mismatch("async reduce_scatter", i, scattered[i], want);
    }
    // A blocking call after queued work runs after it: all-reducing the same buffer twice
    // gives size() times the first result only in that order.
    std::vector<float> twice = shard;
    Work first = dp.AllReduceAsync(twice.data(), twice.data(), count, DataType::kFloat32,
                                   ReduceOp::kSum, deadline);
    s = dp.AllReduce(twice.data(), twice.data(), count, DataType::kFloat32, ReduceOp::kSum,
                     deadline);
    if (!s.ok()) return s;
    s = first.Wait(deadline);
    if (!s.ok()) return s;
    for (size_t i = 0; i < count; ++i) {
      const double want = 2 * Reduce(members, i, ReduceOp::kSum);
      if (twice[i] != want) return Mismatch("async then blocking all_reduce", i, twice[i], want);
    }
    // The other non-blocking forms.
    std::vector<float> b(count, dp.rank() == 1 ? 5.0f : 0.0f);
    Work bcast = dp.BroadcastAsync(b.data(), b.data(), count, DataType::kFloat32, 1, deadline);
    std::vector<float> token(16, static_cast<float>(me)), got(16);
    const int peer = 1 - tp.rank();
    Work sent = tp.SendAsync(token.data(), 16, DataType::kFloat32, peer, deadline);
    Work received = tp.RecvAsync(got.data(), 16, DataType::kFloat32, peer, deadline);
    for (Work* w : {&bcast, &sent, &received}) {
      s = w->Wait(deadline);
      if (!s.ok()) return s;
    }
    if (b[count - 1] != 5.0f) return Mismatch("async broadcast", count - 1, b[count - 1], 5);
    if (got[0] != tp_members[peer]) return Mismatch("async recv", 0, got[0], tp_members[peer]);
    return absl::OkStatus();
  }));
}

TEST(Async, WaitPastItsDeadlineSaysTheOperationStillRuns) {
  MultiProcOptions options;
  options.world_size = 2;
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    float x = 1;
    if (world.rank() == 1) absl::SleepFor(absl::Milliseconds(300));  // late to the op
    Work w = world.AllReduceAsync(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
    if (world.rank() == 0) {
      absl::Status early = w.Wait(absl::Now() + absl::Milliseconds(20));
      if (!absl::IsDeadlineExceeded(early) ||
          early.message().find("still running") == std::string::npos) {
        return absl::InternalError(absl::StrCat("early wait: ", early.ToString()));
      }
    }
    absl::Status s = w.Wait(deadline);
    if (!s.ok()) return s;
    if (x != 2) return Mismatch("all_reduce", 0, x, 2);
    if (!absl::IsFailedPrecondition(Work().Wait(deadline))) {
      return absl::InternalError("an empty Work waited");
    }
    return absl::OkStatus();
  }));
}

// --- Failures break every group of the family -------------------------------------------

constexpr absl::Duration kOpTimeout = absl::Seconds(3);

// Runs small operations on the tp, dp and pp groups and the world, round after round, until
// one fails; then every group of this rank must fail at once. Reports the first error and
// its time from the start.
absl::Status UseGroupsUntilFailure(TcpCommunicator& world, MeshGroups& groups,
                                   absl::Duration* elapsed) {
  const absl::Time start = absl::Now();
  std::vector<Communicator*> all = {&groups.of(MeshDim::kTp), &groups.of(MeshDim::kDp),
                                    &groups.of(MeshDim::kPp), &world};
  absl::Status first;
  for (int round = 0; round < 100000 && first.ok(); ++round) {
    for (Communicator* c : all) {
      float x = 1;
      first = c->AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum,
                           absl::Now() + kOpTimeout);
      if (!first.ok()) break;
    }
  }
  *elapsed = absl::Now() - start;
  if (first.ok()) return absl::InternalError("nothing failed");
  for (Communicator* c : all) {
    const absl::Time t = absl::Now();
    float x = 1;
    absl::Status s = c->AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum,
                                  absl::Now() + kOpTimeout);
    if (s.ok() || c->GetAsyncError().ok() || absl::Now() - t > absl::Milliseconds(100)) {
      return absl::InternalError(absl::StrCat("after \"", first.ToString(), "\" a group of size ",
                                              c->size(), " still answered ", s.ToString()));
    }
  }
  return first;
}

void ExpectSurvivorsFail(const std::vector<RankResult>& results, const std::set<int>& skip) {
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    if (skip.count(r)) continue;
    const RankResult& res = results[r];
    ASSERT_TRUE(res.reported) << "rank " << r << ": " << res.status;
    EXPECT_TRUE(absl::IsUnavailable(res.status) || absl::IsAborted(res.status) ||
                absl::IsDeadlineExceeded(res.status))
        << "rank " << r << ": " << res.status;
    // Each op has kOpTimeout; a rank may be in one when the failure happens.
    EXPECT_LE(res.elapsed, 2 * kOpTimeout + absl::Seconds(1)) << "rank " << r;
  }
}

TEST(Failures, AKilledRankBreaksEveryGroupOfEverySurvivor) {
  MultiProcOptions options;
  options.world_size = 8;
  options.victims = {5};
  auto results = RunRanks(options, [](TcpCommunicator& world, absl::Duration* elapsed) {
    auto groups = MakeGroups(world, k2x2x2);
    if (!groups.ok()) return groups.status();
    if (world.rank() == 5) {
      std::thread([] {
        absl::SleepFor(absl::Milliseconds(100));
        raise(SIGKILL);
      }).detach();
    }
    return UseGroupsUntilFailure(world, *groups, elapsed);
  });
  EXPECT_EQ(results[5].exit_detail, "signal 9");
  ExpectSurvivorsFail(results, {5});
}

// Abort() of one rank's tp group (not the world): its whole family breaks, and peers fail.
TEST(Failures, AbortOfAGroupBreaksTheFamilyAndThePeers) {
  MultiProcOptions options;
  options.world_size = 8;
  auto results = RunRanks(options, [](TcpCommunicator& world, absl::Duration* elapsed) {
    auto groups = MakeGroups(world, k2x2x2);
    if (!groups.ok()) return groups.status();
    std::thread aborter;
    if (world.rank() == 2) {
      aborter = std::thread([&groups] {
        absl::SleepFor(absl::Milliseconds(100));
        groups->of(MeshDim::kTp).Abort();
      });
    }
    absl::Status s = UseGroupsUntilFailure(world, *groups, elapsed);
    if (aborter.joinable()) aborter.join();
    if (world.rank() == 2 && !absl::IsAborted(world.GetAsyncError())) {
      return absl::InternalError(absl::StrCat("world after its tp group's Abort: ",
                                              world.GetAsyncError().ToString()));
    }
    return s;
  });
  ExpectSurvivorsFail(results, {});
  EXPECT_TRUE(absl::IsAborted(results[2].status)) << results[2].status;
}

// Abort() of the world while a non-blocking operation of a group is pending: the Work
// finishes ABORTED promptly, and so does every later operation of every group. The even
// ranks abort (each waits alone in a tp all-reduce its peer never joins); the odd ones
// find out later, from the closed connections.
TEST(Failures, AbortOfTheWorldEndsPendingGroupWork) {
  MultiProcOptions options;
  options.world_size = 4;
  ExpectAllOk(RunRanks(options, [](TcpCommunicator& world, absl::Duration*) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    auto groups = MakeGroups(world, k2x2);
    if (!groups.ok()) return groups.status();
    absl::Status s = world.Barrier(deadline);
    if (!s.ok()) return s;
    const bool aborts = world.rank() % 2 == 0;
    if (!aborts) {
      absl::SleepFor(absl::Milliseconds(600));  // the even ranks have aborted by now
      // Fails: UNAVAILABLE, or INTERNAL when it first reads the message its tp peer sent
      // before aborting (a tp message where the world expected its own).
      s = world.Barrier(deadline);
      if (s.ok()) {
        return absl::InternalError(absl::StrCat("world after the peers' Abort: ", s.ToString()));
      }
    } else {
      float x = 1;
      Work w = groups->of(MeshDim::kTp).AllReduceAsync(&x, &x, 1, DataType::kFloat32,
                                                       ReduceOp::kSum, deadline);
      absl::SleepFor(absl::Milliseconds(100));
      const absl::Time start = absl::Now();
      world.Abort();
      s = w.Wait(deadline);
      if (!absl::IsAborted(s) || absl::Now() - start > absl::Seconds(1)) {
        return absl::InternalError(absl::StrCat("pending work after Abort: ", s.ToString()));
      }
    }
    for (MeshDim d : kMeshDims) {
      const absl::Time t = absl::Now();
      absl::Status g = groups->of(d).Barrier(deadline);
      if (g.ok() || (aborts && !absl::IsAborted(g)) || absl::Now() - t > absl::Milliseconds(100)) {
        return absl::InternalError(absl::StrCat(MeshDimName(d), " afterwards: ", g.ToString()));
      }
    }
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace ringmaster::comm
