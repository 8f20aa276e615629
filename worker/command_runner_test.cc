#include "worker/command_runner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/validate.h"
#include "worker/command_runner_test_util.h"

namespace ringmaster::worker {
namespace {

using testing::AtEpoch;
using ::testing::HasSubstr;
using testing::Joined;
using testing::Slot;
using testing::WriteErrorFileShell;

// Rank 2 of 4: nodes a (ranks 0, 1) and b (ranks 2, 3), this rank on b's slot 5.
JoinResponse TwoNodes() {
  JoinResponse j;
  j.set_epoch(3);
  j.set_rank(2);
  j.set_world_size(4);
  const std::pair<const char*, int> slots[] = {{"b", 7}, {"a", 0}, {"b", 5}, {"a", 1}};
  const int ranks[] = {3, 0, 2, 1};
  for (int i = 0; i < 4; ++i) {
    Member* m = j.add_members();
    *m->mutable_slot() = Slot(slots[i].first, slots[i].second);
    m->set_rank(ranks[i]);
  }
  return j;
}

TEST(PlacementFromMembersTest, CountsRanksAndGroupsByNode) {
  auto p = PlacementFromMembers(TwoNodes(), Slot("b", 5));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank, 2);
  EXPECT_EQ(p->world_size, 4);
  EXPECT_EQ(p->local_rank, 0);  // b's lowest rank
  EXPECT_EQ(p->local_world_size, 2);
  EXPECT_EQ(p->group_rank, 1);  // node a holds rank 0
  EXPECT_EQ(p->group_world_size, 2);
  EXPECT_EQ(p->local_slots, (std::vector<int>{5, 7}));  // b's ranks 2 and 3
  auto q = PlacementFromMembers(TwoNodes(), Slot("b", 7));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->local_rank, 1);
  EXPECT_FALSE(PlacementFromMembers(TwoNodes(), Slot("c", 0)).ok());
  JoinResponse no_members = TwoNodes();
  no_members.clear_members();
  EXPECT_THAT(PlacementFromMembers(no_members, Slot("b", 5)).status().message(),
              HasSubstr("at most 64 ranks"));
}

CommandEnvInput Input() {
  CommandEnvInput in;
  in.base_env = {"PATH=/usr/bin:/bin", "HOME=/home/u", "RANK=99"};
  in.placement = *PlacementFromMembers(TwoNodes(), Slot("b", 5));
  in.master_addr = "10.0.0.1";
  in.master_port = 29517;
  in.job = "ddp";
  in.epoch = 3;
  in.restart_count = 2;
  in.max_restarts = 3;
  in.error_file = "/w/error.json";
  in.checkpoint_dir = "/ck/ddp";
  in.slot = Slot("b", 5);
  in.stop_grace_s = 7.5;
  in.restart_reason = "failure";
  in.user_env = {{"PYTHONUNBUFFERED", "1"}};
  return in;
}

TEST(BuildCommandEnvTest, TorchrunsVariablesAndOurs) {
  const std::map<std::string, std::string> want = {
      {"PATH", "/usr/bin:/bin"},
      {"HOME", "/home/u"},
      {"PYTHONUNBUFFERED", "1"},
      {"RANK", "2"},  // ours, not the inherited 99
      {"WORLD_SIZE", "4"},
      {"LOCAL_RANK", "0"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "2"},
      {"ROLE_NAME", "default"},
      {"ROLE_WORLD_SIZE", "4"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29517"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "ddp"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE", "/w/error.json"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},  // two ranks on the node, none inherited
      {"CUDA_VISIBLE_DEVICES", "5,7"},  // cuda:LOCAL_RANK is the slot's GPU
      {"RINGMASTER_JOB", "ddp"},
      {"RINGMASTER_EPOCH", "3"},
      {"RINGMASTER_NODE", "b"},
      {"RINGMASTER_SLOT", "5"},
      {"RINGMASTER_STOP_GRACE_S", "7.5"},
      {"RINGMASTER_RESTART_REASON", "failure"},
      {"RINGMASTER_CHECKPOINT_DIR", "/ck/ddp"},
  };
  const std::vector<std::string> env = BuildCommandEnv(Input());
  EXPECT_EQ(testing::EnvMap(env), want);
  EXPECT_TRUE(std::is_sorted(env.begin(), env.end()));
  // Every variable ringmaster sets is one command.env may not set.
  for (const auto& [name, value] : want) {
    const bool ours = name != "PATH" && name != "HOME" && name != "PYTHONUNBUFFERED" &&
                      name.find("NCCL") == std::string::npos && name != "OMP_NUM_THREADS" &&
                      name != "CUDA_VISIBLE_DEVICES";
    EXPECT_EQ(spec::IsReservedCommandEnvName(name), ours) << name;
  }
}

