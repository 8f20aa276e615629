#include "common/progress_rate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringmaster {

std::string RateWindowText() {
  return absl::StrCat("over the last ", absl::ToInt64Seconds(kRateWindow), " s of steps");
}

void ProgressRate::Add(absl::Time at, int64_t step) {
  if (!points_.empty() && (step < points_.back().step || at < points_.back().at)) {
    points_.clear();
  }
  points_.push_back({at, step});
  // Keep one point at or before the window's start: the span covers the whole window once
  // it can, and two points always remain.
  while (points_.size() > 2 && at - points_[1].at >= window_) points_.pop_front();
}

void ProgressRate::Exclude(absl::Duration d) {
  for (Point& p : points_) p.at += d;
}

double ProgressRate::steps_per_s() const {
  if (points_.size() < 2) return 0;
  const double seconds = absl::ToDoubleSeconds(points_.back().at - points_.front().at);
  if (seconds <= 0) return 0;
  return static_cast<double>(points_.back().step - points_.front().step) / seconds;
}

std::optional<double> EtaSeconds(int64_t step, int64_t total_steps, double steps_per_s) {
  if (total_steps <= 0 || !(steps_per_s > 0)) return std::nullopt;
  return static_cast<double>(std::max<int64_t>(0, total_steps - std::max<int64_t>(0, step))) /
         steps_per_s;
}

std::string EtaText(double seconds) {
  const int64_t s = seconds > 0 ? static_cast<int64_t>(seconds + 0.5) : 0;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

std::string ResumeText(int64_t step_before, int64_t resumed_step, const std::string& from,
                       const std::string& because) {
  std::string out = absl::StrCat("resumed from ", from);
  if (step_before < 0) return out;
  const int64_t lost = std::max<int64_t>(0, step_before - std::max<int64_t>(0, resumed_step));
  if (lost == 0) return absl::StrCat(out, ": no step lost");
  absl::StrAppend(&out, ": ", lost, lost == 1 ? " step" : " steps",
                  " lost (the job had reached step ", step_before, ")");
  if (!because.empty()) absl::StrAppend(&out, ", because ", because);
  return out;
}

}  // namespace ringmaster
