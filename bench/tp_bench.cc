#include "bench/tp_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "train/nn/random.h"
#include "train/tp/parallel_linear.h"

namespace ringmaster::bench {
namespace {

using train::tp::ColumnParallelLinear;
using train::tp::LinearShard;
using train::tp::ParallelLinearOptions;
using train::tp::RowParallelLinear;

constexpr int kWarmup = 5;
constexpr absl::Duration kTimeout = absl::Seconds(60);

// The whole problem, the same on every rank: weights [out, in] and biases uniform in
// ±1/sqrt(fan-in) as nn.Linear's, the input and the output's gradient uniform in ±1.
struct Whole {
  std::vector<float> w1, b1, w2, b2, x, dy;
};

Whole MakeWhole(const TpBenchOptions& o) {
  train::nn::SplitMix64 rng(o.seed);
  auto fill = [&rng](int64_t n, double fan_in) {
    std::vector<float> v(n);
    train::nn::FillUniform(rng, static_cast<float>(1 / std::sqrt(fan_in)), absl::MakeSpan(v));
    return v;
  };
  Whole w;
  w.w1 = fill(o.hidden * o.in, o.in);
  w.b1 = fill(o.hidden, o.in);
  w.w2 = fill(o.out * o.hidden, o.hidden);
  w.b2 = fill(o.out, o.hidden);
  w.x = fill(o.batch * o.in, 1);
  w.dy = fill(o.batch * o.out, 1);
  return w;
}

// The communicator's operations during the timed steps, summed.
struct Traffic {
  uint64_t forward_all_reduces = 0, forward_bytes = 0;
  uint64_t backward_all_reduces = 0, backward_bytes = 0;
  uint64_t other = 0;

  void Add(const comm::Counters& before, const comm::Counters& middle,
           const comm::Counters& after) {
    auto delta = [](const comm::Counters& a, const comm::Counters& b, comm::OpKind k) {
      return std::make_pair(b.of(k).calls - a.of(k).calls, b.of(k).bytes_sent - a.of(k).bytes_sent);
    };
    const auto [fc, fb] = delta(before, middle, comm::OpKind::kAllReduce);
    const auto [bc, bb] = delta(middle, after, comm::OpKind::kAllReduce);
    forward_all_reduces += fc;
    forward_bytes += fb;
    backward_all_reduces += bc;
    backward_bytes += bb;
    for (int k = 0; k < comm::kNumOpKinds; ++k) {
      const auto kind = static_cast<comm::OpKind>(k);
      if (kind != comm::OpKind::kAllReduce) other += delta(before, after, kind).first;
    }
  }
};

// Column-parallel up-projection, GELU, row-parallel down-projection on one group's shards,
// with the buffers of a step.
class ShardedMlp {
 public:
  static absl::StatusOr<std::unique_ptr<ShardedMlp>> Create(comm::Communicator& group,
                                                            const TpBenchOptions& o,
                                                            const Whole& whole) {
    RM_ASSIGN_OR_RETURN(
        ColumnParallelLinear up,
        ColumnParallelLinear::Create({.in = o.in, .out = o.hidden, .group = &group,
                                      .timeout = kTimeout}));
    RM_ASSIGN_OR_RETURN(
        RowParallelLinear down,
        RowParallelLinear::Create({.in = o.hidden, .out = o.out, .group = &group,
                                   .timeout = kTimeout}));
    auto mlp = std::unique_ptr<ShardedMlp>(new ShardedMlp(group, o, whole, up, down));
    RM_RETURN_IF_ERROR(up.shard().TakeWeight(whole.w1, absl::MakeSpan(mlp->w1_)));
    RM_RETURN_IF_ERROR(up.shard().TakeBias(whole.b1, absl::MakeSpan(mlp->b1_)));
    RM_RETURN_IF_ERROR(down.shard().TakeWeight(whole.w2, absl::MakeSpan(mlp->w2_)));
    RM_RETURN_IF_ERROR(down.shard().TakeBias(whole.b2, absl::MakeSpan(mlp->b2_)));
    return mlp;
  }

