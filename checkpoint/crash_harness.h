// Crash harness: a forked process saves a checkpoint and is SIGKILLed before its k-th
// filesystem operation that changes something (or after a given time); then every
// promise of the format is checked on what it left. Used by crash_test (every k of one
// save) and by bench/checkpoint_soak (random kills, chained over thousands of saves in one
// directory).
#ifndef RINGMASTER_CHECKPOINT_CRASH_HARNESS_H_
#define RINGMASTER_CHECKPOINT_CRASH_HARNESS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "checkpoint/testing.h"
#include "common/fault_injection_env.h"

namespace ringmaster::checkpoint::testing {

// Every file below `dir`, relative path -> contents; empty when `dir` does not exist.
using FileSnapshot = std::map<std::string, std::string>;
FileSnapshot SnapshotFiles(const std::string& dir);

// Operations that change the filesystem. Reads and listings are left out: rank 0 lists the
// directory a varying number of times while it waits for the other ranks.
bool ChangesFilesystem(const FileOp& op);

// Counts the changing operations in `count`; with `kill_at` >= 0, SIGKILLs this process
// before that one.
FileOpHook CountChanges(std::shared_ptr<std::atomic<int64_t>> count, int64_t kill_at = -1);

// The changing operations of a whole SaveWorld(world, step) (it saves: give it a copy of
// the real directory; the count includes retention's and the start-up clean-up's). -1 when
// the save fails.
int64_t CountSaveOperations(const WorldOptions& world, int64_t step);

// Forks a process that runs SaveWorld(world, step) with its Env wrapped in a
// FaultInjectionEnv calling `hook` before each operation; the parent SIGKILLs it after
// `kill_after` (if finite) and reaps it. Returns how the child ended: "signal 9", "exit 0"
// (every rank saved), "exit 1" (a rank failed).
std::string SaveInChild(const WorldOptions& world, int64_t step, FileOpHook hook,
                        absl::Duration kill_after = absl::InfiniteDuration());

// What a crash may and may not have changed in world.root / world.job.
struct CrashExpectations {
  std::vector<int64_t> latest_may_be;         // LATEST names one of these afterwards
  std::map<int64_t, FileSnapshot> untouched;  // these steps byte-identical
  std::map<int64_t, FileSnapshot> whole_or_gone;
  int load_world = 1;       // LATEST is loaded (bit for bit) at this world size
  int load_zero_stage = 0;  // and ZeRO stage
  int64_t next_step = -1;   // >= 0: then a save of this step must work and become LATEST
};

// Checks, after a crash: LATEST loads bit for bit at the load world, names an allowed step;
// the untouched steps are; the others whole or gone; every committed step verifies; a
// rank-0 writer's start removes every tmp-* entry; the next save (if asked) works. Returns
// the violations, empty when everything holds.
std::vector<std::string> CheckAfterCrash(const WorldOptions& world, const CrashExpectations& e);

}  // namespace ringmaster::checkpoint::testing

#endif  // RINGMASTER_CHECKPOINT_CRASH_HARNESS_H_