TEST(RestartReasonTest, TheCoordinatorsCausesInTheIssuesWords) {
  EXPECT_EQ(RestartReason("start"), "start");
  EXPECT_EQ(RestartReason("failure"), "failure");
  EXPECT_EQ(RestartReason("drain"), "drain");
  EXPECT_EQ(RestartReason("grow"), "resize");
  EXPECT_EQ(RestartReason("restore"), "coordinator_restart");
  EXPECT_EQ(RestartReason("resubmit"), "resubmit");
  EXPECT_EQ(RestartReason(""), "start");
}

TEST(BuildCommandEnvTest, InheritsOmpAndNcclAsTorchrunDoes) {
  CommandEnvInput in = Input();
  in.base_env = {"OMP_NUM_THREADS=4", "NCCL_ASYNC_ERROR_HANDLING=0"};
  in.checkpoint_dir.clear();
  auto env = testing::EnvMap(BuildCommandEnv(in));
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  in.base_env.push_back("CUDA_VISIBLE_DEVICES=3,2,1,0,9,8,7,6");  // the agent's own mapping
  EXPECT_EQ(testing::EnvMap(BuildCommandEnv(in))["CUDA_VISIBLE_DEVICES"], "8,6");
  in.base_env.pop_back();
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(env.count("RINGMASTER_CHECKPOINT_DIR"), 0u);
  in.base_env.clear();
  in.placement.local_world_size = 1;  // one rank on the node: torchrun leaves it unset
  EXPECT_EQ(testing::EnvMap(BuildCommandEnv(in)).count("OMP_NUM_THREADS"), 0u);
}

// RunCommandJob against a scripted coordinator, running real programs (/bin/sh).
class RunCommandJobTest : public testing::RunCommandJobFixture {
 protected:
  RunCommandJobTest() : RunCommandJobFixture("command_runner_test") {}

  // Runs the job, which must fail at once with an error no restart can fix: reported once,
  // as permanent. Returns the runner's status.
  absl::Status RunToAPermanentFailure(const CommandRunnerOptions& o) {
    auto r = RunCommandJob(o);
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(IsPermanent(r.status())) << r.status();
    EXPECT_EQ(errors_.size(), 1u);
    if (!errors_.empty()) {
      EXPECT_TRUE(errors_[0].permanent());
    }
    return r.status();
  }
};

