// checkpoint_soak: the longer crash soak of issue 4. One checkpoint directory lives through
// thousands of saves, most of them killed with SIGKILL at a random point:
//
//   bazel run -c opt //bench:checkpoint_soak -- --seconds=600
//
// Each round picks a world size (1-4) and ZeRO stage (0-2), forks a process that saves the
// next step with that many ranks (writers on threads; 4 KiB blocks and pwrites, so a save
// has hundreds of places to die) and kills it: before a random filesystem operation that
// changes something, or after a random time within a save's duration, or not at all. Then
// (checkpoint/crash_harness.h) LATEST must load bit for bit at a random world size (1-6)
// and ZeRO stage, and name the old or the new step; the previous LATEST must be byte-
// identical; older steps whole or gone; every committed step must verify; the next writer
// start must remove every tmp-*; and a normal save of the step after must work. Crashes
// accumulate: nothing is reset between rounds, so a crash during the clean-up of an earlier
// crash's leftovers, or during retention, is part of the soak.
//
// Prints the rounds, how each ended, and every violation; exits 1 if there was one.
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/crash_harness.h"
#include "checkpoint/layout.h"
#include "checkpoint/testing.h"
#include "common/env.h"

ABSL_FLAG(std::string, dir, "/var/tmp/ringmaster-checkpoint-soak",
          "where the soak's checkpoints live (removed first and at the end)");
ABSL_FLAG(int, seconds, 120, "how long to soak");
ABSL_FLAG(uint64_t, seed, 1, "random seed (rounds are reproducible up to timing kills)");
ABSL_FLAG(int, table_scale, 2, "model size: about 5,000 x scale elements per buffer");

namespace ringmaster::checkpoint::testing {
namespace {

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

int Main() {
  const std::string root = absl::GetFlag(FLAGS_dir);
  Env* env = Env::Default();
  Die(DeleteRecursively(env, root), "clean");
  Die(env->CreateDir(root), "mkdir");
  const state::TensorTable table = TestTable(absl::GetFlag(FLAGS_table_scale));
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  auto world_at = [&](const std::string& where, int world, int zero) {
    WorldOptions w;
    w.root = where;
    w.table = &table;
    w.world = world;
    w.zero_stage = zero;
    w.base.retention.keep_last = 2;
    w.base.block_bytes = 4096;
    w.base.write_bytes = 4096;  // many pwrites: many places to die
    w.base.poll_interval = absl::Milliseconds(1);
    w.base.commit_timeout = absl::Seconds(30);
    return w;
  };
  const std::string job_dir = JobDir(root, "job");
  for (int64_t step : {1, 2}) {
    for (const absl::Status& s : SaveWorld(world_at(root, 2, 0), step)) Die(s, "first saves");
  }

  // Changing operations of a save, per (world, ZeRO): counted once, on a scratch copy.
  std::map<std::pair<int, int>, std::pair<int64_t, absl::Duration>> sizes;
  auto save_size = [&](int world, int zero, int64_t step) {
    auto it = sizes.find({world, zero});
    if (it != sizes.end()) return it->second;
    const std::string scratch = root + "-count";
    Die(DeleteRecursively(env, scratch), "clean scratch");
    Die(env->CreateDir(scratch), "mkdir scratch");
    const std::string scratch_job = JobDir(scratch, "job");
    Die(env->CreateDir(scratch_job), "mkdir scratch job");
    for (int64_t s : {step - 2, step - 1}) {
      if (s >= 0) {
        for (const absl::Status& st : SaveWorld(world_at(scratch, world, zero), s)) {
          Die(st, "scratch save");
        }
      }
    }
    const absl::Time start = absl::Now();
    const int64_t ops = CountSaveOperations(world_at(scratch, world, zero), step);
    const absl::Duration took = absl::Now() - start;
    Die(DeleteRecursively(env, scratch), "clean scratch");
    if (ops <= 0) Die(absl::InternalError("the counting save failed"), "count");
    return sizes[{world, zero}] = {ops, took};
  };

  int64_t rounds = 0, by_operation = 0, by_time = 0, finished = 0, new_latest = 0;
  int64_t violations = 0;
  std::map<std::string, int64_t> endings;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  while (absl::Now() < end) {
    const int world = pick(1, 4), zero = pick(0, 2);
    std::vector<int64_t> committed = *ListCommittedSteps(env, job_dir);
    const int64_t latest = ReadLatest(env, job_dir).value_or(-1);
    const int64_t step = *std::max_element(committed.begin(), committed.end()) + 1;
    const auto [ops, save_time] = save_size(world, zero, step);

    CrashExpectations e;
    e.latest_may_be = {latest, step};
    for (int64_t s : committed) {
      (s == latest ? e.untouched : e.whole_or_gone)[s] =
          SnapshotFiles(JoinPath(job_dir, StepDirName(s)));
    }
    e.load_world = pick(1, 6);
    e.load_zero_stage = pick(0, 2);
    e.next_step = step + 1;

    const WorldOptions w = world_at(root, world, zero);
    std::string ending;
    const int mode = pick(0, 9);
    if (mode < 7) {  // before a random operation (a tenth of them past the end: no kill)
      const int64_t k = std::uniform_int_distribution<int64_t>(0, ops + ops / 10)(rng);
      ending = SaveInChild(w, step, CountChanges(std::make_shared<std::atomic<int64_t>>(0), k));
      ++by_operation;
    } else if (mode < 9) {  // at a random time within a save's duration
      const absl::Duration after =
          save_time * std::uniform_real_distribution<double>(0, 1.2)(rng);
      ending = SaveInChild(w, step, nullptr, after);
      ++by_time;
    } else {
      ending = SaveInChild(w, step, nullptr);
      ++finished;
    }
    ++endings[ending];
    ++rounds;
    if (ReadLatest(env, job_dir).value_or(-1) == step) ++new_latest;
    for (const std::string& v : CheckAfterCrash(w, e)) {
      ++violations;
      std::printf("round %lld (world %d, ZeRO %d, step %lld, %s): %s\n",
                  static_cast<long long>(rounds), world, zero, static_cast<long long>(step),
                  ending.c_str(), v.c_str());
    }
    if (rounds % 100 == 0) {
      std::printf("%lld rounds, %lld violations so far\n", static_cast<long long>(rounds),
                  static_cast<long long>(violations));
      std::fflush(stdout);
    }
  }
  std::string how;
  for (const auto& [ending, n] : endings) absl::StrAppend(&how, how.empty() ? "" : ", ", n, " ", ending);
  std::printf(
      "\ncheckpoint_soak: %lld rounds in %d s (kill before a random operation %lld, at a random "
      "time %lld, none %lld; the children ended: %s); the new step became LATEST in %lld\n"
      "after each: LATEST loaded bit for bit at a random world size, previous LATEST "
      "untouched, older steps whole or gone, every step verified, no tmp-* after the next "
      "start, the next save worked\n%lld violations\n",
      static_cast<long long>(rounds), absl::GetFlag(FLAGS_seconds),
      static_cast<long long>(by_operation), static_cast<long long>(by_time),
      static_cast<long long>(finished), how.c_str(), static_cast<long long>(new_latest),
      static_cast<long long>(violations));
  Die(DeleteRecursively(env, root), "clean");
  return violations == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ringmaster::checkpoint::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringmaster::checkpoint::testing::Main();
}
