#include "train/fsdp.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"
#include "train/nn/classifiers.h"
#include "train/nn/gpt.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using testing::ExpectOkOnRanks;

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// What one case of the comparison runs.
struct Case {
  int zero_stage = 3;
  FsdpConfig fsdp;
  Precision compute = Precision::kFloat32;
  Precision reduce = Precision::kFloat32;
  int micro = 1;                 // micro-batches per step
  int64_t checkpoint_every = 0;  // the GPT's activation checkpointing
  enum class Net { kGpt, kMlp, kCnn };
  Net net = Net::kGpt;
  // Gradient buffers apart from the parameters even where the model allows writing over them
  // (ParameterGroup::gradients_over_parameters cleared).
  bool apart = false;
  // Where to put this rank's reduced gradient shard and the unit buffers' peak bytes after
  // the step (null: nowhere).
  std::vector<float>* grads_out = nullptr;
  int64_t* unit_peak_out = nullptr;
};

std::string Name(const Case& c) {
  return absl::StrCat("zero", c.zero_stage, " wrap ", WrapName(c.fsdp.wrap), " prefetch ",
                      PrefetchName(c.fsdp.prefetch), " limit ", c.fsdp.prefetch_limit,
                      c.fsdp.reshard_after_forward ? " reshard" : " keep", " ",
                      PrecisionName(c.compute), "/", PrecisionName(c.reduce), " micro ", c.micro,
                      " ckpt ", c.checkpoint_every,
                      c.net == Case::Net::kGpt ? " gpt" : c.net == Case::Net::kMlp ? " mlp" : " cnn");
}

constexpr int64_t kSamples = 3;  // per rank and micro-batch

std::unique_ptr<Model> MakeModel(const Case& c) {
  if (c.net == Case::Net::kMlp) {
    return *nn::MlpClassifier::Create({.inputs = 24, .hidden = {20, 12}, .classes = 5});
  }
  if (c.net == Case::Net::kCnn) {  // 24 features: 1 x 4 x 6 images
    return *nn::CnnClassifier::Create({.channels = 1,
                                       .height = 4,
                                       .width = 6,
                                       .conv_channels = {3, 4},
                                       .kernel_size = 3,
                                       .hidden = {8},
                                       .classes = 5});
  }
  nn::GptOptions o;
  o.layers = 3;
  o.heads = 2;
  o.width = 16;
  o.context = 8;
  o.vocab = 32;
  o.checkpoint_every = c.checkpoint_every;
  return *nn::GptModel::Create(o);
}

// A batch for rank r's micro-batch k, the same on every run.
Batch MakeBatch(const Case& c, int r, int k) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (100 * r + k + 1);
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  Batch b;
  b.size = kSamples;
  if (c.net != Case::Net::kGpt) {
    b.feature_dim = 24;
    for (int64_t i = 0; i < kSamples * 24; ++i) {
      b.features.push_back(static_cast<float>(next() % 1000) / 500.0f - 1.0f);
    }
    for (int64_t i = 0; i < kSamples; ++i) b.labels.push_back(static_cast<int32_t>(next() % 5));
  } else {
    b.context = 8;
    for (int64_t i = 0; i < kSamples * 9; ++i) b.tokens.push_back(static_cast<int32_t>(next() % 32));
  }
  return b;
}

// The largest |a - b| over `n` values, against the largest |b|.
absl::Status Compare(const char* what, const float* a, const float* b, int64_t n, double rel) {
  double worst = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  if (worst > rel * scale) {
    return Fail(absl::StrCat(what, ": differs by ", worst, " (scale ", scale, ", allowed ",
                             rel * scale, ")"));
  }
  return absl::OkStatus();
}

