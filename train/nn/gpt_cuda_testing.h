// Test helpers of the GPU GPT's tests (CUDA builds only): a tensor-parallel group of ranks
// that are threads of one process, summing on the host in lockstep; the whole model's
// tensors cut to a tensor-parallel rank's shards or a pipeline stage's slice; per-tensor
// comparisons.
#ifndef RINGMASTER_TRAIN_NN_GPT_CUDA_TESTING_H_
#define RINGMASTER_TRAIN_NN_GPT_CUDA_TESTING_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "state/tensor.h"
#include "train/nn/gpt.h"

namespace ringmaster::train::nn::testing {

// `values` of a whole tensor [whole_rows, whole_cols] cut to `shard` (rows in order, each to
// its columns).
inline std::vector<float> CutToShard(const float* values, const TensorShard& shard) {
  std::vector<float> out;
  for (const auto& [lo, hi] : shard.row_ranges) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = values + r * shard.whole_cols;
      out.insert(out.end(), row + shard.col_begin, row + shard.col_end);
    }
  }
  return out;
}

// The whole model's parameters, moved off GPT-2's initialisation.
inline std::vector<float> WholeParams(const GptModel& whole) {
  state::FlatBuffer p(whole.table().total_elements());
  whole.Init(5, p);
  std::vector<float> v(p.data(), p.data() + p.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] += 0.05f * std::sin(0.7f * static_cast<float>(i));
  return v;
}

// A model's flat buffer holding, for each of its tensors, the whole model's values cut to
// the tensor's shard.
inline std::vector<float> CutFlat(const GptModel& part, const GptModel& whole,
                                  const float* values) {
  std::vector<float> out(part.table().total_elements(), 0.0f);
  for (int i = 0; i < part.table().size(); ++i) {
    const state::TensorSpec& t = part.table().tensor(i);
    const state::TensorSpec& w = whole.table().tensor(*whole.table().Find(t.name));
    const std::vector<float> cut = CutToShard(values + w.offset, part.shard(i));
    EXPECT_EQ(static_cast<int64_t>(cut.size()), t.numel) << t.name;
    std::copy(cut.begin(), cut.end(), out.begin() + t.offset);
  }
  return out;
}

// Per tensor of `table`: ||got - want|| <= tol ||want|| + 1e-12. Prints the largest ratio
// ||got - want|| / ||want|| (the measured error).
inline void ExpectClosePerTensor(const state::TensorTable& table, const std::vector<float>& got,
                                 const std::vector<float>& want, double tol,
                                 const std::string& what) {
  double worst = 0;
  for (const state::TensorSpec& t : table.tensors()) {
    double diff = 0, ref = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      ref += double{want[i]} * want[i];
    }
    EXPECT_LE(std::sqrt(diff), tol * std::sqrt(ref) + 1e-12)
        << what << " of " << t.name << " (norm " << std::sqrt(ref) << ")";
    if (ref > 0) worst = std::max(worst, std::sqrt(diff / ref));
  }
  std::printf("%s: largest per-tensor relative error %.3g (bound %.3g)\n", what.c_str(), worst,
              tol);
}

// The sum of a tensor-parallel group whose `size` ranks are threads of this process: each
// rank's call waits until every rank has made its call of the same round, then every rank
// gets the sum of all ranks' values, added in rank order (so every rank gets the same bits).
// Rounds whose counts differ between ranks, or a rank that does not arrive within
// `timeout`, are errors (a model making the wrong calls fails its test instead of hanging).
// Thread-safe.
class HostGroupSum {
 public:
  explicit HostGroupSum(int size, std::chrono::seconds timeout = std::chrono::seconds(300))
      : size_(size), timeout_(timeout), values_(size) {}

  // Host values.
  absl::Status Sum(int rank, absl::Span<float> data) {
    values_[rank].assign(data.begin(), data.end());
    if (absl::Status s = Barrier(); !s.ok()) return s;
    for (int r = 0; r < size_; ++r) {
      if (values_[r].size() != data.size()) {
        return absl::InternalError(absl::StrCat("tensor-parallel sum of rank ", rank, ": ",
                                                data.size(), " values; rank ", r, " gave ",
                                                values_[r].size()));
      }
    }
    for (size_t i = 0; i < data.size(); ++i) {
      float s = values_[0][i];
      for (int r = 1; r < size_; ++r) s += values_[r][i];
      data[i] = s;
    }
    ++rounds_[rank];
    return Barrier();  // nobody refills values_ before every rank has read them
  }

  // Device values of `stream`: waits for the stream, sums on the host, copies the sums back.
  absl::Status SumOnDevice(int rank, float* device, int64_t count, cudaStream_t stream) {
    std::vector<float> host(count);
    if (cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpy(host.data(), device, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return absl::InternalError("tensor-parallel sum: copy to the host failed");
    }
    if (absl::Status s = Sum(rank, absl::MakeSpan(host)); !s.ok()) return s;
    if (cudaMemcpy(device, host.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("tensor-parallel sum: copy to the device failed");
    }
    return absl::OkStatus();
  }

  // Sums rank `rank` has taken part in.
  int rounds(int rank) const { return rounds_.at(rank); }

 private:
  absl::Status Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return absl::OkStatus();
    }
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != generation; })) {
      return absl::DeadlineExceededError("tensor-parallel sum: a rank did not arrive");
    }
    return absl::OkStatus();
  }

  const int size_;
  const std::chrono::seconds timeout_;
  std::vector<std::vector<float>> values_;  // each written by its rank between barriers
  std::vector<int> rounds_ = std::vector<int>(static_cast<size_t>(size_), 0);
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

}  // namespace ringmaster::train::nn::testing

#endif  // RINGMASTER_TRAIN_NN_GPT_CUDA_TESTING_H_
