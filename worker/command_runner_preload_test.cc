// RunCommandJob with command.preload: the program forked from the rank's warm interpreter
// (worker/zygote.h), against a scripted coordinator, with /usr/bin/python3; and how soon a
// rank can learn of a new epoch (its keep-alives' default interval).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/command_runner.h"
#include "worker/command_runner_test_util.h"

namespace ringmaster::worker {
namespace {

using testing::AtEpoch;
using ::testing::HasSubstr;
using testing::Joined;

constexpr char kPython[] = "/usr/bin/python3";

class PreloadTest : public testing::RunCommandJobFixture {
 protected:
  PreloadTest() : RunCommandJobFixture("command_runner_preload_test") {}
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
    RunCommandJobFixture::SetUp();
  }

  // kPython prog.py --flag, with these modules preloaded.
  CommandRunnerOptions PreloadOptions(const std::vector<std::string>& preload) {
    CommandRunnerOptions o = Options({kPython, "prog.py", "--flag"});
    o.spec.mutable_command()->mutable_preload()->Assign(preload.begin(), preload.end());
    return o;
  }
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
  ScriptEpochTwoAfterAFailure();
  auto r = RunCommandJob(PreloadOptions({"warm"}));
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
  auto r = RunCommandJob(PreloadOptions({"no_such_module_for_preload"}));
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
  CommandRunnerOptions o = Options({"/bin/sleep", "1"});
  o.progress_interval = CommandRunnerOptions().progress_interval;  // the default
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
