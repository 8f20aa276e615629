// init_from and export end to end, on forked ranks: a GPT trained by 2 ranks under ZeRO-3
// writes a checkpoint; `ringctl export`'s library call turns it into a GPT-2 safetensors file
// holding exactly the trained weights; jobs with another optimizer, seed, schedule and length
// start from that file (or the checkpoint itself) under plain data parallelism, ZeRO-3,
// tensor and pipeline parallelism, and a job's own checkpoint wins over init_from.
#include "train/init_from.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "comm/testing/multiproc.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "train/data/text_dataset.h"
#include "train/device.h"
#include "train/nn/gpt.h"
#include "train/trainer.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The pre-training job: AdamW, seed 5, 4 steps.
constexpr char kPretrain[] = R"(
name: pretrain
seed: 5
steps: 4
model: {gpt: {layers: 2, heads: 2, width: 16, context: 8}}
data: {text: {path: unused}}
optimizer: {adamw: {}, lr: 0.01}
batch: {global: 12}
device: cpu
checkpoint: {every_steps: 4}
)";

// The fine-tuning job: another seed, optimizer, schedule and length.
constexpr char kFinetune[] = R"(
name: finetune
seed: 77
steps: 2
model: {gpt: {layers: 2, heads: 2, width: 16, context: 8}}
data: {text: {path: unused}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05}
schedule: {warmup_steps: 1, decay: cosine}
batch: {global: 12}
device: cpu
)";

nn::GptOptions ModelOptions(int64_t width = 16) {
  nn::GptOptions o;
  o.layers = 2;
  o.heads = 2;
  o.width = width;
  o.context = 8;
  o.vocab = 256;
  return o;
}

std::unique_ptr<data::Dataset> Text() {
  std::string text;
  for (int i = 0; text.size() < 400; ++i) text += "the ring passes gradients around; ";
  return *data::TextDataset::Create("synthetic text", text, 8);
}

struct JobRun {
  std::vector<absl::Status> status;  // per rank
  std::vector<float> params;         // rank 0's final parameters, tensors in table order
  double first_loss = 0, final_loss = 0;
  int64_t resumed_from_step = -1;
  std::string progress;  // rank 0's lines
  bool ok() const {
    return !status.empty() &&
           std::all_of(status.begin(), status.end(), [](const absl::Status& s) { return s.ok(); });
  }
  std::string errors() const {
    std::vector<std::string> out;
    for (size_t r = 0; r < status.size(); ++r)
      out.push_back(absl::StrCat(r, ": ", status[r].ToString()));
    return absl::StrJoin(out, "; ");
  }
};

JobRun Train(int world, const char* spec_text, std::vector<std::string> overrides) {
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  comm::testing::MultiProcOptions mo;
  mo.world_size = world;
  auto results =
      comm::testing::RunRanks(mo, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(spec_text, overrides));
        std::unique_ptr<data::Dataset> data = Text();
        TrainerOptions o;
        RM_ASSIGN_OR_RETURN(o.config, config::TrainConfigFromSpec(spec));
        o.comm = &comm;
        o.local_ranks = comm.size();
        o.op_timeout = absl::Seconds(60);
        o.train_data = data.get();
        std::string params, progress;
        double first_loss = 0;
        o.on_finish = [&](const state::TensorTable& table, const state::FlatBuffer& p) {
          for (const state::TensorSpec& t : table.tensors()) {
            params.append(reinterpret_cast<const char*>(p.data() + t.offset), t.numel * 4);
          }
        };
        o.on_step = [&](const StepReport& r) {
          if (first_loss == 0) first_loss = r.loss;
        };
        o.progress = [&](const std::string& line) { absl::StrAppend(&progress, line, "\n"); };
        absl::StatusOr<TrainResult> trained = RunTraining(o);
        if (!trained.ok()) {
          // The permanent mark is a payload, which the fork harness does not carry back.
          const absl::Status& s = trained.status();
          return IsPermanent(s) ? absl::Status(s.code(), absl::StrCat("(permanent) ", s.message()))
                                : s;
        }
        const TrainResult& result = *trained;
        if (comm.rank() != 0) return absl::OkStatus();
        const std::string prefix = dir + "/rank0";
        RM_RETURN_IF_ERROR(WriteFileAtomically(prefix + ".params", params));
        RM_RETURN_IF_ERROR(WriteFileAtomically(prefix + ".progress", progress));
        return WriteFileAtomically(
            prefix + ".txt",
            absl::StrCat(first_loss, " ", result.final_loss(), " ", result.resumed_from_step()));
      });
  JobRun run;
  for (const auto& r : results) run.status.push_back(r.status);
  if (auto p = ReadFile(dir + "/rank0.params"); p.ok()) {
    run.params.resize(p->size() / 4);
    std::memcpy(run.params.data(), p->data(), p->size());
  }
  if (auto p = ReadFile(dir + "/rank0.progress"); p.ok()) run.progress = *p;
  if (auto t = ReadFile(dir + "/rank0.txt"); t.ok()) {
    long resumed = -1;
    sscanf(t->c_str(), "%lf %lf %ld", &run.first_loss, &run.final_loss, &resumed);
    run.resumed_from_step = resumed;
  }
  return run;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The parameters of `table` in `path`, tensors in table order (as JobRun::params).
