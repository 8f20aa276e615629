// The cluster's recent preemption rate: the drains its agents asked for because a cloud's
// preemption notice appeared (DrainNodeRequest.preemption_notice), over a sliding window,
// per node and hour. The coordinator tells each job's trainers the rate times the job's nodes
// (ProgressResponse.preemption_rate_per_hour) for checkpoint.every: auto.
//
// Thread-compatible: the coordinator's lock guards it. Times come from the caller (its clock).
#ifndef RINGMASTER_COORDINATOR_PREEMPTION_RATE_H_
#define RINGMASTER_COORDINATOR_PREEMPTION_RATE_H_

#include <deque>

#include "absl/time/time.h"

namespace ringmaster {

class PreemptionRate {
 public:
  static constexpr absl::Duration kDefaultWindow = absl::Hours(6);

  explicit PreemptionRate(absl::Duration window = kDefaultWindow) : window_(window) {}

  // A node drained on a preemption notice at `when` (times in order, as a clock gives them).
  void Record(absl::Time when);

  // The notices in (now - window, now].
  int Recent(absl::Time now) const;

  // Recent(now) / window in hours / max(1, nodes): preemptions per node-hour.
  double PerNodeHour(absl::Time now, int nodes) const;

 private:
  const absl::Duration window_;
  std::deque<absl::Time> times_;  // those of the last window, oldest first
};

}  // namespace ringmaster

#endif  // RINGMASTER_COORDINATOR_PREEMPTION_RATE_H_
