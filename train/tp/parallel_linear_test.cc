#include "train/tp/parallel_linear.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/mesh.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gelu.h"
#include "train/nn/random.h"

namespace ringmaster::train::tp {
namespace {

using ::testing::HasSubstr;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

std::vector<float> Random(uint64_t seed, int64_t n) {
  nn::SplitMix64 rng(seed);
  std::vector<float> v(n);
  nn::FillUniform(rng, 1.0f, absl::MakeSpan(v));
  return v;
}

// ---------------------------------------------------------------------------------------
// The shard layout, without a communicator.

TEST(LinearShardTest, ColumnShardIsRowsOfTheWeight) {
  // W [4, 3] = 0..11; T = 2, rank 1 holds rows 2 and 3 and bias[2..3].
  std::vector<float> w(12), b = {10, 11, 12, 13};
  for (int i = 0; i < 12; ++i) w[i] = static_cast<float>(i);
  absl::StatusOr<LinearShard> s = LinearShard::Create(SplitDimension::kOutput, 3, 4, 2, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->local_out(), 2);
  EXPECT_EQ(s->local_in(), 3);
  EXPECT_EQ(s->offset(), 2);
  std::vector<float> ws(s->weight_elements()), bs(s->bias_elements());
  ASSERT_TRUE(s->TakeWeight(w, absl::MakeSpan(ws)).ok());
  ASSERT_TRUE(s->TakeBias(b, absl::MakeSpan(bs)).ok());
  EXPECT_EQ(ws, (std::vector<float>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(bs, (std::vector<float>{12, 13}));
}

TEST(LinearShardTest, RowShardIsColumnsOfTheWeight) {
  // W [2, 4] = 0..7; T = 2, rank 1 holds columns 2 and 3 of each row and the whole bias.
  std::vector<float> w(8), b = {10, 11};
  for (int i = 0; i < 8; ++i) w[i] = static_cast<float>(i);
  absl::StatusOr<LinearShard> s = LinearShard::Create(SplitDimension::kInput, 4, 2, 2, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->local_out(), 2);
  EXPECT_EQ(s->local_in(), 2);
  EXPECT_EQ(s->offset(), 2);
  std::vector<float> ws(s->weight_elements()), bs(s->bias_elements());
  ASSERT_TRUE(s->TakeWeight(w, absl::MakeSpan(ws)).ok());
  ASSERT_TRUE(s->TakeBias(b, absl::MakeSpan(bs)).ok());
  EXPECT_EQ(ws, (std::vector<float>{2, 3, 6, 7}));
  EXPECT_EQ(bs, (std::vector<float>{10, 11}));
}

TEST(LinearShardTest, PutReassemblesWhatTakeSplit) {
  for (SplitDimension split : {SplitDimension::kOutput, SplitDimension::kInput}) {
    const int64_t in = 6, out = 9, parts = 3;
    const std::vector<float> w = Random(1, in * out), b = Random(2, out);
    std::vector<float> w2(in * out, 0.0f), b2(out, 0.0f);
    for (int r = 0; r < parts; ++r) {
      absl::StatusOr<LinearShard> s = LinearShard::Create(split, in, out, parts, r);
      ASSERT_TRUE(s.ok()) << s.status();
      std::vector<float> ws(s->weight_elements()), bs(s->bias_elements());
      ASSERT_TRUE(s->TakeWeight(w, absl::MakeSpan(ws)).ok());
      ASSERT_TRUE(s->TakeBias(b, absl::MakeSpan(bs)).ok());
      ASSERT_TRUE(s->PutWeight(ws, absl::MakeSpan(w2)).ok());
      ASSERT_TRUE(s->PutBias(bs, absl::MakeSpan(b2)).ok());
    }
    EXPECT_EQ(w2, w) << static_cast<int>(split);
    EXPECT_EQ(b2, b) << static_cast<int>(split);
  }
}

TEST(LinearShardTest, UnevenSplitsAreInvalidAndNameTheDimension) {
  absl::StatusOr<LinearShard> column = LinearShard::Create(SplitDimension::kOutput, 8, 6, 4, 0);
  EXPECT_EQ(column.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(column.status().message()), HasSubstr("out (6)"));
  EXPECT_THAT(std::string(column.status().message()), HasSubstr("T = 4"));
  absl::StatusOr<LinearShard> row = LinearShard::Create(SplitDimension::kInput, 6, 8, 4, 0);
  EXPECT_EQ(row.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(row.status().message()), HasSubstr("in (6)"));
  EXPECT_THAT(std::string(row.status().message()), HasSubstr("T = 4"));
  // The other dimension need not divide.
  EXPECT_TRUE(LinearShard::Create(SplitDimension::kOutput, 6, 8, 4, 3).ok());
  EXPECT_TRUE(LinearShard::Create(SplitDimension::kInput, 8, 6, 4, 3).ok());
  EXPECT_EQ(LinearShard::Create(SplitDimension::kInput, 8, 6, 4, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearShard::Create(SplitDimension::kInput, 0, 6, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinearShardTest, WrongSpanSizesAreInvalid) {
  absl::StatusOr<LinearShard> s = LinearShard::Create(SplitDimension::kInput, 4, 2, 2, 0);
  ASSERT_TRUE(s.ok());
  std::vector<float> w(8), ws(4), small(3);
  absl::Status st = s->TakeWeight(w, absl::MakeSpan(small));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("shard"));
  st = s->PutWeight(ws, absl::MakeSpan(small));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("full weight"));
}

TEST(ParallelLinearTest, NoGroupIsInvalid) {
  ParallelLinearOptions o;
  o.in = 4;
  o.out = 4;
  EXPECT_EQ(ColumnParallelLinear::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowParallelLinear::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Column → GELU → row on T forked ranks against the same two layers unsplit.

// Sizes of the two-layer MLP: x [kN, kIn] → [kN, kHidden] → y [kN, kOut].
constexpr int64_t kN = 5, kIn = 12, kHidden = 16, kOut = 10;

// The tolerance: fp32 layers against a double-precision reference with whole weights, the
// largest |difference| at most 1e-5 times the reference's largest magnitude (the sums have
// at most 16 terms; fp32 rounding is ~1e-7 per term).
constexpr double kTolerance = 1e-5;

// The whole problem, the same on every rank: weights, input and the output's gradient.
struct Problem {
  std::vector<float> w1 = Random(11, kHidden * kIn), b1 = Random(12, kHidden);
  std::vector<float> w2 = Random(13, kOut * kHidden), b2 = Random(14, kOut);
  std::vector<float> x = Random(15, kN * kIn), dy = Random(16, kN * kOut);
};

// The unsplit MLP's output and gradients, in double precision, by plain loops (no shared code
// with the kernels).
struct Reference {
  std::vector<double> y, dx, dw1, db1, dw2, db2;
};

double Gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double GeluGrad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

Reference Unsplit(const Problem& p) {
  Reference r;
  std::vector<double> h(kN * kHidden), a(kN * kHidden), da(kN * kHidden);
  r.y.assign(kN * kOut, 0);
  r.dx.assign(kN * kIn, 0);
  r.dw1.assign(kHidden * kIn, 0);
  r.db1.assign(kHidden, 0);
  r.dw2.assign(kOut * kHidden, 0);
  r.db2.assign(kOut, 0);
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t j = 0; j < kHidden; ++j) {
      double s = p.b1[j];
      for (int64_t k = 0; k < kIn; ++k) s += double{p.x[i * kIn + k]} * p.w1[j * kIn + k];
      h[i * kHidden + j] = s;
      a[i * kHidden + j] = Gelu(s);
    }
    for (int64_t j = 0; j < kOut; ++j) {
      double s = p.b2[j];
      for (int64_t k = 0; k < kHidden; ++k) s += a[i * kHidden + k] * p.w2[j * kHidden + k];
      r.y[i * kOut + j] = s;
    }
  }
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t j = 0; j < kOut; ++j) {
      const double g = p.dy[i * kOut + j];
      r.db2[j] += g;
      for (int64_t k = 0; k < kHidden; ++k) {
        r.dw2[j * kHidden + k] += g * a[i * kHidden + k];
        da[i * kHidden + k] += g * p.w2[j * kHidden + k];
      }
    }
    for (int64_t k = 0; k < kHidden; ++k) {
      const double g = da[i * kHidden + k] * GeluGrad(h[i * kHidden + k]);
      r.db1[k] += g;
      for (int64_t m = 0; m < kIn; ++m) {
        r.dw1[k * kIn + m] += g * p.x[i * kIn + m];
        r.dx[i * kIn + m] += g * p.w1[k * kIn + m];
      }
    }
  }
  return r;
}

absl::Status Compare(const std::string& what, const std::vector<float>& got,
                     const std::vector<double>& want) {
  if (got.size() != want.size()) return Fail(absl::StrCat(what, ": size ", got.size()));
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  if (worst > kTolerance * scale) {
    return Fail(absl::StrCat(what, ": differs by ", worst, " (largest magnitude ", scale,
                             ", allowed ", kTolerance * scale, ")"));
  }
  return absl::OkStatus();
}

// The all-reduces (and every other operation) between two snapshots of the counters:
// `all_reduces` all-reduces, nothing else; with T > 1 they carried data.
absl::Status ExpectTraffic(const std::string& pass, const comm::Counters& before,
                           const comm::Counters& after, int group_size) {
  for (int k = 0; k < comm::kNumOpKinds; ++k) {
    const auto kind = static_cast<comm::OpKind>(k);
    const uint64_t calls = after.of(kind).calls - before.of(kind).calls;
    const uint64_t want = kind == comm::OpKind::kAllReduce ? 1 : 0;
    if (calls != want) {
      return Fail(absl::StrCat(pass, ": ", calls, " ", comm::OpKindName(kind), " calls, expected ",
                               want));
    }
  }
  const uint64_t sent = after.of(comm::OpKind::kAllReduce).bytes_sent -
                        before.of(comm::OpKind::kAllReduce).bytes_sent;
  if ((group_size > 1) != (sent > 0)) {
    return Fail(absl::StrCat(pass, ": the all-reduce sent ", sent, " bytes at T = ", group_size));
  }
  return absl::OkStatus();
}

absl::Status RunMlp(comm::Communicator& group) {
  const int t = group.size();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const Problem p;
  const Reference want = Unsplit(p);

  ParallelLinearOptions o1{.in = kIn, .out = kHidden, .group = &group};
  ParallelLinearOptions o2{.in = kHidden, .out = kOut, .group = &group};
  RM_ASSIGN_OR_RETURN(ColumnParallelLinear up, ColumnParallelLinear::Create(o1));
  RM_ASSIGN_OR_RETURN(RowParallelLinear down, RowParallelLinear::Create(o2));
  const LinearShard& s1 = up.shard();
  const LinearShard& s2 = down.shard();
  const int64_t local_hidden = s1.local_out();
  if (local_hidden != kHidden / t || s2.local_in() != local_hidden) {
    return Fail(absl::StrCat("local hidden ", local_hidden, " and ", s2.local_in()));
  }

  // This rank's shards of the parameters.
  std::vector<float> w1(s1.weight_elements()), b1(s1.bias_elements());
  std::vector<float> w2(s2.weight_elements()), b2(s2.bias_elements());
  RM_RETURN_IF_ERROR(s1.TakeWeight(p.w1, absl::MakeSpan(w1)));
  RM_RETURN_IF_ERROR(s1.TakeBias(p.b1, absl::MakeSpan(b1)));
  RM_RETURN_IF_ERROR(s2.TakeWeight(p.w2, absl::MakeSpan(w2)));
  RM_RETURN_IF_ERROR(s2.TakeBias(p.b2, absl::MakeSpan(b2)));

  // Forward: one all-reduce (the row layer's).
  std::vector<float> h(kN * local_hidden), a(kN * local_hidden), y(kN * kOut);
  const comm::Counters before_forward = group.counters();
  up.Forward(p.x.data(), w1.data(), b1.data(), h.data(), kN);
  kernels::GeluForward(a.data(), h.data(), kN * local_hidden);
  RM_RETURN_IF_ERROR(down.Forward(a.data(), w2.data(), b2.data(), y.data(), kN));
  const comm::Counters after_forward = group.counters();
  RM_RETURN_IF_ERROR(ExpectTraffic("forward", before_forward, after_forward, t));
  RM_RETURN_IF_ERROR(Compare("output", y, want.y));

  // Backward: one all-reduce (the column layer's input gradient).
  std::vector<float> da(kN * local_hidden), dh(kN * local_hidden), dx(kN * kIn);
  std::vector<float> dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  down.BackwardInput(p.dy.data(), w2.data(), da.data(), kN);
  down.BackwardWeights(a.data(), p.dy.data(), dw2.data(), db2.data(), kN,
                       kernels::OutputMode::kOverwrite);
  kernels::GeluBackward(dh.data(), h.data(), da.data(), kN * local_hidden);
  up.BackwardWeights(p.x.data(), dh.data(), dw1.data(), db1.data(), kN,
                     kernels::OutputMode::kOverwrite);
  RM_RETURN_IF_ERROR(up.BackwardInput(dh.data(), w1.data(), dx.data(), kN));
  RM_RETURN_IF_ERROR(ExpectTraffic("backward", after_forward, group.counters(), t));
  RM_RETURN_IF_ERROR(Compare("input gradient", dx, want.dx));

  // The shards' gradients, reassembled, are the unsplit layers'; so are the weights.
  std::vector<float> full1(kHidden * kIn), full_b1(kHidden), full2(kOut * kHidden), full_b2(kOut);
  RM_RETURN_IF_ERROR(s1.GatherWeight(group, dw1, absl::MakeSpan(full1), deadline));
  RM_RETURN_IF_ERROR(s1.GatherBias(group, db1, absl::MakeSpan(full_b1), deadline));
  RM_RETURN_IF_ERROR(s2.GatherWeight(group, dw2, absl::MakeSpan(full2), deadline));
  RM_RETURN_IF_ERROR(s2.GatherBias(group, db2, absl::MakeSpan(full_b2), deadline));
  RM_RETURN_IF_ERROR(Compare("up weight gradient", full1, want.dw1));
  RM_RETURN_IF_ERROR(Compare("up bias gradient", full_b1, want.db1));
  RM_RETURN_IF_ERROR(Compare("down weight gradient", full2, want.dw2));
  RM_RETURN_IF_ERROR(Compare("down bias gradient", full_b2, want.db2));
  RM_RETURN_IF_ERROR(s1.GatherWeight(group, w1, absl::MakeSpan(full1), deadline));
  RM_RETURN_IF_ERROR(s2.GatherWeight(group, w2, absl::MakeSpan(full2), deadline));
  if (full1 != p.w1 || full2 != p.w2) return Fail("the gathered weights differ from the whole");
  return absl::OkStatus();
}

void ExpectOkOnRanks(int world, const comm::testing::RankFn& fn) {
  comm::testing::MultiProcOptions options;
  options.world_size = world;
  const std::vector<comm::testing::RankResult> results = comm::testing::RunRanks(options, fn);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "T = " << world << ", rank " << r << ": "
                                        << results[r].status;
  }
}

TEST(ParallelLinearTest, ColumnThenRowEqualsTheUnsplitLayers) {
  for (int t : {1, 2, 4}) {
    ExpectOkOnRanks(t, [](comm::TcpCommunicator& comm, absl::Duration*) { return RunMlp(comm); });
  }
}

// The tp groups of a mesh (dp 2 x tp 2 over 4 ranks: {0, 1} and {2, 3}), each on its own.
TEST(ParallelLinearTest, WorksOnTheTensorParallelGroupsOfAMesh) {
  ExpectOkOnRanks(4, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(comm::Mesh mesh, comm::Mesh::Create(4, {{"dp", 2}, {"tp", 2}}));
    RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> tp,
                        mesh.Group(comm, comm::MeshDim::kTp, absl::Now() + absl::Seconds(30)));
    if (tp->size() != 2) return Fail(absl::StrCat("tp group of ", tp->size()));
    return RunMlp(*tp);
  });
}

