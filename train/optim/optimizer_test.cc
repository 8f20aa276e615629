#include "train/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/optim/testing.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;

// ---- Double-precision references, written from the published formulas ----

struct Reference {
  std::vector<double> params;
  std::map<std::string, std::vector<double>> state;  // by the optimizer's buffer names
  std::vector<bool> decay;                           // per tensor
};

// The test's own statement of the default rule: weights (>= 2 dims) decay, 1-D do not.
std::vector<bool> MatricesDecay(const state::TensorTable& table) {
  std::vector<bool> decay;
  for (const state::TensorSpec& t : table.tensors()) decay.push_back(t.shape.size() >= 2);
  return decay;
}

using ReferenceStep = std::function<void(const state::TensorTable& table, int64_t step, double lr,
                                         const state::FlatBuffer& grads, Reference& ref)>;

// Calls fn(tensor, its weight decay) for every tensor of the table.
void ForEachTensor(const state::TensorTable& table, const Reference& ref, double weight_decay,
                   const std::function<void(const state::TensorSpec& t, double wd)>& fn) {
  for (int i = 0; i < table.size(); ++i) fn(table.tensor(i), ref.decay[i] ? weight_decay : 0);
}

// A state buffer of the reference, as large as the parameters, zero at first.
std::vector<double>& StateOf(Reference& ref, const std::string& name) {
  std::vector<double>& s = ref.state[name];
  s.resize(ref.params.size());
  return s;
}

// torch.optim.SGD, dampening 0.
ReferenceStep SgdReference(double momentum, bool nesterov, double weight_decay) {
  return [=](const state::TensorTable& table, int64_t step, double lr,
             const state::FlatBuffer& grads, Reference& ref) {
    ForEachTensor(table, ref, weight_decay, [&](const state::TensorSpec& t, double wd) {
      for (int64_t k = t.offset; k < t.offset + t.numel; ++k) {
        double d = grads.data()[k] + wd * ref.params[k];
        if (momentum != 0) {
          double& buf = StateOf(ref, "momentum")[k];
          buf = step == 1 ? d : momentum * buf + d;
          d = nesterov ? d + momentum * buf : buf;
        }
        ref.params[k] -= lr * d;
      }
    });
  };
}

// Advances the Adam moments of flat element k by gradient g; returns
// m_hat / (sqrt(v_hat) + eps).
double AdamDirection(double beta1, double beta2, double eps, int64_t step, double g, int64_t k,
                     Reference& ref) {
  double& m = StateOf(ref, "exp_avg")[k];
  double& v = StateOf(ref, "exp_avg_sq")[k];
  m = beta1 * m + (1 - beta1) * g;
  v = beta2 * v + (1 - beta2) * g * g;
  const double m_hat = m / (1 - std::pow(beta1, step));
  const double v_hat = v / (1 - std::pow(beta2, step));
  return m_hat / (std::sqrt(v_hat) + eps);
}

// torch.optim.AdamW.
ReferenceStep AdamWReference(double beta1, double beta2, double eps, double weight_decay) {
  return [=](const state::TensorTable& table, int64_t step, double lr,
             const state::FlatBuffer& grads, Reference& ref) {
    ForEachTensor(table, ref, weight_decay, [&](const state::TensorSpec& t, double wd) {
      for (int64_t k = t.offset; k < t.offset + t.numel; ++k) {
        ref.params[k] *= 1 - lr * wd;
        ref.params[k] -= lr * AdamDirection(beta1, beta2, eps, step, grads.data()[k], k, ref);
      }
    });
  };
}

// You et al. 2019, algorithm 2, with phi(z) = clamp(z, lo, hi).
ReferenceStep LambReference(double beta1, double beta2, double eps, double weight_decay, double lo,
                            double hi) {
  return [=](const state::TensorTable& table, int64_t step, double lr,
             const state::FlatBuffer& grads, Reference& ref) {
    ForEachTensor(table, ref, weight_decay, [&](const state::TensorSpec& t, double wd) {
      std::vector<double> r;
      double w_norm = 0, r_norm = 0;
      for (int64_t k = t.offset; k < t.offset + t.numel; ++k) {
        r.push_back(AdamDirection(beta1, beta2, eps, step, grads.data()[k], k, ref) +
                    wd * ref.params[k]);
        w_norm += ref.params[k] * ref.params[k];
        r_norm += r.back() * r.back();
      }
      w_norm = std::sqrt(w_norm);
      r_norm = std::sqrt(r_norm);
      const double ratio =
          (w_norm == 0 || r_norm == 0) ? 1.0 : std::min(std::max(w_norm, lo), hi) / r_norm;
      for (int64_t k = t.offset; k < t.offset + t.numel; ++k) {
        ref.params[k] -= lr * ratio * r[k - t.offset];
      }
    });
  };
}

