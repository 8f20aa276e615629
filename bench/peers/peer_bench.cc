#include "bench/peers/peer_bench.h"

#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace ringmaster::bench::peers {
namespace {

// The input pattern: element i of rank r is r + 1 + (i mod 1024). Sums over up
// to thousands of ranks stay below 2^24, so float32 adds them exactly in any
// order.
constexpr size_t kPatternPeriod = 1024;

inline float InputValue(int rank, size_t index) {
  return static_cast<float>(rank + 1 + (index & (kPatternPeriod - 1)));
}

// Sum over ranks 0..n-1 of InputValue(r, index).
inline float SumOverRanks(int ranks, size_t index) {
  return static_cast<float>(ranks * (ranks + 1) / 2 +
                            ranks * static_cast<int64_t>(index & (kPatternPeriod - 1)));
}

constexpr float kSentinel = -1.0f;

double MicrosSince(std::chrono::steady_clock::time_point t0,
                   std::chrono::steady_clock::time_point t1) {
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseNames(absl::string_view flag, absl::string_view value,
                                                    const std::vector<std::string>& allowed) {
  if (absl::StripAsciiWhitespace(value).empty()) return allowed;
  std::vector<std::string> names;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (std::find(allowed.begin(), allowed.end(), entry) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: \"%s\" is not one of %s", flag, entry,
                                                        absl::StrJoin(allowed, ", ")));
    }
    if (std::find(names.begin(), names.end(), entry) != names.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: \"%s\" is given twice", flag, entry));
    }
    names.emplace_back(entry);
  }
  return names;
}

absl::StatusOr<Layout> MakeLayout(Op op, size_t bytes, int ranks) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ranks must be >= 1, not ", ranks));
  }
  const size_t n = static_cast<size_t>(ranks);
  size_t elements = bytes / sizeof(float);
  Layout layout;
  layout.op = op;
  layout.ranks = ranks;
  switch (op) {
    case Op::kAllReduce:
    case Op::kBroadcast:
      elements = std::max<size_t>(elements, 1);
      layout.in_count = elements;
      layout.out_count = elements;
      break;
    case Op::kAllGather:
      elements = std::max(n, elements / n * n);
      layout.in_count = elements / n;
      layout.out_count = elements;
      break;
    case Op::kReduceScatter:
      elements = std::max(n, elements / n * n);
      layout.in_count = elements;
      layout.out_count = elements / n;
      break;
  }
  if (elements > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--sizes: %d bytes is too large; %s counts elements in "
                        "an int (at most %d "
                        "float32 elements)",
                        bytes, CollectiveName(op), INT_MAX));
  }
  layout.bytes = elements * sizeof(float);
  return layout;
}

absl::StatusOr<Counts> LargestCounts(const std::vector<Op>& ops, const std::vector<size_t>& sizes,
                                     int ranks) {
  Counts counts;
  for (Op op : ops) {
    for (size_t size : sizes) {
      RM_ASSIGN_OR_RETURN(Layout layout, MakeLayout(op, size, ranks));
      counts.in = std::max(counts.in, layout.in_count);
      counts.out = std::max(counts.out, layout.out_count);
    }
  }
  return counts;
}

absl::Status ValidateRunFlags(int iters, int warmup, int timeout_s) {
  if (iters == 0 || iters < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--iters: must be at least 1 (or -1 for the default), not ", iters));
  }
  if (warmup < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup: must be at least 0 (or -1 for the default), not ", warmup));
  }
  if (timeout_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout_s: must be at least 1, not ", timeout_s));
  }
  return absl::OkStatus();
}

int DefaultIters(size_t bytes) {
  if (bytes <= (size_t{1} << 20)) return 50;
  if (bytes <= (size_t{16} << 20)) return 20;
  return 5;
}

int DefaultWarmup(size_t bytes) { return bytes <= (size_t{16} << 20) ? 5 : 1; }

void FillInput(int rank, absl::Span<float> in) {
  for (size_t i = 0; i < in.size(); ++i) in[i] = InputValue(rank, i);
}

void FillSentinel(absl::Span<float> out) { std::fill(out.begin(), out.end(), kSentinel); }

