// Scenario scripts for the membership state machine (coordinator/testdata/*.txt), in the
// style of etcd-io/raft's data-driven tests. Each block is a command, a line "----", and
// the expected output (the actions it emitted, one per line, or "error: ..."), ended by a
// blank line. Lines starting with '#' are comments. Time moves only by `advance`.
//
// Commands:
//   options lease=3s join_timeout=30s ready_timeout=120s hang_timeout=120s
//           rendezvous_timeout=300s slot_backoff=10s grow_after=5s restore_grace=10s
//                                  (first, optional)
//   register NODE slots=N [memory_mib=N]    heartbeat NODE... [running=SLOT:JOB,...]     drain NODE
//   exited NODE/SLOT JOB code=N [stopped=1] [epoch=N] [DETAIL...]    submit JOB min=N max=N [budget=N] [memory_mib=N] [multiple=N]    cancel JOB
//   delete JOB                     nodes   (the Nodes() query, one line per node)
//   join|ready|finished JOB EPOCH NODE/SLOT...
//   progress JOB EPOCH step=N [step_time=DURATION] NODE/SLOT...
//   error JOB EPOCH NODE/SLOT [permanent=1|node_local=1|rejoin=1] DETAIL...
//   advance DURATION               (then Tick)
//   show                           (DebugString)
//   restart                        (a new machine restored from the last PersistJob of
//                                   each job: a coordinator killed and started again)
//
// To write the expected outputs of a new script, run with RINGMASTER_REWRITE set to the
// source directory of the scripts (bazel test --test_env=RINGMASTER_REWRITE=$PWD/coordinator/testdata)
// and read every line of the result before committing it (with --strategy=TestRunner=standalone:
// the sandbox does not let the test write the source tree).
#include "coordinator/membership.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ringmaster::coordinator {
namespace {

struct Block {
  std::vector<std::string> comments;  // '#' lines and blank lines before the command
  std::string command;
  std::string expected;
  int line = 0;
};

std::vector<Block> ParseScript(const std::string& text) {
  std::vector<Block> blocks;
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  size_t i = 0;
  while (i < lines.size()) {
    Block b;
    while (i < lines.size() && (lines[i].empty() || lines[i][0] == '#')) {
      b.comments.push_back(lines[i++]);
    }
    if (i >= lines.size()) break;
    b.line = static_cast<int>(i + 1);
    b.command = lines[i++];
    EXPECT_TRUE(i < lines.size() && lines[i] == "----")
        << "line " << i + 1 << ": expected ---- after the command";
    ++i;
    std::vector<std::string> out;
    while (i < lines.size() && !lines[i].empty()) out.push_back(lines[i++]);
    b.expected = absl::StrJoin(out, "\n");
    blocks.push_back(b);
  }
  return blocks;
}

SlotRef ParseSlot(absl::string_view s) {
  std::vector<std::string> parts = absl::StrSplit(s, '/');
  SlotRef ref;
  ref.node = parts[0];
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &ref.slot)) {
    ADD_FAILURE() << "bad slot \"" << s << "\" (want NODE/SLOT)";
  }
  return ref;
}

absl::Duration ParseDuration(absl::string_view s) {
  absl::Duration d;
  if (!absl::ParseDuration(s, &d)) ADD_FAILURE() << "bad duration \"" << s << "\"";
  return d;
}

// key=value arguments into a map; positional ones into `positional`.
std::map<std::string, std::string> Args(const std::vector<std::string>& words,
                                        std::vector<std::string>* positional) {
  std::map<std::string, std::string> kv;
  for (size_t i = 1; i < words.size(); ++i) {
    const size_t eq = words[i].find('=');
    if (eq == std::string::npos) {
      positional->push_back(words[i]);
    } else {
      kv[words[i].substr(0, eq)] = words[i].substr(eq + 1);
    }
  }
  return kv;
}

int IntArg(const std::map<std::string, std::string>& kv, const std::string& key, int fallback) {
  auto it = kv.find(key);
  if (it == kv.end()) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) ADD_FAILURE() << "bad " << key << "=" << it->second;
  return v;
}