  // One forward and backward; the counters' changes go to `traffic`.
  absl::Status Step(Traffic* traffic) {
    const int64_t n = batch_, local = up_.shard().local_out();
    const comm::Counters before = group_.counters();
    up_.Forward(x_, w1_.data(), b1_.data(), h_.data(), n);
    kernels::GeluForward(a_.data(), h_.data(), n * local);
    RM_RETURN_IF_ERROR(down_.Forward(a_.data(), w2_.data(), b2_.data(), y_.data(), n));
    const comm::Counters middle = group_.counters();
    down_.BackwardInput(dy_, w2_.data(), da_.data(), n);
    down_.BackwardWeights(a_.data(), dy_, dw2_.data(), db2_.data(), n,
                          kernels::OutputMode::kOverwrite);
    kernels::GeluBackward(dh_.data(), h_.data(), da_.data(), n * local);
    up_.BackwardWeights(x_, dh_.data(), dw1_.data(), db1_.data(), n,
                        kernels::OutputMode::kOverwrite);
    RM_RETURN_IF_ERROR(up_.BackwardInput(dh_.data(), w1_.data(), dx_.data(), n));
    if (traffic != nullptr) traffic->Add(before, middle, group_.counters());
    return absl::OkStatus();
  }

  // Median microseconds per step over `iters` after the warm-up; the timed steps' traffic
  // goes to `traffic`.
  absl::StatusOr<double> TimeSteps(int iters, Traffic* traffic) {
    for (int i = 0; i < kWarmup; ++i) RM_RETURN_IF_ERROR(Step(nullptr));
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) {
      const absl::Time start = absl::Now();
      RM_RETURN_IF_ERROR(Step(traffic));
      us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  }

  // The whole parameter gradients, on every rank of the group: dW1, db1, dW2, db2.
  absl::StatusOr<std::vector<std::vector<float>>> GatherGradients(const TpBenchOptions& o) {
    std::vector<std::vector<float>> g = {std::vector<float>(o.hidden * o.in),
                                         std::vector<float>(o.hidden),
                                         std::vector<float>(o.out * o.hidden),
                                         std::vector<float>(o.out)};
    const absl::Time deadline = absl::Now() + kTimeout;
    RM_RETURN_IF_ERROR(up_.shard().GatherWeight(group_, dw1_, absl::MakeSpan(g[0]), deadline));
    RM_RETURN_IF_ERROR(up_.shard().GatherBias(group_, db1_, absl::MakeSpan(g[1]), deadline));
    RM_RETURN_IF_ERROR(down_.shard().GatherWeight(group_, dw2_, absl::MakeSpan(g[2]), deadline));
    RM_RETURN_IF_ERROR(down_.shard().GatherBias(group_, db2_, absl::MakeSpan(g[3]), deadline));
    return g;
  }

  const std::vector<float>& y() const { return y_; }
  const std::vector<float>& dx() const { return dx_; }

 private:
  ShardedMlp(comm::Communicator& group, const TpBenchOptions& o, const Whole& whole,
             const ColumnParallelLinear& up, const RowParallelLinear& down)
      : group_(group),
        up_(up),
        down_(down),
        batch_(o.batch),
        x_(whole.x.data()),
        dy_(whole.dy.data()),
        w1_(up.shard().weight_elements()),
        b1_(up.shard().bias_elements()),
        w2_(down.shard().weight_elements()),
        b2_(down.shard().bias_elements()),
        h_(o.batch * up.shard().local_out()),
        a_(h_.size()),
        da_(h_.size()),
        dh_(h_.size()),
        y_(o.batch * o.out),
        dx_(o.batch * o.in),
        dw1_(w1_.size()),
        db1_(b1_.size()),
        dw2_(w2_.size()),
        db2_(b2_.size()) {}

