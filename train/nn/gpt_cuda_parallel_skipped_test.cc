// Stands in for gpt_cuda_tp_test.cc and gpt_cuda_slice_test.cc in builds without
// --config=cuda, so that the test target exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(GptCudaParallel, NotBuilt) {
  GTEST_SKIP() << "the GPU GPT is not built: build with --config=cuda (CUDA under "
                  "/usr/local/cuda) and run on a machine with a GPU, or --config=cudaemu";
}

}  // namespace
