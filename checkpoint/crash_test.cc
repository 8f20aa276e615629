// Crash safety: a forked process saves step 3 with two ranks (two writers on threads) over
// a checkpoint directory holding steps 1 and 2, and is killed with SIGKILL before its k-th
// filesystem operation that changes something, for every k of a whole save (and at spread-out
// times, to tear writes in the middle). After each kill:
//   - LATEST loads (step 2 or 3), bit for bit, at another world size;
//   - step 2 is byte-identical to before; step 1 is intact or gone, never partial;
//   - every visible step-* verifies;
//   - the next writer start on rank 0 leaves no tmp-* entry, and the next save succeeds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/testing.h"
#include "checkpoint/writer.h"
#include "common/fault_injection_env.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;

// Operations that change the filesystem. Reads and listings are left out of the count:
// rank 0 lists the directory a varying number of times while it waits for rank 1.
bool Changes(const FileOp& op) {
  switch (op.kind) {
    case FileOp::Kind::kOpenRead:
    case FileOp::Kind::kPRead:
    case FileOp::Kind::kGetChildren:
    case FileOp::Kind::kExists:
      return false;
    default:
      return true;
  }
}

// Counts the changing operations; with `kill_at` >= 0, dies before that one.
FileOpHook CountChanges(std::shared_ptr<std::atomic<int64_t>> count, int64_t kill_at = -1) {
  return [count, kill_at](const FileOp& op) {
    if (Changes(op) && count->fetch_add(1) == kill_at) kill(getpid(), SIGKILL);
    return absl::OkStatus();
  };
}

// Every file below `dir`, relative path -> contents.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[fs::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

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
    step1_ = Snapshot(JoinPath(JobDir(base_, "job"), "step-1"));
    step2_ = Snapshot(JoinPath(JobDir(base_, "job"), "step-2"));
    ASSERT_EQ(step2_.size(), 4u);
  }

  testing::WorldOptions World(const std::string& root, Env* env = Env::Default()) const {
    testing::WorldOptions world;
    world.root = root;
    world.table = &table_;
    world.world = kWorld;
    world.zero_stage = 1;
    world.base.env = env;
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
  int64_t CountOperations() const {
    auto count = std::make_shared<std::atomic<int64_t>>(0);
    FaultInjectionEnv counting(Env::Default(), CountChanges(count));
    for (const absl::Status& s : testing::SaveWorld(World(Copy("crash-count"), &counting), 3)) {
      EXPECT_TRUE(s.ok()) << s;
    }
    return count->load();
  }

  // Forks a process that saves step 3 in `root`; `hook` runs in the child before each
  // operation; the parent kills the child after `kill_after`. Returns how the child ended.
  std::string SaveInChild(const std::string& root, FileOpHook hook,
                          absl::Duration kill_after = absl::InfiniteDuration()) const {
    const pid_t pid = fork();
    if (pid == 0) {
      FaultInjectionEnv env(Env::Default(), std::move(hook));
      bool ok = true;
      for (const absl::Status& s : testing::SaveWorld(World(root, &env), 3)) ok = ok && s.ok();
      _exit(ok ? 0 : 1);
    }
    if (kill_after != absl::InfiniteDuration()) {
      absl::SleepFor(kill_after);  // spreads the kill over the save; any point must be safe
      kill(pid, SIGKILL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                               : absl::StrCat("exit ", WEXITSTATUS(status));
  }

  // Everything that must hold after a crash at any point.
  void CheckAfterCrash(const std::string& root) {
    const std::string job_dir = JobDir(root, "job");
    // LATEST loads, bit for bit, into another world size.
    testing::WorldOptions three = World(root);
    three.world = 3;
    LoadOptions load;
    load.root = root;
    load.job = "job";
    load.spec_hash = three.spec_hash;
    absl::StatusOr<testing::LoadCheck> loaded = testing::LoadWorld(three, load);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->step == 2 || loaded->step == 3) << loaded->step;
    EXPECT_TRUE(loaded->mismatches.empty()) << absl::StrJoin(loaded->mismatches, "\n");
    // The previous checkpoint is untouched; the one before is whole or gone.
    EXPECT_EQ(Snapshot(JoinPath(job_dir, "step-2")), step2_);
    std::map<std::string, std::string> step1 = Snapshot(JoinPath(job_dir, "step-1"));
    EXPECT_TRUE(step1.empty() || step1 == step1_) << step1.size() << " files in step-1";
    const std::vector<int64_t> steps = *ListCommittedSteps(Env::Default(), job_dir);
    for (int64_t step : steps) {
      absl::StatusOr<VerifyReport> v =
          VerifyCheckpoint(Env::Default(), JoinPath(job_dir, StepDirName(step)));
      EXPECT_TRUE(v.ok()) << v.status();
    }
    // The next start removes the temporaries; the next save works.
    CheckpointWriterOptions o = World(root).base;
    o.root = root;
    o.job = "job";
    ASSERT_TRUE(CheckpointWriter::Create(o).ok());
    const std::vector<std::string> names = *Env::Default()->GetChildren(job_dir);
    for (const std::string& name : names) {
      EXPECT_FALSE(absl::StartsWith(name, kTempPrefix)) << name;
    }
    for (const absl::Status& s : testing::SaveWorld(World(root), 4)) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(ReadLatest(Env::Default(), job_dir).value_or(-1), 4);
  }

  train::TensorTable table_;
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
    const std::string end =
        SaveInChild(root, CountChanges(std::make_shared<std::atomic<int64_t>>(0), k));
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
    SaveInChild(root, nullptr, save_time * i / 10);
    CheckAfterCrash(root);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

}  // namespace
}  // namespace ringmaster::checkpoint
