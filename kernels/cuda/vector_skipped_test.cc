// Stands in for vector_test.cc in builds without --config=cuda, so that the test target
// exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(VectorCuda, NotBuilt) {
  GTEST_SKIP() << "CUDA residual backward, Accumulate and Scale kernels not built: "
                  "build with --config=cuda (CUDA under /usr/local/cuda) and run on a "
                  "machine with a GPU";
}

}  // namespace
