// Records of trainers and the end of those left running, with real processes: children of
// this test (each in a process group of its own, as the launcher makes them), reaped here
// so that the way each died can be checked.
#include "worker/trainer_records.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

class TrainerRecordsTest : public ::testing::Test {
 protected:
  TrainerRecordsTest() {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  ~TrainerRecordsTest() override {
    for (pid_t pid : children_) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  // A child running `script` under /bin/sh in its own process group; it has run the
  // script's first command (`ready`) when this returns.
  pid_t Spawn(const std::string& script) {
    int ready[2];
    EXPECT_EQ(pipe(ready), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      dup2(ready[1], 3);
      execl("/bin/sh", "sh", "-c", script.c_str(), nullptr);
      _exit(127);
    }
    setpgid(pid, pid);
    close(ready[1]);
    char c = 0;
    EXPECT_EQ(read(ready[0], &c, 1), 1) << "the child did not start: " << script;
    close(ready[0]);
    children_.push_back(pid);
    return pid;
  }
  // How `pid` ended (a signal as its negative number), waiting at most 30 s; 1000 when it
  // still runs then.
  int Reap(pid_t pid) {
    for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(children_, pid);
        return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return 1000;
  }
  bool Runs(pid_t pid) {
    int status = 0;
    return waitpid(pid, &status, WNOHANG) == 0;
  }

  std::string dir_;
  std::vector<pid_t> children_;
};

TEST_F(TrainerRecordsTest, ARecordNamesTheProcessBySlotJobEpochAndStartTime) {
  const pid_t pid = Spawn("echo >&3; exec sleep 600");
  ASSERT_TRUE(RecordTrainer(dir_, 1, pid, 7, "job-a").ok());
  const std::vector<TrainerRecord> records = ReadTrainerRecords(dir_);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].slot, 1);
  EXPECT_EQ(records[0].pid, pid);
  EXPECT_EQ(records[0].epoch, 7);
  EXPECT_EQ(records[0].job, "job-a");
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(records[0].start_time, *start);
  ForgetTrainer(dir_, 1);
  EXPECT_TRUE(ReadTrainerRecords(dir_).empty());
}

TEST_F(TrainerRecordsTest, AnExitedProcessHasNoStartTime) {
  const pid_t pid = Spawn("echo >&3; exit 0");
  // Exited but not reaped yet: a zombie runs nothing.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       ProcessStartTime(pid).ok() && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(absl::IsNotFound(ProcessStartTime(pid).status()));
  EXPECT_EQ(Reap(pid), 0);
  EXPECT_TRUE(absl::IsNotFound(ProcessStartTime(pid).status()));
  EXPECT_TRUE(absl::IsNotFound(RecordTrainer(dir_, 0, pid, 1, "job-a")));
}

TEST_F(TrainerRecordsTest, ATrainerLeftRunningIsEndedBySigtermAndItsRecordRemoved) {
  const pid_t pid = Spawn("echo >&3; exec sleep 600");
  ASSERT_TRUE(RecordTrainer(dir_, 0, pid, 3, "job-a").ok());
  const absl::Time began = absl::Now();
  const std::vector<EndedTrainer> ended =
      EndRecordedTrainers(dir_, {.term_grace = absl::Seconds(20), .kill_wait = absl::Seconds(5)});
  EXPECT_LT(absl::Now() - began, absl::Seconds(10)) << "it waited for the exit, not the grace";
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].record.pid, pid);
  EXPECT_EQ(ended[0].record.job, "job-a");
  EXPECT_EQ(ended[0].signal, SIGTERM);
  EXPECT_FALSE(ended[0].survived);
  EXPECT_EQ(Reap(pid), -SIGTERM);
  EXPECT_TRUE(ReadTrainerRecords(dir_).empty());
}

TEST_F(TrainerRecordsTest, OneThatIgnoresSigtermIsKilledAfterTheGrace) {
  // The shell ignores SIGTERM, and so does the sleep it starts (an ignored signal stays
  // ignored across exec): the whole group outlives SIGTERM.
  const pid_t pid = Spawn("trap '' TERM; echo >&3; sleep 600; exit 0");
  ASSERT_TRUE(RecordTrainer(dir_, 1, pid, 3, "job-a").ok());
  const std::vector<EndedTrainer> ended = EndRecordedTrainers(
      dir_, {.term_grace = absl::Milliseconds(300), .kill_wait = absl::Seconds(20)});
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].signal, SIGKILL);
  EXPECT_FALSE(ended[0].survived);
  EXPECT_EQ(Reap(pid), -SIGKILL);
}

TEST_F(TrainerRecordsTest, ARecordWhosePidNamesAnotherProcessNowIsDroppedWithoutASignal) {
  const pid_t pid = Spawn("echo >&3; exec sleep 600");
  ASSERT_TRUE(RecordTrainer(dir_, 0, pid, 3, "job-a").ok());
  // The same pid started at another time: the recorded trainer is gone and its pid reused.
  const std::string path = absl::StrCat(dir_, "/slot-0");
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.ok());
  {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "%d %llu 3 job-a\n", pid, static_cast<unsigned long long>(*start + 1));
    fclose(f);
  }
  // And a record of a process that exited long ago.
  const pid_t gone = Spawn("echo >&3; exit 0");
  ASSERT_EQ(Reap(gone), 0);
  {
    FILE* f = fopen(absl::StrCat(dir_, "/slot-1").c_str(), "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "%d 12345 3 job-a\n", gone);
    fclose(f);
  }
  const std::vector<EndedTrainer> ended = EndRecordedTrainers(dir_, {});
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].record.slot, 0);
  EXPECT_EQ(ended[0].signal, 0) << "gone already: not signalled";
  EXPECT_EQ(ended[1].record.slot, 1);
  EXPECT_EQ(ended[1].signal, 0);
  EXPECT_TRUE(Runs(pid)) << "a process the record does not name was signalled";
  EXPECT_TRUE(ReadTrainerRecords(dir_).empty()) << "stale records are removed";
}

TEST_F(TrainerRecordsTest, FilesThatAreNoRecordsAreSkipped) {
  std::filesystem::create_directories(dir_);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"slot-0", "not a record\n"}, {"slot-x", "1 2 3 job\n"}, {"other", "1 2 3 job\n"},
           {"slot-2", "-5 2 3 job\n"}}) {
    FILE* f = fopen(absl::StrCat(dir_, "/", name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(text.c_str(), f);
    fclose(f);
  }
  EXPECT_TRUE(ReadTrainerRecords(dir_).empty());
  EXPECT_TRUE(ReadTrainerRecords(dir_ + "/missing").empty());
}

}  // namespace
}  // namespace ringmaster::worker
