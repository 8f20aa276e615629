// Model parallelism on GPUs: the trainer's PipelineParallel runs the GPT's stages on each
// rank's GPU (train/pipeline/gpt_cuda_stage.h, made by TrainingDevice::CreateStage), with the
// step's buffers, the pipeline's messages, the tensor-parallel sums and the data-parallel
// reduction in device memory. Each layout is trained on the GPU and on the CPU, with the same
// micro-batches and sums in the same order, so the same parameters up to the products'
// rounding: |gpu - cpu| <= 2e-5 + 1e-4 |cpu| (trainer_test's bound between the GPU and the
// CPU), the same losses within 1e-4 relative, and the same evaluation loss (evaluated through
// the stages).
//   - Two ranks sharing one GPU: no NCCL between them (one GPU), so the mesh's groups are the
//     host's, which stage device buffers through the host.
//   - A GPU per rank, backend: nccl: the groups are split from the job's NCCL communicator
//     (ncclCommSplit): send/recv for the pipeline, all-reduces for the tensor-parallel sums,
//     the data-parallel reduction over the dp group; 2 and 4 ranks.
//   - ZeRO-3 over tensor-parallel shards (train/tensor_parallel_sharded.h): each rank's
//     shard runs on its GPU, its units gathered and reduce-scattered in device memory.
//   - bf16: tp 2 against one GPU rank in bf16 (the same kernels; the halves' partial products
//     summed in another order), within a tenth of trainer_test's bf16-against-fp32 bound.
// Under --config=cudaemu every forked rank has its own emulated GPU and NCCL is emulated;
// with --config=cuda the per-rank cases need a GPU per rank and skip otherwise. This process
// never initialises CUDA (it forks the ranks).
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/nccl/gpu_per_rank.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "train/data/text_dataset.h"
#include "train/device.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

// trainer_test's GPU job: SGD with momentum (AdamW's first steps would turn a rounding
// difference in a near-zero gradient into a whole learning rate).
constexpr char kSpec[] = R"(
name: trainer_mesh_gpu_test
seed: 5
steps: 4
model: {gpt: {layers: 2, heads: 2, width: 32, context: 8}}
data: {text: {path: unused}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05, clip_grad_norm: 1.0}
batch: {global: 12}
parallelism: {bucket_mb: 0.01}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

std::unique_ptr<data::Dataset> Text() {
  std::string text;
  for (int i = 0; text.size() < 400; ++i) text += "the ring passes gradients around; ";
  return *data::TextDataset::Create("synthetic text", text, 8);
}

struct Outcome {
  std::vector<float> params;  // rank 0's whole model at the end
  TrainResult result;         // rank 0's
};

enum class Gpus { kShared, kOnePerRank };

// Trains kSpec with `overrides` on `world` forked ranks, each given a Store to bootstrap NCCL
// through (it is used where every rank has a GPU of its own), evaluating on the text at the
// end.
Outcome Train(int world, const std::vector<std::string>& overrides, Gpus gpus) {
  const std::string what = absl::StrCat("world ", world, " ", absl::StrJoin(overrides, " "));
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  comm::testing::MultiProcOptions options;
  options.world_size = world;
  auto results = comm::testing::RunRanks(
      options, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        const int gpu = gpus == Gpus::kOnePerRank ? comm::testing::UseOwnGpu(comm.rank()) : 0;
        RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, overrides));
        std::unique_ptr<data::Dataset> train_data = Text(), test_data = Text();
        RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Store> store,
                            comm::FileStore::Create({dir + "/store"}));
        TrainerOptions o;
        RM_ASSIGN_OR_RETURN(o.config, config::TrainConfigFromSpec(spec));
        o.comm = &comm;
        o.nccl_store = store.get();
        o.nccl_prefix = "trainer_mesh_gpu_test/nccl";
        o.gpu = gpu;
        o.local_ranks = world;
        o.op_timeout = absl::Seconds(60);
        o.train_data = train_data.get();
        o.test_data = test_data.get();
        std::string params;
        o.on_finish = [&](const state::TensorTable& table, const state::FlatBuffer& p) {
          for (const state::TensorSpec& t : table.tensors()) {
            params.append(reinterpret_cast<const char*>(p.data() + t.offset), t.numel * 4);
          }
        };
        RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
        if (comm.rank() != 0) return absl::OkStatus();
        RM_RETURN_IF_ERROR(WriteFileAtomically(dir + "/result.json", TrainResultJson(result)));
        return WriteFileAtomically(dir + "/params", params);
      });
  Outcome out;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << what << " rank " << r << ": " << results[r].status;
  }
  auto json = ReadFile(dir + "/result.json");
  auto params = ReadFile(dir + "/params");
  if (!json.ok() || !params.ok()) return out;
  EXPECT_TRUE(FromJson(*json, &out.result, "result").ok()) << *json;
  out.params.resize(params->size() / 4);
  std::memcpy(out.params.data(), params->data(), params->size());
  return out;
}

