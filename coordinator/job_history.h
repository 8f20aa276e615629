// What the coordinator remembers of a job's past for its dashboard (dashboard.h): rank 0's
// progress reports as a bounded series (loss, throughput and communication share against
// step and time) and the members of each epoch as it commits.
//
// Bounded: at most JobHistoryOptions::max_points points. When the series is full, every
// other kept point is dropped and from then on only every 2nd report is kept (then every
// 4th, ...), so the kept points stay evenly spread over the whole run; the latest report is
// always in the view. A report whose step is at or below the last kept one (the job went
// back to a checkpoint after a recovery) replaces the points from that step on: the curve
// is the run that continued (the steps done twice are the recovery's lost steps). At most
// max_epochs epochs are kept, the newest.
//
// In memory only: a restarted coordinator starts each job's series again.
// Not thread-safe: the coordinator calls it under its lock.
#ifndef RINGMASTER_COORDINATOR_JOB_HISTORY_H_
#define RINGMASTER_COORDINATOR_JOB_HISTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/membership.h"

namespace ringmaster::coordinator {

struct JobHistoryOptions {
  int max_points = 2000;  // at least 2 (a smaller value counts as 2)
  int max_epochs = 256;   // at least 1
};

class JobHistory {
 public:
  // One progress report of rank 0 (RankStats): its figures are the job's (throughput is
  // all ranks together). A figure not measured is 0.
  struct Point {
    absl::Time time;
    int64_t epoch = 0;
    int64_t step = 0;
    double loss = 0;
    double step_time_s = 0;
    double samples_per_s = 0;
    double tokens_per_s = 0;
    double comm_fraction = 0;          // of the step time, in collectives
    double exposed_comm_fraction = 0;  // of the step time, waiting for collectives
  };
  // The members of a committed epoch.
  struct Epoch {
    int64_t epoch = 0;
    EpochCause cause = EpochCause::kStart;
    absl::Time committed;
    std::vector<SlotRef> ranks;  // rank r's slot at [r]; the world size is its length
  };
  struct View {
    std::vector<Point> points;  // in report order (steps increase)
    std::vector<Epoch> epochs;  // oldest first
  };

  explicit JobHistory(const JobHistoryOptions& options = {});

  void AddPoint(const Point& point);
  // An epoch committed again (a restarted coordinator restoring the current one) replaces
  // its record.
  void AddEpoch(Epoch epoch);

  // A copy of what is kept.
  View Snapshot() const;

  // Reports per kept point now: 1, then 2, 4, ... as the series fills.
  int64_t stride() const { return stride_; }

 private:
  const int max_points_;
  const int max_epochs_;
  std::vector<Point> points_;
  std::vector<Epoch> epochs_;
  int64_t stride_ = 1;
  int64_t skipped_ = 0;          // reports since the last kept point
  std::optional<Point> latest_;  // the latest report, when it was not kept
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_JOB_HISTORY_H_