// ---- The runs under test ----

constexpr int kSteps = 5;

double LrAt(int64_t step) { return 0.02 * (1 + step % 3); }  // varies, like a schedule

struct Case {
  std::string name;
  OptimizerOptions options;
  ReferenceStep reference;
  std::vector<std::string> state_names;
  // SGD and AdamW are element-wise: any sharding gives the same bits.
  bool bitwise_sharding = true;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  return {
      {"Sgd", SgdOptions{.weight_decay = 0.1}, SgdReference(0, false, 0.1), {}},
      {"SgdMomentum",
       SgdOptions{.momentum = 0.9, .weight_decay = 0.05},
       SgdReference(0.9, false, 0.05),
       {"momentum"}},
      {"SgdNesterov",
       SgdOptions{.momentum = 0.8, .nesterov = true, .weight_decay = 0.05},
       SgdReference(0.8, true, 0.05),
       {"momentum"}},
      {"AdamW",
       AdamWOptions{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1},
       AdamWReference(0.9, 0.99, 1e-8, 0.1),
       {"exp_avg", "exp_avg_sq"}},
      {"Lamb",
       LambOptions{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.01},
       LambReference(0.9, 0.999, 1e-6, 0.01, 0, kInf),
       {"exp_avg", "exp_avg_sq"},
       false},
      {"LambClampedWeightNorm",
       LambOptions{.weight_decay = 0.1, .min_weight_norm = 2.5, .max_weight_norm = 3},
       LambReference(0.9, 0.999, 1e-6, 0.1, 2.5, 3),
       {"exp_avg", "exp_avg_sq"},
       false},
  };
}

// The model's parameters at the start: random, with head.bias zero (as biases start), which
// gives LAMB a tensor with ||w|| = 0 on the first step.
state::FlatBuffer InitialParams(const state::TensorTable& table) {
  state::FlatBuffer params(table.total_elements());
  testing::FillRandom(table, 7, 0.5f, params);
  for (float& x : params.tensor(table.tensor(table.Find("head.bias").value()))) x = 0;
  return params;
}

// The gradients of step `step` (1-based), the same on every rank.
std::vector<state::FlatBuffer> Gradients(const state::TensorTable& table, int steps) {
  std::vector<state::FlatBuffer> grads;
  for (int s = 1; s <= steps; ++s) {
    grads.emplace_back(table.total_elements());
    testing::FillRandom(table, 100 + s, 1.0f, grads.back());
  }
  return grads;
}

// Saved optimizer state: the chunks every rank wrote, as a checkpoint keeps them.
struct Chunk {
  std::string name;
  state::FlatRange range;
  std::vector<float> data;
};

class OptimizerTest : public ::testing::TestWithParam<Case> {
 protected:
  OptimizerTest() : table_(testing::SmallModelTable()), params_(InitialParams(table_)) {}

  // Runs steps [first, last] with the flat space cut into `ranges`, one thread per range, on
  // params_. Restores `restore` (chunks of any ranges) at `restore_step` first when that is
  // not 0; returns the state of every range afterwards.
  std::vector<Chunk> RunSharded(const std::vector<state::FlatRange>& ranges, int first, int last,
                                const std::vector<Chunk>& restore = {}, int64_t restore_step = 0) {
    const std::vector<state::FlatBuffer> grads = Gradients(table_, last);
    std::vector<std::vector<Chunk>> saved(ranges.size());
    testing::FakeRanks group(static_cast<int>(ranges.size()));
    group.Run([&](int rank, const SumAcrossRanks& sum) {
      const state::FlatRange range = ranges[rank];
      auto opt = CreateOptimizer(table_, range, GetParam().options);
      ASSERT_TRUE(opt.ok()) << opt.status();
      Optimizer& optimizer = **opt;
      EXPECT_EQ(optimizer.state_bytes(),
                static_cast<int64_t>(GetParam().state_names.size()) * range.size() * 4);
      EXPECT_EQ(optimizer.range(), range);
      EXPECT_EQ(optimizer.placement(), (std::vector<state::PlacedRange>{{range, 0}}));
      EXPECT_EQ(optimizer.local_elements(), range.size());
      if (restore_step > 0) Restore(restore, restore_step, optimizer);
      for (int s = first; s <= last; ++s) {
        ASSERT_TRUE(optimizer
                        .Step(LrAt(s), state::Slice(params_.span(), range),
                              state::Slice(grads[s - 1].span(), range), sum)
                        .ok());
      }
      EXPECT_EQ(optimizer.step(), last);
      for (const StateBuffer& b : optimizer.state_buffers()) {
        EXPECT_EQ(b.range, range);
        EXPECT_EQ(static_cast<int64_t>(b.data.size()), range.size()) << "moments are range-sized";
        saved[rank].push_back({b.name, b.range, {b.data.begin(), b.data.end()}});
      }
    });
    std::vector<Chunk> all;
    for (auto& chunks : saved) all.insert(all.end(), chunks.begin(), chunks.end());
    return all;
  }