std::vector<float> WeightsIn(const std::string& path, const state::TensorTable& table) {
  std::vector<float> out;
  const absl::Status s = checkpoint::ReadWeights(path, table, [&](int, absl::Span<const float> v) {
    out.insert(out.end(), v.begin(), v.end());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

class InitFromTest : public ::testing::Test {
 protected:
  // Pre-trained by 2 ranks under ZeRO-3 (each saves its shards), exported once.
  static void SetUpTestSuite() {
    root_ = new std::string(comm::testing::FreshStoreDir() + "-pretrain");
    pretrained_ =
        new JobRun(Train(2, kPretrain, {"parallelism.zero_stage=3", "checkpoint.dir=" + *root_}));
    weights_ = new std::string(*root_ + "/model.safetensors");
    export_ = new absl::StatusOr<checkpoint::ExportReport>(
        checkpoint::ExportCheckpoint(checkpoint::JobDir(*root_, "pretrain"), *weights_, {}));
  }
  static void TearDownTestSuite() {
    delete root_;
    delete pretrained_;
    delete weights_;
    delete export_;
  }
  static std::string* root_;
  static JobRun* pretrained_;
  static std::string* weights_;
  static absl::StatusOr<checkpoint::ExportReport>* export_;
};
std::string* InitFromTest::root_ = nullptr;
JobRun* InitFromTest::pretrained_ = nullptr;
std::string* InitFromTest::weights_ = nullptr;
absl::StatusOr<checkpoint::ExportReport>* InitFromTest::export_ = nullptr;

TEST_F(InitFromTest, ExportOfATwoRankZero3CheckpointHoldsTheTrainedWeights) {
  ASSERT_TRUE(pretrained_->ok()) << pretrained_->errors();
  ASSERT_TRUE(export_->ok()) << export_->status();
  EXPECT_EQ((*export_)->step, 4);
  EXPECT_EQ((*export_)->model, "gpt");
  auto model = nn::GptModel::Create(ModelOptions());
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*export_)->parameters, (*model)->table().parameter_count());
  EXPECT_TRUE(BitEqual(WeightsIn(*weights_, (*model)->table()), pretrained_->params));
}

// A checkpoint holds whole-model tensors whatever the mesh: one saved by tensor-parallel and
// pipeline ranks exports the same way.
TEST_F(InitFromTest, ExportOfMeshCheckpointsHoldsTheTrainedWeights) {
  auto model = nn::GptModel::Create(ModelOptions());
  ASSERT_TRUE(model.ok());
  for (const char* mesh : {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}) {
    const std::string root = comm::testing::FreshStoreDir() + "-mesh";
    const JobRun run = Train(2, kPretrain, {mesh, "checkpoint.dir=" + root});
    ASSERT_TRUE(run.ok()) << mesh << ": " << run.errors();
    const std::string out = root + "/model.safetensors";
    auto report = checkpoint::ExportCheckpoint(checkpoint::JobDir(root, "pretrain"), out, {});
    ASSERT_TRUE(report.ok()) << mesh << ": " << report.status();
    EXPECT_TRUE(BitEqual(WeightsIn(out, (*model)->table()), run.params)) << mesh;
  }
}

// A learning rate of 1e-30 moves no weight of this size by a float's rounding: the final
// parameters are the loaded ones, bit for bit, whatever holds which piece of them.
TEST_F(InitFromTest, LoadsExactlyUnderEveryLayout) {
  ASSERT_TRUE(pretrained_->ok()) << pretrained_->errors();
  struct Layout {
    int world;
    std::vector<std::string> overrides;
  };
  const std::vector<Layout> layouts = {
      {1, {}},
      {2, {"parallelism.zero_stage=3"}},
      {2, {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer"}},
      {2, {"parallelism.mesh.tp=2"}},
      {2, {"parallelism.mesh.pp=2"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"}},
  };
  for (const std::string& source : {*weights_, checkpoint::JobDir(*root_, "pretrain")}) {
    for (const Layout& l : layouts) {
      if (source != *weights_ && l.world == 4) continue;  // one layout is enough for the checkpoint
      std::vector<std::string> o = l.overrides;
      o.push_back("optimizer.lr=1e-30");
      o.push_back("optimizer.sgd.momentum=0");
      o.push_back("init_from=" + source);
      const std::string what =
          absl::StrCat("world ", l.world, " ", absl::StrJoin(l.overrides, " "), " from ", source);
      const JobRun run = Train(l.world, kFinetune, o);
      ASSERT_TRUE(run.ok()) << what << ": " << run.errors();
      EXPECT_TRUE(BitEqual(run.params, pretrained_->params)) << what;
      EXPECT_THAT(run.progress, HasSubstr("init_from: read 29 tensors"));
      EXPECT_THAT(run.progress, HasSubstr(source)) << what;
    }
  }
}

// On GPUs (one per rank, or emulated ones under --config=cudaemu): the weights go to the
// device's buffers as they are.
TEST_F(InitFromTest, LoadsExactlyOnGpus) {
  if (comm::testing::RunInChild([] { return CudaDeviceCount(); }) <= 0) {
    GTEST_SKIP() << "no CUDA GPU here (or a build without --config=cuda/cudaemu)";
  }
  ASSERT_TRUE(pretrained_->ok()) << pretrained_->errors();
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {}, {"parallelism.zero_stage=3"}, {"parallelism.mesh.tp=2"}}) {
    std::vector<std::string> o = layout;
    o.insert(o.end(), {"device=cuda", "optimizer.lr=1e-30", "optimizer.sgd.momentum=0",
                       "init_from=" + *weights_});
    const JobRun run = Train(layout.empty() ? 1 : 2, kFinetune, o);
    ASSERT_TRUE(run.ok()) << absl::StrJoin(layout, " ") << ": " << run.errors();
    EXPECT_TRUE(BitEqual(run.params, pretrained_->params)) << absl::StrJoin(layout, " ");
  }
}

// Fine-tuning from the pre-trained weights starts where pre-training ended, not at a fresh
// model's loss, and trains the same under ZeRO-3 and tensor parallelism as on one rank.
TEST_F(InitFromTest, FineTunesUnderZero3AndTensorParallelism) {
  ASSERT_TRUE(pretrained_->ok()) << pretrained_->errors();
  const JobRun fresh = Train(1, kFinetune, {});
  const JobRun one = Train(1, kFinetune, {"init_from=" + *weights_});
  ASSERT_TRUE(fresh.ok() && one.ok()) << fresh.errors() << one.errors();
  // Pre-training took the loss from ln(256) = 5.5 towards the text's; the fine-tune's first
  // step sees the pre-trained model's loss.
  EXPECT_LT(one.first_loss, fresh.first_loss - 0.5) << one.first_loss << " vs " << fresh.first_loss;
  EXPECT_NEAR(one.first_loss, pretrained_->final_loss, 0.5);
  printf(
      "pre-training's last loss %.4f; fine-tuning's first loss %.4f from its weights, %.4f "
      "from the seed\n",
      pretrained_->final_loss, one.first_loss, fresh.first_loss);
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {"parallelism.zero_stage=3"}, {"parallelism.mesh.tp=2"}}) {
    std::vector<std::string> o = layout;
    o.push_back("init_from=" + *weights_);
    const JobRun run = Train(2, kFinetune, o);
    ASSERT_TRUE(run.ok()) << run.errors();
    ASSERT_EQ(run.params.size(), one.params.size());
    double worst = 0;
    for (size_t i = 0; i < run.params.size(); ++i) {
      worst = std::max<double>(worst, std::fabs(run.params[i] - one.params[i]) /
                                          (2e-5 + 1e-4 * std::fabs(one.params[i])));
    }
    EXPECT_LE(worst, 1.0) << absl::StrJoin(layout, " ");
    EXPECT_NEAR(run.final_loss, one.final_loss, 1e-4);
  }
}

// A restarted fine-tune resumes its own checkpoint and does not read init_from again (here:
// the file is gone); without a checkpoint to resume, the missing file fails the job.
TEST_F(InitFromTest, TheJobsOwnCheckpointWinsOverInitFrom) {
  ASSERT_TRUE(export_->ok()) << export_->status();
  const std::string dir = comm::testing::FreshStoreDir() + "-finetune";
  const std::string copy = dir + "-weights.safetensors";
  std::filesystem::copy_file(*weights_, copy);
  const std::vector<std::string> o = {"init_from=" + copy, "checkpoint.dir=" + dir,
                                      "checkpoint.every_steps=1"};
  const JobRun first = Train(2, kFinetune, o);
  ASSERT_TRUE(first.ok()) << first.errors();
  std::filesystem::remove(copy);
  std::vector<std::string> longer = o;
  longer.push_back("steps=3");
  longer.push_back("resume=extend");
  const JobRun again = Train(2, kFinetune, longer);
  ASSERT_TRUE(again.ok()) << again.errors();
  EXPECT_EQ(again.resumed_from_step, 2);
  EXPECT_THAT(again.progress, HasSubstr(absl::StrCat("init_from: ", copy,
                                                     " not read: this job resumed at step 2")));
  std::vector<std::string> never = o;
  never.push_back("resume=never");
  const JobRun fresh = Train(2, kFinetune, never);
  ASSERT_EQ(fresh.status.size(), 2u);
  for (const absl::Status& s : fresh.status) {
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("init_from: "), HasSubstr(copy)));
  }
}

