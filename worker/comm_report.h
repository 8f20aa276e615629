// A trainer process's communication since it started (RankStats.comm_ops, buckets and
// process_steps), across the epochs it trains in: each epoch's trainer reports its own
// communicators' counters (train::StepReport), which start again with the epoch's new
// communicators; these totals add the epochs up.
//
// Thread-safety: any thread (the training thread updates, the progress reporter fills).
#ifndef RINGMASTER_WORKER_COMM_REPORT_H_
#define RINGMASTER_WORKER_COMM_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"
#include "train/trainer.h"

namespace ringmaster::worker {

class ProcessCommStats {
 public:
  // The current epoch's latest report (its counters since the epoch's trainer started).
  void Update(const train::StepReport& report);
  // The epoch is over: its last report joins the totals of the epochs before.
  void EndEpoch();
  // Sets stats' comm_ops (by group, then op kind; kinds never called left out), buckets
  // and process_steps to the totals so far.
  void Fill(RankStats* stats) const;

 private:
  // Keyed by (group, op kind).
  using OpTotals = std::map<std::pair<std::string, int>, CommOpStats>;
  static void AddEpoch(const train::StepReport& report, OpTotals* ops,
                       std::vector<BucketStats>* buckets, int64_t* steps);

  mutable absl::Mutex mu_;
  OpTotals ops_ ABSL_GUARDED_BY(mu_);  // the epochs before
  std::vector<BucketStats> buckets_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  train::StepReport current_ ABSL_GUARDED_BY(mu_);  // this epoch's latest
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_COMM_REPORT_H_
