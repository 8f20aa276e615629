// Time as a seam: production code asks a Clock, tests drive a FakeClock by hand.
//
// Thread-safety: both implementations may be used from any thread.
#ifndef RINGMASTER_COMMON_CLOCK_H_
#define RINGMASTER_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks until Now() >= deadline. A FakeClock returns when a test advances it there.
  virtual void SleepUntil(absl::Time deadline) = 0;

  // The process-wide real clock. Never null, never destroyed.
  static Clock* Real();
};

// A clock that moves only when told to. SleepUntil blocks until Advance/Set reaches the
// deadline, so scenario tests run without sleeping.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50));

  absl::Time Now() const override;
  void SleepUntil(absl::Time deadline) override;

  void Advance(absl::Duration d);
  void Set(absl::Time t);
  // Number of threads blocked in SleepUntil right now (lets tests wait for a sleeper).
  int sleepers() const;

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_CLOCK_H_
