// Crash safety: a forked process saves step 3 with two ranks (two writers on threads) over
// a checkpoint directory holding steps 1 and 2, and is killed with SIGKILL before its k-th
// filesystem operation that changes something, for every k of a whole save (and at spread-out
// times, to tear writes in the middle). After each kill:
//   - LATEST loads (step 2 or 3), bit for bit, at another world size;
//   - step 2 is byte-identical to before; step 1 is intact or gone, never partial;
//   - every visible step-* verifies;
//   - the next writer start on rank 0 leaves no tmp-* entry, and the next save succeeds.
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/crash_harness.h"
#include "checkpoint/layout.h"
#include "checkpoint/testing.h"
#include "common/fault_injection_env.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = testing::TestTable(1);
    base_ = testing::FreshDir("crash-base");
    testing::WorldOptions world = World(base_);
    for (int64_t step : {1, 2}) {
      for (const absl::Status& s : testing::SaveWorld(world, step)) ASSERT_TRUE(s.ok()) << s;
    }
    // Leftovers of an earlier crash, for the start-up clean-up to remove (and be killed in).
    const std::string junk = JoinPath(JobDir(base_, "job"), "tmp-step-9-save-0");
    ASSERT_TRUE(Env::Default()->CreateDir(junk).ok());
    ASSERT_TRUE(WriteFileDurably(Env::Default(), JoinPath(junk, "shard-1-of-2.bin"), "x").ok());
    step1_ = testing::SnapshotFiles(JoinPath(JobDir(base_, "job"), "step-1"));
    step2_ = testing::SnapshotFiles(JoinPath(JobDir(base_, "job"), "step-2"));
    ASSERT_EQ(step2_.size(), 4u);
  }

  // units > 0: ZeRO-3's pieces of `units` units (testing::UnitPieces), saved and loaded.
  testing::WorldOptions World(const std::string& root, int units = 0) const {
    testing::WorldOptions world;
    world.root = root;
    world.table = &table_;
    world.world = kWorld;
    world.zero_stage = units > 0 ? 3 : 1;
    world.units = units;
    world.base.retention.keep_last = 2;
    world.base.block_bytes = 4096;
    world.base.write_bytes = 4096;  // many pwrites: many places to die
    world.base.poll_interval = absl::Milliseconds(1);
    return world;
  }

  // A copy of the prepared directory.
  std::string Copy(const std::string& name) const {
    const std::string root = testing::FreshDir(name);
    fs::copy(base_, root, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    return root;
  }

  // Changing operations of a whole save of step 3, counted in this process.
  int64_t CountOperations(int units = 0) const {
    return testing::CountSaveOperations(World(Copy("crash-count"), units), 3);
  }

  // Everything that must hold after a crash at any point (with `units`: LATEST loads in
  // pieces, the next save is in pieces).
  void CheckAfterCrash(const std::string& root, int units = 0) {
    testing::CrashExpectations e;
    e.latest_may_be = {2, 3};
    e.untouched[2] = step2_;  // the previous checkpoint
    e.whole_or_gone[1] = step1_;
    e.load_world = 3;  // another world size
    e.load_zero_stage = 1;
    e.next_step = 4;
    const std::vector<std::string> violations =
        testing::CheckAfterCrash(World(root, units), e);
    EXPECT_TRUE(violations.empty()) << absl::StrJoin(violations, "\n");
  }

  state::TensorTable table_;
  std::string base_;
  std::map<std::string, std::string> step1_, step2_;
};

TEST_F(CrashTest, KilledBeforeAnyOperationOfASave) {
  const int64_t operations = CountOperations();
  ASSERT_GE(operations, 50) << "too few places to crash";
  int killed = 0;
  for (int64_t k = 0; k < operations; ++k) {
    SCOPED_TRACE(absl::StrCat("killed before operation ", k, " of ", operations));
    const std::string root = Copy("crash");
    const std::string end = testing::SaveInChild(
        World(root), 3, testing::CountChanges(std::make_shared<std::atomic<int64_t>>(0), k));
    EXPECT_EQ(end, "signal 9");
    killed += end == "signal 9";
    CheckAfterCrash(root);
    if (HasFatalFailure() || HasFailure()) return;
  }
  EXPECT_GE(killed, 50);
}

TEST_F(CrashTest, KilledAtSpreadOutTimes) {
  const absl::Time start = absl::Now();
  CountOperations();
  const absl::Duration save_time = absl::Now() - start;
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE(absl::StrCat("killed after ", i, "/10 of a save's time"));
    const std::string root = Copy("crash-timed");
    testing::SaveInChild(World(root), 3, nullptr, save_time * i / 10);
    CheckAfterCrash(root);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

// The same with a save of ZeRO-3's pieces (a chunk per piece, many per rank) after
// contiguous ones: LATEST loads in pieces at 3 ranks whichever step it names.
TEST_F(CrashTest, KilledAtSpreadOutTimesWhileSavingPieces) {
  constexpr int kUnits = 5;
  const absl::Time start = absl::Now();
  ASSERT_GT(CountOperations(kUnits), 0);
  const absl::Duration save_time = absl::Now() - start;
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE(absl::StrCat("killed after ", i, "/10 of a save's time"));
    const std::string root = Copy("crash-pieces");
    testing::SaveInChild(World(root, kUnits), 3, nullptr, save_time * i / 10);
    CheckAfterCrash(root, kUnits);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

}  // namespace
}  // namespace ringmaster::checkpoint
