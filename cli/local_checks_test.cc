#include "cli/local_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

JobSpec Mesh(int tp, int pp) {
  JobSpec spec;
  spec.set_device(JobSpec::DEVICE_CPU);
  spec.mutable_parallelism()->mutable_mesh()->set_tp(tp);
  spec.mutable_parallelism()->mutable_mesh()->set_pp(pp);
  return spec;
}

absl::Status Check(const JobSpec& spec, int workers, const std::string& summary = "",
                   int cuda_devices = 0) {
  LocalChecks checks;
  checks.workers = workers;
  checks.summary = summary;
  checks.cuda_devices = cuda_devices;
  return CheckLocalRun(spec, checks);
}

// Issue 36 point 11: --workers 3 with tp 2 trained on 2 ranks and said "succeeded on 2
// workers"; the third idled.
TEST(CheckLocalRun, RefusesWorkersTheMeshCannotAllUse) {
  absl::Status s = Check(Mesh(2, 1), 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--workers 3 is not a multiple of "
                                             "parallelism.mesh.tp × pp (2 × 1 = 2)"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "use --workers 2 or 4")) << s;
  s = Check(Mesh(2, 2), 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "--workers 2 is fewer than")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "use --workers 4")) << s;
  JobSpec capped = Mesh(2, 1);
  capped.mutable_elastic()->set_max_ranks(3);
  s = Check(capped, 4);
  EXPECT_TRUE(absl::StrContains(s.message(), "elastic.max_ranks 3")) << s;

  EXPECT_TRUE(Check(Mesh(2, 1), 4).ok());
  EXPECT_TRUE(Check(Mesh(2, 2), 8).ok());
  EXPECT_TRUE(Check(Mesh(1, 1), 3).ok()) << "plain data parallelism takes any number";
  EXPECT_TRUE(Check(JobSpec(), 3).ok()) << "a mesh left unset is 1 × 1";
}

// Issue 36 point 10: device: cuda on a build without CUDA failed in every trainer, through
// the restart budget.
TEST(CheckLocalRun, RefusesCudaWithoutAGpu) {
  JobSpec spec = Mesh(1, 1);
  spec.set_device(JobSpec::DEVICE_CUDA);
  absl::Status s = Check(spec, 1, "", /*cuda_devices=*/0);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), "device: cuda")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "set device: cpu")) << s;
  EXPECT_TRUE(Check(spec, 2, "", /*cuda_devices=*/1).ok());
  spec.set_device(JobSpec::DEVICE_AUTO);
  EXPECT_TRUE(Check(spec, 1, "", /*cuda_devices=*/0).ok());
}

// Issue 36 point 13: an unwritable --summary failed after the training, and exited 0.
TEST(CheckLocalRun, RefusesASummaryThatCannotBeWritten) {
  const std::string tmp = getenv("TEST_TMPDIR");
  const JobSpec spec = Mesh(1, 1);
  EXPECT_TRUE(Check(spec, 1, tmp + "/summary.json").ok());
  absl::Status s = Check(spec, 1, tmp + "/no/such/dir/summary.json");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--summary " + tmp + "/no/such/dir/summary.json"))
      << s;
  s = Check(spec, 1, tmp);
  EXPECT_TRUE(absl::StrContains(s.message(), "is a directory")) << s;
  const std::string locked = tmp + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0555), 0);
  if (geteuid() != 0) {  // root writes anywhere
    s = Check(spec, 1, locked + "/summary.json");
    EXPECT_TRUE(absl::StrContains(s.message(), "cannot write in " + locked)) << s;
  }
  const std::string file = tmp + "/a_file";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  s = Check(spec, 1, file + "/summary.json");
  EXPECT_TRUE(absl::StrContains(s.message(), "is not a directory")) << s;
}

}  // namespace
}  // namespace ringmaster::cli