absl::Status CheckOutput(const Layout& layout, int rank, absl::string_view impl,
                         absl::Span<const float> out) {
  if (out.size() != layout.out_count) {
    return absl::InternalError(absl::StrFormat("%s %s: output has %d elements, not %d",
                                               CollectiveName(layout.op), impl, out.size(),
                                               layout.out_count));
  }
  const int n = layout.ranks;
  // Index of the first wrong element and the value expected there; out.size()
  // if none.
  size_t bad = out.size();
  float want = 0;
  auto check = [&](size_t i, float expected) {
    if (out[i] != expected && bad == out.size()) {
      bad = i;
      want = expected;
    }
  };
  switch (layout.op) {
    case Op::kAllReduce:
      for (size_t i = 0; i < out.size(); ++i) check(i, SumOverRanks(n, i));
      break;
    case Op::kBroadcast:
      for (size_t i = 0; i < out.size(); ++i) check(i, InputValue(kBroadcastRoot, i));
      break;
    case Op::kAllGather:
      for (int r = 0; r < n; ++r) {
        const size_t base = static_cast<size_t>(r) * layout.in_count;
        for (size_t i = 0; i < layout.in_count; ++i) check(base + i, InputValue(r, i));
      }
      break;
    case Op::kReduceScatter: {
      const size_t base = static_cast<size_t>(rank) * layout.out_count;
      for (size_t i = 0; i < out.size(); ++i) check(i, SumOverRanks(n, base + i));
      break;
    }
  }
  if (bad != out.size()) {
    return absl::DataLossError(absl::StrFormat(
        "%s %s with %d ranks, %d bytes: wrong result on rank %d at element %d: "
        "got %g, "
        "expected %g",
        CollectiveName(layout.op), impl, n, layout.bytes, rank, bad, out[bad], want));
  }
  return absl::OkStatus();
}

Stats Summarize(std::vector<double> times_us) {
  std::sort(times_us.begin(), times_us.end());
  const size_t n = times_us.size();
  Stats stats;
  stats.p50_us = n % 2 == 1 ? times_us[n / 2] : (times_us[n / 2 - 1] + times_us[n / 2]) / 2;
  const size_t p90_rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n)));
  stats.p90_us = times_us[std::max<size_t>(p90_rank, 1) - 1];
  stats.max_us = times_us.back();
  return stats;
}

absl::StatusOr<Measurement> Measure(const Layout& layout, const MeasureOptions& options,
                                    Candidate& candidate) {
  Group& group = *candidate.group;
  // Runs the candidate once after a barrier; returns this rank's time.
  auto timed_run = [&]() -> absl::StatusOr<double> {
    RM_RETURN_IF_ERROR(group.Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = candidate.run();
    const auto t1 = std::chrono::steady_clock::now();
    RM_RETURN_IF_ERROR(status);
    return MicrosSince(t0, t1);
  };

  // Touch every buffer once and check one run's result on every rank. The
  // sentinel goes first: for in-place algorithms the output overlaps the input.
  FillSentinel(candidate.out);
  FillInput(group.rank(), candidate.in);
  std::vector<double> untimed_us(std::max(options.warmup, 1));
  RM_ASSIGN_OR_RETURN(untimed_us[0], timed_run());
  absl::Status check = CheckOutput(layout, group.rank(), candidate.impl, candidate.out);
  double failed = check.ok() ? 0 : 1;
  RM_RETURN_IF_ERROR(group.MaxOverRanks(absl::MakeSpan(&failed, 1)));
  if (!check.ok()) return check;
  if (failed != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s %s with %d ranks, %d bytes: wrong result on another rank (see its "
                        "stderr)",
                        CollectiveName(layout.op), candidate.impl, layout.ranks, layout.bytes));
  }
  for (size_t i = 1; i < untimed_us.size(); ++i) {
    RM_ASSIGN_OR_RETURN(untimed_us[i], timed_run());
  }
  RM_RETURN_IF_ERROR(group.MaxOverRanks(absl::MakeSpan(untimed_us)));
  Measurement measurement;
  measurement.untimed_us = *std::min_element(untimed_us.begin(), untimed_us.end());
  if (measurement.untimed_us > options.prune_above_us) {
    measurement.pruned = true;
    return measurement;
  }

  std::vector<double> times_us(std::max(options.iters, 1));
  for (double& time_us : times_us) {
    RM_ASSIGN_OR_RETURN(time_us, timed_run());
  }
  RM_RETURN_IF_ERROR(group.MaxOverRanks(absl::MakeSpan(times_us)));
  measurement.stats = Summarize(std::move(times_us));
  return measurement;
}

