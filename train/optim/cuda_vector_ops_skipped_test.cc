// Stands in for cuda_vector_ops_test.cc in builds without --config=cuda, so that the test
// target exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(CudaVectorOps, NotBuilt) {
  GTEST_SKIP() << "the optimizers on a GPU (CudaVectorOps) are not built: build with "
                  "--config=cuda (CUDA under /usr/local/cuda) and run on a machine with a GPU";
}

}  // namespace