  // Runs steps 1..kSteps with `world` ranks, each holding its testing::UnitShardOf `units`
  // in local buffers whose gaps hold sentinels (NaN gradients there would reach any
  // element they were read into). Checks what each optimizer reports of its placement, that
  // the gaps of params and state are untouched, and that state_buffers() lists the
  // non-empty pieces. Writes the pieces' parameters back into params_; returns the state
  // of every piece.
  std::vector<Chunk> RunPlaced(const std::vector<state::FlatRange>& units, int world) {
    const std::vector<state::FlatBuffer> grads = Gradients(table_, kSteps);
    const std::vector<std::string>& names = GetParam().state_names;
    std::vector<std::vector<Chunk>> saved(world);
    testing::FakeRanks group(world);
    group.Run([&](int rank, const SumAcrossRanks& sum) {
      const testing::UnitShard shard = testing::UnitShardOf(units, world, rank);
      const std::vector<bool> gap = Gaps(shard);
      auto opt = CreateOptimizer(table_, shard.pieces, shard.local_elements, GetParam().options);
      ASSERT_TRUE(opt.ok()) << opt.status();
      Optimizer& optimizer = **opt;
      EXPECT_EQ(optimizer.placement(), shard.pieces);
      EXPECT_EQ(optimizer.local_elements(), shard.local_elements);
      EXPECT_EQ(optimizer.range(),
                (state::FlatRange{shard.pieces.front().range.begin, shard.pieces.back().range.end}));
      EXPECT_EQ(optimizer.state_bytes(),
                static_cast<int64_t>(names.size()) * shard.local_elements * 4);

      std::vector<float> params = ToLocal(params_.span(), shard, kParamGap);
      for (int s = 1; s <= kSteps; ++s) {
        const std::vector<float> g = ToLocal(grads[s - 1].span(), shard, std::nanf(""));
        ASSERT_TRUE(optimizer.Step(LrAt(s), absl::MakeSpan(params), g, sum).ok());
      }
      for (size_t k = 0; k < params.size(); ++k) {
        if (gap[k]) {
          ASSERT_EQ(params[k], kParamGap) << "rank " << rank << " gap element " << k;
        }
      }
      for (const state::PlacedRange& p : shard.pieces) {
        std::copy_n(params.begin() + p.at, p.range.size(), params_.data() + p.range.begin);
      }

      // Name-major, one per non-empty piece, each the piece's part of a local-sized buffer.
      std::vector<state::PlacedRange> listed;
      for (const state::PlacedRange& p : shard.pieces) {
        if (p.range.size() > 0) listed.push_back(p);
      }
      const std::vector<StateBuffer> buffers = optimizer.state_buffers();
      ASSERT_EQ(buffers.size(), names.size() * listed.size()) << "rank " << rank;
      for (size_t n = 0; n < names.size(); ++n) {
        const float* base = buffers[n * listed.size()].data.data() - listed[0].at;
        for (size_t i = 0; i < listed.size(); ++i) {
          const StateBuffer& b = buffers[n * listed.size() + i];
          EXPECT_EQ(b.name, names[n]);
          EXPECT_EQ(b.range, listed[i].range);
          EXPECT_EQ(b.data.data(), base + listed[i].at) << b.name << " piece " << i;
          EXPECT_EQ(static_cast<int64_t>(b.data.size()), listed[i].range.size());
          saved[rank].push_back({b.name, b.range, {b.data.begin(), b.data.end()}});
        }
        for (size_t k = 0; k < gap.size(); ++k) {
          if (gap[k]) {
            ASSERT_EQ(base[k], 0.0f) << names[n] << " of rank " << rank << " gap " << k;
          }
        }
      }
    });
    const bool lamb = std::holds_alternative<LambOptions>(GetParam().options);
    EXPECT_EQ(group.rounds(), lamb ? kSteps : 0) << "one sum per step, LAMB only";
    std::vector<Chunk> all;
    for (auto& chunks : saved) all.insert(all.end(), chunks.begin(), chunks.end());
    return all;
  }

