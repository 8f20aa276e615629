// RunCommandJob with command.preload: the program forked from the rank's warm interpreter
// (worker/zygote.h), against a scripted coordinator, with /usr/bin/python3; and how soon a
// rank can learn of a new epoch (its keep-alives' default interval).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/testing/fake_coordinator.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/command_runner.h"

namespace ringmaster::worker {
namespace {

using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

class PreloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
    char tmpl[] = "/tmp/command_runner_preload_test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fake_.ready.Always(ReadyResponse());
    fake_.finished.Always(FinishedResponse());
    fake_.report_error.Otherwise([this](const ReportErrorRequest& r) {
      errors_.push_back(r);
      return ReportErrorResponse();
    });
    fake_.progress.Always(AtEpoch(1));
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static JoinResponse Joined(int64_t epoch) {
    JoinResponse j;
    j.set_epoch(epoch);
    j.set_rank(0);
    j.set_world_size(1);
    j.set_store_prefix(absl::StrCat("epoch-", epoch, "/"));
    Member* m = j.add_members();
    *m->mutable_slot() = Slot("n1", 0);
    m->set_rank(0);
    return j;
  }
  static ProgressResponse AtEpoch(int64_t epoch) {
    ProgressResponse p;
    p.set_epoch(epoch);
    return p;
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  CommandRunnerOptions Options(std::vector<std::string> preload) {
    CommandRunnerOptions o;
    o.client = &fake_;
    o.job = "cmd";
    o.slot = Slot("n1", 0);
    for (const char* a : {kPython, "prog.py", "--flag"}) o.spec.mutable_command()->add_argv(a);
    o.spec.mutable_command()->mutable_preload()->Assign(preload.begin(), preload.end());
    o.spec.mutable_command()->set_stop_grace_s(30);
    o.spec.mutable_command()->set_workdir(dir_);
    o.spec.mutable_elastic()->set_restart_budget(3);
    o.base_env = {"PATH=/usr/bin:/bin"};
    o.error_file_dir = dir_;
    o.progress_interval = absl::Milliseconds(50);
    o.join_timeout = absl::Seconds(10);
    return o;
  }

  client::testing::FakeCoordinator fake_;
  std::string dir_;
  std::vector<ReportErrorRequest> errors_;
};

// warm.py (next to the script) is preloaded: it was imported once, in one interpreter, for
// both epochs (the same pid at import), not by the programs (their own pids differ), and each
// epoch's program saw its own epoch's environment and argv.
TEST_F(PreloadTest, BothEpochsForkFromOneWarmInterpreter) {
  Write("warm.py", "import os\nIMPORTED_BY = os.getpid()\n");
  Write("prog.py", R"(
import os, sys
preloaded = "warm" in sys.modules
import warm
with open("epochs.txt", "a") as f:
    f.write(f"{os.environ['RINGMASTER_EPOCH']} {preloaded} {warm.IMPORTED_BY} "
            f"{warm.IMPORTED_BY != os.getpid()} {sys.argv[1:]}\n")
sys.exit(0 if os.environ["RINGMASTER_EPOCH"] == "2" else 3)
)");
  JoinResponse second = Joined(2);
  second.set_restarts(1);
  second.set_epoch_cause("failure");
  fake_.join.Then(Joined(1)).Then(second);
  fake_.progress.Then(AtEpoch(1)).Always(AtEpoch(2));
  auto r = RunCommandJob(Options({"warm"}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epochs, 2);
  const std::string epochs = Read("epochs.txt");
  const std::string imported_by = epochs.substr(7, epochs.find(' ', 7) - 7);
  EXPECT_EQ(epochs, absl::StrCat("1 True ", imported_by, " True ['--flag']\n2 True ", imported_by,
                                 " True ['--flag']\n"));
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_THAT(errors_[0].detail(), HasSubstr("/usr/bin/python3: exit code 3"));
  EXPECT_EQ(fake_.finished.calls(), 1);
}

// A module that cannot be imported fails the job once, naming command.preload and the node.
TEST_F(PreloadTest, APreloadThatFailsIsPermanent) {
  Write("prog.py", "pass\n");
  fake_.join.Then(Joined(1));
  auto r = RunCommandJob(Options({"no_such_module_for_preload"}));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsPermanent(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("command.preload"));
  EXPECT_THAT(r.status().message(), HasSubstr("on node n1 (slot 0)"));
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_TRUE(errors_[0].permanent());
}

// A running program's rank asks the coordinator every progress_interval, by default often
// enough that a survivor of another rank's failure learns of the new epoch within ~0.1 s:
// the calls of a program that runs for a second are at most ~0.1 s apart (the median gap).
TEST_F(PreloadTest, KeepAlivesComeEveryTenthOfASecondByDefault) {
  std::vector<absl::Time> calls;
  fake_.progress.Otherwise([&calls](const ProgressRequest&) {
    calls.push_back(absl::Now());
    return AtEpoch(1);
  });
  fake_.join.Then(Joined(1));
  CommandRunnerOptions o = Options({});
  o.progress_interval = CommandRunnerOptions().progress_interval;  // the default
  o.spec.mutable_command()->clear_argv();
  for (const char* a : {"/bin/sleep", "1"}) o.spec.mutable_command()->add_argv(a);
  auto r = RunCommandJob(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GE(calls.size(), 3u);
  std::vector<absl::Duration> gaps;
  for (size_t i = 1; i < calls.size(); ++i) gaps.push_back(calls[i] - calls[i - 1]);
  std::sort(gaps.begin(), gaps.end());
  EXPECT_LE(gaps[gaps.size() / 2], absl::Milliseconds(150)) << calls.size() << " calls";
}

}  // namespace
}  // namespace ringmaster::worker
