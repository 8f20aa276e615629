#include "train/parallel_strategy.h"

#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/tcp/tcp_communicator.h"
#include "gtest/gtest.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::ExpectOkOnRanks;

// Table elements: not a multiple of world × 16, so that the last shard holds padding.
constexpr int64_t kElements = 10007;

// Rank r's gradient at flat index i before the reduction, and the value the update gives
// parameter i.
float Grad(int r, int64_t i) { return static_cast<float>((r + 1) * (i % 89) - 2 * r); }
float Updated(int64_t i) { return static_cast<float>(i % 101) * 0.5f + 1; }

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// Gathers every rank's [begin, end) of `range`.
absl::StatusOr<std::vector<int64_t>> GatherRanges(TcpCommunicator& comm, state::FlatRange range) {
  int64_t mine[2] = {range.begin, range.end};
  std::vector<int64_t> all(2 * comm.size());
  absl::Status s =
      comm.AllGather(mine, all.data(), 2, DataType::kInt64, absl::Now() + absl::Seconds(30));
  if (!s.ok()) return s;
  return all;
}

// The ranks' ranges lie one after another and cover [0, kElements) exactly.
absl::Status CheckTiling(const std::vector<int64_t>& ranges, const char* what) {
  int64_t next = 0;
  for (size_t r = 0; r < ranges.size() / 2; ++r) {
    if (ranges[2 * r] != next || ranges[2 * r + 1] < ranges[2 * r]) {
      return Fail(absl::StrCat(what, " of rank ", r, " is [", ranges[2 * r], ", ",
                               ranges[2 * r + 1], "), expected it to begin at ", next));
    }
    next = ranges[2 * r + 1];
  }
  if (next != kElements) return Fail(absl::StrCat(what, " ranges end at ", next));
  return absl::OkStatus();
}

// Data parallelism updates and saves one range each, in place in the step's buffers.
state::FlatRange Owned(const ParallelStrategy& s) {
  EXPECT_EQ(s.update_pieces().size(), 1u);
  EXPECT_EQ(s.update_pieces()[0].at, 0);
  EXPECT_EQ(s.update_pieces()[0].range, s.update_window());
  return s.update_window();
}
state::FlatRange Saved(const ParallelStrategy& s) {
  EXPECT_EQ(s.saved_pieces().size(), 1u);
  EXPECT_EQ(s.saved_pieces()[0].at, s.saved_pieces()[0].range.begin);
  return s.saved_pieces()[0].range;
}

// The ranges this rank owns and saves, against those of the others.
absl::Status CheckRanges(TcpCommunicator& comm, const ParallelStrategy& s, int zero) {
  absl::StatusOr<std::vector<int64_t>> owned = GatherRanges(comm, Owned(s));
  if (!owned.ok()) return owned.status();
  absl::StatusOr<std::vector<int64_t>> saved = GatherRanges(comm, Saved(s));
  if (!saved.ok()) return saved.status();
  if (zero == 0) {
    // Every rank owns everything.
    if (Owned(s) != state::FlatRange{0, kElements}) {
      return Fail(absl::StrCat("ZeRO-0 owns ", state::RangeString(Owned(s))));
    }
  } else if (absl::Status t = CheckTiling(*owned, "owned"); !t.ok()) {
    return t;
  }
  return CheckTiling(*saved, "saved");
}

// sum() adds up across the ranks that share an update; with ZeRO-0 each rank's sums are
// global already.
absl::Status CheckSum(TcpCommunicator& comm, const ParallelStrategy& s, int zero) {
  const int n = comm.size(), r = comm.rank();
  std::vector<double> values = {static_cast<double>(r + 1), 10};
  if (absl::Status st = s.sum()(absl::MakeSpan(values)); !st.ok()) return st;
  const std::vector<double> want = zero == 0 ? std::vector<double>{static_cast<double>(r + 1), 10}
                                             : std::vector<double>{n * (n + 1) / 2.0, 10.0 * n};
  if (values != want) {
    return Fail(absl::StrCat("sum gave ", values[0], ", ", values[1], "; expected ", want[0], ", ",
                             want[1]));
  }
  return absl::OkStatus();
}