  static constexpr float kParamGap = -777.25f;

  // Which local offsets belong to no piece.
  static std::vector<bool> Gaps(const testing::UnitShard& shard) {
    std::vector<bool> gap(shard.local_elements, true);
    for (const state::PlacedRange& p : shard.pieces) {
      std::fill_n(gap.begin() + p.at, p.range.size(), false);
    }
    return gap;
  }

  // The pieces' elements of a flat buffer in a local buffer whose gaps hold `gap_value`.
  static std::vector<float> ToLocal(absl::Span<const float> flat, const testing::UnitShard& shard,
                                    float gap_value) {
    std::vector<float> local(shard.local_elements, gap_value);
    for (const state::PlacedRange& p : shard.pieces) {
      std::copy_n(flat.begin() + p.range.begin, p.range.size(), local.begin() + p.at);
    }
    return local;
  }

  // Checkpoint resharding: each buffer takes, from every saved chunk of its name, the
  // intersection of the chunk's range with its own.
  static void Restore(const std::vector<Chunk>& chunks, int64_t step, Optimizer& optimizer) {
    for (const StateBuffer& b : optimizer.state_buffers()) {
      int64_t restored = 0;
      for (const Chunk& c : chunks) {
        const int64_t begin = std::max(c.range.begin, b.range.begin);
        const int64_t end = std::min(c.range.end, b.range.end);
        if (c.name != b.name || begin >= end) continue;
        std::copy(c.data.begin() + (begin - c.range.begin), c.data.begin() + (end - c.range.begin),
                  b.data.begin() + (begin - b.range.begin));
        restored += end - begin;
      }
      EXPECT_EQ(restored, b.range.size()) << b.name;
    }
    ASSERT_TRUE(optimizer.RestoreStep(step).ok());
  }

  // Joins saved chunks into whole-table buffers by name.
  std::map<std::string, std::vector<float>> Join(const std::vector<Chunk>& chunks) const {
    std::map<std::string, std::vector<float>> joined;
    for (const Chunk& c : chunks) {
      std::vector<float>& all = joined[c.name];
      all.resize(table_.total_elements());
      std::copy(c.data.begin(), c.data.end(), all.begin() + c.range.begin);
    }
    return joined;
  }

  const state::TensorTable table_;
  state::FlatBuffer params_;
};

void ExpectNear(absl::Span<const float> got, const std::vector<double>& want, double rel,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * (1e-2 + std::abs(want[i]))) << what << " element " << i;
  }
}

void ExpectSame(absl::Span<const float> got, absl::Span<const float> want, bool bitwise,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bitwise) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
          << what << " element " << i << ": " << got[i] << " vs " << want[i];
    } else {
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << what << " element " << i;
    }
  }
}

TEST_P(OptimizerTest, MatchesDoublePrecisionReference) {
  Reference ref{{params_.data(), params_.data() + params_.size()}, {}, MatricesDecay(table_)};
  const std::vector<state::FlatBuffer> grads = Gradients(table_, kSteps);
  for (int s = 1; s <= kSteps; ++s) GetParam().reference(table_, s, LrAt(s), grads[s - 1], ref);

  const std::vector<Chunk> state = RunSharded({state::FullRange(table_)}, 1, kSteps);
  ExpectNear(params_.span(), ref.params, 2e-5, "params");
  // The updates moved every tensor: the test would notice a no-op.
  for (const state::TensorSpec& t : table_.tensors()) {
    EXPECT_GT(std::abs(ref.params[t.offset] - InitialParams(table_).data()[t.offset]), 1e-4)
        << t.name;
  }
  const auto joined = Join(state);
  ASSERT_EQ(joined.size(), ref.state.size());
  for (const auto& [name, values] : ref.state) {
    ASSERT_TRUE(joined.contains(name)) << name;
    ExpectNear(joined.at(name), values, 2e-5, name);
  }
}

