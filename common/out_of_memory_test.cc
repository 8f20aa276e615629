#include "common/out_of_memory.h"

#include <new>
#include <stdexcept>
#include <thread>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

// A bad_alloc that escapes a background thread: one named line and the permanent exit
// status, not an abort (issue 17, point 8: "allocation failure anywhere in a trainer").
TEST(OutOfMemoryExitDeathTest, ABadAllocOnAnyThreadExitsPermanentlyNamingIt) {
  EXPECT_EXIT(
      {
        InstallOutOfMemoryExit("ringtrainer a/0");
        std::thread([] { throw std::bad_alloc(); }).join();
      },
      ::testing::ExitedWithCode(kExitCodePermanent),
      "ringtrainer a/0: RESOURCE_EXHAUSTED: out of memory");
}

// Anything else still aborts, as an ordinary crash.
TEST(OutOfMemoryExitDeathTest, OtherExceptionsStillAbort) {
  EXPECT_DEATH(
      {
        InstallOutOfMemoryExit("ringtrainer a/0");
        std::thread([] { throw std::runtime_error("boom"); }).join();
      },
      "");
}

}  // namespace
}  // namespace ringmaster
