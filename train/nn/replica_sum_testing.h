// Test helper: ForwardBackwardOptions::sum_across_replicas for replicas run as threads of
// one process (each thread one replica), so that synchronized statistics can be checked
// against one replica holding every batch.
#ifndef RINGMASTER_TRAIN_NN_REPLICA_SUM_TESTING_H_
#define RINGMASTER_TRAIN_NN_REPLICA_SUM_TESTING_H_

#include <barrier>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ringmaster::train::nn {

// Sum() blocks until every one of `replicas` threads has called it with a span of the same
// length, then gives each the element-wise total (in the order the threads arrived: tests
// compare with a tolerance).
class ThreadReplicaSum {
 public:
  explicit ThreadReplicaSum(int replicas) : barrier_(replicas) {}

  absl::Status Sum(int replica, absl::Span<double> values) {
    {
      absl::MutexLock lock(&mu_);
      if (arrived_ == 0) total_.assign(values.size(), 0.0);
      if (total_.size() != values.size()) return absl::InternalError("replicas disagree");
      for (size_t i = 0; i < values.size(); ++i) total_[i] += values[i];
      ++arrived_;
    }
    barrier_.arrive_and_wait();
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < values.size(); ++i) values[i] = total_[i];
    }
    barrier_.arrive_and_wait();
    if (replica == 0) {
      absl::MutexLock lock(&mu_);
      arrived_ = 0;
    }
    barrier_.arrive_and_wait();
    return absl::OkStatus();
  }

 private:
  std::barrier<> barrier_;
  absl::Mutex mu_;
  std::vector<double> total_;
  int arrived_ = 0;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_REPLICA_SUM_TESTING_H_