TEST_P(OptimizerTest, ShardedMatchesUnshardedForOneToFiveShards) {
  RunSharded({state::FullRange(table_)}, 1, kSteps);
  const state::FlatBuffer want = std::move(params_);
  for (int shards = 1; shards <= 5; ++shards) {
    params_ = InitialParams(table_);
    RunSharded(testing::Shards(table_, shards), 1, kSteps);
    ExpectSame(params_.span(), want.span(), GetParam().bitwise_sharding,
               absl::StrCat(shards, " shards"));
  }
}

TEST_P(OptimizerTest, CheckpointReshardedFromTwoToThreeRanksContinuesTheSameRun) {
  const std::vector<Chunk> uninterrupted_state = RunSharded({state::FullRange(table_)}, 1, 4);
  const state::FlatBuffer want = std::move(params_);

  params_ = InitialParams(table_);
  const std::vector<Chunk> saved = RunSharded(testing::Shards(table_, 2), 1, 2);
  const std::vector<Chunk> resumed_state =
      RunSharded(testing::Shards(table_, 3), 3, 4, saved, /*restore_step=*/2);

  const bool bitwise = GetParam().bitwise_sharding;
  ExpectSame(params_.span(), want.span(), bitwise, "params");
  const auto resumed = Join(resumed_state);
  for (const auto& [name, values] : Join(uninterrupted_state)) {
    ExpectSame(resumed.at(name), values, bitwise, name);
  }
}

TEST_P(OptimizerTest, EmptyRangeStillJoinsTheSums) {
  RunSharded({state::FullRange(table_)}, 1, kSteps);
  const state::FlatBuffer want = std::move(params_);
  params_ = InitialParams(table_);
  const int64_t total = table_.total_elements();
  RunSharded({{0, 40}, {40, 40}, {40, total}}, 1, kSteps);
  ExpectSame(params_.span(), want.span(), GetParam().bitwise_sharding, "params");
}

// Unit layouts over SmallModelTable for RunPlaced: units of whole tensors (as ZeRO-3's
// wrapping makes them), and units cut inside tensors, so that conv.weight [112, 133) has
// two pieces on one rank (its part of the small middle unit and its part of the next).
std::vector<std::pair<std::string, std::vector<state::FlatRange>>> UnitLayouts(
    const state::TensorTable& table) {
  return {{"units of 2+2+2 tensors", testing::WholeTensorUnits(table, {2, 2, 2})},
          {"units of 3+3 tensors", testing::WholeTensorUnits(table, {3, 3})},
          {"units cut inside tensors", {{0, 115}, {115, 125}, {125, 160}}}};
}

TEST(UnitLayouts, CutTensorsTheWayTheTestsSay) {
  const state::TensorTable table = testing::SmallModelTable();
  EXPECT_EQ(testing::WholeTensorUnits(table, {2, 2, 2}),
            (std::vector<state::FlatRange>{{0, 74}, {80, 103}, {112, 147}}));
  // 3 ranks: unit 1 (23 elements) pads to 48, parts of 16; rank 2's part is empty.
  const auto units = testing::WholeTensorUnits(table, {2, 2, 2});
  const testing::UnitShard r2 = testing::UnitShardOf(units, 3, 2);
  EXPECT_EQ(r2.pieces, (std::vector<state::PlacedRange>{
                           {{64, 74}, 0}, {{103, 103}, 32}, {{144, 147}, 48}}));
  EXPECT_EQ(r2.local_elements, 64);
  // Cut inside conv.weight: rank 0 of 2 holds [115, 125) and [125, 157), both of conv.
  const testing::UnitShard r0 = testing::UnitShardOf(UnitLayouts(table)[2].second, 2, 0);
  EXPECT_EQ(r0.pieces, (std::vector<state::PlacedRange>{
                           {{0, 64}, 0}, {{115, 125}, 64}, {{125, 157}, 80}}));
}

TEST_P(OptimizerTest, UnitShardsMatchOneOptimizerOverEverything) {
  const auto whole_state = Join(RunSharded({state::FullRange(table_)}, 1, kSteps));
  const state::FlatBuffer want = std::move(params_);
  const bool bitwise = GetParam().bitwise_sharding;
  for (const auto& [layout, units] : UnitLayouts(table_)) {
    for (int world : {2, 3}) {
      const std::string what = absl::StrCat(layout, " on ", world, " ranks");
      SCOPED_TRACE(what);
      params_ = InitialParams(table_);
      const auto state = Join(RunPlaced(units, world));
      ExpectSame(params_.span(), want.span(), bitwise, what);
      ASSERT_EQ(state.size(), whole_state.size());
      for (const auto& [name, values] : whole_state) {
        ASSERT_TRUE(state.contains(name)) << name;
        ExpectSame(state.at(name), values, bitwise, absl::StrCat(what, ": ", name));
      }
    }
  }
}