TEST_F(RunCommandJobTest, ExitZeroFinishesWithTheEnvironmentInWorkdir) {
  fake_.join.Then(Joined(1));
  auto r = RunCommandJob(Options(
      {"/bin/sh", "-c", "echo $RANK $WORLD_SIZE $MASTER_ADDR $RINGMASTER_EPOCH > env.txt"}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->left);
  EXPECT_EQ(Read("env.txt"), "0 1 127.0.0.1 1\n");
  EXPECT_EQ(fake_.finished.calls(), 1);
  EXPECT_TRUE(errors_.empty());
}

// The coordinator takes Finished from a running epoch only (every rank Ready): a program
// that ends at once waits for its peers' Ready before its trainer says Finished.
TEST_F(RunCommandJobTest, FinishedWaitsForEveryRanksReady) {
  JoinResponse joined = Joined(1);
  joined.set_world_size(2);
  Member* peer = joined.add_members();
  *peer->mutable_slot() = Slot("n2", 0);
  peer->set_rank(1);
  fake_.join.Then(joined);
  absl::Time finished_at = absl::InfinitePast();
  fake_.finished.Otherwise([&finished_at](const FinishedRequest&) {
    finished_at = absl::Now();
    return FinishedResponse();
  });
  const absl::Time start = absl::Now();
  std::thread peer_ready([this] {
    absl::SleepFor(absl::Milliseconds(500));
    StoreSetRequest set;
    set.set_job("cmd");
    set.set_epoch(1);
    *set.mutable_slot() = Slot("n2", 0);
    set.set_key("epoch-1/command/ready/1");
    set.set_value("1");
    ASSERT_TRUE(fake_.StoreSet(set).ok());
  });
  auto r = RunCommandJob(Options({"/bin/true"}));
  peer_ready.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(finished_at - start, absl::Milliseconds(500));
}

TEST_F(RunCommandJobTest, ANonZeroExitIsReportedAndTheNextEpochRunsAgain) {
  ScriptEpochTwoAfterAFailure();
  auto r = RunCommandJob(Options(
      {"/bin/sh", "-c",
       "echo $RINGMASTER_EPOCH $TORCHELASTIC_RESTART_COUNT $RINGMASTER_RESTART_REASON >> "
       "epochs.txt; [ $RINGMASTER_EPOCH = 2 ]"}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Read("epochs.txt"), "1 0 start\n2 1 failure\n");
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_EQ(errors_[0].epoch(), 1);
  EXPECT_FALSE(errors_[0].permanent());
  EXPECT_THAT(errors_[0].detail(), HasSubstr("rank 0 (node n1, slot 0) /bin/sh: exit code 1"));
  EXPECT_EQ(fake_.finished.calls(), 1);
}

// torchelastic's @record writes the exception to TORCHELASTIC_ERROR_FILE: it is in the report.
TEST_F(RunCommandJobTest, TheErrorFilesMessageIsReported) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o =
      Options({"/bin/sh", "-c", WriteErrorFileShell("RuntimeError: boom", "1") + "; exit 1"});
  o.spec.mutable_command()->add_permanent_exit_codes(1);
  auto r = RunCommandJob(o);
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_THAT(errors_[0].detail(),
              HasSubstr("exit code 1 (in command.permanent_exit_codes: no restart); its error "
                        "file says: RuntimeError: boom"));
}

TEST(ErrorFileMessageTest, TorchelasticsFormOnly) {
  const std::string path = ::testing::TempDir() + "/error.json";
  auto write = [&path](const std::string& text) { std::ofstream(path) << text; };
  write(R"({"message": {"message": "ValueError: x", "extraInfo": {"timestamp": "5"}}})");
  EXPECT_EQ(ErrorFileMessage(path), "ValueError: x");
  write(R"({"message": "SignalException: got SIGTERM"})");
  EXPECT_EQ(ErrorFileMessage(path), "SignalException: got SIGTERM");
  write("not json");
  EXPECT_EQ(ErrorFileMessage(path), "");
  write(R"({"message": {"extraInfo": {}}})");
  EXPECT_EQ(ErrorFileMessage(path), "");
  write(absl::StrCat(R"({"message": {"message": ")", std::string(5000, 'a'), R"("}})"));
  EXPECT_EQ(ErrorFileMessage(path).size(), 2003u);
  EXPECT_EQ(ErrorFileMessage(path + ".missing"), "");
}

TEST_F(RunCommandJobTest, APermanentExitCodeFailsAtOnce) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Options({"/bin/sh", "-c", "exit 3"});
  o.spec.mutable_command()->add_permanent_exit_codes(3);
  EXPECT_THAT(RunToAPermanentFailure(o).message(), HasSubstr("exit code 3"));
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_THAT(errors_[0].detail(), HasSubstr("exit code 3 (in command.permanent_exit_codes"));
  EXPECT_EQ(fake_.join.calls(), 1);
}

TEST_F(RunCommandJobTest, AMissingProgramIsPermanentNamingNodeAndPath) {
  fake_.join.Then(Joined(1));
  const absl::Status status = RunToAPermanentFailure(Options({"./no-such-program", "--x"}));
  EXPECT_THAT(status.message(), HasSubstr("command.argv[0] ./no-such-program cannot be run "
                                          "on node n1 (slot 0): No such file or directory"));
}

TEST_F(RunCommandJobTest, AWorldWithoutItsMemberListFailsOnceSayingWhy) {
  JoinResponse joined = Joined(1);
  joined.set_world_size(65);  // the coordinator sends members for up to 64 ranks
  joined.clear_members();
  fake_.join.Then(joined);
  EXPECT_THAT(RunToAPermanentFailure(Options({"/bin/true"})).message(),
              HasSubstr("command jobs run on at most 64 ranks"));
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_THAT(errors_[0].detail(), HasSubstr("command jobs run on at most 64 ranks"));
}

TEST_F(RunCommandJobTest, ACheckpointDirThatCannotBeMadeIsThisNodes) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Options({"/bin/true"});
  o.spec.mutable_checkpoint()->set_dir("/proc/no-checkpoints-here");
  auto r = RunCommandJob(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("checkpoint.dir: cannot create"));
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_TRUE(errors_[0].node_local());
  EXPECT_FALSE(errors_[0].permanent());
}

TEST_F(RunCommandJobTest, AMissingWorkdirIsPermanent) {
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Options({"/bin/true"});
  o.spec.mutable_command()->set_workdir(dir_ + "/absent");
  const absl::Status status = RunToAPermanentFailure(o);
  EXPECT_THAT(status.message(), HasSubstr("command.workdir " + dir_ + "/absent"));
}

