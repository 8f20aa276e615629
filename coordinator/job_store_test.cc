#include "coordinator/job_store.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <string>

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ringmaster::coordinator {
namespace {

std::string FreshPath(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "-", getpid());
  std::filesystem::remove_all(dir);
  return dir + "/sub/jobs.db";
}

Job MakeJob(const std::string& id, int64_t epoch) {
  Job job;
  job.set_id(id);
  job.set_phase(JOB_PHASE_RUNNING);
  job.set_epoch(epoch);
  job.mutable_spec()->set_name(id);
  Member* m = job.add_members();
  m->mutable_slot()->set_node("a");
  m->mutable_slot()->set_slot(1);
  m->set_rank(0);
  return job;
}

TEST(JobStore, PutReplacesAndKeepsSubmissionOrder) {
  const std::string path = FreshPath("order");
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put(MakeJob("b", 1)).ok());
  ASSERT_TRUE((*store)->Put(MakeJob("a", 1)).ok());
  ASSERT_TRUE((*store)->Put(MakeJob("b", 7)).ok());
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "b");
  EXPECT_EQ((*jobs)[0].epoch(), 7);
  EXPECT_EQ((*jobs)[0].members(0).slot().node(), "a");
  EXPECT_EQ((*jobs)[1].id(), "a");
  auto a = (*store)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->epoch(), 1);
  EXPECT_EQ((*store)->Get("zzz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->Put(Job()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobStore, DeleteRemovesTheJobForGood) {
  const std::string path = FreshPath("delete");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(MakeJob("a", 1)).ok());
    ASSERT_TRUE((*store)->Put(MakeJob("b", 1)).ok());
    ASSERT_TRUE((*store)->Delete("a").ok());
    EXPECT_EQ((*store)->Delete("a").code(), absl::StatusCode::kNotFound);
    EXPECT_EQ((*store)->Get("a").status().code(), absl::StatusCode::kNotFound);
    // The name again: a new job, last in submission order.
    ASSERT_TRUE((*store)->Put(MakeJob("a", 2)).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "b");
  EXPECT_EQ((*jobs)[1].id(), "a");
  EXPECT_EQ((*jobs)[1].epoch(), 2);
}

int Mode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

// The database holds the membership secret: it and its WAL are the coordinator's alone,
// whatever the umask, and one left readable (by an older version) is closed up on open.
TEST(JobStore, TheDatabaseAndItsWalAreReadableByTheOwnerOnly) {
  const std::string path = FreshPath("mode");
  const mode_t old_umask = umask(0022);
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->GetOrCreateSetting("membership_secret", "s").ok());
    ASSERT_TRUE((*store)->Put(MakeJob("j", 1)).ok());
    EXPECT_EQ(Mode(path), 0600);
    EXPECT_EQ(Mode(path + "-wal"), 0600);
  }
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(Mode(path), 0600);
    ASSERT_TRUE((*store)->Get("j").ok());
  }
  umask(old_umask);
}

TEST(JobStore, SettingsKeepTheirFirstValueAcrossReopening) {
  const std::string path = FreshPath("settings");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->GetOrCreateSetting("secret", "0123"), "0123");
    EXPECT_EQ(*(*store)->GetOrCreateSetting("secret", "other"), "0123");
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->GetOrCreateSetting("secret", "third"), "0123");
}

// A child writes jobs one by one and reports each through a pipe after Put returns; the
// parent SIGKILLs it at once. Everything reported must be there after reopening.
TEST(JobStore, EveryReturnedPutSurvivesSigkill) {
  const std::string path = FreshPath("kill");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto store = JobStore::Open(path);
    if (!store.ok()) _exit(2);
    for (int i = 0;; ++i) {
      if (!(*store)->Put(MakeJob(absl::StrCat("job", i % 50), i)).ok()) _exit(3);
      if (write(fds[1], &i, sizeof(i)) != sizeof(i)) _exit(4);
    }
  }
  close(fds[1]);
  int last = -1, got;
  while (last < 200 && read(fds[0], &got, sizeof(got)) == sizeof(got)) last = got;
  kill(pid, SIGKILL);
  while (read(fds[0], &got, sizeof(got)) == sizeof(got)) last = got;  // drain: all were durable
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_GE(last, 200) << "child ended early: status " << status;

  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->Get(absl::StrCat("job", last % 50));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_GE(job->epoch(), last);
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 50u);
}