// Data parallelism's reduced gradient and the sharded strategy's shard, for one step of
// `c.micro` micro-batches on every rank; also the losses, an evaluation, the traffic and the
// unit buffers.
absl::Status RunCase(TcpCommunicator& comm, const Case& c) {
  const int r = comm.rank(), world = comm.size();
  std::unique_ptr<Model> model = MakeModel(c);
  const state::TensorTable& table = model->table();
  state::FlatBuffer full(table.total_elements());
  model->Init(7, full);
  const double divisor =
      static_cast<double>(world * c.micro * kSamples * model->LossTermsPerSample());

  // The reference: every rank runs the whole model, the gradients are all-reduced.
  state::FlatBuffer reference(table.total_elements());
  std::vector<double> losses;
  for (int k = 0; k < c.micro; ++k) {
    ForwardBackwardOptions fb;
    fb.precision = c.compute;
    fb.loss_divisor = divisor;
    fb.accumulate = k > 0;
    absl::StatusOr<StepStats> s = model->ForwardBackward(MakeBatch(c, r, k), full, reference, fb);
    if (!s.ok()) return s.status();
    losses.push_back(s->loss_sum);
  }
  RM_RETURN_IF_ERROR(comm.AllReduce(reference.data(), reference.data(), reference.size(),
                                    DataType::kFloat32, comm::ReduceOp::kSum,
                                    absl::Now() + absl::Seconds(30)));

  ShardedOptions so;
  so.table = &table;
  so.groups = model->parameter_groups();
  if (c.apart) {
    for (ParameterGroup& g : so.groups) g.gradients_over_parameters = false;
  }
  so.zero_stage = c.zero_stage;
  so.fsdp = c.fsdp;
  so.bucket_mb = 0.002;  // stage 2: several buckets
  so.compute = c.compute;
  so.reduce = c.reduce;
  so.op_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<ParallelStrategy>> made =
      CreateShardedDataParallel(&comm, &comm, so);
  if (!made.ok()) return made.status();
  ParallelStrategy& s = **made;
  absl::StatusOr<FsdpLayout> layout = ShardedLayout(so, world);
  if (!layout.ok()) return layout.status();
  if (s.local_elements() != layout->local_elements) return Fail("local_elements");

  // This rank's master pieces; the rest of the shard buffer is padding (zero).
  state::FlatBuffer master(s.local_elements()), grads(s.local_elements());
  master.Zero();
  for (const state::PlacedRange& p : s.update_pieces()) {
    std::copy_n(full.data() + p.range.begin, p.range.size(), master.data() + p.at);
  }
  RM_RETURN_IF_ERROR(s.AfterOptimizerStep(master.span()));  // ZeRO-2: the compute copy
  const comm::Counters before = comm.counters();
  RM_RETURN_IF_ERROR(s.MaterializeParameters(master.span()));
  s.BeginGradients(grads.data(), /*measure_local_norm=*/true);
  for (int k = 0; k < c.micro; ++k) {
    s.BeginPass(ParallelStrategy::Pass::kTrain);
    ForwardBackwardOptions fb;
    fb.precision = c.compute;
    fb.loss_divisor = divisor;
    fb.store = s.store();
    state::FlatBuffer none;
    absl::StatusOr<StepStats> st = model->ForwardBackward(MakeBatch(c, r, k), none, none, fb);
    if (!st.ok()) return st.status();
    if (st->loss_sum != losses[k]) {
      return Fail(absl::StrCat("micro-batch ", k, ": loss sum ", st->loss_sum, " against ",
                               losses[k], " with the whole model"));
    }
  }
  RM_RETURN_IF_ERROR(s.ReduceGradients());
  const comm::Counters after = comm.counters();
  if (s.last_step().local_grad_norm <= 0) return Fail("no local gradient norm");
  if (c.grads_out != nullptr) c.grads_out->assign(grads.data(), grads.data() + grads.size());
  if (c.unit_peak_out != nullptr) *c.unit_peak_out = s.unit_buffer_bytes_peak();

  // Each piece of the reduced gradient is the reference's.
  const double tolerance = c.reduce == Precision::kBFloat16 ? 2e-2 : 1e-5;
  for (const state::PlacedRange& p : s.update_pieces()) {
    RM_RETURN_IF_ERROR(Compare(absl::StrCat("gradient ", state::RangeString(p.range)).c_str(),
                               grads.data() + p.at, reference.data() + p.range.begin,
                               p.range.size(), tolerance));
  }

  // The traffic of ZeRO-3 is the formula's, per micro-batch.
  if (c.zero_stage == 3) {
    const PassTraffic t =
        Zero3PassTraffic(*layout, c.fsdp.reshard_after_forward,
                         c.compute == Precision::kFloat32 ? 4 : 2,
                         c.reduce == Precision::kFloat32 ? 4 : 2);
    const uint64_t gathered = after.of(comm::OpKind::kAllGather).bytes_sent -
                              before.of(comm::OpKind::kAllGather).bytes_sent;
    const uint64_t reduced = after.of(comm::OpKind::kReduceScatter).bytes_sent -
                             before.of(comm::OpKind::kReduceScatter).bytes_sent;
    if (gathered != static_cast<uint64_t>(c.micro * t.all_gather_bytes) ||
        reduced != static_cast<uint64_t>(c.micro * t.reduce_scatter_bytes)) {
      return Fail(absl::StrCat("sent ", gathered, " bytes in all-gathers and ", reduced,
                               " in reduce-scatters; the formula says ",
                               c.micro * t.all_gather_bytes, " and ",
                               c.micro * t.reduce_scatter_bytes));
    }
    // Per unit (bucket_counters): one reduce-scatter per micro-batch, the bytes its ring's
    // formula says, adding up to the communicator's.
    const std::vector<BucketCounters> units = s.bucket_counters();
    uint64_t unit_sent = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      unit_sent += units[u].bytes_sent;
      if (units[u].calls != static_cast<uint64_t>(c.micro) ||
          units[u].formula_bytes_sent != units[u].bytes_sent) {
        return Fail(absl::StrCat("unit ", u, ": ", units[u].calls, " reduce-scatters, ",
                                 units[u].bytes_sent, " bytes sent, formula ",
                                 units[u].formula_bytes_sent));
      }
    }
    if (units.size() != layout->units.size() || unit_sent != reduced) {
      return Fail(absl::StrCat(units.size(), " units counted sent ", unit_sent, " bytes; ",
                               layout->units.size(), " units, ", reduced, " bytes"));
    }
    // The unit buffers (fsdp.h): parameters in use and prefetched, gradients being written
    // and reduced, each at most the largest unit; and the staging of one unit.
    const int64_t unit_bytes = layout->largest_unit * 4;
    const int64_t shard = layout->largest_unit / world;
    const int64_t staging =
        4 * shard + (c.compute != Precision::kFloat32 || c.reduce != Precision::kFloat32
                         ? 2 * (layout->largest_unit + shard)
                         : 0);
    const int64_t ahead =
        c.fsdp.prefetch == FsdpConfig::Prefetch::kNone ? 0 : c.fsdp.prefetch_limit;
    const int64_t bound = (ahead + 3) * unit_bytes + staging;
    if (c.fsdp.reshard_after_forward && c.checkpoint_every == 0 &&
        s.unit_buffer_bytes_peak() > bound) {
      return Fail(absl::StrCat("unit buffers peaked at ", s.unit_buffer_bytes_peak(),
                               " bytes, above ", bound, " (", layout->units.size(),
                               " units, the largest ", unit_bytes, " bytes)"));
    }
  }

  // An evaluation through the store sees the same parameters.
  const Batch eval = MakeBatch(c, r, 99);
  absl::StatusOr<StepStats> whole = model->Evaluate(eval, full, c.compute);
  RM_RETURN_IF_ERROR(s.MaterializeParameters(master.span()));
  s.BeginPass(ParallelStrategy::Pass::kEvaluate);
  state::FlatBuffer none;
  absl::StatusOr<StepStats> stored = model->Evaluate(eval, none, c.compute, s.store());
  RM_RETURN_IF_ERROR(s.EndEvaluation());
  if (!whole.ok() || !stored.ok() || whole->loss_sum != stored->loss_sum) {
    return Fail("the evaluation through the store differs");
  }
  return absl::OkStatus();
}

