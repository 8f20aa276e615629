// What //tools/cuda_emu's tests are outside --config=cudaemu: one skipped case saying how to
// run them (the emulation needs the CUDA headers of /usr/local/cuda, which a default build
// must not).
#include "gtest/gtest.h"

TEST(CudaEmu, NeedsConfigCudaemu) {
  GTEST_SKIP() << "the CUDA emulation's tests run with `bazel test --config=cudaemu "
                  "//tools/cuda_emu/...` (needs the CUDA toolkit's headers)";
}