class Scenario {
 public:
  Scenario() : machine_(std::make_unique<Membership>(options_)) {}

  std::string Run(const std::string& command) {
    std::vector<std::string> words = absl::StrSplit(command, ' ', absl::SkipEmpty());
    std::vector<std::string> pos;
    const auto kv = Args(words, &pos);
    const std::string& verb = words[0];
    std::vector<Action> actions;
    std::vector<std::string> errors;
    auto check = [&](const absl::Status& s) {
      if (!s.ok()) errors.push_back(absl::StrCat("error: ", s.ToString()));
    };
    if (verb == "options") {
      for (const auto& [k, v] : kv) {
        const absl::Duration d = ParseDuration(v);
        if (k == "lease") options_.lease = d;
        else if (k == "join_timeout") options_.join_timeout = d;
        else if (k == "ready_timeout") options_.ready_timeout = d;
        else if (k == "hang_timeout") options_.hang_timeout = d;
        else if (k == "silence_floor") options_.silence_floor = d;
        else if (k == "rendezvous_timeout") options_.rendezvous_timeout = d;
        else if (k == "slot_backoff") options_.slot_backoff = d;
        else if (k == "grow_after") options_.grow_after = d;
        else if (k == "restore_grace") options_.restore_grace = d;
        else ADD_FAILURE() << "unknown option " << k;
      }
      machine_ = std::make_unique<Membership>(options_);
    } else if (verb == "advance") {
      now_ += ParseDuration(pos.at(0));
      machine_->Tick(now_, &actions);
    } else if (verb == "register") {
      check(machine_->RegisterNode(pos.at(0), IntArg(kv, "slots", 1), now_, &actions,
                                   int64_t{IntArg(kv, "memory_mib", 0)} << 20));
    } else if (verb == "heartbeat") {
      std::vector<std::pair<int, std::string>> running;
      if (kv.count("running")) {
        for (absl::string_view t : absl::StrSplit(kv.at("running"), ',', absl::SkipEmpty())) {
          std::pair<std::string, std::string> slot_job = absl::StrSplit(t, ':');
          int slot = -1;
          EXPECT_TRUE(absl::SimpleAtoi(slot_job.first, &slot)) << command;
          running.emplace_back(slot, slot_job.second);
        }
      }
      for (const std::string& n : pos) check(machine_->Heartbeat(n, running, now_, &actions));
    } else if (verb == "drain") {
      check(machine_->DrainNode(pos.at(0), now_, &actions));
    } else if (verb == "exited") {
      std::vector<std::string> detail(pos.begin() + 2, pos.end());
      check(machine_->TrainerExited(ParseSlot(pos.at(0)), pos.at(1), IntArg(kv, "code", 0), now_,
                                    &actions, absl::StrJoin(detail, " "),
                                    IntArg(kv, "stopped", 0) != 0, IntArg(kv, "epoch", 0)));
    } else if (verb == "submit") {
      JobRequest r;
      r.id = pos.at(0);
      r.min_ranks = IntArg(kv, "min", 1);
      r.max_ranks = IntArg(kv, "max", r.min_ranks);
      r.restart_budget = IntArg(kv, "budget", 3);
      r.memory_per_rank = int64_t{IntArg(kv, "memory_mib", 0)} << 20;
      r.rank_multiple = IntArg(kv, "multiple", 1);
      if (IntArg(kv, "cannot_grow", 0) != 0) r.cannot_grow = "its state is sharded";
      check(machine_->SubmitJob(r, now_, &actions));
    } else if (verb == "cancel") {
      check(machine_->CancelJob(pos.at(0), now_, &actions));
    } else if (verb == "join" || verb == "ready" || verb == "finished" || verb == "progress") {
      int64_t epoch = 0;
      EXPECT_TRUE(absl::SimpleAtoi(pos.at(1), &epoch)) << command;
      for (size_t i = 2; i < pos.size(); ++i) {
        const SlotRef slot = ParseSlot(pos[i]);
        if (verb == "join") check(machine_->Join(pos[0], epoch, slot, now_, &actions));
        if (verb == "ready") check(machine_->Ready(pos[0], epoch, slot, now_, &actions));
        if (verb == "finished") check(machine_->Finished(pos[0], epoch, slot, now_, &actions));
        if (verb == "progress") {
          const absl::Duration step_time =
              kv.count("step_time") ? ParseDuration(kv.at("step_time")) : absl::ZeroDuration();
          check(machine_->Progress(pos[0], epoch, slot, IntArg(kv, "step", 0), now_, &actions,
                                   step_time));
        }
      }
    } else if (verb == "error") {
      int64_t epoch = 0;
      EXPECT_TRUE(absl::SimpleAtoi(pos.at(1), &epoch)) << command;
      std::vector<std::string> detail(pos.begin() + 3, pos.end());
      if (IntArg(kv, "rejoin", 0) != 0) {
        check(machine_->LeaveToRejoin(pos[0], epoch, ParseSlot(pos.at(2)),
                                      absl::StrJoin(detail, " "), now_, &actions));
      } else {
        check(machine_->CollectiveError(
            pos[0], epoch, ParseSlot(pos.at(2)), absl::StrJoin(detail, " "), now_, &actions,
            IntArg(kv, "permanent", 0) != 0    ? ErrorScope::kPermanent
            : IntArg(kv, "node_local", 0) != 0 ? ErrorScope::kNodeLocal
                                               : ErrorScope::kRestartable));
      }
    } else if (verb == "delete") {
      check(machine_->DeleteJob(pos.at(0)));
    } else if (verb == "nodes") {
      std::vector<std::string> lines;
      for (const Membership::NodeView& n : machine_->Nodes(now_)) lines.push_back(NodeLine(n));
      return lines.empty() ? "(none)" : absl::StrJoin(lines, "\n");
    } else if (verb == "cause") {
      // Why the job's current epoch formed (a command job's RINGMASTER_RESTART_REASON).
      const JobState* job = machine_->job(pos.at(0));
      if (job == nullptr) return std::string("(no job)");
      return absl::StrCat(pos.at(0), " epoch=", job->epoch, " cause=", EpochCauseName(job->cause),
                          job->resubmitted ? " resubmitted" : "");
    } else if (verb == "show") {
      return std::string(absl::StripSuffix(machine_->DebugString(now_), "\n"));
    } else if (verb == "restart") {
      std::vector<JobState> db;
      for (const auto& [id, job] : persisted_) db.push_back(job);
      machine_ = std::make_unique<Membership>(options_);
      check(machine_->Restore(db, now_));
    } else {
      ADD_FAILURE() << "unknown command: " << command;
    }
    std::vector<std::string> out = errors;
    for (const Action& a : actions) {
      if (const auto* p = std::get_if<PersistJob>(&a)) persisted_[p->job.request.id] = p->job;
      out.push_back(ToString(a));
    }
    return out.empty() ? "(none)" : absl::StrJoin(out, "\n");
  }