// A new epoch announced while the program runs: SIGTERM; a program that ignores it is
// killed at stop_grace_s, and its exit is no failure.
TEST_F(RunCommandJobTest, ANewEpochStopsTheProgramKillingItAtStopGrace) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  ScriptEpochTwoOnceExists("started");
  CommandRunnerOptions o = Options(
      {"/bin/sh", "-c",
       "if [ $RINGMASTER_EPOCH = 1 ]; then trap '' TERM; touch started; sleep 30; fi; exit 0"});
  o.spec.mutable_command()->set_stop_grace_s(1);
  const absl::Time start = absl::Now();
  auto r = RunCommandJob(o);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(errors_.empty());
  EXPECT_EQ(r->epochs, 2);
  EXPECT_EQ(fake_.finished.calls(), 1);
  EXPECT_GE(took, absl::Seconds(1));  // the grace was given
  EXPECT_LT(took, absl::Seconds(10));  // and not the program's 30 s
}

TEST_F(RunCommandJobTest, LeavingSendsSigtermToTheProgram) {
  fake_.join.Then(Joined(1));
  auto r = RunLeavingOnceExists(
      Options({"/bin/sh", "-c", "trap 'echo saved > saved.txt; exit 0' TERM; "
                                "touch started; while true; do sleep 0.05; done"}),
      "started");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->left);
  EXPECT_EQ(Read("saved.txt"), "saved\n");
  EXPECT_TRUE(errors_.empty());
  EXPECT_EQ(fake_.finished.calls(), 0);
}

// The program's output passes through the runner unchanged, after the epoch's header line;
// its last non-empty line, its exit and when it was seen go into a structured failure report.
TEST_F(RunCommandJobTest, OutputPassesThroughAndTheFailureReportSaysWhoHowAndTheLastLine) {
  fake_.join.Then(Joined(1));
  const int out = OpenForOutput("runner.out");
  const int err = OpenForOutput("runner.err");
  ASSERT_GE(out, 0);
  ASSERT_GE(err, 0);
  CommandRunnerOptions o = Options(
      {"/bin/sh", "-c", "echo step 1; printf 'warn\\n' >&2; printf 'x\\n\\nlast words  \\n\\n' >&2; "
                        "exit 3"});
  o.output_fd = out;
  o.error_fd = err;
  o.spec.mutable_command()->add_permanent_exit_codes(3);
  const double before = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
  auto r = RunCommandJob(o);
  const double after = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
  close(out);
  close(err);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Read("runner.out"),
            "==== ringmaster: job cmd membership epoch 1: rank 0 of 1 on n1 slot 0 (restart 0, "
            "reason start) ====\nstep 1\n");
  EXPECT_EQ(Read("runner.err"), "warn\nx\n\nlast words  \n\n");
  ASSERT_EQ(errors_.size(), 1u);
  ASSERT_TRUE(errors_[0].has_failure());
  const ringmaster::RankFailure& f = errors_[0].failure();
  EXPECT_EQ(f.epoch(), 1);
  EXPECT_EQ(f.rank(), 0);
  EXPECT_EQ(f.slot().node(), "n1");
  EXPECT_EQ(f.slot().slot(), 0);
  EXPECT_EQ(f.program(), "/bin/sh");
  EXPECT_EQ(f.how(), "exit code 3 (in command.permanent_exit_codes: no restart)");
  EXPECT_EQ(f.exit_code(), 3);
  EXPECT_EQ(f.signal(), 0);
  EXPECT_EQ(f.error_message(), "");
  EXPECT_EQ(f.last_output_line(), "last words");
  EXPECT_FALSE(f.failed_at_from_error_file());
  EXPECT_GE(f.failed_at_s(), before);  // when the runner saw the exit
  EXPECT_LE(f.failed_at_s(), after);
  EXPECT_THAT(errors_[0].detail(), HasSubstr("; its last output line: last words"));
}