void ExpectSameAsDataParallel(const Case& c, std::vector<int> worlds = {1, 2, 3}) {
  SCOPED_TRACE(Name(c));
  for (int world : worlds) {
    ExpectOkOnRanks(world, [&c](TcpCommunicator& comm) { return RunCase(comm, c); });
  }
}

FsdpConfig Fsdp(FsdpConfig::Wrap wrap, FsdpConfig::Prefetch prefetch, bool reshard = true,
                int limit = 1) {
  FsdpConfig f;
  f.wrap = wrap;
  f.prefetch = prefetch;
  f.reshard_after_forward = reshard;
  f.prefetch_limit = limit;
  return f;
}

using Wrap = FsdpConfig::Wrap;
using Prefetch = FsdpConfig::Prefetch;

TEST(ShardedDataParallel, Zero3GivesDataParallelGradientsForEachWrapping) {
  for (Wrap wrap : {Wrap::kLayer, Wrap::kBlock, Wrap::kModel}) {
    for (Prefetch prefetch : {Prefetch::kNone, Prefetch::kBoth}) {
      ExpectSameAsDataParallel({.fsdp = Fsdp(wrap, prefetch)});
    }
  }
}

TEST(ShardedDataParallel, Zero3PrefetchAndResharding) {
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kLayer, Prefetch::kForward, true, 3)}, {3});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kLayer, Prefetch::kBackward, true, 2)}, {2});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kBlock, Prefetch::kBoth, false)}, {2, 3});
}

