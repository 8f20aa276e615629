// Stands in for trainer_mesh_gpu_test.cc in builds without --config=cuda, so that the test
// target exists everywhere and says why it did not run.
#include "gtest/gtest.h"

namespace {

TEST(TrainerMeshOnGpu, NotBuilt) {
  GTEST_SKIP() << "model parallelism on GPUs is not built: run with --config=cudaemu (emulated "
                  "GPUs and NCCL, on the CPU) or --config=cuda on a machine with GPUs";
}

}  // namespace