TEST_F(InitFromTest, AnotherModelsWeightsAreRefusedNamingTheTensor) {
  ASSERT_TRUE(export_->ok()) << export_->status();
  const JobRun wider = Train(2, kFinetune, {"model.gpt.width=32", "init_from=" + *weights_});
  ASSERT_EQ(wider.status.size(), 2u);
  for (const absl::Status& s : wider.status) {
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("(permanent) ")) << s;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("init_from: "), HasSubstr(*weights_),
                                                HasSubstr("tensor wte.weight is [256, 16]"),
                                                HasSubstr("ringmaster's wte [256, 32]")));
  }
}

// The pieces a rank holds (a ZeRO-3 rank's units back to back) get exactly their part.
TEST(LoadInitialWeights, FillsOnlyTheHeldPiecesAtTheirPlaces) {
  const std::string dir = comm::testing::FreshStoreDir() + "-pieces";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  auto model = nn::GptModel::Create(ModelOptions());
  ASSERT_TRUE(model.ok());
  const state::TensorTable& table = (*model)->table();
  std::vector<float> whole(table.total_elements(), 0.0f);
  for (const state::TensorSpec& t : table.tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) whole[t.offset + i] = static_cast<float>(t.offset + i);
  }
  auto tensors = checkpoint::Gpt2Tensors(table, whole);
  ASSERT_TRUE(tensors.ok());
  ASSERT_TRUE(checkpoint::WriteSafetensors(dir + "/w.safetensors", *tensors, {}).ok());
  // Two pieces cutting through tensors, placed in reverse order of their flat ranges' sizes.
  const int64_t n = table.total_elements();
  const std::vector<state::PlacedRange> pieces = {{{5, 1000}, 10}, {{n / 2 + 3, n - 7}, 1200}};
  state::FlatBuffer params(1200 + (n - 7 - (n / 2 + 3)) + 5);
  std::fill(params.span().begin(), params.span().end(), -1.0f);
  InitFromOptions o;
  o.path = dir + "/w.safetensors";
  o.table = &table;
  o.params = &params;
  o.pieces = pieces;
  ASSERT_TRUE(LoadInitialWeights(o).ok());
  std::vector<float> want(params.size(), -1.0f);
  for (const state::PlacedRange& p : pieces) {
    for (int64_t i = p.range.begin; i < p.range.end; ++i) want[p.at + i - p.range.begin] = whole[i];
  }
  // Padding between tensors is not a tensor's: the file does not have it.
  for (const state::PlacedRange& p : pieces) {
    for (int64_t i = p.range.begin; i < p.range.end; ++i) {
      bool in_tensor = false;
      for (const state::TensorSpec& t : table.tensors()) {
        in_tensor |= i >= t.offset && i < t.offset + t.numel;
      }
      if (!in_tensor) want[p.at + i - p.range.begin] = -1.0f;
    }
  }
  EXPECT_TRUE(BitEqual(std::vector<float>(params.data(), params.data() + params.size()), want));
  // Pieces that do not fit are refused before anything is read.
  o.pieces = {{{0, n}, 5}};
  EXPECT_TRUE(absl::IsInvalidArgument(LoadInitialWeights(o)));
}

}  // namespace
}  // namespace ringmaster::train
