// What the node agent keeps on disk of its trainers, so that an agent restarted on the same
// work directory finds what its predecessor left running and ends it before it starts
// trainers on those slots. (A trainer dies with its agent (LaunchSpec::parent_death_signal),
// but not one started by an agent without that, nor one whose agent's death the kernel
// could not signal; and two trainers of one slot must never run at once.)
//
// One file per slot, <dir>/slot-<S>: "<pid> <start time> <epoch> <job>\n", written
// atomically (write temp, fsync, rename) once the trainer is launched and removed once it
// is reaped. The start time (field 22 of /proc/<pid>/stat, in clock ticks since boot) tells
// the recorded process from a later one that reuses its pid: a record whose process is gone,
// or whose pid now names another process, is dropped without a signal.
//
// Not thread-safe: one thread (the agent's) calls it. Linux only (/proc, pidfd).
#ifndef RINGMASTER_WORKER_TRAINER_RECORDS_H_
#define RINGMASTER_WORKER_TRAINER_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::worker {

struct TrainerRecord {
  int slot = 0;
  int64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22
  int64_t epoch = 0;        // the epoch it was started for
  std::string job;
};

// The start time of process `pid` (/proc/<pid>/stat field 22). NOT_FOUND when there is no
// such process or it has exited (a zombie): nothing runs under that pid.
absl::StatusOr<uint64_t> ProcessStartTime(int64_t pid);

// Writes the record of `slot`'s trainer into `dir` (created when missing), reading the
// start time of `pid`. INTERNAL when the file cannot be written; NOT_FOUND when `pid` is
// gone already.
absl::Status RecordTrainer(const std::string& dir, int slot, int64_t pid, int64_t epoch,
                           const std::string& job);
// Removes `slot`'s record. Never fails (a missing record is fine).
void ForgetTrainer(const std::string& dir, int slot);
// The records in `dir`; files that do not parse are skipped (logged). Empty when `dir`
// does not exist.
std::vector<TrainerRecord> ReadTrainerRecords(const std::string& dir);

struct EndOptions {
  // How long a trainer has to leave after SIGTERM (its job's drain save), then SIGKILL.
  absl::Duration term_grace = absl::Seconds(10);
  // How long to wait for it to go after SIGKILL.
  absl::Duration kill_wait = absl::Seconds(5);
};

struct EndedTrainer {
  TrainerRecord record;
  // What ended it: SIGTERM, or SIGKILL when it outlived term_grace; 0 when it was gone
  // already (it died with the agent that recorded it, or its pid names another process).
  int signal = 0;
  // Still there after kill_wait (unkillable: stuck in the kernel). The caller must not
  // start a trainer on its slot.
  bool survived = false;
};

// Ends every trainer recorded in `dir` that still runs (the same pid and start time):
// SIGTERM to its process group, SIGKILL after term_grace, then waits up to kill_wait for it
// to be gone. Waits on all of them together (the longest is term_grace + kill_wait). The
// records are removed, those of processes already gone included. Returns every trainer
// recorded, by slot: those it signalled, and those gone already (signal 0).
std::vector<EndedTrainer> EndRecordedTrainers(const std::string& dir, const EndOptions& options);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_TRAINER_RECORDS_H_
