// Stands in for gpt_cuda_stage_test.cc in builds without --config=cuda, so that the test
// target exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(GptCudaStage, NotBuilt) {
  GTEST_SKIP() << "the GPU pipeline stages are not built: run with --config=cudaemu (emulated "
                  "GPUs and NCCL, on the CPU) or --config=cuda on a machine with a GPU per rank";
}

}  // namespace
