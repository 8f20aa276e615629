#include "train/testing.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "common/env.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace ringmaster::train::testing {

TrainConfig CheckpointedJob(absl::string_view dir_name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", dir_name);
  absl::Status made = DeleteRecursively(Env::Default(), dir);
  if (made.ok()) made = Env::Default()->CreateDir(dir);
  CHECK(made.ok()) << made;
  TrainConfig c;
  c.name = "job";
  c.checkpoint.dir = dir;
  c.checkpoint.spec_hash = kTestSpecHash;
  return c;
}

void ExpectOkOnRanks(int world, const std::function<absl::Status(comm::TcpCommunicator&)>& fn) {
  comm::testing::MultiProcOptions options;
  options.world_size = world;
  const std::vector<comm::testing::RankResult> results = comm::testing::RunRanks(
      options, [&](comm::TcpCommunicator& comm, absl::Duration*) { return fn(comm); });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok())
        << "world " << world << ", rank " << r << ": " << results[r].status;
  }
}

}  // namespace ringmaster::train::testing