// A collective's error reaches the caller: after Abort() the row layer's forward and the
// column layer's input backward return ABORTED.
TEST(ParallelLinearTest, CommunicatorErrorsAreReturned) {
  ExpectOkOnRanks(2, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(ColumnParallelLinear up,
                        ColumnParallelLinear::Create({.in = 4, .out = 4, .group = &comm}));
    RM_ASSIGN_OR_RETURN(RowParallelLinear down,
                        RowParallelLinear::Create({.in = 4, .out = 4, .group = &comm}));
    RM_RETURN_IF_ERROR(comm.Barrier(absl::Now() + absl::Seconds(30)));
    comm.Abort();
    std::vector<float> x(8, 1.0f), w(8, 1.0f), y(8);
    const absl::Status forward = down.Forward(x.data(), w.data(), nullptr, y.data(), 2);
    const absl::Status backward = up.BackwardInput(x.data(), w.data(), y.data(), 2);
    if (!absl::IsAborted(forward) || !absl::IsAborted(backward)) {
      return Fail(absl::StrCat("expected ABORTED twice, got ", forward.ToString(), " and ",
                               backward.ToString()));
    }
    return absl::OkStatus();
  });
}

TEST(ParallelLinearTest, UnevenSplitsAreInvalidOnAGroup) {
  ExpectOkOnRanks(4, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    absl::StatusOr<ColumnParallelLinear> column =
        ColumnParallelLinear::Create({.in = 8, .out = 6, .group = &comm});
    absl::StatusOr<RowParallelLinear> row =
        RowParallelLinear::Create({.in = 6, .out = 8, .group = &comm});
    for (const absl::Status& s : {column.status(), row.status()}) {
      if (!absl::IsInvalidArgument(s) ||
          !absl::StrContains(s.message(), "(6) is not a multiple of the tensor-parallel size T = 4")) {
        return Fail(absl::StrCat("expected INVALID_ARGUMENT, got ", s.ToString()));
      }
    }
    if (!absl::StrContains(column.status().message(), "out (6)") ||
        !absl::StrContains(row.status().message(), "in (6)")) {
      return Fail("the errors do not name the dimension");
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace ringmaster::train::tp
