#include "coordinator/preemption_rate.h"

#include <algorithm>

namespace ringmaster {

void PreemptionRate::Record(absl::Time when) {
  times_.push_back(when);
  while (!times_.empty() && times_.front() <= when - window_) times_.pop_front();
}

int PreemptionRate::Recent(absl::Time now) const {
  return static_cast<int>(std::count_if(times_.begin(), times_.end(), [&](absl::Time t) {
    return t > now - window_ && t <= now;
  }));
}

double PreemptionRate::PerNodeHour(absl::Time now, int nodes) const {
  return Recent(now) / absl::ToDoubleHours(window_) / std::max(1, nodes);
}

}  // namespace ringmaster
