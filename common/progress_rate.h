// One definition of a job's training rate and its ETA, for every place a user reads them:
// the trainer's progress line, the coordinator's job record (`ringctl list -o wide`, `top`,
// `status`, `submit --wait`), the dashboard and /metrics.
//
// The rate is steps per second over the last kRateWindow of steps: from the oldest step
// inside the window (or the last one before it, so that a step longer than the window still
// counts) to the newest, less time spent outside the steps (evaluations: Exclude). Samples
// per second are that times the global batch, tokens per second that times the context.
// The ETA is the steps left at that rate.
//
// Thread-safety: a ProgressRate is not synchronised; the functions are pure.
#ifndef RINGMASTER_COMMON_PROGRESS_RATE_H_
#define RINGMASTER_COMMON_PROGRESS_RATE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace ringmaster {

// The window every rate and ETA is measured over.
inline constexpr absl::Duration kRateWindow = absl::Seconds(30);

// How the figures say their window: "over the last 30 s of steps".
std::string RateWindowText();

// Steps per second over a sliding window of (time, step) points.
class ProgressRate {
 public:
  explicit ProgressRate(absl::Duration window = kRateWindow) : window_(window) {}

  // The job was at `step` (steps done) at `at`. A step lower than the last one (a restore
  // from an older checkpoint) or a time before the last starts the window again.
  void Add(absl::Time at, int64_t step);
  void Clear() { points_.clear(); }
  // The last `d` were spent outside the steps (an evaluation): not counted.
  void Exclude(absl::Duration d);

  // Steps per second across the window; 0 before two points a positive time apart.
  double steps_per_s() const;

 private:
  struct Point {
    absl::Time at;
    int64_t step;
  };
  absl::Duration window_;
  std::deque<Point> points_;
};

// Seconds until `total_steps` at `steps_per_s` from `step`; nullopt when either is not
// known (a rate of 0, no total), 0 once the step reaches the total.
std::optional<double> EtaSeconds(int64_t step, int64_t total_steps, double steps_per_s);

// An ETA as every view writes it: "42s", "3m05s", "1h02m" (rounded to the second).
std::string EtaText(double seconds);

// What a recovery cost, the same words in the trainer's progress lines, `ringctl status` and
// the dashboard: "resumed from step 200's checkpoint: 65 steps lost (the job had reached
// step 265), because <because>". `from` says where the state came from ("step 200's
// checkpoint", "rank 1's memory", "scratch"); `because`, when not empty, why not from a
// survivor's memory. Without a step before (< 0) it says only where it resumed from; "no
// step lost" when it resumed where the job was.
std::string ResumeText(int64_t step_before, int64_t resumed_step, const std::string& from,
                       const std::string& because);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_PROGRESS_RATE_H_