TEST_P(OptimizerTest, NegativeOrNanLearningRateChangesNothing) {
  auto opt = CreateOptimizer(table_, state::FullRange(table_), GetParam().options);
  ASSERT_TRUE(opt.ok());
  state::FlatBuffer grads(table_.total_elements());
  testing::FillRandom(table_, 3, 1.0f, grads);
  const state::FlatBuffer before = InitialParams(table_);
  for (double lr : {-0.1, std::nan("")}) {
    absl::Status s = (*opt)->Step(lr, params_.span(), grads.span(), SumOnOneRank);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("lr must be >= 0"));
  }
  EXPECT_EQ((*opt)->step(), 0);
  ExpectSame(params_.span(), before.span(), true, "params");
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// ---- Behaviour specific to one optimizer ----

TEST(Lamb, FailedSumChangesNothing) {
  const state::TensorTable table = testing::SmallModelTable();
  state::FlatBuffer params = InitialParams(table), grads(table.total_elements());
  testing::FillRandom(table, 5, 1.0f, grads);
  auto opt = CreateOptimizer(table, state::FullRange(table), LambOptions{});
  ASSERT_TRUE(opt.ok());
  int calls = 0;
  const SumAcrossRanks broken = [&](absl::Span<double> values) {
    ++calls;
    EXPECT_EQ(static_cast<int>(values.size()), 2 * table.size());
    return absl::AbortedError("peer left");
  };
  EXPECT_EQ((*opt)->Step(0.1, params.span(), grads.span(), broken).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ((*opt)->step(), 0);
  ExpectSame(params.span(), InitialParams(table).span(), true, "params");
  for (const StateBuffer& b : (*opt)->state_buffers()) {
    EXPECT_TRUE(std::all_of(b.data.begin(), b.data.end(), [](float x) { return x == 0; }))
        << b.name;
  }
}

// A tensor-parallel rank other than 0 holds the replicated tensors too but leaves them out
// of LAMB's per-tensor squares (set_duplicate_ranges), so that the group's sum counts them
// once; a range that cuts a tensor leaves out only its part. They are still updated.
TEST(Lamb, DuplicateRangesAreLeftOutOfTheNorms) {
  const state::TensorTable table = testing::SmallModelTable();
  ASSERT_GE(table.size(), 3);
  state::FlatBuffer grads(table.total_elements());
  testing::FillRandom(table, 5, 1.0f, grads);
  auto squares_of = [&](std::vector<state::FlatRange> duplicates, state::FlatBuffer& params) {
    auto opt = CreateOptimizer(table, state::FullRange(table), LambOptions{});
    EXPECT_TRUE(opt.ok());
    (*opt)->set_duplicate_ranges(std::move(duplicates));
    std::vector<double> seen;
    const SumAcrossRanks keep = [&](absl::Span<double> values) {
      seen.assign(values.begin(), values.end());
      return absl::OkStatus();
    };
    EXPECT_TRUE((*opt)->Step(0.1, params.span(), grads.span(), keep).ok());
    return seen;
  };
  state::FlatBuffer whole_params = InitialParams(table), dup_params = InitialParams(table);
  const std::vector<double> whole = squares_of({}, whole_params);
  const state::TensorSpec& t0 = table.tensor(0);
  const state::TensorSpec& t1 = table.tensor(1);
  const std::vector<double> dup = squares_of(
      {{t0.offset, t0.offset + t0.numel}, {t1.offset, t1.offset + t1.numel / 2}}, dup_params);
  ASSERT_EQ(whole.size(), dup.size());
  EXPECT_EQ(dup[0], 0);  // tensor 0: ||w||^2 and ||r||^2 left out
  EXPECT_EQ(dup[1], 0);
  for (int k : {2, 3}) {  // tensor 1: its second half only
    EXPECT_GT(dup[k], 0) << k;
    EXPECT_LT(dup[k], whole[k]) << k;
  }
  for (size_t k = 4; k < whole.size(); ++k) EXPECT_EQ(dup[k], whole[k]) << k;
  // Tensor 0 was updated too (its trust ratio 1: no norms).
  const state::FlatBuffer initial = InitialParams(table);
  EXPECT_NE(dup_params.data()[t0.offset], initial.data()[t0.offset]);
}

TEST(SgdAndAdamW, NeverCallTheSum) {
  const state::TensorTable table = testing::SmallModelTable();
  state::FlatBuffer params = InitialParams(table), grads(table.total_elements());
  const SumAcrossRanks must_not_call = [](absl::Span<double>) {
    ADD_FAILURE() << "an element-wise optimizer summed across ranks";
    return absl::OkStatus();
  };
  for (const OptimizerOptions& options :
       {OptimizerOptions{SgdOptions{.momentum = 0.9}}, OptimizerOptions{AdamWOptions{}}}) {
    auto opt = CreateOptimizer(table, state::FullRange(table), options);
    ASSERT_TRUE(opt.ok());
    EXPECT_TRUE((*opt)->Step(0.1, params.span(), grads.span(), must_not_call).ok());
  }
}

TEST(DecayMask, CustomMaskReplacesTheDefaultRule) {
  const state::TensorTable table = testing::SmallModelTable();
  std::vector<bool> mask(table.size(), false);
  mask[table.Find("fc1.bias").value()] = true;
  mask[table.Find("embed.weight").value()] = true;

  Reference ref{{}, {}, mask};
  state::FlatBuffer params = InitialParams(table);
  ref.params.assign(params.data(), params.data() + params.size());
  const std::vector<state::FlatBuffer> grads = Gradients(table, kSteps);
  auto opt = CreateOptimizer(table, state::FullRange(table),
                             AdamWOptions{.weight_decay = 0.3, .decay_mask = mask});
  ASSERT_TRUE(opt.ok());
  for (int s = 1; s <= kSteps; ++s) {
    AdamWReference(0.9, 0.999, 1e-8, 0.3)(table, s, 0.05, grads[s - 1], ref);
    ASSERT_TRUE((*opt)->Step(0.05, params.span(), grads[s - 1].span(), SumOnOneRank).ok());
  }
  ExpectNear(params.span(), ref.params, 2e-5, "params");
  EXPECT_THAT((*opt)->Describe(), HasSubstr("weight_decay=0.3 on 2 of 6 tensors"));
}

TEST(DecayMask, DefaultDecaysTensorsOfTwoOrMoreDimensions) {
  const state::TensorTable table = testing::SmallModelTable();
  EXPECT_EQ(DecayMatrices(table), (std::vector<bool>{true, true, false, false, true, false}));
}

TEST(Describe, NamesTheOptimizerAndItsSettings) {
  const state::TensorTable table = testing::SmallModelTable();
  auto describe = [&](const OptimizerOptions& options) {
    return CreateOptimizer(table, state::FullRange(table), options).value()->Describe();
  };
  EXPECT_EQ(describe(SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 0.0001}),
            "SGD(momentum=0.9, nesterov, weight_decay=0.0001 on 3 of 6 tensors)");
  EXPECT_EQ(describe(AdamWOptions{}),
            "AdamW(beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.01 on 3 of 6 tensors)");
  EXPECT_EQ(describe(LambOptions{.max_weight_norm = 10}),
            "LAMB(beta1=0.9, beta2=0.999, eps=1e-06, weight_decay=0.01 on 3 of 6 tensors, "
            "weight norm in [0, 10])");
}

