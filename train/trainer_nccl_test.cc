// A two-rank job with backend: nccl on GPUs: the trainer bootstraps NCCL through the Store
// it is given, reduces its gradients over NCCL, and ends where the same job over the TCP
// backend (host staging) ends, up to float summation order; both ranks end identical.
//
// Under --config=cudaemu each rank has its own emulated GPU (comm/nccl/gpu_per_rank.h) and
// the emulated NCCL computes the collectives on the host; with --config=cuda it needs two
// GPUs and skips otherwise. This process never initialises CUDA (it forks the ranks).
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "train/data/fashion_mnist.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

constexpr int kRanks = 2;

// A small classifier (it has a CUDA path) over a few steps, with several gradient buckets.
constexpr char kSpec[] = R"(
name: trainer_nccl_test
seed: 11
steps: 5
model: {mlp: {hidden: [24]}}
data: {fashion_mnist: {}, eval_every_epoch: false}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05, clip_grad_norm: 1.0}
batch: {global: 40}
parallelism: {bucket_mb: 0.002}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

// 160 samples of 20 features in 4 classes, each class marked in its own features.
std::unique_ptr<data::Dataset> Data() {
  constexpr int64_t kSamples = 160, kFeatures = 20, kClasses = 4;
  std::vector<uint8_t> pixels(kSamples * kFeatures), labels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) {
    labels[i] = static_cast<uint8_t>(i % kClasses);
    for (int64_t f = 0; f < kFeatures; ++f) {
      const bool marked = f % kClasses == i % kClasses;
      pixels[i * kFeatures + f] = static_cast<uint8_t>((i * 37 + f * 11) % 97 + (marked ? 120 : 0));
    }
  }
  return *data::ImageClassificationDataset::Create("synthetic", std::move(pixels),
                                                   std::move(labels), kFeatures, kClasses, {});
}

struct RankOutcome {
  std::string backend;
  double final_loss = 0;
  std::vector<float> params;
};

// Trains kSpec with `backend` on kRanks forked ranks, each on its own GPU, the trainer given
// a Store to bootstrap NCCL through; returns each rank's outcome.
std::vector<RankOutcome> Train(const std::string& backend) {
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  comm::testing::MultiProcOptions options;
  options.world_size = kRanks;
  auto results = comm::testing::RunRanks(
      options, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        const int gpu = comm::testing::UseOwnGpu(comm.rank());
        RM_ASSIGN_OR_RETURN(JobSpec spec,
                            spec::LoadJobSpecText(kSpec, {"device=cuda", "backend=" + backend}));
        std::unique_ptr<data::Dataset> train_data = Data();
        RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Store> store,
                            comm::FileStore::Create({dir + "/store"}));
        TrainerOptions o;
        RM_ASSIGN_OR_RETURN(o.config, config::TrainConfigFromSpec(spec));
        o.comm = &comm;
        o.nccl_store = store.get();
        o.nccl_prefix = "job/epoch1/nccl";
        o.gpu = gpu;
        o.local_ranks = kRanks;
        o.op_timeout = absl::Seconds(60);
        o.train_data = train_data.get();
        std::string params;
        o.on_finish = [&](const state::TensorTable& table, const state::FlatBuffer& p) {
          for (const state::TensorSpec& t : table.tensors()) {
            params.append(reinterpret_cast<const char*>(p.data() + t.offset), t.numel * 4);
          }
        };
        RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
        const std::string prefix = absl::StrCat(dir, "/rank", comm.rank());
        RM_RETURN_IF_ERROR(WriteFileAtomically(
            prefix + ".txt", absl::StrCat(result.gradient_backend(), " ", result.final_loss())));
        return WriteFileAtomically(prefix + ".params", params);
      });
  std::vector<RankOutcome> outcomes(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << backend << " rank " << r << ": " << results[r].status;
    auto text = ReadFile(absl::StrCat(dir, "/rank", r, ".txt"));
    auto params = ReadFile(absl::StrCat(dir, "/rank", r, ".params"));
    if (!text.ok() || !params.ok()) continue;
    std::vector<std::string> fields = absl::StrSplit(*text, ' ');
    if (fields.size() != 2) continue;
    outcomes[r].backend = fields[0];
    outcomes[r].final_loss = std::stod(fields[1]);
    outcomes[r].params.resize(params->size() / 4);
    std::memcpy(outcomes[r].params.data(), params->data(), params->size());
  }
  return outcomes;
}

TEST(TrainerOverNccl, TwoRanksMatchTheTcpBackend) {
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {
    GTEST_SKIP() << "fewer than " << kRanks << " GPUs: backend: nccl needs one per rank (or "
                 << "run this test on the CPU with --config=cudaemu)";
  }
  const std::vector<RankOutcome> nccl = Train("nccl");
  const std::vector<RankOutcome> tcp = Train("tcp");
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(nccl[r].backend, "nccl") << "rank " << r;
    EXPECT_EQ(tcp[r].backend, "tcp") << "rank " << r;
  }
  ASSERT_FALSE(nccl[0].params.empty());
  // The ranks hold the same parameters: NCCL gave each the same reduced gradients.
  EXPECT_EQ(nccl[0].params, nccl[1].params);
  EXPECT_EQ(nccl[0].final_loss, nccl[1].final_loss);
  // Against TCP: the same up to the gradients' summation order.
  ASSERT_EQ(nccl[0].params.size(), tcp[0].params.size());
  EXPECT_NEAR(nccl[0].final_loss, tcp[0].final_loss, 1e-5 * std::fabs(tcp[0].final_loss));
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < tcp[0].params.size(); ++i) {
    const double d = std::fabs(nccl[0].params[i] - tcp[0].params[i]);
    worst = std::max(worst, d);
    if (!(d <= 2e-5 + 1e-4 * std::fabs(tcp[0].params[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << tcp[0].params.size()
                    << " parameters differ between nccl and tcp; largest difference " << worst;
}

}  // namespace
}  // namespace ringmaster::train
