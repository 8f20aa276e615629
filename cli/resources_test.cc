#include "cli/resources.h"

#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::cli {
namespace {

JobSpec Example(const char* file) {
  auto spec = spec::LoadJobSpecFile(file, {});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// The MLP of examples/ (784-512-512-10, SGD with momentum): 669,706 parameters, 4 bytes each
// for the parameters, the gradients and the momentum: 7.7 MiB, rounded up to 8.
TEST(FillMemoryEstimate, FillsTheModelsStateWhenNotStated) {
  JobSpec spec = Example("examples/fashion_mnist_mlp.yaml");
  const std::string line = FillMemoryEstimate(&spec);
  EXPECT_EQ(spec.resources().memory_per_rank_mib(), 8);
  EXPECT_NE(line.find("8 MiB"), std::string::npos) << line;
}

// A model of 10^12 parameters is described, not allocated: the estimate is quick and huge.
TEST(FillMemoryEstimate, AHugeModelIsEstimatedNotAllocated) {
  JobSpec spec = Example("examples/fashion_mnist_mlp.yaml");
  spec.mutable_model()->mutable_mlp()->clear_hidden();
  spec.mutable_model()->mutable_mlp()->add_hidden(1000000);
  spec.mutable_model()->mutable_mlp()->add_hidden(1000000);
  FillMemoryEstimate(&spec);
  EXPECT_GT(spec.resources().memory_per_rank_mib(), int64_t{10} << 20) << "over 10 TiB";
}

TEST(FillMemoryEstimate, AStatedValueIsKept) {
  JobSpec spec = Example("examples/fashion_mnist_mlp.yaml");
  spec.mutable_resources()->set_memory_per_rank_mib(3);
  EXPECT_EQ(FillMemoryEstimate(&spec), "");
  EXPECT_EQ(spec.resources().memory_per_rank_mib(), 3);
}

}  // namespace
}  // namespace ringmaster::cli