double AlgBwGbps(const Result& result) {
  // bytes / (us * 1e-6) / 1e9
  return static_cast<double>(result.layout.bytes) / result.stats.p50_us / 1e3;
}

double BusBwGbps(const Result& result) {
  return AlgBwGbps(result) * BusFactor(result.layout.op, result.layout.ranks);
}

std::string CsvHeader() { return "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl"; }

std::string CsvLine(const Result& result) {
  return absl::StrFormat("%s,%d,%d,%.2f,%.3f,%.3f,%s", CollectiveName(result.layout.op),
                         result.layout.ranks, result.layout.bytes, result.stats.p50_us,
                         AlgBwGbps(result), BusBwGbps(result), result.impl);
}

std::string TailCsvHeader() { return "op,ranks,bytes,impl,p50_us,p90_us,max_us"; }

std::string TailCsvLine(const Result& result) {
  return absl::StrFormat("%s,%d,%d,%s,%.2f,%.2f,%.2f", CollectiveName(result.layout.op),
                         result.layout.ranks, result.layout.bytes, result.impl, result.stats.p50_us,
                         result.stats.p90_us, result.stats.max_us);
}

absl::StatusOr<Report> Report::Create(int rank, const std::string& tail_csv_path) {
  if (rank != 0) return Report(false, nullptr);
  std::unique_ptr<std::FILE, FileCloser> tail;
  if (!tail_csv_path.empty()) {
    tail.reset(std::fopen(tail_csv_path.c_str(), "w"));
    if (tail == nullptr) {
      return ErrnoToStatus(errno, absl::StrCat("--tail_csv: cannot create ", tail_csv_path));
    }
    std::fprintf(tail.get(), "%s\n", TailCsvHeader().c_str());
    std::fflush(tail.get());
  }
  std::printf("%s\n", CsvHeader().c_str());
  std::fflush(stdout);
  return Report(true, std::move(tail));
}

void Report::Add(const Result& result) {
  if (!active_) return;
  std::printf("%s\n", CsvLine(result).c_str());
  std::fflush(stdout);
  if (tail_ != nullptr) {
    std::fprintf(tail_.get(), "%s\n", TailCsvLine(result).c_str());
    std::fflush(tail_.get());
  }
}

absl::Status KeepMallocMemory() {
  constexpr int kOneGiB = 1 << 30;
  if (mallopt(M_MMAP_THRESHOLD, kOneGiB) != 1) {
    return absl::InternalError("mallopt(M_MMAP_THRESHOLD, 1 GiB) was refused");
  }
  if (mallopt(M_TRIM_THRESHOLD, kOneGiB) != 1) {
    return absl::InternalError("mallopt(M_TRIM_THRESHOLD, 1 GiB) was refused");
  }
  return absl::OkStatus();
}

Watchdog::Watchdog(absl::Duration limit, std::string who)
    : limit_(limit), who_(std::move(who)), thread_([this] { Loop(); }) {}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Watchdog::Start(absl::string_view step) {
  absl::MutexLock lock(&mu_);
  step_ = std::string(step);
  deadline_ = absl::Now() + limit_;
}

void Watchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (absl::Now() >= deadline_) {
      std::fprintf(stderr, "%s: %s did not finish within %s (--timeout_s); exiting\n", who_.c_str(),
                   step_.c_str(), absl::FormatDuration(limit_).c_str());
      std::fflush(stderr);
      std::_Exit(124);
    }
    // Wakes at the deadline seen now; a later Start() only moves it further
    // away.
    mu_.AwaitWithDeadline(absl::Condition(&stop_), deadline_);
  }
}

const Result& Best(const std::vector<Result>& results) {
  return *std::min_element(results.begin(), results.end(), [](const Result& a, const Result& b) {
    return a.stats.p50_us < b.stats.p50_us;
  });
}

absl::Status Settle(Group& group, absl::Duration time) {
  const absl::Time until = absl::Now() + time;
  while (true) {
    double more = group.rank() == 0 && absl::Now() < until ? 1 : 0;
    RM_RETURN_IF_ERROR(group.MaxOverRanks(absl::MakeSpan(&more, 1)));
    if (more == 0) return absl::OkStatus();
  }
}

}  // namespace ringmaster::bench::peers
