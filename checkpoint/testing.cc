#include "checkpoint/testing.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringmaster::checkpoint::testing {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NameHash(absl::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

std::string FreshDir(absl::string_view name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  absl::Status s = DeleteRecursively(Env::Default(), dir);
  if (s.ok()) s = Env::Default()->CreateDir(dir);
  if (!s.ok()) std::abort();
  return dir;
}

state::TensorTable TestTable(int scale) {
  state::TensorTable table;
  table.Add("embed", {97 * scale, 13});
  table.Add("fc1.weight", {31 * scale, 61});
  table.Add("fc1.bias", {31 * scale});
  table.Add("fc2.weight", {7, 19 * scale});
  table.Add("ln.gain", {5});
  return table;
}

int64_t PaddedElements(const state::TensorTable& table, int world) {
  const int64_t unit = world * state::kAlignElements;
  return (table.total_elements() + unit - 1) / unit * unit;
}

float PatternValue(absl::string_view name, int64_t step, int64_t i, int64_t used) {
  if (i >= used) return 0.0f;
  uint32_t bits = static_cast<uint32_t>(
      SplitMix(NameHash(name) ^ SplitMix(static_cast<uint64_t>(step) * 1000003u + i)));
  if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00800000u;  // no inf or NaN
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

std::vector<float> PatternBuffer(absl::string_view name, int64_t step, int64_t elements,
                                 int64_t used) {
  std::vector<float> v(elements);
  for (int64_t i = 0; i < elements; ++i) v[i] = PatternValue(name, step, i, used);
  return v;
}

TrainingState PatternState(int64_t step) {
  TrainingState s;
  s.step = step;
  s.sampler = {static_cast<uint64_t>(step / 7), step * 128 % 60000};
  s.rng_seed = 42;
  s.rng_state = absl::StrCat("rng@", step);
  s.loss_scaler = state::LossScalerState{65536.0 / (1 + step % 3), step % 11, step, step / 10};
  s.optimizer_step = step - step / 10;
  s.schedule_step = step;
  return s;
}

state::FlatRange SavedRange(int64_t elements, int rank, int world, int zero_stage) {
  if (zero_stage == 0) return SaveSlice(elements, rank, world);
  const int64_t shard = elements / world;
  return {rank * shard, (rank + 1) * shard};
}

state::FlatRange NeededRange(absl::string_view buffer, int64_t elements, int rank, int world,
                             int zero_stage) {
  if (zero_stage == 0 || buffer == "params") return {0, elements};
  const int64_t shard = elements / world;
  return {rank * shard, (rank + 1) * shard};
}

std::vector<state::FlatRange> UnitPieces(int64_t elements, int units, int rank, int world) {
  const int64_t unit = (elements + units - 1) / units;
  std::vector<state::FlatRange> pieces;
  for (int u = 0; u < units; ++u) {
    const int64_t begin = std::min(elements, u * unit);
    const int64_t end = std::min(elements, begin + unit);
    const state::FlatRange slice = SaveSlice(end - begin, rank, world);
    pieces.push_back({begin + slice.begin, begin + slice.end});
  }
  return pieces;
}

namespace {

// The ranges of buffer `buffer` that rank `rank` saves (`saving`) or needs.
std::vector<state::FlatRange> RanksRanges(const WorldOptions& options, absl::string_view buffer,
                                          int64_t elements, int rank, bool saving) {
  if (options.units > 0) return UnitPieces(elements, options.units, rank, options.world);
  if (saving) return {SavedRange(elements, rank, options.world, options.zero_stage)};
  return {NeededRange(buffer, elements, rank, options.world, options.zero_stage)};
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<CheckpointWriter>>> CreateWriters(
    const CheckpointWriterOptions& base, int world) {
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < world; ++r) {
    CheckpointWriterOptions o = base;
    o.rank = r;
    o.world_size = world;
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> w = CheckpointWriter::Create(o);
    if (!w.ok()) return w.status();
    writers.push_back(*std::move(w));
  }
  return writers;
}

std::vector<absl::Status> SaveWorld(const WorldOptions& options, int64_t step) {
  const int world = options.world;
  const int64_t elements = PaddedElements(*options.table, world);
  const int64_t used = options.table->total_elements();
  std::vector<absl::Status> statuses(world);
  std::vector<std::unique_ptr<CheckpointWriter>> writers(world);
  for (int r = 0; r < world; ++r) {
    CheckpointWriterOptions o = options.base;
    o.root = options.root;
    o.job = options.job;
    o.rank = r;
    o.world_size = world;
    o.zero_stage = options.zero_stage;
    o.spec_hash = options.spec_hash;
    o.table = options.table;
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> w = CheckpointWriter::Create(o);
    if (!w.ok()) {
      statuses[r] = w.status();
      return statuses;
    }
    writers[r] = *std::move(w);
  }
  std::vector<std::vector<float>> full;  // every rank holds the whole pattern (it is read-only)
  for (const std::string& name : kBuffers)
    full.push_back(PatternBuffer(name, step, elements, used));
  const absl::Time deadline = absl::Now() + options.deadline;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      SaveRequest request;
      request.step = step;
      request.state = PatternState(step);
      // Piece by piece, every buffer's piece i before any buffer's piece i + 1.
      std::vector<std::vector<state::FlatRange>> ranges;
      for (const std::string& name : kBuffers) {
        ranges.push_back(RanksRanges(options, name, elements, r, /*saving=*/true));
      }
      for (size_t i = 0; i < ranges[0].size(); ++i) {
        for (size_t b = 0; b < kBuffers.size(); ++b) {
          const state::FlatRange range = ranges[b][i];
          request.buffers.push_back(
              {kBuffers[b], elements, range,
               absl::MakeConstSpan(full[b]).subspan(range.begin, range.size())});
        }
      }
      statuses[r] = writers[r]->SaveSync(request, deadline);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

absl::StatusOr<LoadCheck> LoadWorld(const WorldOptions& options, const LoadOptions& load) {
  const int world = options.world;
  const int64_t elements = PaddedElements(*options.table, world);
  const int64_t used = options.table->total_elements();
  std::vector<absl::StatusOr<LoadResult>> results(world, absl::UnknownError("not run"));
  // ranges[r][b]: the ranges of buffer b rank r needs; outs[r][b]: its pieces of them, back
  // to back (as a ZeRO-3 rank holds them).
  std::vector<std::vector<std::vector<state::FlatRange>>> ranges(world);
  std::vector<std::vector<std::vector<float>>> outs(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::vector<LoadTarget> targets;
      outs[r].resize(kBuffers.size());
      for (size_t b = 0; b < kBuffers.size(); ++b) {
        ranges[r].push_back(RanksRanges(options, kBuffers[b], elements, r, /*saving=*/false));
        int64_t size = 0;
        for (const state::FlatRange& range : ranges[r][b]) size += range.size();
        outs[r][b].assign(size, -1.0f);
        int64_t at = 0;
        for (const state::FlatRange& range : ranges[r][b]) {
          targets.push_back(
              {kBuffers[b], range, absl::MakeSpan(outs[r][b]).subspan(at, range.size())});
          at += range.size();
        }
      }
      results[r] = LoadCheckpoint(load, targets);
    });
  }
  for (std::thread& t : threads) t.join();
  LoadCheck check;
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) return results[r].status();
    check.stats.push_back(results[r]->stats);
    const int64_t step = results[r]->checkpoint.manifest.step();
    if (r == 0) check.step = step;
    if (step != check.step) {
      check.mismatches.push_back(absl::StrCat("rank ", r, " loaded step ", step));
      continue;
    }
    if (!(results[r]->checkpoint.state == PatternState(step))) {
      check.mismatches.push_back(absl::StrCat("rank ", r, ": training state differs"));
    }
    for (size_t b = 0; b < kBuffers.size(); ++b) {
      const float* got = outs[r][b].data();
      for (const state::FlatRange& range : ranges[r][b]) {
        int64_t i = range.begin;
        for (; i < range.end; ++i, ++got) {
          const float want = PatternValue(kBuffers[b], step, i, used);
          if (std::memcmp(&want, got, sizeof(float)) != 0) break;
        }
        if (i < range.end) {
          check.mismatches.push_back(absl::StrCat("rank ", r, " ", kBuffers[b], "[", i, "]"));
          break;
        }
      }
    }
  }
  return check;
}

}  // namespace ringmaster::checkpoint::testing