TEST(JobStore, SecondOpenerIsRefusedWhileTheFirstHoldsIt) {
  const std::string path = FreshPath("lock");
  auto first = JobStore::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Put(MakeJob("x", 1)).ok());
  // Another process (SQLite's locks are per process) must be refused.
  const pid_t pid = fork();
  if (pid == 0) {
    auto second = JobStore::Open(path);
    _exit(!second.ok() && second.status().code() == absl::StatusCode::kFailedPrecondition &&
                  second.status().message().find("another coordinator") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(JobStore, RejectsAFileThatIsNotADatabase) {
  const std::string path = FreshPath("garbage");
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << std::string(4096, 'x');
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status();
  EXPECT_EQ(JobStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

// A database truncated to 0 bytes (or replaced by one without ringmaster's tables) must not
// start a fresh cluster silently: that would forget every job and the membership secret.
void ExpectRefusedAsDamaged(const std::string& path) {
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok()) << "opened a damaged database " << path;
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_TRUE(absl::StrContains(store.status().message(), path)) << store.status();
  EXPECT_TRUE(absl::StrContains(store.status().message(), "--fresh_db")) << store.status();
}

TEST(JobStore, AnEmptyDatabaseFileIsRefusedUnlessAFreshStartIsAsked) {
  const std::string path = FreshPath("empty");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(MakeJob("j", 1)).ok());
  }
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  ExpectRefusedAsDamaged(path);
  ExpectRefusedAsDamaged(path);  // refusing leaves it as it was
  JobStoreOptions fresh;
  fresh.start_fresh = true;
  auto store = JobStore::Open(path, fresh);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());
  ASSERT_TRUE((*store)->Put(MakeJob("k", 1)).ok());
  store->reset();
  // Started fresh on purpose, it is a database like any other from then on.
  auto again = JobStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->Get("k").ok());
}

// The coordinator killed with its WAL beside the database, then the database truncated.
TEST(JobStore, AnEmptyDatabaseWithItsWalBesideItIsRefused) {
  const std::string path = FreshPath("empty-wal");
  const pid_t pid = fork();
  if (pid == 0) {
    auto store = JobStore::Open(path);
    if (!store.ok()) _exit(2);
    for (int i = 0; i < 20; ++i) {
      if (!(*store)->Put(MakeJob(absl::StrCat("job", i), i)).ok()) _exit(3);
    }
    kill(getpid(), SIGKILL);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  const auto wal_size = std::filesystem::file_size(path + "-wal");
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  {
    SCOPED_TRACE("truncated, its WAL beside it");
    ExpectRefusedAsDamaged(path);
  }
  // Refusing left the WAL as it was (SQLite deletes the WAL of an empty database).
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  EXPECT_EQ(std::filesystem::file_size(path + "-wal"), wal_size);
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
  // The WAL alone, the database file gone.
  ASSERT_EQ(unlink(path.c_str()), 0);
  {
    SCOPED_TRACE("the WAL alone");
    ExpectRefusedAsDamaged(path);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(JobStore, ASqliteDatabaseWithoutRingmastersTablesIsRefused) {
  const std::string path = FreshPath("foreign");
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE other (x INTEGER)", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const auto size = std::filesystem::file_size(path);
  ExpectRefusedAsDamaged(path);
  EXPECT_EQ(std::filesystem::file_size(path), size);
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST(JobStore, ANewPathCreatesTheDatabase) {
  const std::string path = FreshPath("new");
  ASSERT_FALSE(std::filesystem::exists(path));
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(MakeJob("j", 1)).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Get("j").ok());
}

}  // namespace
}  // namespace ringmaster::coordinator