 private:
  // "a: slots=2 lease=3s 0=job 1:exiting=old 1:backoff=10s [draining] [restored]"
  std::string NodeLine(const Membership::NodeView& n) const {
    std::string line = absl::StrCat(n.node, ": slots=", n.slots, " lease=",
                                    absl::FormatDuration(n.lease_expiry - now_));
    for (const auto& [slot, job] : n.assigned) absl::StrAppend(&line, " ", slot, "=", job);
    for (const auto& [slot, job] : n.exiting) absl::StrAppend(&line, " ", slot, ":exiting=", job);
    for (const auto& [slot, until] : n.backoff_until) {
      absl::StrAppend(&line, " ", slot, ":backoff=", absl::FormatDuration(until - now_));
    }
    if (n.draining) absl::StrAppend(&line, " draining");
    if (n.restored) absl::StrAppend(&line, " restored");
    return line;
  }

  MembershipOptions options_;
  std::unique_ptr<Membership> machine_;
  absl::Time now_ = absl::UnixEpoch() + absl::Hours(1000);
  std::map<std::string, JobState> persisted_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Scripts() {
  const std::string dir = "coordinator/testdata";
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.substr(name.size() - 4) == ".txt") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

class MembershipScenarioTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MembershipScenarioTest, Script) {
  const std::string path = "coordinator/testdata/" + GetParam();
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty()) << "cannot read " << path;
  Scenario scenario;
  std::string rewritten;
  for (const Block& b : ParseScript(text)) {
    const std::string got = scenario.Run(b.command);
    EXPECT_EQ(got, b.expected) << GetParam() << ":" << b.line << ": " << b.command;
    for (const std::string& c : b.comments) absl::StrAppend(&rewritten, c, "\n");
    absl::StrAppend(&rewritten, b.command, "\n----\n", got, "\n");
  }
  if (const char* dir = std::getenv("RINGMASTER_REWRITE")) {
    std::ofstream(std::string(dir) + "/" + GetParam()) << rewritten;
  }
}