TEST(ShardedDataParallel, Zero3WithAccumulationCheckpointingAndTheClassifiers) {
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kBlock, Prefetch::kBoth), .micro = 3}, {2, 3});
  ExpectSameAsDataParallel(
      {.fsdp = Fsdp(Wrap::kLayer, Prefetch::kBoth), .checkpoint_every = 2}, {2});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kLayer, Prefetch::kBoth), .net = Case::Net::kMlp},
                           {1, 3});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kLayer, Prefetch::kBoth), .net = Case::Net::kCnn},
                           {2, 3});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kModel, Prefetch::kNone), .net = Case::Net::kCnn},
                           {2});
}

TEST(ShardedDataParallel, Zero3InHalfPrecision) {
  ExpectSameAsDataParallel(
      {.fsdp = Fsdp(Wrap::kBlock, Prefetch::kBoth), .compute = Precision::kBFloat16}, {2, 3});
  ExpectSameAsDataParallel(
      {.fsdp = Fsdp(Wrap::kBlock, Prefetch::kBoth), .compute = Precision::kFloat16}, {2});
  ExpectSameAsDataParallel({.fsdp = Fsdp(Wrap::kBlock, Prefetch::kBoth),
                            .compute = Precision::kBFloat16,
                            .reduce = Precision::kBFloat16},
                           {2, 3});
}

// The GPT on the CPU writes each unit's gradients over its gathered parameters
// (ParameterGroup::gradients_over_parameters): the same reduced gradients, bit for bit, as
// with gradient buffers apart, in at most 2 unit buffers (+ the accumulation's staging shard)
// with or without prefetch: the unit in use and the one prefetched, the one being reduced
// handing its buffer to the next gather. Apart, prefetch holds 4.
TEST(ShardedDataParallel, Zero3WritesGradientsOverTheParameters) {
  for (Prefetch prefetch : {Prefetch::kNone, Prefetch::kBoth}) {
    for (int micro : {1, 2}) {
      Case c{.fsdp = Fsdp(Wrap::kBlock, prefetch), .micro = micro};
      SCOPED_TRACE(Name(c));
      ExpectOkOnRanks(2, [c](TcpCommunicator& comm) mutable {
        std::vector<float> over, apart;
        int64_t over_peak = 0, apart_peak = 0;
        c.grads_out = &over;
        c.unit_peak_out = &over_peak;
        RM_RETURN_IF_ERROR(RunCase(comm, c));
        c.apart = true;
        c.grads_out = &apart;
        c.unit_peak_out = &apart_peak;
        RM_RETURN_IF_ERROR(RunCase(comm, c));
        if (over != apart) return Fail("the gradients written over the parameters differ");
        std::unique_ptr<Model> model = MakeModel(c);
        ShardedOptions so;
        so.table = &model->table();
        so.groups = model->parameter_groups();
        so.fsdp = c.fsdp;
        RM_ASSIGN_OR_RETURN(const FsdpLayout layout, ShardedLayout(so, comm.size()));
        const int64_t unit = 4 * layout.largest_unit;
        const int64_t staging = c.micro > 1 ? 4 * layout.largest_unit / comm.size() : 0;
        if (over_peak > 2 * unit + staging) {
          return Fail(absl::StrCat("unit buffers peaked at ", over_peak, " bytes, above 2 units (",
                                   2 * unit, ") + staging ", staging));
        }
        if (c.fsdp.prefetch == Prefetch::kBoth && apart_peak < 3 * unit) {
          return Fail(absl::StrCat("apart, the unit buffers peaked at only ", apart_peak,
                                   " bytes (a unit is ", unit, ")"));
        }
        return absl::OkStatus();
      });
    }
  }
}