// |a - b| <= absolute + relative |b| for every parameter; the losses within 1e-4 relative
// (10 x `relative` when it is larger).
void ExpectClose(const Outcome& a, const Outcome& b, double absolute, double relative,
                 const std::string& what) {
  ASSERT_FALSE(b.params.empty()) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < b.params.size(); ++i) {
    const double d = std::fabs(a.params[i] - b.params[i]);
    worst = std::max(worst, d);
    if (!(d <= absolute + relative * std::fabs(b.params[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << b.params.size()
                    << " parameters differ; largest difference " << worst;
  std::printf("%s: largest parameter difference %.3g\n", what.c_str(), worst);
  const double loss_tol = std::max(1e-4, 10 * relative);
  EXPECT_NEAR(a.result.final_loss(), b.result.final_loss(),
              loss_tol * std::fabs(b.result.final_loss()))
      << what;
  ASSERT_TRUE(b.result.has_eval_loss()) << what;
  EXPECT_NEAR(a.result.eval_loss(), b.result.eval_loss(), loss_tol * b.result.eval_loss()) << what;
}

// Whether a GPU is visible, asked in a child (this process must never initialise CUDA).
bool GpuVisible() {
  static const bool visible = comm::testing::RunInChild([] { return CudaDeviceCount(); }) > 0;
  return visible;
}

// `overrides` on the CPU over TCP and on the GPU(s), `world` ranks.
void ExpectGpuMatchesCpu(int world, std::vector<std::string> overrides, Gpus gpus) {
  const std::string what =
      absl::StrCat(world, " ranks, ", gpus == Gpus::kShared ? "one GPU, " : "a GPU each, ",
                   absl::StrJoin(overrides, " "));
  std::vector<std::string> cpu = overrides;
  cpu.insert(cpu.end(), {"device=cpu", "backend=tcp"});
  overrides.push_back("device=cuda");
  if (gpus == Gpus::kOnePerRank) overrides.push_back("backend=nccl");
  const Outcome on_cpu = Train(world, cpu, Gpus::kShared);
  const Outcome on_gpu = Train(world, overrides, gpus);
  EXPECT_EQ(on_gpu.result.gradient_backend(), gpus == Gpus::kShared ? "tcp" : "nccl") << what;
  ExpectClose(on_gpu, on_cpu, 2e-5, 1e-4, what);
  // The pipeline's messages moved (counted on the device groups as on the host's).
  if (absl::StrContains(what, "pp=2")) {
    EXPECT_GT(on_gpu.result.pipeline_bytes_per_step(), 0) << what;
    if (gpus == Gpus::kShared) {
      EXPECT_EQ(on_gpu.result.pipeline_bytes_per_step(), on_cpu.result.pipeline_bytes_per_step())
          << what;
    }
  }
  if (absl::StrContains(what, "tp=2")) {
    EXPECT_GT(on_gpu.result.tensor_parallel_bytes_per_step(), 0) << what;
  }
}

TEST(TrainerMeshOnGpu, RanksSharingAGpuMatchTheCpu) {
  if (!GpuVisible()) {
    GTEST_SKIP() << "no CUDA GPU here (or a build without --config=cuda): run with "
                    "--config=cudaemu (an emulated GPU on the CPU) or on a GPU";
  }
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.pp=2"}, Gpus::kShared);
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.tp=2"}, Gpus::kShared);
  ExpectGpuMatchesCpu(2,
                      {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=zero_bubble",
                       "parallelism.activation_checkpointing_every=1"},
                      Gpus::kShared);
  // ZeRO-3 over the tensor-parallel shards: the shard on the GPU, its units gathered there.
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"}, Gpus::kShared);
  // A tied LM head: the last stage's copy of wte, its gradient summed with the first stage's
  // in device memory.
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.pp=2", "model.gpt.tied_head=true"}, Gpus::kShared);
  // bf16: two heads of 64 channels (one per tensor-parallel rank; the bf16 attention takes
  // 64), two steps of 4 samples (this model is 11 times the fp32 one's size, slow to emulate).
  const std::vector<std::string> bf16 = {
      "model.gpt.width=128", "model.gpt.heads=2", "precision.compute=bf16",
      "device=cuda",         "steps=2",           "batch.global=4"};
  std::vector<std::string> tp2 = bf16;
  tp2.push_back("parallelism.mesh.tp=2");
  ExpectClose(Train(2, tp2, Gpus::kShared), Train(1, bf16, Gpus::kShared), 1e-4, 1e-3,
              "bf16 on the gpu, tp 2 against one rank");
}

TEST(TrainerMeshOnGpu, NcclGroupsMatchTheCpu) {
  if (!comm::testing::GpuPerRankAvailable(4)) {
    GTEST_SKIP() << "fewer than 4 GPUs: the NCCL groups need one per rank (or run this test on "
                    "the CPU with --config=cudaemu)";
  }
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.tp=2"}, Gpus::kOnePerRank);
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=zero_bubble"},
                      Gpus::kOnePerRank);
  ExpectGpuMatchesCpu(4, {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}, Gpus::kOnePerRank);
  ExpectGpuMatchesCpu(4, {"parallelism.mesh.pp=2", "parallelism.zero_stage=1"}, Gpus::kOnePerRank);
  ExpectGpuMatchesCpu(2, {"parallelism.mesh.pp=2", "model.gpt.tied_head=true"}, Gpus::kOnePerRank);
  // ZeRO-3 over tensor-parallel shards: units gathered and reduce-scattered over the NCCL dp
  // group (tp 2 x dp 2), per layer.
  ExpectGpuMatchesCpu(
      4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer"},
      Gpus::kOnePerRank);
}

}  // namespace
}  // namespace ringmaster::train
