// Stands in for tcp_cuda_test.cc in builds without --config=cuda, so that the test target
// exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(TcpCuda, NotBuilt) {
  GTEST_SKIP() << "device-buffer staging of the TCP backend not built: build with "
                  "--config=cuda (CUDA 13 under /usr/local/cuda) on a machine with a GPU";
}

}  // namespace
