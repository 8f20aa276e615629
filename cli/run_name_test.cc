#include "cli/run_name.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::cli {
namespace {

using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1796179500);  // 2026-12-02 02:45:00 UTC

JobSpec Spec(const std::string& jsonl) {
  JobSpec spec;
  spec.set_name("tiny_gpt");
  spec.mutable_metrics()->set_jsonl(jsonl);
  return spec;
}

TEST(NameRun, EachRunGetsItsOwnFile) {
  JobSpec spec = Spec("out/{job}-{run}.metrics.jsonl");
  absl::StatusOr<std::string> path = NameRun(&spec, kNow, "/home/u/work");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(spec.metrics().run(), "tiny_gpt-20261202-024500");
  EXPECT_EQ(*path, "/home/u/work/out/tiny_gpt-tiny_gpt-20261202-024500.metrics.jsonl");
  EXPECT_EQ(spec.metrics().jsonl(), *path);
  // A second later, another run and another file.
  JobSpec again = Spec("out/{job}-{run}.metrics.jsonl");
  absl::StatusOr<std::string> next = NameRun(&again, kNow + absl::Seconds(1), "/home/u/work");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(*next, *path);
}

TEST(NameRun, AGivenRunNameAndAnAbsolutePathAreKept) {
  JobSpec spec = Spec("/data/runs/{run}.jsonl");
  spec.mutable_metrics()->set_run("baseline");
  absl::StatusOr<std::string> path = NameRun(&spec, kNow, "/home/u/work");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, "/data/runs/baseline.jsonl");
  EXPECT_EQ(spec.metrics().run(), "baseline");
}

TEST(NameRun, WithoutAWorkingDirectoryARelativePathStays) {
  JobSpec spec = Spec("m.jsonl");
  absl::StatusOr<std::string> path = NameRun(&spec, kNow, "");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, "m.jsonl");
  // The run is named even without a metrics file (its TensorBoard events, its records).
  JobSpec none = Spec("");
  path = NameRun(&none, kNow, "/w");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, "");
  EXPECT_EQ(none.metrics().run(), "tiny_gpt-20261202-024500");
  EXPECT_EQ(none.metrics().jsonl(), "");
}

TEST(NameRun, AMistypedPlaceholderIsRefusedNamingTheField) {
  for (const char* bad : {"out/{jobs}.jsonl", "out/{run.jsonl", "out/run}.jsonl"}) {
    JobSpec spec = Spec(bad);
    absl::StatusOr<std::string> path = NameRun(&spec, kNow, "/w");
    EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(path.status().message(), HasSubstr("metrics.jsonl")) << bad;
    EXPECT_THAT(path.status().message(), HasSubstr("{job}")) << bad;
  }
}

TEST(NameRun, NoExampleNamesAMachineWideFile) {
  // Every example's metrics file, if it has one, is the run's own.
  for (const char* example :
       {"fashion_mnist_cnn", "fashion_mnist_mlp", "fashion_mnist_resnet18", "gpt2_sotu_finetune",
        "gpt2_sotu_pretrain", "larger_than_a_rank", "sotu_bytes_gpt", "tiny_gpt"}) {
    absl::StatusOr<JobSpec> spec =
        spec::LoadJobSpecFile(std::string("examples/") + example + ".yaml", {});
    ASSERT_TRUE(spec.ok()) << example << ": " << spec.status();
    const std::string& jsonl = spec->metrics().jsonl();
    if (jsonl.empty()) continue;
    EXPECT_THAT(jsonl, HasSubstr("{run}")) << example;
    EXPECT_NE(jsonl[0], '/') << example << ": " << jsonl;
  }
}

}  // namespace
}  // namespace ringmaster::cli
