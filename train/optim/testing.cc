#include "train/optim/testing.h"

#include <algorithm>
#include <random>
#include <thread>

#include "glog/logging.h"

namespace ringmaster::train::testing {

state::TensorTable SmallModelTable() {
  state::TensorTable table;
  table.Add("embed.weight", {6, 5});    // [0, 30), padded to 32
  table.Add("fc1.weight", {7, 6});      // [32, 74), padded to 80
  table.Add("fc1.bias", {7});           // [80, 87)
  table.Add("ln.gain", {7});            // [96, 103)
  table.Add("conv.weight", {3, 1, 7});  // [112, 133)
  table.Add("head.bias", {3});          // [144, 147), total 160
  return table;
}

std::vector<state::FlatRange> Shards(const state::TensorTable& table, int shards) {
  static const std::vector<std::vector<int64_t>> kCuts = {
      {}, {50}, {15, 100}, {15, 77, 120}, {15, 50, 83, 145}};
  CHECK(shards >= 1 && shards <= static_cast<int>(kCuts.size())) << shards;
  std::vector<state::FlatRange> ranges;
  int64_t begin = 0;
  for (int64_t cut : kCuts[shards - 1]) {
    ranges.push_back({begin, cut});
    begin = cut;
  }
  ranges.push_back({begin, table.total_elements()});
  return ranges;
}

UnitShard UnitShardOf(absl::Span<const state::FlatRange> units, int world, int rank) {
  CHECK(world >= 1 && rank >= 0 && rank < world) << rank << " of " << world;
  const int64_t quantum = world * state::kAlignElements;
  UnitShard shard;
  for (const state::FlatRange& unit : units) {
    const int64_t part = (unit.size() + quantum - 1) / quantum * quantum / world;
    const int64_t begin = std::min(unit.begin + rank * part, unit.end);
    const int64_t end = std::min(unit.begin + (rank + 1) * part, unit.end);
    shard.pieces.push_back({{begin, end}, shard.local_elements});
    shard.local_elements += part;
  }
  return shard;
}

std::vector<state::FlatRange> WholeTensorUnits(const state::TensorTable& table,
                                               const std::vector<int>& tensors_per_unit) {
  std::vector<state::FlatRange> units;
  int first = 0;
  for (int count : tensors_per_unit) {
    CHECK(count >= 1 && first + count <= table.size()) << count << " tensors from " << first;
    const state::TensorSpec& last = table.tensor(first + count - 1);
    units.push_back({table.tensor(first).offset, last.offset + last.numel});
    first += count;
  }
  return units;
}

void FillRandom(const state::TensorTable& table, uint64_t seed, float scale,
                state::FlatBuffer& buffer) {
  CHECK_EQ(buffer.size(), table.total_elements());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (const state::TensorSpec& t : table.tensors()) {
    for (float& x : buffer.tensor(t)) x = normal(rng);
  }
}

FakeRanks::FakeRanks(int world) : world_(world), contributions_(world) {}

void FakeRanks::Run(const std::function<void(int rank, const SumAcrossRanks& sum)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_; ++rank) {
    threads.emplace_back([this, rank, &body] {
      body(rank, [this, rank](absl::Span<double> values) { return Sum(rank, values); });
    });
  }
  for (std::thread& t : threads) t.join();
}

int64_t FakeRanks::rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

absl::Status FakeRanks::Sum(int rank, absl::Span<double> values) {
  absl::MutexLock lock(&mu_);
  // The previous round must have handed out its totals to every rank first.
  mu_.Await(absl::Condition(
      +[](bool* summed) { return !*summed; }, &summed_));
  contributions_[rank].assign(values.begin(), values.end());
  if (++arrived_ == world_) {
    totals_.assign(values.size(), 0.0);
    for (const std::vector<double>& c : contributions_) {
      CHECK_EQ(c.size(), totals_.size()) << "ranks summed spans of different lengths";
      for (size_t i = 0; i < c.size(); ++i) totals_[i] += c[i];
    }
    summed_ = true;
  }
  mu_.Await(absl::Condition(&summed_));
  std::copy(totals_.begin(), totals_.end(), values.begin());
  if (++departed_ == world_) {
    arrived_ = 0;
    departed_ = 0;
    summed_ = false;
    ++rounds_;
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::train::testing