  comm::Communicator& group_;
  ColumnParallelLinear up_;
  RowParallelLinear down_;
  int64_t batch_;
  const float* x_;   // whole.x: replicated input
  const float* dy_;  // whole.dy: replicated output gradient
  std::vector<float> w1_, b1_, w2_, b2_;       // this rank's shards
  std::vector<float> h_, a_, da_, dh_;         // [batch, hidden / T]
  std::vector<float> y_, dx_;                  // whole, replicated
  std::vector<float> dw1_, db1_, dw2_, db2_;  // the shards' gradients
};

TpCheck Check(std::string name, const std::vector<float>& got, const std::vector<float>& want) {
  TpCheck c;
  c.name = std::move(name);
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    c.max_difference =
        std::max(c.max_difference, std::abs(static_cast<double>(got[i]) - want[i]));
    c.largest = std::max(c.largest, std::abs(static_cast<double>(want[i])));
  }
  if (got.size() != want.size()) c.max_difference = INFINITY;
  return c;
}

}  // namespace

bool TpBenchResult::ok() const {
  return !checks.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const TpCheck& c) { return c.ok(); }) &&
         forward_all_reduces == 1 && backward_all_reduces == 1 && other_operations == 0;
}

absl::Status ValidateTpBench(const TpBenchOptions& o, int ranks) {
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--batch", o.batch},
                                    {"--in", o.in},
                                    {"--hidden", o.hidden},
                                    {"--out", o.out},
                                    {"--iters", o.iters}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, got ", value));
    }
  }
  if (ranks < 1 || o.hidden % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden (", o.hidden, ") must be a multiple of --ranks (", ranks,
                     "): the hidden features are split evenly across the ranks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TpBenchResult> RunTpBench(comm::Communicator& group, const TpBenchOptions& o) {
  RM_RETURN_IF_ERROR(ValidateTpBench(o, group.size()));
  kernels::SetBlasThreads(1);
  const Whole whole = MakeWhole(o);
  TpBenchResult result;
  result.ranks = group.size();

  // The shards: timed steps, then the gradients reassembled.
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ShardedMlp> tp, ShardedMlp::Create(group, o, whole));
  Traffic traffic;
  RM_ASSIGN_OR_RETURN(result.tp_step_us, tp->TimeSteps(o.iters, &traffic));
  result.forward_all_reduces = static_cast<double>(traffic.forward_all_reduces) / o.iters;
  result.forward_bytes_sent = static_cast<double>(traffic.forward_bytes) / o.iters;
  result.backward_all_reduces = static_cast<double>(traffic.backward_all_reduces) / o.iters;
  result.backward_bytes_sent = static_cast<double>(traffic.backward_bytes) / o.iters;
  result.other_operations = static_cast<double>(traffic.other) / o.iters;
  RM_ASSIGN_OR_RETURN(std::vector<std::vector<float>> grads, tp->GatherGradients(o));

  // Rank 0 alone with the whole weights: the same layers on a group of one.
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> alone,
                      group.Split(group.rank() == 0 ? 0 : -1, 0, absl::Now() + kTimeout));
  if (alone == nullptr) return result;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ShardedMlp> single, ShardedMlp::Create(*alone, o, whole));
  RM_ASSIGN_OR_RETURN(result.single_step_us, single->TimeSteps(o.iters, nullptr));
  RM_ASSIGN_OR_RETURN(std::vector<std::vector<float>> want, single->GatherGradients(o));
  result.checks.push_back(Check("output y", tp->y(), single->y()));
  result.checks.push_back(Check("input gradient dx", tp->dx(), single->dx()));
  const char* names[] = {"up weight gradient (column)", "up bias gradient (column)",
                         "down weight gradient (row)", "down bias gradient (row)"};
  for (int i = 0; i < 4; ++i) result.checks.push_back(Check(names[i], grads[i], want[i]));
  return result;
}

