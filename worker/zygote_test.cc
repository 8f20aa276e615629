#include "worker/zygote.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";

class ZygoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
    dir_ = std::filesystem::path(testing::TempDir()) /
           absl::StrCat("zygote-", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "work");
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  ZygoteOptions Options(const std::string& script, std::vector<std::string> args = {}) {
    ZygoteOptions o;
    o.argv = {kPython, script};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.preload = {"colorsys"};
    o.env = {"PATH=/usr/bin:/bin", "WHO=zygote"};
    o.slot.set_node("n1");
    o.slot.set_slot(2);
    o.reply_timeout = absl::Seconds(60);
    return o;
  }
  static int Wait(pid_t pid) {
    int wstatus = 0;
    EXPECT_EQ(waitpid(pid, &wstatus, 0), pid) << "the program is not this process's child";
    return wstatus;
  }
  std::filesystem::path dir_;
};

// What `python3 SCRIPT ARGS` gives a script: sys.argv, the environment, the workdir, sys.path[0]
// the script's directory; and what the zygote adds: the preloaded module already imported, a
// process group of its own, this process as its parent, its own exit code.
TEST_F(ZygoteTest, TheScriptRunsAsPythonWouldRunItFromAWarmInterpreter) {
  const std::string out = (dir_ / "seen.txt").string();
  const std::string script = Write("prog.py", absl::StrCat(R"(
import os, sys
preloaded = "colorsys" in sys.modules
with open(")", out, R"(", "w") as f:
    f.write("\n".join([repr(sys.argv), os.environ.get("WHO", "-"), os.environ.get("X", "-"),
                       os.getcwd(), sys.path[0], str(preloaded), str(os.getpgrp() == os.getpid()),
                       str(os.getppid()), __name__]))
sys.exit(7)
)"));
  auto zygote = Zygote::Start(Options(script, {"--epochs", "3"}));
  ASSERT_TRUE(zygote.ok()) << zygote.status();
  ASSERT_TRUE((*zygote)->WaitReady().ok());
  const std::string work = (dir_ / "work").string();
  auto pid = (*zygote)->Spawn({"PATH=/usr/bin:/bin", "WHO=epoch1", "X=1"}, work, {0, 1, 2});
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int wstatus = Wait(*pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 7);
  EXPECT_EQ(Read(out), absl::StrCat("['", script, "', '--epochs', '3']\nepoch1\n1\n", work, "\n",
                                    dir_.string(), "\nTrue\nTrue\n", getpid(), "\n__main__"));
}

// One interpreter serves every epoch, each with its own environment; a stop of the program's
// group (SIGTERM) ends it by that signal, as it would a program this process exec'd.
TEST_F(ZygoteTest, ForksEveryEpochAndTheProgramsGroupCanBeStopped) {
  const std::string script = Write("prog.py", R"(
import os, sys, time
with open(os.environ["OUT"], "w") as f:
    f.write(os.environ["RINGMASTER_EPOCH"])
if os.environ["RINGMASTER_EPOCH"] == "2":
    time.sleep(600)
)");
  auto zygote = Zygote::Start(Options(script));
  ASSERT_TRUE(zygote.ok()) << zygote.status();
  for (int epoch = 1; epoch <= 2; ++epoch) {
    const std::string out = (dir_ / absl::StrCat("epoch", epoch)).string();
    auto pid = (*zygote)->Spawn({absl::StrCat("OUT=", out), absl::StrCat("RINGMASTER_EPOCH=", epoch)},
                                "", {0, 1, 2});
    ASSERT_TRUE(pid.ok()) << pid.status();
    if (epoch == 2) {
      while (Read(out) != "2") usleep(10000);
      ASSERT_EQ(kill(-*pid, SIGTERM), 0);
      const int wstatus = Wait(*pid);
      ASSERT_TRUE(WIFSIGNALED(wstatus));
      EXPECT_EQ(WTERMSIG(wstatus), SIGTERM);
    } else {
      const int wstatus = Wait(*pid);
      ASSERT_TRUE(WIFEXITED(wstatus));
      EXPECT_EQ(WEXITSTATUS(wstatus), 0);
    }
    EXPECT_EQ(Read(out), absl::StrCat(epoch));
  }
}

// stdout and stderr are the ones passed to Spawn; an uncaught exception prints its traceback
// there and exits 1, and a missing script exits 2, as python does.
TEST_F(ZygoteTest, OutputGoesWhereSpawnSaysAndFailuresExitAsPythonDoes) {
  const std::string script = Write("prog.py", "print('hello')\nraise RuntimeError('boom')\n");
  auto zygote = Zygote::Start(Options(script));
  ASSERT_TRUE(zygote.ok()) << zygote.status();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  auto pid = (*zygote)->Spawn({}, "", {0, out[1], out[1]});
  close(out[1]);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) text.append(buf, n);
  close(out[0]);
  const int wstatus = Wait(*pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 1);
  EXPECT_THAT(text, HasSubstr("hello\n"));
  EXPECT_THAT(text, HasSubstr("RuntimeError: boom"));

  std::filesystem::remove(script);
  auto missing = (*zygote)->Spawn({}, "", {0, 1, 2});
  ASSERT_TRUE(missing.ok()) << missing.status();
  const int missing_status = Wait(*missing);
  ASSERT_TRUE(WIFEXITED(missing_status));
  EXPECT_EQ(WEXITSTATUS(missing_status), 2);
}

