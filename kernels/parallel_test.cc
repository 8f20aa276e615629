#include "kernels/parallel.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/matmul.h"

namespace ringmaster::kernels {
namespace {

TEST(ParallelRunTest, RunsEveryPartOnceEachOnItsOwnThreadAtOnce) {
  for (int parts : {1, 2, 3, 2, 4, 1}) {  // the pool grows and is reused with fewer
    std::vector<int> runs(parts, 0);
    std::vector<std::thread::id> ids(parts);
    std::atomic<int> arrived{0};
    ParallelRun(parts, [&](int i) {
      ++runs[i];
      ids[i] = std::this_thread::get_id();
      // Every part waits for all the others: they run at once, or this never ends.
      ++arrived;
      while (arrived.load() < parts) std::this_thread::yield();
    });
    for (int i = 0; i < parts; ++i) EXPECT_EQ(runs[i], 1) << parts << " parts, part " << i;
    EXPECT_EQ(ids[0], std::this_thread::get_id()) << "part 0 runs on the caller";
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), static_cast<size_t>(parts));
  }
  ParallelRun(0, [](int) { ADD_FAILURE() << "no parts, no calls"; });
}

TEST(ParallelRunTest, BlasRunsOneThreadInsideAndIsRestoredAfter) {
  SetBlasThreads(2);
  std::vector<int> inside(2, 0);
  ParallelRun(2, [&](int i) { inside[i] = BlasThreads(); });
  EXPECT_EQ(inside, std::vector<int>({1, 1}));
  EXPECT_EQ(BlasThreads(), 2);
}

TEST(ParallelRunTest, ConcurrentCallsLeaveOpenBlasAsItWas) {
  SetBlasThreads(2);
  auto call = [] {
    for (int k = 0; k < 200; ++k) ParallelRun(2, [](int) {});
  };
  std::thread a(call), b(call);
  a.join();
  b.join();
  EXPECT_EQ(BlasThreads(), 2);
}

TEST(ParallelRunTest, AChildOfForkRunsItsOwnPool) {
  ParallelRun(2, [](int) {});  // the parent's workers exist
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int> ran{0};
    ParallelRun(3, [&](int) { ++ran; });  // with the parent's workers gone, this would hang
    _exit(ran.load() == 3 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ParallelRunTest, CallsFromSeveralThreadsRunOneAfterTheOther) {
  std::atomic<int> inside{0}, most{0};
  auto call = [&] {
    for (int k = 0; k < 50; ++k) {
      ParallelRun(2, [&](int) {
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        --inside;
      });
    }
  };
  std::thread a(call), b(call);
  a.join();
  b.join();
  EXPECT_LE(most.load(), 2);
}

}  // namespace
}  // namespace ringmaster::kernels