// torchelastic's @record: the failure's time is its error file's timestamp.
TEST_F(RunCommandJobTest, AKilledProgramAndAnErrorFilesTimestamp) {
  ScriptEpochTwoAfterAFailure();
  const int out = OpenForOutput("runner.out");
  ASSERT_GE(out, 0);
  CommandRunnerOptions o =
      Options({"/bin/sh", "-c",
               "if [ $RINGMASTER_EPOCH = 1 ]; then echo about to die; kill -9 $$; fi; " +
                   WriteErrorFileShell("RuntimeError: boom", "7") +
                   "; echo RuntimeError: boom >&2; exit 2"});
  o.output_fd = out;
  o.spec.mutable_command()->add_permanent_exit_codes(2);
  auto r = RunCommandJob(o);
  close(out);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(Read("runner.out"),
              HasSubstr("about to die\n==== ringmaster: job cmd membership epoch 2: rank 0 of 1 "
                        "on n1 slot 0 (restart 1, reason failure) ====\n"));
  ASSERT_EQ(errors_.size(), 2u);
  const ringmaster::RankFailure& killed = errors_[0].failure();
  EXPECT_EQ(killed.how(), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(killed.exit_code(), -1);
  EXPECT_EQ(killed.signal(), 9);
  EXPECT_EQ(killed.signal_name(), "SIGKILL");
  EXPECT_EQ(killed.last_output_line(), "about to die");
  const ringmaster::RankFailure& raised = errors_[1].failure();
  EXPECT_EQ(raised.epoch(), 2);
  EXPECT_EQ(raised.error_message(), "RuntimeError: boom");
  EXPECT_EQ(raised.last_output_line(), "RuntimeError: boom");
  EXPECT_TRUE(raised.failed_at_from_error_file());
  EXPECT_EQ(raised.failed_at_s(), 7.0);  // the file was written long after second 7
}

// A program that had raised (its error file) but was slower to exit than a peer whose report
// re-formed the job: stopped by the runner, its failure is still reported for its epoch.
TEST_F(RunCommandJobTest, AStoppedProgramThatHadRaisedIsReportedForItsEpoch) {
  fake_.join.Then(Joined(1)).Then(Joined(2));
  ScriptEpochTwoOnceExists("raised");
  CommandRunnerOptions o = Options(
      {"/bin/sh", "-c",
       "if [ $RINGMASTER_EPOCH = 1 ]; then " + WriteErrorFileShell("ValueError: first", "5") +
           "; echo ValueError: first; touch raised; sleep 30; fi; exit 0"});
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_EQ(errors_[0].epoch(), 1);
  const ringmaster::RankFailure& f = errors_[0].failure();
  EXPECT_TRUE(f.stopped_after());
  EXPECT_EQ(f.error_message(), "ValueError: first");
  EXPECT_EQ(f.last_output_line(), "ValueError: first");
  EXPECT_EQ(f.failed_at_s(), 5.0);
  EXPECT_EQ(fake_.finished.calls(), 1);
}

// So is one stopped because its trainer leaves (a drain): as stopped_after, which the
// coordinator never counts as a failure of its own.
TEST_F(RunCommandJobTest, AProgramThatHadRaisedWhenItsTrainerLeavesIsReportedAsStopped) {
  fake_.join.Then(Joined(1));
  auto r = RunLeavingOnceExists(
      Options({"/bin/sh", "-c",
               WriteErrorFileShell("RuntimeError: peer gone", "6") + "; touch started; sleep 30"}),
      "started");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->left);
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_TRUE(errors_[0].failure().stopped_after());
  EXPECT_EQ(errors_[0].failure().error_message(), "RuntimeError: peer gone");
}

TEST(ReadErrorFileTest, TheTimestampIsRefinedByTheFilesModificationTimeWithinItsSecond) {
  const std::string path = ::testing::TempDir() + "/error-time.json";
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  std::ofstream(path) << R"({"message": {"message": "E: x", "extraInfo": {"timestamp": ")"
                      << now << R"("}}})";
  auto set_mtime = [&path](absl::Time t) {
    const timespec times[2] = {absl::ToTimespec(t), absl::ToTimespec(t)};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  };
  set_mtime(absl::FromUnixSeconds(now) + absl::Milliseconds(250));
  ErrorFile e = ReadErrorFile(path);
  EXPECT_EQ(e.message, "E: x");
  EXPECT_EQ(e.timestamp, absl::FromUnixSeconds(now) + absl::Milliseconds(250));
  set_mtime(absl::FromUnixSeconds(now + 3));  // not the same second: the timestamp alone
  EXPECT_EQ(ReadErrorFile(path).timestamp, absl::FromUnixSeconds(now));
  // The newer form: "message" a string, "timestamp" beside it (a number here).
  std::ofstream(path) << R"({"message": "E: y", "timestamp": 9})";
  e = ReadErrorFile(path);
  EXPECT_EQ(e.message, "E: y");
  EXPECT_EQ(e.timestamp, absl::FromUnixSeconds(9));
  std::ofstream(path) << R"({"message": {"message": "E: z"}})";  // no timestamp
  EXPECT_EQ(ReadErrorFile(path).timestamp, absl::InfinitePast());
}

}  // namespace
}  // namespace ringmaster::worker
