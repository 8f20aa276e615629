// Stands in for activation_test.cc in builds without --config=cuda, so that the test target
// exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(ActivationCuda, NotBuilt) {
  GTEST_SKIP() << "CUDA ReLU kernels not built: build with --config=cuda (CUDA under "
                  "/usr/local/cuda) and run on a machine with a GPU";
}

}  // namespace
