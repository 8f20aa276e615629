#include "train/gradient_backend.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;

TEST(ChooseGradientBackend, AutoPicksNcclWhenEveryRankHasItsOwnGpu) {
  auto c = ChooseGradientBackend(TrainConfig::Backend::kAuto, {"aa", "bb", "cc"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->nccl);
  EXPECT_EQ(c->reason, "every rank has its own GPU");
  c = ChooseGradientBackend(TrainConfig::Backend::kAuto, {"aa"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->nccl);
}

TEST(ChooseGradientBackend, AutoFallsBackToTcpAndSaysWhy) {
  auto shared = ChooseGradientBackend(TrainConfig::Backend::kAuto, {"aa", "bb", "aa"});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_FALSE(shared->nccl);
  EXPECT_EQ(shared->reason, "ranks 0 and 2 share GPU aa");
  auto cpu = ChooseGradientBackend(TrainConfig::Backend::kAuto, {"aa", ""});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(cpu->nccl);
  EXPECT_EQ(cpu->reason, "rank 1 trains on the CPU");
}

TEST(ChooseGradientBackend, TcpIsTcpEvenWithGpus) {
  auto c = ChooseGradientBackend(TrainConfig::Backend::kTcp, {"aa", "bb"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->nccl);
}

TEST(ChooseGradientBackend, NcclThatCannotBeNamesTheFieldAndTheRanks) {
  auto c = ChooseGradientBackend(TrainConfig::Backend::kNccl, {"aa", "aa"});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("backend: nccl"));
  EXPECT_THAT(c.status().message(), HasSubstr("ranks 0 and 1 share GPU aa"));
  c = ChooseGradientBackend(TrainConfig::Backend::kNccl, {""});
  EXPECT_THAT(c.status().message(), HasSubstr("rank 0 trains on the CPU"));
  c = ChooseGradientBackend(TrainConfig::Backend::kNccl, {"aa", "bb"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->nccl);
}

TEST(GatherGpuIds, EveryRankGetsEveryRanksIdInRankOrder) {
  comm::testing::MultiProcOptions options;
  options.world_size = 3;
  auto results = comm::testing::RunRanks(
      options, [](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        // Rank 1 is on the CPU; the others have ids of different lengths.
        const std::string mine =
            comm.rank() == 1 ? "" : std::string(comm.rank() == 0 ? 32 : kMaxGpuIdBytes, 'a' + comm.rank());
        auto ids = GatherGpuIds(comm, mine, absl::Now() + absl::Seconds(30));
        if (!ids.ok()) return ids.status();
        const std::vector<std::string> want = {std::string(32, 'a'), "",
                                               std::string(kMaxGpuIdBytes, 'c')};
        if (*ids != want) return absl::InternalError(absl::StrCat("rank ", comm.rank(), " got other ids"));
        auto too_long = GatherGpuIds(comm, std::string(kMaxGpuIdBytes + 1, 'x'), absl::Now());
        if (too_long.status().code() != absl::StatusCode::kInvalidArgument) {
          return absl::InternalError(absl::StrCat("a long id gave ", too_long.status().ToString()));
        }
        return absl::OkStatus();
      });
  ASSERT_EQ(results.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(results[r].status.ok()) << r << ": " << results[r].status;
}

}  // namespace
}  // namespace ringmaster::train