// One step's gradients, released from the top down as a backward would, reduced: this rank
// holds their sum over the ranks on owned().
absl::Status CheckReduce(TcpCommunicator& comm, ParallelStrategy& s) {
  const int n = comm.size(), r = comm.rank();
  std::vector<float> grads(s.local_elements());
  for (int64_t i = 0; i < kElements; ++i) grads[i] = Grad(r, i);
  s.BeginGradients(grads.data(), /*measure_local_norm=*/false);
  for (int64_t offset = kElements - 1500; offset > 0; offset -= 1500) s.GradientsReady(offset);
  if (absl::Status st = s.ReduceGradients(); !st.ok()) return st;
  for (int64_t i = Owned(s).begin; i < Owned(s).end; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += Grad(q, i);
    if (grads[i] != want) {
      return Fail(absl::StrCat("gradient ", i, " is ", grads[i], ", expected ", want));
    }
  }
  return absl::OkStatus();
}

// Each rank updates only owned(); afterwards every rank's parameters are whole.
absl::Status CheckAfterStep(TcpCommunicator& comm, ParallelStrategy& s) {
  const int r = comm.rank();
  std::vector<float> params(s.local_elements(), -1.0f - r);  // stale, and rank-specific
  for (int64_t i = Owned(s).begin; i < Owned(s).end; ++i) params[i] = Updated(i);
  if (absl::Status st = s.AfterOptimizerStep(absl::MakeSpan(params)); !st.ok()) return st;
  for (int64_t i = 0; i < kElements; ++i) {
    if (params[i] != Updated(i)) {
      return Fail(absl::StrCat("parameter ", i, " is ", params[i], ", expected ", Updated(i)));
    }
  }
  return absl::OkStatus();
}

// world size, ZeRO stage
class DataParallelTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DataParallelTest, OwnsReducesAndGathersItsPart) {
  const auto [world, zero] = GetParam();
  ExpectOkOnRanks(world, [zero = zero](TcpCommunicator& comm) -> absl::Status {
    DataParallelOptions o;
    o.elements = kElements;
    o.zero_stage = zero;
    o.bucket_mb = 0.01;  // several buckets
    absl::StatusOr<std::unique_ptr<ParallelStrategy>> s = CreateDataParallel(&comm, &comm, o);
    if (!s.ok()) return s.status();
    if ((*s)->local_elements() != PaddedElements(kElements, comm.size())) {
      return Fail(absl::StrCat("padded_elements ", (*s)->local_elements()));
    }
    if ((*s)->whole_state_on_every_rank() != (zero == 0)) return Fail("whole state");
    if ((*s)->Describe().find(absl::StrCat("ZeRO-", zero)) != 0) {
      return Fail((*s)->Describe());
    }
    if (absl::Status st = (*s)->MaterializeParameters({}); !st.ok()) return st;
    for (auto check : {CheckRanges, CheckSum}) {
      if (absl::Status st = check(comm, **s, zero); !st.ok()) return st;
    }
    for (auto check : {CheckReduce, CheckAfterStep}) {
      if (absl::Status st = check(comm, **s); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(All, DataParallelTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return absl::StrCat("world", std::get<0>(info.param), "_zero",
                                               std::get<1>(info.param));
                         });

TEST(DataParallel, RejectsAZeroStageItDoesNotHave) {
  ExpectOkOnRanks(1, [](TcpCommunicator& comm) -> absl::Status {
    for (int zero : {-1, 3}) {
      DataParallelOptions o;
      o.elements = kElements;
      o.zero_stage = zero;
      absl::StatusOr<std::unique_ptr<ParallelStrategy>> s = CreateDataParallel(&comm, &comm, o);
      if (!absl::IsInvalidArgument(s.status()) ||
          s.status().message().find("parallelism.zero_stage") == std::string::npos) {
        return Fail(absl::StrCat("zero_stage ", zero, ": ", s.status().ToString()));
      }
    }
    DataParallelOptions o;
    o.elements = kElements;
    if (!absl::IsInvalidArgument(CreateDataParallel(nullptr, &comm, o).status())) {
      return Fail("a null communicator was taken");
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace ringmaster::train