INSTANTIATE_TEST_SUITE_P(Scripts, MembershipScenarioTest, ::testing::ValuesIn(Scripts()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.size() - 4);
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(MembershipScripts, ThereAreScripts) { EXPECT_GE(Scripts().size(), 5u); }

// Command jobs (ProgramFailed): rank 2's program raised first; ranks 0, 1 and 3 failed in Gloo
// a moment later, but their reports reach the coordinator first. Whatever the order, the
// epoch's first failure is rank 2's, and the job's reason names it.
class ProgramFailedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(machine_.RegisterNode("a", 4, now_, &actions_).ok());
    JobRequest r;
    r.id = "j";
    r.min_ranks = r.max_ranks = 4;
    r.restart_budget = budget_;
    ASSERT_TRUE(machine_.SubmitJob(r, now_, &actions_).ok());
    StartEpoch(1);
  }
  void StartEpoch(int64_t epoch) {
    for (int s = 0; s < 4; ++s) ASSERT_TRUE(machine_.Join("j", epoch, {"a", s}, now_, &actions_).ok());
    for (int s = 0; s < 4; ++s) ASSERT_TRUE(machine_.Ready("j", epoch, {"a", s}, now_, &actions_).ok());
    ASSERT_EQ(machine_.job("j")->phase, JobPhase::kRunning);
  }
  // Rank `rank` (slot `rank`) failed `ms` milliseconds after t0.
  static RankFailure Failure(int rank, int ms, const std::string& message) {
    RankFailure f;
    f.rank = rank;
    f.program = "python3";
    f.how = "exit code 1";
    f.exit_code = 1;
    f.error_message = message;
    f.last_output_line = absl::StrCat("rank ", rank, " last words");
    f.failed_at = absl::FromUnixSeconds(1000) + absl::Milliseconds(ms);
    f.failed_at_from_error_file = true;
    return f;
  }
  absl::Status Report(int64_t epoch, int rank, int ms, const std::string& message,
                      ErrorScope scope = ErrorScope::kRestartable) {
    return machine_.ProgramFailed("j", epoch, {"a", rank}, Failure(rank, ms, message), now_,
                                  &actions_, scope);
  }

  int budget_ = 3;
  Membership machine_{MembershipOptions()};
  absl::Time now_ = absl::FromUnixSeconds(5000);
  std::vector<Action> actions_;
};

