// A two-rank job with backend: nccl on GPUs: the trainer bootstraps NCCL through the Store
// it is given, reduces its gradients over NCCL, and ends where the same job over the TCP
// backend (host staging) ends, up to float summation order; both ranks end identical. The
// same under ZeRO-2 and ZeRO-3 (the sharded strategy in GPU memory) against the CPU.
//
// Under --config=cudaemu each rank has its own emulated GPU (comm/nccl/gpu_per_rank.h) and
// the emulated NCCL computes the collectives on the host; with --config=cuda it needs two
// GPUs and skips otherwise. This process never initialises CUDA (it forks the ranks).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// Trains kSpec with `overrides` (device=cuda and backend=nccl unless they say otherwise) on
// kRanks forked ranks, each on its own GPU, the trainer given a Store to bootstrap NCCL
// through; returns each rank's outcome.
std::vector<RankOutcome> Train(std::vector<std::string> overrides) {
  const std::string label = absl::StrJoin(overrides, " ");
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  comm::testing::MultiProcOptions options;
  options.world_size = kRanks;
  auto results = comm::testing::RunRanks(
      options, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        const int gpu = comm::testing::UseOwnGpu(comm.rank());
        std::vector<std::string> set = {"device=cuda", "backend=nccl"};
        set.insert(set.end(), overrides.begin(), overrides.end());  // later ones win
        RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, set));
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
    EXPECT_TRUE(results[r].status.ok()) << label << " rank " << r << ": " << results[r].status;
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

// Rank 0's parameters of `a` and `b` agree within absolute + relative |p|, their losses within
// 10 × relative.
void ExpectClose(const std::vector<RankOutcome>& a, const std::vector<RankOutcome>& b,
                 double absolute, double relative, const std::string& what) {
  ASSERT_FALSE(a[0].params.empty()) << what;
  ASSERT_EQ(a[0].params.size(), b[0].params.size()) << what;
  EXPECT_NEAR(a[0].final_loss, b[0].final_loss, 10 * relative * std::fabs(b[0].final_loss))
      << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < b[0].params.size(); ++i) {
    const double d = std::fabs(a[0].params[i] - b[0].params[i]);
    worst = std::max(worst, d);
    if (!(d <= absolute + relative * std::fabs(b[0].params[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << b[0].params.size()
                    << " parameters differ; largest difference " << worst;
}

#define SKIP_WITHOUT_GPUS()                                                                     \
  if (!comm::testing::GpuPerRankAvailable(kRanks)) {                                            \
    GTEST_SKIP() << "fewer than " << kRanks << " GPUs: backend: nccl needs one per rank (or " \
                 << "run this test on the CPU with --config=cudaemu)";                         \
  }

TEST(TrainerOverNccl, TwoRanksMatchTheTcpBackend) {
  SKIP_WITHOUT_GPUS();
  const std::vector<RankOutcome> nccl = Train({});
  const std::vector<RankOutcome> tcp = Train({"backend=tcp"});
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(nccl[r].backend, "nccl") << "rank " << r;
    EXPECT_EQ(tcp[r].backend, "tcp") << "rank " << r;
  }
  ASSERT_FALSE(nccl[0].params.empty());
  // The ranks hold the same parameters: NCCL gave each the same reduced gradients.
  EXPECT_EQ(nccl[0].params, nccl[1].params);
  EXPECT_EQ(nccl[0].final_loss, nccl[1].final_loss);
  // Against TCP: the same up to the gradients' summation order.
  ExpectClose(nccl, tcp, 2e-5, 1e-4, "nccl vs tcp");
}

// ZeRO-2 and ZeRO-3 on two GPUs over NCCL (train/fsdp.h in device memory: all-gathers and
// reduce-scatters of the units over NCCL) against the same stage on the CPU over TCP: the
// same units in the same order, so the same parameters up to float summation order; in bf16
// (16-bit gathers and reduce-scatters on the GPU, kernels/cuda's casts) against the CPU's
// emulation of bf16 within ClassifierMatchesTheCpu's bound (train/trainer_test.cc).
TEST(TrainerOverNccl, ShardedStagesMatchTheCpu) {
  SKIP_WITHOUT_GPUS();
  const std::vector<std::vector<std::string>> cases = {
      {"parallelism.zero_stage=2"},
      {"parallelism.zero_stage=3"},
      {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer",
       "parallelism.fsdp.prefetch=forward", "parallelism.fsdp.prefetch_limit=2",
       "batch.accumulation=2"},
  };
  for (const std::vector<std::string>& c : cases) {
    const std::string what = absl::StrJoin(c, " ");
    std::vector<std::string> cpu = c;
    cpu.insert(cpu.end(), {"device=cpu", "backend=tcp"});
    const std::vector<RankOutcome> gpu = Train(c);
    EXPECT_EQ(gpu[0].backend, "nccl") << what;
    ExpectClose(gpu, Train(cpu), 2e-5, 1e-4, what);
  }
  const std::vector<std::string> bf16 = {"parallelism.zero_stage=3", "precision.compute=bf16",
                                         "precision.reduce=bf16", "parallelism.fsdp.wrap=layer"};
  std::vector<std::string> cpu = bf16;
  cpu.insert(cpu.end(), {"device=cpu", "backend=tcp"});
  ExpectClose(Train(bf16), Train(cpu), 2e-4, 2e-3, "ZeRO-3 bf16");
}

}  // namespace
}  // namespace ringmaster::train
