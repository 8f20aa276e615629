#include "train/grad_sync.h"

#include <signal.h>

#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using comm::testing::MultiProcOptions;
using comm::testing::RunRanks;

// Rank r's gradient at flat index i before the reduction.
float Grad(int r, int64_t i) { return static_cast<float>((r + 1) * (i % 97) - 3 * r); }

TEST(PaddedElements, RoundsUpToWholeLinesPerRank) {
  EXPECT_EQ(PaddedElements(1, 1), 16);
  EXPECT_EQ(PaddedElements(100, 3), 144);
  EXPECT_EQ(PaddedElements(96, 3), 96);
  EXPECT_EQ(PaddedElements(0, 2), 32);
}

// Every bucket reduced once per step, its payload its share of the buffer, and the bytes
// this rank sent those of the algorithm that ran, worked out here: all-reduces of these
// small buckets use recursive doubling (B per rank at N = 2; at N = 3 rank 1 takes rank 0's
// data and hands the result back, 2B, the others B); reduce-scatters the ring, (N-1)/N x B.
absl::Status CheckBucketCounters(const GradientSync& sync, GradientReduction reduction, int r,
                                 int n, int steps, int64_t buffer_bytes) {
  const std::vector<BucketCounters> buckets = sync.bucket_counters();
  if (static_cast<int>(buckets.size()) != sync.num_buckets()) {
    return absl::InternalError(absl::StrCat(buckets.size(), " bucket counters"));
  }
  int64_t payload = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketCounters& c = buckets[b];
    payload += c.payload_bytes;
    const uint64_t per_call = static_cast<uint64_t>(c.payload_bytes);
    const uint64_t expected = n == 1 ? 0
                              : reduction == GradientReduction::kReduceScatter
                                  ? per_call * (n - 1) / n
                              : n == 3 && r == 1 ? 2 * per_call
                                                 : per_call;
    if (c.calls != static_cast<uint64_t>(steps) || c.bytes_sent != steps * expected ||
        c.formula_bytes_sent != c.bytes_sent || (n > 1 && c.time <= absl::ZeroDuration())) {
      return absl::InternalError(absl::StrCat("bucket ", b, ": ", c.calls, " calls, ", c.bytes_sent,
                                              " bytes sent, formula ", c.formula_bytes_sent,
                                              ", payload ", c.payload_bytes, "; expected ", steps,
                                              " calls, ", steps * expected, " bytes"));
    }
  }
  if (payload != buffer_bytes) {
    return absl::InternalError(
        absl::StrCat("buckets' payloads sum to ", payload, ", not ", buffer_bytes));
  }
  return absl::OkStatus();
}

// world size, reduction, overlap
class GradientSyncTest : public ::testing::TestWithParam<std::tuple<int, GradientReduction, bool>> {
};

TEST_P(GradientSyncTest, SumsEveryBucketAsBackwardReleasesIt) {
  const auto [world, reduction, overlap] = GetParam();
  MultiProcOptions options;
  options.world_size = world;
  auto results =
      RunRanks(options,
               [reduction = reduction, overlap = overlap](TcpCommunicator& comm,
                                                          absl::Duration*) -> absl::Status {
                 const int n = comm.size(), r = comm.rank();
                 GradientSyncOptions o;
                 o.padded_elements = PaddedElements(100003, n);
                 o.bucket_elements = 7000;  // many buckets, and a short last one
                 o.reduction = reduction;
                 o.overlap = overlap;
                 auto sync = GradientSync::Create(&comm, o);
                 if (!sync.ok()) return sync.status();
                 std::vector<float> grads(o.padded_elements);
                 for (int step = 0; step < 3; ++step) {
                   for (int64_t i = 0; i < o.padded_elements; ++i) grads[i] = Grad(r, i) + step;
                   (*sync)->Begin(grads.data());
                   // "Backward": layers of 3001 elements finish from the top down.
                   for (int64_t offset = o.padded_elements - 3001; offset > 0; offset -= 3001) {
                     (*sync)->Ready(offset);
                   }
                   absl::Status s = (*sync)->Finish();
                   if (!s.ok()) return s;
                   const state::FlatRange shard = (*sync)->shard();
                   if (shard.size() * n != o.padded_elements || shard.begin != r * shard.size()) {
                     return absl::InternalError(absl::StrCat("shard ", state::RangeString(shard)));
                   }
                   const bool whole = reduction == GradientReduction::kAllReduce;
                   for (int64_t i = whole ? 0 : shard.begin;
                        i < (whole ? o.padded_elements : shard.end); ++i) {
                     float expected = 0;
                     for (int q = 0; q < n; ++q) expected += Grad(q, i) + step;
                     if (grads[i] != expected) {
                       return absl::InternalError(absl::StrCat("step ", step, " element ", i, ": ",
                                                               grads[i], " expected ", expected));
                     }
                   }
                   if ((*sync)->last_step().buckets != (*sync)->num_buckets() ||
                       (n > 1 && (*sync)->last_step().comm_time <= absl::ZeroDuration())) {
                     return absl::InternalError("stats not recorded");
                   }
                 }
                 return CheckBucketCounters(**sync, reduction, r, n, 3,
                                            o.padded_elements * int64_t{sizeof(float)});
               });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  }
}

INSTANTIATE_TEST_SUITE_P(All, GradientSyncTest,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(GradientReduction::kAllReduce,
                                                              GradientReduction::kReduceScatter),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(
                               "world", std::get<0>(info.param), "_",
                               std::get<1>(info.param) == GradientReduction::kAllReduce
                                   ? "allreduce"
                                   : "reducescatter",
                               std::get<2>(info.param) ? "_overlap" : "_sequential");
                         });

TEST(GradientSync, DeadPeerFailsTheStepInsteadOfHanging) {
  MultiProcOptions options;
  options.world_size = 3;
  options.victims = {1};
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    GradientSyncOptions o;
    o.padded_elements = PaddedElements(1 << 20, comm.size());
    o.bucket_elements = 1 << 16;
    o.op_timeout = absl::Seconds(5);
    auto sync = GradientSync::Create(&comm, o);
    if (!sync.ok()) return sync.status();
    std::vector<float> grads(o.padded_elements, 1.0f);
    if (comm.rank() == 1) raise(SIGKILL);
    (*sync)->Begin(grads.data());
    return (*sync)->Finish();
  });
  for (int r : {0, 2}) {
    ASSERT_TRUE(results[r].reported) << r;
    EXPECT_TRUE(absl::IsUnavailable(results[r].status) || absl::IsAborted(results[r].status))
        << "rank " << r << ": " << results[r].status;
  }
}

TEST(GradientSync, RejectsBadOptions) {
  MultiProcOptions options;
  options.world_size = 2;
  auto results = RunRanks(options, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    GradientSyncOptions o;
    o.padded_elements = 100;
    auto sync = GradientSync::Create(&comm, o);
    if (!absl::IsInvalidArgument(sync.status()) ||
        sync.status().message().find("padded_elements") == std::string::npos) {
      return absl::InternalError(sync.status().ToString());
    }
    return absl::OkStatus();
  });
  for (const auto& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
}

}  // namespace
}  // namespace ringmaster::train
