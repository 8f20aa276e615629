// kernels::CheckBlasKernels and UseBestBlasKernels (kernels/matmul.h). The test re-runs its
// own binary as a child (BLAS_KERNELS_TEST_CHILD set), which calls UseBestBlasKernels as a
// program's main() does and prints the kernels OpenBLAS then runs.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "kernels/matmul.h"

namespace ringmaster::kernels {
namespace {

constexpr char kChild[] = "BLAS_KERNELS_TEST_CHILD";

// Runs this binary as the child, without OPENBLAS_CORETYPE and the re-execution's marker but
// with the assignments `env`; its stdout.
std::string RunChild(const std::string& env) {
  const std::string command = "env -u OPENBLAS_CORETYPE -u RINGMASTER_BLAS_REEXEC " +
                              std::string(kChild) + "=1 " + env + " /proc/" +
                              std::to_string(getpid()) + "/exe";
  FILE* p = popen(command.c_str(), "r");
  EXPECT_NE(p, nullptr) << command;
  if (p == nullptr) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  EXPECT_EQ(pclose(p), 0) << command << ": " << out;
  return out;
}

TEST(BlasKernels, NamesTheKernelsThatRun) {
  const BlasKernels k = CheckBlasKernels();
  EXPECT_FALSE(k.chosen.empty());
  EXPECT_NE(k.suggested, k.chosen);
}

TEST(BlasKernels, AProgramRunsTheSuggestedKernelsAfterUseBestBlasKernels) {
  // What this process (started without OPENBLAS_CORETYPE by the test runner, unless the
  // machine sets it) runs and would be told.
  const BlasKernels here = CheckBlasKernels();
  const std::string child = RunChild("");
  const std::string expected = here.suggested.empty() ? here.chosen : here.suggested;
  if (getenv("OPENBLAS_CORETYPE") == nullptr) {
    EXPECT_EQ(child, "chosen " + expected + "\n") << "suggested: " << here.suggested;
  }
  // The user's choice is kept: no re-execution, no suggestion.
  EXPECT_EQ(RunChild("OPENBLAS_CORETYPE=Prescott"), "chosen Prescott\n");
}

}  // namespace
}  // namespace ringmaster::kernels

int main(int argc, char** argv) {
  if (getenv(ringmaster::kernels::kChild) != nullptr) {
    ringmaster::kernels::UseBestBlasKernels(argv);
    const ringmaster::kernels::BlasKernels k = ringmaster::kernels::CheckBlasKernels();
    printf("chosen %s\n", k.chosen.c_str());
    return k.suggested.empty() ? 0 : 1;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
