// train/trainer_mesh.h's fingerprints: the copies a mesh keeps equal are compared, and a copy
// that differs is named with the job's ranks that hold it.
#include "train/trainer_mesh.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/testing/multiproc.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "train/nn/gpt.h"

namespace ringmaster::train {
namespace {

// On 4 forked ranks under tp 2 x dp 2 (ranks 0, 1 the first replica's tensor-parallel pair,
// 2, 3 the second's): every rank's stage parameters from the common initialisation, then
// `corrupt(rank, stage table, stage params)`; the status of CheckMeshFingerprints on each
// rank.
std::vector<absl::Status> Fingerprint(
    const std::function<void(int, const nn::GptModel&, float*)>& corrupt) {
  comm::testing::MultiProcOptions mp;
  mp.world_size = 4;
  const auto results = comm::testing::RunRanks(
      mp, [&](comm::TcpCommunicator& world, absl::Duration*) -> absl::Status {
        TrainConfig config;
        config.mesh.tp = 2;
        const absl::Duration timeout = absl::Seconds(30);
        RM_ASSIGN_OR_RETURN(MeshGroups groups, BuildMeshGroups(config, world, timeout));
        nn::GptOptions gpt{.layers = 2, .heads = 2, .width = 16, .context = 8, .vocab = 32};
        RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> whole, nn::GptModel::Create(gpt));
        RM_ASSIGN_OR_RETURN(std::unique_ptr<ParallelStrategy> strategy,
                            CreatePipelineStrategy(config, *whole, groups, world, timeout));
        PipelineParallel& pipeline = *strategy->pipeline();
        state::FlatBuffer params(strategy->local_elements());
        for (const PipelineParallel::StageView& stage : pipeline.stage_views()) {
          state::FlatBuffer mine(stage.model->table().total_elements());
          stage.model->Init(7, mine);
          std::copy_n(mine.data(), mine.size(), params.data() + stage.base);
          corrupt(world.rank(), *stage.model, params.data() + stage.base);
        }
        return CheckMeshFingerprints(groups, world, pipeline, params.span(), 1.5, 4,
                                     absl::Now() + timeout);
      });
  std::vector<absl::Status> statuses;
  for (const auto& r : results) statuses.push_back(r.status);
  return statuses;
}

// Adds 1 to tensor `name`'s first element of the stage on `rank`.
std::function<void(int, const nn::GptModel&, float*)> Bump(int rank, const std::string& name) {
  return [rank, name](int r, const nn::GptModel& model, float* params) {
    if (r != rank) return;
    auto t = model.table().Find(name);
    ASSERT_TRUE(t.ok()) << name;
    params[model.table().tensor(*t).offset] += 1;
  };
}

TEST(CheckMeshFingerprints, EqualCopiesPass) {
  for (const absl::Status& s : Fingerprint([](int, const nn::GptModel&, float*) {})) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(CheckMeshFingerprints, AReplicatedTensorThatDiffersIsNamedAndEveryRankStops) {
  // Rank 3's LayerNorm: replicated over its pair (2, 3), and rank 1 is its data-parallel twin.
  const std::vector<absl::Status> s = Fingerprint(Bump(3, "h1.ln2.weight"));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(absl::IsInternal(s[r])) << r << ": " << s[r];
  // The data-parallel replicas compare first: ranks 1 and 3 find it there, rank 2 in its pair.
  for (int r : {1, 3}) {
    EXPECT_TRUE(absl::StrContains(s[r].message(),
                                  "h1.ln2.weight differs between rank 1 and rank 3 (the "
                                  "data-parallel replicas of pipeline stage 0)"))
        << s[r];
  }
  EXPECT_TRUE(absl::StrContains(s[2].message(),
                                "h1.ln2.weight differs between rank 2 and rank 3 (the tensors "
                                "the tensor-parallel group of pipeline stage 0 replicates)"))
      << s[2];
  // Rank 0's groups agree: it names the lowest rank that found a difference.
  EXPECT_TRUE(absl::StrContains(s[0].message(), "rank 1 found copies of a tensor that differ"))
      << s[0];
}

TEST(CheckMeshFingerprints, AShardThatDiffersFromItsDataParallelTwinIsNamed) {
  // Rank 2's shard of mlp.fc: its twin is rank 0; the shards of a pair differ by design.
  const std::vector<absl::Status> s = Fingerprint(Bump(2, "h0.mlp.fc.weight"));
  for (int r : {1, 3}) {
    EXPECT_TRUE(absl::StrContains(s[r].message(), "rank 0 found copies of a tensor that differ"))
        << s[r];
  }
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::StrContains(s[r].message(),
                                  "h0.mlp.fc.weight differs between rank 0 and rank 2 (the "
                                  "data-parallel replicas of pipeline stage 0)"))
        << s[r];
  }
}

}  // namespace
}  // namespace ringmaster::train