TEST(CreateOptimizer, RejectsBadSettingsNamingThem) {
  const state::TensorTable table = testing::SmallModelTable();
  const struct {
    OptimizerOptions options;
    std::string message;
  } kBad[] = {
      {SgdOptions{.momentum = 1}, "momentum must be in [0, 1), got 1"},
      {SgdOptions{.momentum = -0.5}, "momentum must be in [0, 1), got -0.5"},
      {SgdOptions{.nesterov = true}, "nesterov needs a momentum > 0"},
      {SgdOptions{.weight_decay = -1}, "weight_decay must be >= 0 and finite, got -1"},
      {SgdOptions{.decay_mask = {true, false}}, "decay_mask has 2 entries for 6 tensors"},
      {AdamWOptions{.beta1 = 1.5}, "beta1 must be in [0, 1), got 1.5"},
      {AdamWOptions{.beta2 = std::nan("")}, "beta2 must be in [0, 1), got nan"},
      {AdamWOptions{.eps = 0}, "eps must be > 0 and finite, got 0"},
      {LambOptions{.weight_decay = std::numeric_limits<double>::infinity()},
       "weight_decay must be >= 0 and finite, got inf"},
      {LambOptions{.min_weight_norm = 2, .max_weight_norm = 1},
       "max_weight_norm must be in [2, inf], got 1"},
  };
  for (const auto& bad : kBad) {
    auto opt = CreateOptimizer(table, state::FullRange(table), bad.options);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_EQ(opt.status().message(), bad.message);
  }
  auto outside = CreateOptimizer(table, {100, 161}, SgdOptions{});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(), HasSubstr("[100, 161)"));
}