TEST_F(ZygoteTest, APreloadThatRaisesIsReported) {
  ZygoteOptions o = Options(Write("prog.py", "pass\n"));
  o.preload = {"no_such_module_for_the_zygote"};
  auto zygote = Zygote::Start(o);
  ASSERT_TRUE(zygote.ok()) << zygote.status();
  const absl::Status ready = (*zygote)->WaitReady();
  EXPECT_TRUE(absl::IsUnavailable(ready)) << ready;
  EXPECT_THAT(ready.message(), HasSubstr("exit code 1"));
  zygote = Zygote::Start(o);
  ASSERT_TRUE(zygote.ok()) << zygote.status();
  auto pid = (*zygote)->Spawn({}, "", {0, 1, 2});
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(absl::IsUnavailable(pid.status())) << pid.status();
  EXPECT_THAT(pid.status().message(), HasSubstr("command.preload"));
  EXPECT_THAT(pid.status().message(), HasSubstr("exit code 1"));
}

TEST_F(ZygoteTest, AnInterpreterOrWorkdirThatCannotBeUsedIsPermanentAndNamed) {
  ZygoteOptions o = Options(Write("prog.py", "pass\n"));
  o.argv[0] = "/nonexistent/python3";
  auto zygote = Zygote::Start(o);
  ASSERT_FALSE(zygote.ok());
  EXPECT_TRUE(IsPermanent(zygote.status()));
  EXPECT_THAT(zygote.status().message(), HasSubstr("/nonexistent/python3 cannot be run on node n1"));
  o = Options(Write("prog.py", "pass\n"));
  o.workdir = "/nonexistent/dir";
  zygote = Zygote::Start(o);
  ASSERT_FALSE(zygote.ok());
  EXPECT_TRUE(IsPermanent(zygote.status()));
  EXPECT_THAT(zygote.status().message(), HasSubstr("command.workdir /nonexistent/dir"));
}

TEST(WaitForListenerTest, TrueOnceAPortAcceptsFalseAtTheDeadline) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  // Bound, not listening: refused until the deadline.
  const absl::Time start = absl::Now();
  EXPECT_FALSE(WaitForListener("127.0.0.1", port, start + absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  std::thread later([fd] {
    absl::SleepFor(absl::Milliseconds(50));
    listen(fd, 4);
  });
  EXPECT_TRUE(WaitForListener("127.0.0.1", port, absl::Now() + absl::Seconds(30)));
  later.join();
  close(fd);
}

}  // namespace
}  // namespace ringmaster::worker