TEST_F(ProgramFailedTest, TheEarliestFailureWinsWhateverOrderTheReportsArriveIn) {
  const std::string gloo = "RuntimeError: Connection closed by peer";
  ASSERT_TRUE(Report(1, 0, 40, gloo).ok());  // the first to arrive re-forms the job
  const JobState* job = machine_.job("j");
  EXPECT_EQ(job->epoch, 2);
  EXPECT_EQ(job->restarts, 1);
  ASSERT_TRUE(job->first_failure.has_value());
  EXPECT_EQ(job->first_failure->rank, 0);
  // The others arrive after the epoch was re-formed: taken, though late.
  actions_.clear();
  EXPECT_TRUE(Report(1, 3, 30, gloo).ok());
  EXPECT_TRUE(Report(1, 2, 10, "ValueError: bad batch").ok());
  EXPECT_TRUE(Report(1, 1, 20, gloo).ok());
  EXPECT_EQ(job->epoch, 2) << "late reports re-form nothing";
  EXPECT_EQ(job->restarts, 1) << "late reports spend no budget";
  ASSERT_TRUE(job->first_failure.has_value());
  EXPECT_EQ(job->first_failure->rank, 2);
  EXPECT_EQ(job->first_failure->epoch, 1);
  EXPECT_EQ(job->first_failure->slot, (SlotRef{"a", 2}));
  EXPECT_EQ(job->first_failure->error_message, "ValueError: bad batch");
  EXPECT_EQ(job->reason,
            "rank 2 (node a, slot 2) failed first in membership epoch 1: python3: exit code 1; "
            "its error file says: ValueError: bad batch; its last output line: rank 2 last words");
  // Each change was persisted (rank 3's, then rank 2's; rank 1's was later than rank 2's).
  int persisted = 0;
  for (const Action& a : actions_) persisted += std::holds_alternative<PersistJob>(a);
  EXPECT_EQ(persisted, 2);
  // A report of an epoch without a recorded failure (or of a later one) changes nothing.
  EXPECT_TRUE(Report(0, 1, 0, gloo).ok());
  EXPECT_EQ(job->first_failure->rank, 2);
}

// In-process recovery (LeaveToRejoin): the dead rank's failure is the epoch's first failure,
// named in the job's reason, as a whole-group restart's; re-forming and spending as without it.
TEST_F(ProgramFailedTest, AnInProcessRecoveryNamesTheRankWhoseProgramDied) {
  RankFailure killed = Failure(1, 30, "");
  killed.how = "killed by signal 9 (SIGKILL)";
  killed.exit_code = -1;
  killed.signal = 9;
  killed.signal_name = "SIGKILL";
  killed.failed_at_from_error_file = false;
  ASSERT_TRUE(machine_
                  .LeaveToRejoin("j", 1, {"a", 1}, "killed by signal 9 (SIGKILL)", now_,
                                 &actions_, killed)
                  .ok());
  const JobState* job = machine_.job("j");
  EXPECT_EQ(job->phase, JobPhase::kPending) << "3 of min_ranks 4 left";
  EXPECT_EQ(job->epoch, 2);
  EXPECT_EQ(job->restarts, 1);
  EXPECT_EQ(job->rejoining, (std::vector<SlotRef>{{"a", 1}}));
  ASSERT_TRUE(job->first_failure.has_value());
  EXPECT_EQ(job->first_failure->rank, 1);
  EXPECT_EQ(job->first_failure->epoch, 1);
  EXPECT_EQ(job->first_failure->slot, (SlotRef{"a", 1}));
  EXPECT_TRUE(absl::EndsWith(
      job->reason,
      "; rank 1 (node a, slot 1) failed first in membership epoch 1: python3: killed by "
      "signal 9 (SIGKILL); its last output line: rank 1 last words; its peers recover "
      "in-process"))
      << job->reason;
  // A peer's report of an earlier failure in that epoch, arriving late, is named instead.
  actions_.clear();
  EXPECT_TRUE(Report(1, 3, 10, "ValueError: bad batch").ok());
  EXPECT_EQ(job->first_failure->rank, 3);
  EXPECT_EQ(job->epoch, 2);
  EXPECT_EQ(job->restarts, 1);
  EXPECT_TRUE(absl::StrContains(job->reason, "; rank 3 (node a, slot 3) failed first in "
                                              "membership epoch 1: python3: exit code 1"))
      << job->reason;
  EXPECT_TRUE(absl::EndsWith(job->reason, "; its peers recover in-process")) << job->reason;
}

