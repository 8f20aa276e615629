#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/store.h"
#include "gtest/gtest.h"

namespace ringmaster::comm {
namespace {

std::unique_ptr<FileStore> MakeStore() {
  FileStoreOptions options;
  options.directory = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store-",
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  auto store = FileStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

TEST(FileStore, SetThenGet) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("job/epoch-1/rank-0/addr", "127.0.0.1:5000").ok());
  auto value = store->Get("job/epoch-1/rank-0/addr", absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "127.0.0.1:5000");
  ASSERT_TRUE(store->Set("job/epoch-1/rank-0/addr", std::string("\0binary\xff", 8)).ok());
  EXPECT_EQ(*store->Get("job/epoch-1/rank-0/addr", absl::Now()), std::string("\0binary\xff", 8));
}

TEST(FileStore, GetWaitsForALaterSet) {
  auto store = MakeStore();
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store->Set("late", "here").ok());
  });
  auto value = store->Get("late", absl::Now() + absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TEST(FileStore, GetTimesOutNamingTheKey) {
  auto store = MakeStore();
  absl::Time start = absl::Now();
  auto value = store->Get("never", start + absl::Milliseconds(100));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(value.status().message().find("never"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(FileStore, WaitNamesMissingKeys) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("a", "1").ok());
  absl::Status s = store->Wait({"a", "b"}, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("b"), std::string::npos);
  ASSERT_TRUE(store->Set("b", "2").ok());
  EXPECT_TRUE(store->Wait({"a", "b"}, absl::Now() + absl::Seconds(1)).ok());
}

TEST(FileStore, RejectsBadKeys) {
  auto store = MakeStore();
  EXPECT_EQ(store->Set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("a b", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("../escape", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("/abs", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FileStore::Create(FileStoreOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FileStore, AddIsAtomicAcrossProcesses) {
  auto store = MakeStore();
  constexpr int kProcs = 4, kAdds = 50;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < kAdds; ++i) {
        if (!store->Add("counter", 1).ok()) _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto total = store->Add("counter", 0);
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(*total, kProcs * kAdds);
  ASSERT_TRUE(store->Set("text", "abc").ok());
  EXPECT_EQ(store->Add("text", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ringmaster::comm
