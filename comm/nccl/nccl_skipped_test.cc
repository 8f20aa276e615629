// Stands in for nccl_communicator_test.cc in builds without --config=cuda, so that the
// test target exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(NcclCommunicator, NotBuilt) {
  GTEST_SKIP() << "NCCL backend not built: build with --config=cuda (CUDA 13 + NCCL under "
                  "/usr/local/cuda) on a machine with a GPU";
}

}  // namespace