TEST(CreateOptimizer, RefusesBadPlacementsNamingThePiece) {
  const state::TensorTable table = testing::SmallModelTable();  // 160 flat elements
  const struct {
    std::vector<state::PlacedRange> pieces;
    int64_t local_elements;
    std::string message;
  } kBad[] = {
      {{{{0, 40}, 0}, {{30, 60}, 40}}, 70, "piece 1 ([30, 60) at 40): overlaps"},
      {{{{50, 60}, 0}, {{0, 10}, 10}}, 20, "piece 1 ([0, 10) at 10): overlaps or comes before"},
      {{{{0, 10}, 0}, {{150, 161}, 10}}, 30, "piece 1 ([150, 161) at 10): range [150, 161)"},
      {{{{0, 10}, 0}, {{20, 30}, 15}}, 20, "piece 1 ([20, 30) at 15): its local span"},
      {{{{0, 10}, -1}}, 20, "piece 0 ([0, 10) at -1): its local span"},
      {{{{0, 10}, 0}, {{20, 30}, 5}}, 20, "local spans [0, 10) and [5, 15) overlap"},
      {{}, -1, "local_elements must be >= 0, got -1"},
  };
  for (const auto& bad : kBad) {
    for (const OptimizerOptions& options :
         {OptimizerOptions{SgdOptions{}}, OptimizerOptions{LambOptions{}}}) {
      auto opt = CreateOptimizer(table, bad.pieces, bad.local_elements, options);
      EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << bad.message;
      EXPECT_THAT(opt.status().message(), HasSubstr("optimizer placement: " + bad.message));
    }
  }
  // The same pieces, well placed, are fine.
  EXPECT_TRUE(CreateOptimizer(table, {{{0, 10}, 0}, {{20, 30}, 10}}, 20, SgdOptions{}).ok());
}

TEST(StateBuffers, EmptyPiecesListTheFirstAndNoPiecesNothing) {
  const state::TensorTable table = testing::SmallModelTable();
  auto empty = CreateOptimizer(table, {{{40, 40}, 0}, {{50, 50}, 0}}, 8, AdamWOptions{});
  ASSERT_TRUE(empty.ok()) << empty.status();
  const std::vector<StateBuffer> buffers = (*empty)->state_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].name, "exp_avg");
  EXPECT_EQ(buffers[1].name, "exp_avg_sq");
  for (const StateBuffer& b : buffers) {
    EXPECT_EQ(b.range, (state::FlatRange{40, 40}));
    EXPECT_TRUE(b.data.empty());
  }
  EXPECT_EQ((*empty)->state_bytes(), 2 * 8 * 4);

  auto none = CreateOptimizer(table, {}, 0, LambOptions{});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)->state_buffers().empty());
  EXPECT_EQ((*none)->range(), (state::FlatRange{0, 0}));
  // With nothing to update it still joins the ranks' sum, with every tensor's slots.
  int calls = 0;
  const SumAcrossRanks sum = [&](absl::Span<double> values) {
    ++calls;
    EXPECT_EQ(static_cast<int>(values.size()), 2 * table.size());
    return absl::OkStatus();
  };
  EXPECT_TRUE((*none)->Step(0.1, {}, {}, sum).ok());
  EXPECT_EQ(calls, 1);
}

TEST(RestoreStep, RejectsNegativeSteps) {
  const state::TensorTable table = testing::SmallModelTable();
  auto opt = CreateOptimizer(table, state::FullRange(table), AdamWOptions{});
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ((*opt)->RestoreStep(-1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*opt)->RestoreStep(7).ok());
  EXPECT_EQ((*opt)->step(), 7);
}

}  // namespace
}  // namespace ringmaster::train