// Without a failure (a trainer that sent none), the reason says what the trainer said.
TEST_F(ProgramFailedTest, AnInProcessRecoveryWithoutAFailureNamesTheSlot) {
  ASSERT_TRUE(machine_.LeaveToRejoin("j", 1, {"a", 2}, "exit code 1", now_, &actions_).ok());
  const JobState* job = machine_.job("j");
  EXPECT_FALSE(job->first_failure.has_value());
  EXPECT_TRUE(absl::EndsWith(job->reason,
                             "; program on a/2 failed (exit code 1); its peers recover in-process"))
      << job->reason;
}

// A program ringmaster stopped (a drain, say) that had written an error file: it may name the
// first failure of an epoch that failed, but never makes one.
TEST_F(ProgramFailedTest, AStoppedProgramsReportCausesNoFailure) {
  RankFailure stopped = Failure(1, 0, "RuntimeError: Connection closed by peer");
  stopped.stopped_after = true;
  EXPECT_TRUE(machine_.ProgramFailed("j", 1, {"a", 1}, stopped, now_, &actions_).ok());
  const JobState* job = machine_.job("j");
  EXPECT_EQ(job->phase, JobPhase::kRunning);
  EXPECT_EQ(job->restarts, 0);
  EXPECT_FALSE(job->first_failure.has_value());
  ASSERT_TRUE(Report(1, 3, 50, "ValueError: x").ok());
  EXPECT_TRUE(machine_.ProgramFailed("j", 1, {"a", 1}, stopped, now_, &actions_).ok());
  EXPECT_EQ(job->first_failure->rank, 1) << "earlier than rank 3's: named";
  EXPECT_EQ(job->restarts, 1);
}

TEST_F(ProgramFailedTest, AJobThatFailedNamesTheEarliestInItsFinalReason) {
  ASSERT_TRUE(Report(1, 1, 50, "RuntimeError: gloo", ErrorScope::kPermanent).ok());
  const JobState* job = machine_.job("j");
  EXPECT_EQ(job->phase, JobPhase::kFailed);
  EXPECT_TRUE(Report(1, 3, 5, "ZeroDivisionError: division by zero").ok());
  EXPECT_EQ(job->first_failure->rank, 3);
  EXPECT_EQ(job->reason,
            "error on a/1 that no restart can fix: rank 3 (node a, slot 3) failed first in "
            "membership epoch 1: python3: exit code 1; its error file says: ZeroDivisionError: "
            "division by zero; its last output line: rank 3 last words");
}

TEST_F(ProgramFailedTest, ALaterEpochsFailureReplacesTheLastOnesAndDescribeSaysHowItEnded) {
  ASSERT_TRUE(Report(1, 2, 10, "RuntimeError: first").ok());
  StartEpoch(2);
  RankFailure killed = Failure(0, 999999, "");
  killed.how = "killed by signal 9 (SIGKILL)";
  killed.last_output_line = "step 7";
  ASSERT_TRUE(machine_.ProgramFailed("j", 2, {"a", 0}, killed, now_, &actions_).ok());
  const JobState* job = machine_.job("j");
  EXPECT_EQ(job->first_failure->epoch, 2);
  EXPECT_EQ(job->first_failure->rank, 0);
  EXPECT_EQ(job->reason,
            "rank 0 (node a, slot 0) failed first in membership epoch 2: python3: killed by "
            "signal 9 (SIGKILL); its last output line: step 7");
  // A late report of epoch 1 cannot take it back, however early.
  EXPECT_TRUE(Report(1, 1, 0, "RuntimeError: older").ok());
  EXPECT_EQ(job->first_failure->epoch, 2);
  // The last line is left out of the reason when it is the error file's message.
  RankFailure same = Failure(1, 0, "RuntimeError: x");
  same.last_output_line = "RuntimeError: x";
  same.epoch = 4;
  same.slot = {"b", 1};
  EXPECT_EQ(Describe(same),
            "rank 1 (node b, slot 1) failed first in membership epoch 4: python3: exit code 1; "
            "its error file says: RuntimeError: x");
}

}  // namespace
}  // namespace ringmaster::coordinator
