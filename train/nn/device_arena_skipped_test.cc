// Stands in for device_arena_test.cc in builds without --config=cuda.
#include "gtest/gtest.h"

namespace {

TEST(DeviceArena, NotBuilt) {
  GTEST_SKIP() << "the device arena is not built: build with --config=cuda (CUDA under "
                  "/usr/local/cuda) and run on a machine with a GPU, or --config=cudaemu";
}

}  // namespace