TEST(ShardedDataParallel, Zero2ShardsTheGradients) {
  ExpectSameAsDataParallel({.zero_stage = 2});
  ExpectSameAsDataParallel({.zero_stage = 2, .compute = Precision::kBFloat16, .micro = 2}, {3});
}

// A peer that goes away mid-step: the gathers fail, the model still finishes its pass on
// whatever the unit buffers hold, and ReduceGradients returns the communicator's error
// (the step must not be applied), well within the operation timeout.
TEST(ShardedDataParallel, APeerLostMidStepFailsTheStep) {
  comm::testing::MultiProcOptions mp;
  mp.world_size = 2;
  mp.victims = {1};
  const std::vector<comm::testing::RankResult> results = comm::testing::RunRanks(
      mp, [](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    const Case c{.fsdp = Fsdp(Wrap::kLayer, Prefetch::kBoth)};
    std::unique_ptr<Model> model = MakeModel(c);
    ShardedOptions so;
    so.table = &model->table();
    so.groups = model->parameter_groups();
    so.op_timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<ParallelStrategy>> s = CreateShardedDataParallel(&comm, &comm, so);
    if (!s.ok()) return s.status();
    if (comm.rank() == 1) _exit(0);  // gone, with its sockets
    state::FlatBuffer master((*s)->local_elements()), grads((*s)->local_elements()), none;
    master.Zero();
    const absl::Time start = absl::Now();
    RM_RETURN_IF_ERROR((*s)->MaterializeParameters(master.span()));
    (*s)->BeginGradients(grads.data(), false);
    (*s)->BeginPass(ParallelStrategy::Pass::kTrain);
    ForwardBackwardOptions fb;
    fb.loss_divisor = 100;
    fb.store = (*s)->store();
    RM_RETURN_IF_ERROR(model->ForwardBackward(MakeBatch(c, 0, 0), none, none, fb).status());
    const absl::Status reduced = (*s)->ReduceGradients();
    if (reduced.ok()) return Fail("the step succeeded without its peer");
    if (absl::Now() - start > absl::Seconds(15)) {
      return Fail(absl::StrCat("the failure took ", absl::FormatDuration(absl::Now() - start)));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[0].status.ok()) << results[0].status;
}

TEST(ShardedDataParallel, RefusesWhatItCannotDo) {
  ExpectOkOnRanks(1, [](TcpCommunicator& comm) -> absl::Status {
    std::unique_ptr<Model> model = MakeModel({});
    ShardedOptions so;
    so.table = &model->table();
    so.groups = model->parameter_groups();
    for (int stage : {0, 1, 4}) {
      so.zero_stage = stage;
      absl::Status st = CreateShardedDataParallel(&comm, &comm, so).status();
      if (!absl::IsInvalidArgument(st) || st.message().find("zero_stage") == std::string::npos) {
        return Fail(st.ToString());
      }
    }
    so.zero_stage = 3;
    so.reduce = Precision::kFloat16;
    absl::Status st = CreateShardedDataParallel(&comm, &comm, so).status();
    if (!absl::IsInvalidArgument(st) || st.message().find("precision.reduce") == std::string::npos) {
      return Fail(st.ToString());
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace ringmaster::train