std::string TpResultToText(const TpBenchResult& r) {
  std::string text = absl::StrFormat(
      "ranks %d\ntraffic %.17g %.17g %.17g %.17g %.17g\ntimes %.17g %.17g\n", r.ranks,
      r.forward_all_reduces, r.forward_bytes_sent, r.backward_all_reduces, r.backward_bytes_sent,
      r.other_operations, r.tp_step_us, r.single_step_us);
  for (const TpCheck& c : r.checks) {
    absl::StrAppendFormat(&text, "check %.17g %.17g %s\n", c.max_difference, c.largest, c.name);
  }
  return text;
}

absl::StatusOr<TpBenchResult> TpResultFromText(absl::string_view text) {
  TpBenchResult r;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 7));
    bool ok = false;
    if (f[0] == "ranks" && f.size() == 2) {
      ok = absl::SimpleAtoi(f[1], &r.ranks);
    } else if (f[0] == "traffic" && f.size() == 6) {
      ok = absl::SimpleAtod(f[1], &r.forward_all_reduces) &&
           absl::SimpleAtod(f[2], &r.forward_bytes_sent) &&
           absl::SimpleAtod(f[3], &r.backward_all_reduces) &&
           absl::SimpleAtod(f[4], &r.backward_bytes_sent) &&
           absl::SimpleAtod(f[5], &r.other_operations);
    } else if (f[0] == "times" && f.size() == 3) {
      ok = absl::SimpleAtod(f[1], &r.tp_step_us) && absl::SimpleAtod(f[2], &r.single_step_us);
    } else if (f[0] == "check") {
      f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      TpCheck c;
      ok = f.size() == 4 && absl::SimpleAtod(f[1], &c.max_difference) &&
           absl::SimpleAtod(f[2], &c.largest);
      if (ok) c.name = std::string(f[3]);
      r.checks.push_back(std::move(c));
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("tp result: bad line \"", line, "\""));
    }
  }
  return r;
}

std::string FormatTpTable(const TpBenchOptions& o, const TpBenchResult& r) {
  std::string t = absl::StrFormat(
      "column-parallel [%d -> %d] -> GELU -> row-parallel [%d -> %d], batch %d, %d ranks "
      "(hidden %d per rank), fp32, 1 BLAS thread per rank\n\n",
      o.in, o.hidden, o.hidden, o.out, o.batch, r.ranks, o.hidden / std::max(r.ranks, 1));
  absl::StrAppendFormat(&t, "%-30s %12s %12s %12s  %s\n", "against one rank, whole weights",
                        "max |diff|", "max |value|", "allowed", "");
  for (const TpCheck& c : r.checks) {
    absl::StrAppendFormat(&t, "%-30s %12.3g %12.4g %12.3g  %s\n", c.name, c.max_difference,
                          c.largest, kTpTolerance * c.largest, c.ok() ? "ok" : "OUTSIDE");
  }
  absl::StrAppendFormat(&t, "tolerance: max |diff| <= %g x max |value| of the unsplit tensor\n\n",
                        kTpTolerance);
  absl::StrAppendFormat(&t, "%-30s %12s %14s\n", "per step (rank 0's counters)", "all-reduces",
                        "bytes sent");
  absl::StrAppendFormat(&t, "%-30s %12.2f %14.0f  (row layer: %d x %d floats)\n", "forward",
                        r.forward_all_reduces, r.forward_bytes_sent, o.batch, o.out);
  absl::StrAppendFormat(&t, "%-30s %12.2f %14.0f  (column layer's dx: %d x %d floats)\n",
                        "backward", r.backward_all_reduces, r.backward_bytes_sent, o.batch, o.in);
  if (r.other_operations != 0) {
    absl::StrAppendFormat(&t, "%-30s %12.2f\n", "other operations (unexpected)",
                          r.other_operations);
  }
  absl::StrAppendFormat(&t, "\n%-30s %12.1f us\n%-30s %12.1f us  (%.2fx)\n",
                        absl::StrCat("step time, ", r.ranks, r.ranks == 1 ? " rank" : " ranks", " (median)"), r.tp_step_us,
                        "step time, one rank (median)", r.single_step_us,
                        r.tp_step_us > 0 ? r.single_step_us / r.tp_step_us : 0.0);
  return t;
}

}  // namespace ringmaster::bench
