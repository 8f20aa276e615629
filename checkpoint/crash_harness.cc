#include "checkpoint/crash_harness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/writer.h"

namespace ringmaster::checkpoint::testing {

namespace fs = std::filesystem;

FileSnapshot SnapshotFiles(const std::string& dir) {
  FileSnapshot files;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[fs::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

bool ChangesFilesystem(const FileOp& op) {
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

FileOpHook CountChanges(std::shared_ptr<std::atomic<int64_t>> count, int64_t kill_at) {
  return [count = std::move(count), kill_at](const FileOp& op) {
    if (ChangesFilesystem(op) && count->fetch_add(1) == kill_at) kill(getpid(), SIGKILL);
    return absl::OkStatus();
  };
}

int64_t CountSaveOperations(const WorldOptions& world, int64_t step) {
  auto count = std::make_shared<std::atomic<int64_t>>(0);
  FaultInjectionEnv counting(world.base.env, CountChanges(count));
  WorldOptions counted = world;
  counted.base.env = &counting;
  for (const absl::Status& s : SaveWorld(counted, step)) {
    if (!s.ok()) return -1;
  }
  return count->load();
}

std::string SaveInChild(const WorldOptions& world, int64_t step, FileOpHook hook,
                        absl::Duration kill_after) {
  const pid_t pid = fork();
  if (pid == 0) {
    FaultInjectionEnv env(world.base.env, std::move(hook));
    WorldOptions hooked = world;
    hooked.base.env = &env;
    bool ok = true;
    for (const absl::Status& s : SaveWorld(hooked, step)) ok = ok && s.ok();
    _exit(ok ? 0 : 1);
  }
  if (pid < 0) return "fork failed";
  if (kill_after != absl::InfiniteDuration()) {
    absl::SleepFor(kill_after);  // any point of the save must be safe
    kill(pid, SIGKILL);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                             : absl::StrCat("exit ", WEXITSTATUS(status));
}

std::vector<std::string> CheckAfterCrash(const WorldOptions& world, const CrashExpectations& e) {
  std::vector<std::string> violations;
  Env* env = Env::Default();
  const std::string job_dir = JobDir(world.root, world.job);
  // LATEST loads, bit for bit, into the load world.
  WorldOptions loader = world;
  loader.world = e.load_world;
  loader.zero_stage = e.load_zero_stage;
  loader.base.env = env;
  LoadOptions load;
  load.root = world.root;
  load.job = world.job;
  load.spec_hash = world.spec_hash;
  absl::StatusOr<LoadCheck> loaded = LoadWorld(loader, load);
  if (!loaded.ok()) {
    violations.push_back(absl::StrCat("LATEST does not load: ", loaded.status().ToString()));
  } else {
    if (std::find(e.latest_may_be.begin(), e.latest_may_be.end(), loaded->step) ==
        e.latest_may_be.end()) {
      violations.push_back(absl::StrCat("LATEST is step ", loaded->step, ", expected one of ",
                                        absl::StrJoin(e.latest_may_be, ", ")));
    }
    for (const std::string& m : loaded->mismatches) {
      violations.push_back(absl::StrCat("loaded step ", loaded->step, " differs: ", m));
    }
  }
  // Committed checkpoints never change; older ones go whole or not at all.
  for (const auto& [step, files] : e.untouched) {
    if (SnapshotFiles(JoinPath(job_dir, StepDirName(step))) != files) {
      violations.push_back(absl::StrCat("step ", step, " changed"));
    }
  }
  for (const auto& [step, files] : e.whole_or_gone) {
    const FileSnapshot now = SnapshotFiles(JoinPath(job_dir, StepDirName(step)));
    if (!now.empty() && now != files) {
      violations.push_back(
          absl::StrCat("step ", step, " is partly removed (", now.size(), " files left)"));
    }
  }
  absl::StatusOr<std::vector<int64_t>> steps = ListCommittedSteps(env, job_dir);
  if (!steps.ok()) {
    violations.push_back(absl::StrCat("cannot list: ", steps.status().ToString()));
    return violations;
  }
  for (int64_t step : *steps) {
    absl::StatusOr<VerifyReport> v = VerifyCheckpoint(env, JoinPath(job_dir, StepDirName(step)));
    if (!v.ok()) {
      violations.push_back(
          absl::StrCat("step ", step, " does not verify: ", v.status().ToString()));
    }
  }
  // The next start removes the temporaries.
  CheckpointWriterOptions o = world.base;
  o.env = env;
  o.root = world.root;
  o.job = world.job;
  o.rank = 0;
  o.world_size = world.world;
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> started = CheckpointWriter::Create(o);
  if (!started.ok()) {
    violations.push_back(absl::StrCat("the next start fails: ", started.status().ToString()));
    return violations;
  }
  started->reset();
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(job_dir);
  for (const std::string& name : names.value_or(std::vector<std::string>{})) {
    if (absl::StartsWith(name, kTempPrefix)) {
      violations.push_back(absl::StrCat(name, " survived the next start"));
    }
  }
  if (e.next_step >= 0) {
    WorldOptions next = world;
    next.base.env = env;
    for (const absl::Status& s : SaveWorld(next, e.next_step)) {
      if (!s.ok()) violations.push_back(absl::StrCat("the next save fails: ", s.ToString()));
    }
    const int64_t latest = ReadLatest(env, job_dir).value_or(-1);
    if (latest != e.next_step) {
      violations.push_back(
          absl::StrCat("after the next save LATEST is ", latest, ", not ", e.next_step));
    }
  }
  return violations;
}

}  // namespace ringmaster::checkpoint::testing
