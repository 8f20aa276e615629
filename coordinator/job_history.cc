#include "coordinator/job_history.h"

#include <algorithm>
#include <utility>

namespace ringmaster::coordinator {

JobHistory::JobHistory(const JobHistoryOptions& options)
    : max_points_(std::max(options.max_points, 2)), max_epochs_(std::max(options.max_epochs, 1)) {}

void JobHistory::AddPoint(const Point& point) {
  // The job went back to a checkpoint: the points from its step on are superseded.
  const bool went_back = !points_.empty() && point.step <= points_.back().step;
  if (went_back) {
    points_.erase(std::lower_bound(points_.begin(), points_.end(), point.step,
                                   [](const Point& p, int64_t step) { return p.step < step; }),
                  points_.end());
  }
  ++skipped_;
  if (!went_back && !points_.empty() && skipped_ < stride_) {
    latest_ = point;
    return;
  }
  points_.push_back(point);
  skipped_ = 0;
  latest_.reset();
  if (static_cast<int>(points_.size()) <= max_points_) return;
  // Full: keep the newest point and every other one before it, and from now on every
  // (2 * stride)-th report, which continues the same spacing.
  std::vector<Point> kept;
  kept.reserve(points_.size() / 2 + 1);
  for (size_t i = points_.size() % 2 == 0 ? 1 : 0; i < points_.size(); i += 2) {
    kept.push_back(points_[i]);
  }
  points_ = std::move(kept);
  stride_ *= 2;
}

void JobHistory::AddEpoch(Epoch epoch) {
  std::erase_if(epochs_, [&](const Epoch& e) { return e.epoch == epoch.epoch; });
  epochs_.push_back(std::move(epoch));
  if (static_cast<int>(epochs_.size()) > max_epochs_) {
    epochs_.erase(epochs_.begin(), epochs_.end() - max_epochs_);
  }
}

JobHistory::View JobHistory::Snapshot() const {
  View view{points_, epochs_};
  if (latest_.has_value()) view.points.push_back(*latest_);
  return view;
}

}  // namespace ringmaster::coordinator
