#include "worker/program_output.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

TEST(LastLineTest, TheLastNonBlankLineOfEitherSource) {
  LastLine last;
  EXPECT_EQ(last.Get(), "");
  last.Feed(0, "step 1\nstep");
  EXPECT_EQ(last.Get(), "step 1");
  last.Feed(1, "Traceback (most recent call last):\n  File \"x.py\"");  // a partial line of 1
  last.Feed(0, " 2  \n\n   \n");  // blank lines do not count; trailing spaces go
  EXPECT_EQ(last.Get(), "step 2");
  last.Feed(1, ", line 3\nRuntimeError: boom");
  EXPECT_EQ(last.Get(), "  File \"x.py\", line 3") << "the line of source 1, whole";
  last.End(1);  // the unterminated last line counts once its source ends
  EXPECT_EQ(last.Get(), "RuntimeError: boom");
}

TEST(LastLineTest, CarriageReturnsEndLinesAndLongLinesAreCut) {
  LastLine last(8);
  last.Feed(0, "10%\r50%\r");
  EXPECT_EQ(last.Get(), "50%");
  last.Feed(0, "0123456789abc\n");
  EXPECT_EQ(last.Get(), "01234567...");
  last.Feed(0, "ok\n");
  EXPECT_EQ(last.Get(), "ok") << "the cut belongs to the long line only";
}

TEST(LastLineTest, InvalidUtf8BecomesQuestionMarks) {
  LastLine last;
  last.Feed(0, "caf\xc3\xa9 \xff\xfe ok \xe2\x82\n");  // é, two bad bytes, a cut sequence
  EXPECT_EQ(last.Get(), "caf\xc3\xa9 ?? ok ??");
  EXPECT_EQ(ValidUtf8("\xc0\xaf"), "??") << "an overlong '/'";
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80"), "???") << "a surrogate";
  EXPECT_EQ(ValidUtf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(ValidUtf8(std::string("a\0b\x1b[1m\tc", 9)), "a?b?[1m\tc") << "controls but tab";
}

class ProgramOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/program_output_test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    out_fd_ = open((dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    err_fd_ = open((dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(out_fd_, 0);
    ASSERT_GE(err_fd_, 0);
  }
  void TearDown() override {
    close(out_fd_);
    close(err_fd_);
    std::filesystem::remove_all(dir_);
  }

  // Runs `script` under /bin/sh in dir_ (its own process group) with its output in `output`.
  pid_t Run(ProgramOutput& output, const std::string& script) {
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      dup2(output.child_stdout_fd(), 1);
      dup2(output.child_stderr_fd(), 2);
      if (chdir(dir_.c_str()) != 0) _exit(126);
      execl("/bin/sh", "sh", "-c", script.c_str(), nullptr);
      _exit(127);
    }
    output.Start();
    return pid;
  }

  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string dir_;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

TEST_F(ProgramOutputTest, EveryByteGoesThroughUnchangedToItsOwnStream) {
  auto output = ProgramOutput::Create({.out_fd = out_fd_, .err_fd = err_fd_});
  ASSERT_TRUE(output.ok()) << output.status();
  // 200 KB on stdout (more than a pipe holds) with a NUL and no final newline; stderr apart.
  const pid_t pid = Run(**output,
                        "i=0; while [ $i -lt 2000 ]; do printf '%099d\\n' $i; i=$((i+1)); done; "
                        "printf 'a\\000b' ; printf 'warning: x\\nlast words\\n' >&2; "
                        "printf 'no newline'");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE((*output)->Finish(absl::Now() + absl::Seconds(10)));
  std::string want;
  for (int i = 0; i < 2000; ++i) want += std::string(99 - std::to_string(i).size(), '0') + std::to_string(i) + "\n";
  want += std::string("a\0b", 3) + "no newline";
  EXPECT_EQ(Read("out"), want);
  EXPECT_EQ(Read("err"), "warning: x\nlast words\n");
  EXPECT_EQ((*output)->last_line(), "a?bno newline") << "a control character is shown as ?";
}

// Copied as it comes: the program sees its first line copied before it writes the second.
TEST_F(ProgramOutputTest, OutputIsCopiedWhileTheProgramRuns) {
  auto output = ProgramOutput::Create({.out_fd = out_fd_, .err_fd = err_fd_});
  ASSERT_TRUE(output.ok()) << output.status();
  const pid_t pid = Run(**output,
                        "echo ready; i=0; while [ ! -e go ] && [ $i -lt 1000 ]; do sleep 0.01; "
                        "i=$((i+1)); done; [ -e go ] && echo went >&2");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Read("out") != "ready\n" && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Read("out"), "ready\n");
  std::ofstream(dir_ + "/go") << "";
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE((*output)->Finish(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(Read("err"), "went\n");
  EXPECT_EQ((*output)->last_line(), "went");
}

// A process the program left behind holds the pipes: Finish stops at its deadline anyway.
TEST_F(ProgramOutputTest, FinishStopsAtItsDeadlineWhenALeftoverHoldsThePipes) {
  auto output = ProgramOutput::Create({.out_fd = out_fd_, .err_fd = err_fd_});
  ASSERT_TRUE(output.ok()) << output.status();
  const pid_t pid = Run(**output, "sleep 30 & echo 'started a leftover'");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const absl::Time start = absl::Now();
  EXPECT_FALSE((*output)->Finish(absl::Now() + absl::Milliseconds(300)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ((*output)->last_line(), "started a leftover");
  kill(-pid, SIGKILL);  // the leftover sleep, in the program's group
}

}  // namespace
}  // namespace ringmaster::worker
