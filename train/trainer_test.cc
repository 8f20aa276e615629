// The trainer's data-parallel promises, on forked ranks with synthetic data: N ranks with
// a global batch B end with the same parameters as 1 rank with B (and as 1 rank with B in
// accumulated micro-batches); ZeRO-1 and ZeRO-2 match plain data parallelism while each
// rank keeps 1/N of the optimizer state; fp16 loss scaling skips and backs off on an
// overflow and training goes on; a full disk fails checkpoints, never training; after a
// peer fails, the survivors restore from memory and lose no step.
#include "train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "comm/store.h"
#include "comm/testing/multiproc.h"
#include "common/fault_injection_env.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "train/data/fashion_mnist.h"
#include "train/data/text_dataset.h"
#include "train/device.h"

namespace ringmaster::train {
namespace {

using comm::TcpCommunicator;
using comm::testing::MultiProcOptions;
using comm::testing::RankResult;
using comm::testing::RunRanks;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The trainer's options for a validated spec with its defaults.
TrainConfig Config(const JobSpec& spec) {
  absl::StatusOr<TrainConfig> c = config::TrainConfigFromSpec(spec);
  CHECK(c.ok()) << c.status();
  return *std::move(c);
}

// Whether a GPU is visible, asked in a child: the ranks are forked from this process, and
// CUDA does not survive fork, so this process must never initialise it.
bool GpuVisible() {
  static const bool visible = comm::testing::RunInChild([] { return CudaDeviceCount(); }) > 0;
  return visible;
}

#define SKIP_WITHOUT_GPU()                                                                  \
  if (!GpuVisible()) {                                                                      \
    GTEST_SKIP() << "no CUDA GPU here (or a build without --config=cuda): the GPU trainer " \
                    "tests need one";                                                       \
  }

constexpr char kSpec[] = R"(
name: trainer_test
seed: 3
steps: 6
model: {mlp: {hidden: [32, 16]}}
data: {fashion_mnist: {}, eval_every_epoch: false}
optimizer: {adamw: {}, lr: 0.01, weight_decay: 0.01, clip_grad_norm: 0.5}
schedule: {warmup_steps: 2, decay: cosine}
batch: {global: 60}
parallelism: {bucket_mb: 0.002}
diagnostics: {fingerprint_every: 2, log_every: 1}
)";

// `kSamples` samples of 48 "pixels" whose class is readable from the data.
std::unique_ptr<data::ImageClassificationDataset> Synthetic(int64_t kSamples = 250,
                                                            int64_t kFeatures = 48) {
  std::vector<uint8_t> pixels(kSamples * kFeatures), labels(kSamples);
  uint64_t x = 12345;
  for (int64_t i = 0; i < kSamples; ++i) {
    labels[i] = static_cast<uint8_t>(i % 10);
    for (int64_t f = 0; f < kFeatures; ++f) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      pixels[i * kFeatures + f] =
          static_cast<uint8_t>((x >> 56) / 2 + (f % 10 == i % 10 ? 100 : 0));
    }
  }
  return *data::ImageClassificationDataset::Create(
      "synthetic", std::move(pixels), std::move(labels), kFeatures, 10, data::PixelNormalization{});
}

struct RunResult {
  std::vector<float> params;         // rank 0's final parameters (tensors only)
  std::vector<int64_t> state_bytes;  // each rank's optimizer state
  int64_t skipped_steps = 0;
  double final_loss = 0;
  int64_t resumed_from_step = -1;
  int64_t steps = 0;
  std::string gradient_backend;  // rank 0's
  // Each rank's memory as its result reports it (train/result.proto).
  std::vector<int64_t> parameter_bytes, gradient_bytes, unit_buffer_bytes;
  double eval_accuracy = -1, eval_loss = -1;  // rank 0's; -1: not evaluated
  TrainResult summary;                        // rank 0's result
};

// Trains kSpec with `overrides` on `world` ranks.
constexpr char kGptSpec[] = R"(
name: trainer_test_gpt
seed: 5
steps: 4
model: {gpt: {layers: 2, heads: 2, width: 16, context: 8}}
data: {text: {path: unused}}
optimizer: {adamw: {}, lr: 0.003, clip_grad_norm: 1.0}
batch: {global: 12}
parallelism: {bucket_mb: 0.01}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

std::unique_ptr<data::Dataset> SyntheticText() {
  std::string text;
  for (int i = 0; text.size() < 400; ++i) text += "the ring passes gradients around; ";
  return *data::TextDataset::Create("synthetic text", text, 8);
}

// kNccl gives the trainer a Store to bootstrap NCCL through (TrainerOptions::nccl_store):
// it reduces the gradients over NCCL where the spec's backend and the ranks' GPUs allow.
enum class Gradients { kTcp, kNccl };

// The synthetic data a spec's model reads: images for the classifiers, text for the GPT.
std::unique_ptr<data::Dataset> DataFor(const JobSpec& spec) {
  if (spec.model().has_mlp() || spec.model().has_cnn()) return Synthetic();
  if (spec.model().has_resnet18()) return Synthetic(60, 28 * 28);
  return SyntheticText();
}

// With `evaluate`, the classifiers are evaluated on 513 synthetic samples at the end (so
// that 2 ranks get 2 and 1 evaluation batches of 256).
RunResult Train(int world, std::vector<std::string> overrides, const char* spec_text = kSpec,
                int64_t stop_at_step = 0, Gradients gradients = Gradients::kTcp,
                bool evaluate = false) {
  const std::string dir = comm::testing::FreshStoreDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  MultiProcOptions options;
  options.world_size = world;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec = spec::LoadJobSpecText(spec_text, overrides);
    if (!spec.ok()) return spec.status();
    std::unique_ptr<data::Dataset> train_data = DataFor(*spec);
    std::unique_ptr<data::Dataset> test_data;
    if (evaluate) {
      test_data =
          spec->model().has_gpt() || spec->model().has_gpt2() ? SyntheticText() : Synthetic(513);
    }
    TrainerOptions o;
    o.config = Config(*spec);
    o.comm = &comm;
    std::unique_ptr<comm::Store> nccl_store;
    if (gradients == Gradients::kNccl) {
      RM_ASSIGN_OR_RETURN(nccl_store, comm::FileStore::Create({dir + "/nccl"}));
      o.nccl_store = nccl_store.get();
      o.nccl_prefix = "trainer_test/nccl";
    }
    o.local_ranks = comm.size();
    o.op_timeout = absl::Seconds(60);
    o.train_data = train_data.get();
    o.test_data = test_data.get();
    o.stop_at_step = stop_at_step;
    std::string params;
    o.on_finish = [&](const state::TensorTable& table, const state::FlatBuffer& p) {
      for (const state::TensorSpec& t : table.tensors()) {
        params.append(reinterpret_cast<const char*>(p.data() + t.offset), t.numel * 4);
      }
    };
    // Every run also checks the per-step reports: one per step taken, in order, the last
    // with the final loss.
    std::vector<StepReport> reports;
    o.on_step = [&](const StepReport& r) { reports.push_back(r); };
    auto result = RunTraining(o);
    if (!result.ok()) return result.status();
    if (reports.empty() || reports.back().step != result->steps() ||
        reports.back().loss != result->final_loss()) {
      return absl::InternalError(
          absl::StrCat("on_step: ", reports.size(), " reports for ", result->steps(), " steps"));
    }
    for (size_t i = 1; i < reports.size(); ++i) {
      if (reports[i].step != reports[i - 1].step + 1 ||
          reports[i].step_time <= absl::ZeroDuration()) {
        return absl::InternalError(
            absl::StrCat("on_step: report ", i, " is step ", reports[i].step));
      }
    }
    // The first step is logged, so every report has a window's throughput; a share is a
    // share; the learning rate is the schedule's (positive somewhere).
    bool some_lr = false;
    for (const StepReport& r : reports) {
      some_lr = some_lr || r.lr > 0;
      if (!(r.samples_per_s > 0) || r.tokens_per_s < 0 || !(r.exposed_comm_fraction >= 0) ||
          r.exposed_comm_fraction > 1 || !(r.lr >= 0) || r.loss_scale < 0) {
        return absl::InternalError(absl::StrCat(
            "on_step: step ", r.step, ": ", r.samples_per_s, " samples/s, ", r.tokens_per_s,
            " tokens/s, exposed ", r.exposed_comm_fraction, ", lr ", r.lr, ", loss scale ",
            r.loss_scale));
      }
    }
    if (!some_lr) return absl::InternalError("on_step: no report has a learning rate");
    const std::string prefix = absl::StrCat(dir, "/rank", comm.rank());
    absl::Status s = WriteFileAtomically(
        prefix + ".txt",
        absl::StrCat(result->optimizer_state_bytes(), " ", result->skipped_steps(), " ",
                     result->final_loss(), " ", result->resumed_from_step(), " ", result->steps(),
                     " ", result->gradient_backend(), " ", result->parameter_bytes(), " ",
                     result->gradient_bytes(), " ", result->unit_buffer_bytes(), " ",
                     result->has_eval_accuracy() ? result->eval_accuracy() : -1.0, " ",
                     result->has_eval_loss() ? result->eval_loss() : -1.0));
    if (!s.ok()) return s;
    RM_RETURN_IF_ERROR(WriteFileAtomically(prefix + ".json", TrainResultJson(*result)));
    return WriteFileAtomically(prefix + ".params", params);
  });
  RunResult run;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].status.ok())
        << "world " << world << " rank " << r << ": " << results[r].status;
    auto text = ReadFile(absl::StrCat(dir, "/rank", r, ".txt"));
    if (!text.ok()) continue;
    int64_t bytes = 0, parameter = 0, gradient = 0, units = 0;
    double accuracy = -1, loss = -1;
    char backend[16] = "";
    sscanf(text->c_str(), "%ld %ld %lf %ld %ld %15s %ld %ld %ld %lf %lf", &bytes,
           &run.skipped_steps, &run.final_loss, &run.resumed_from_step, &run.steps, backend,
           &parameter, &gradient, &units, &accuracy, &loss);
    if (r == 0) {
      run.gradient_backend = backend;
      run.eval_accuracy = accuracy;
      run.eval_loss = loss;
    }
    run.state_bytes.push_back(bytes);
    run.parameter_bytes.push_back(parameter);
    run.gradient_bytes.push_back(gradient);
    run.unit_buffer_bytes.push_back(units);
  }
  if (auto json = ReadFile(absl::StrCat(dir, "/rank0.json")); json.ok()) {
    EXPECT_TRUE(FromJson(*json, &run.summary, "summary").ok()) << *json;
  }
  auto params = ReadFile(absl::StrCat(dir, "/rank0.params"));
  if (params.ok()) {
    run.params.resize(params->size() / 4);
    memcpy(run.params.data(), params->data(), params->size());
  }
  return run;
}

// Same parameters up to float summation order: |a - b| <= 2e-5 + 1e-4 |b|.
// |a - b| <= absolute + relative |b| for every parameter.
void ExpectCloseParameters(const RunResult& a, const RunResult& b, double absolute, double relative,
                           const std::string& what) {
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  ASSERT_FALSE(a.params.empty()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const double d = std::fabs(a.params[i] - b.params[i]);
    worst = std::max(worst, d);
    if (!(d <= absolute + relative * std::fabs(b.params[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.params.size()
                    << " parameters differ; largest difference " << worst;
}

void ExpectSameParameters(const RunResult& a, const RunResult& b, const std::string& what) {
  ExpectCloseParameters(a, b, 2e-5, 1e-4, what);
}

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { reference_ = new RunResult(Train(1, {})); }
  static void TearDownTestSuite() { delete reference_; }
  static RunResult* reference_;
};
RunResult* TrainerTest::reference_ = nullptr;

TEST_F(TrainerTest, TrainsAndChangesTheParameters) {
  ASSERT_FALSE(reference_->params.empty());
  RunResult fewer = Train(1, {"steps=3"});
  double moved = 0;
  for (size_t i = 0; i < fewer.params.size(); ++i) {
    moved += std::fabs(fewer.params[i] - reference_->params[i]);
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_TRUE(std::isfinite(reference_->final_loss));
}

// The Trainer's own steps: Create restores nothing here, Step takes one step at a time,
// Run goes on from there, and the result is RunTraining's.
TEST_F(TrainerTest, StepByStepThenRunIsRunTraining) {
  MultiProcOptions options;
  options.world_size = 1;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, {}));
    std::unique_ptr<data::Dataset> train_data = DataFor(spec);
    TrainerOptions o;
    o.config = Config(spec);
    o.comm = &comm;
    o.local_ranks = 1;
    o.train_data = train_data.get();
    RM_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(o));
    if (trainer->steps_done() != 0 || trainer->total_steps() != reference_->steps ||
        trainer->finished()) {
      return absl::InternalError(
          absl::StrCat("at start: ", trainer->steps_done(), " of ", trainer->total_steps()));
    }
    RM_RETURN_IF_ERROR(trainer->Step());
    RM_RETURN_IF_ERROR(trainer->Step());
    if (trainer->steps_done() != 2) {
      return absl::InternalError(absl::StrCat("after two steps: ", trainer->steps_done()));
    }
    RM_ASSIGN_OR_RETURN(TrainResult result, trainer->Run());
    if (!trainer->finished() || result.steps() != reference_->steps ||
        std::fabs(result.final_loss() - reference_->final_loss) > 1e-5) {
      return absl::InternalError(
          absl::StrCat("run: ", result.steps(), " steps, loss ", result.final_loss()));
    }
    absl::Status again = trainer->Step();
    if (!absl::IsFailedPrecondition(again)) {
      return absl::InternalError(absl::StrCat("a step after the end: ", again.ToString()));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
}

TEST_F(TrainerTest, AnyWorldSizeMatchesOneRankWithTheSameGlobalBatch) {
  for (int world : {2, 3}) {
    ExpectSameParameters(Train(world, {}), *reference_, absl::StrCat("world ", world));
  }
}

TEST_F(TrainerTest, OverlapOffGivesTheSameResult) {
  ExpectSameParameters(Train(2, {"parallelism.overlap=false"}), *reference_, "overlap off");
}

TEST_F(TrainerTest, AccumulationMatchesOneBigBatch) {
  ExpectSameParameters(Train(1, {"batch.accumulation=3"}), *reference_, "accumulation 3");
  ExpectSameParameters(Train(2, {"batch.micro_max=7"}), *reference_, "world 2, micro 7");
}

TEST_F(TrainerTest, UnevenSharesOfTheGlobalBatch) {
  RunResult one = Train(1, {"batch.global=61"});
  ExpectSameParameters(Train(3, {"batch.global=61"}), one, "world 3, batch 61");
}

TEST_F(TrainerTest, ZeroStagesMatchPlainDataParallelismWithAShareOfTheState) {
  struct Case {
    int stage;
    std::vector<std::string> set;
  };
  const std::vector<Case> cases = {
      {1, {}},
      {2, {}},
      {3, {}},  // wrap: block, prefetch: both
      {3, {"parallelism.fsdp.wrap=layer", "parallelism.fsdp.prefetch=none"}},
      {3, {"parallelism.fsdp.wrap=model", "parallelism.fsdp.reshard_after_forward=false"}},
      {3,
       {"parallelism.fsdp.wrap=layer", "parallelism.fsdp.prefetch=forward",
        "parallelism.fsdp.prefetch_limit=2", "batch.accumulation=2"}},
  };
  for (const Case& c : cases) {
    for (int world : {2, 3}) {
      std::vector<std::string> set = c.set;
      set.push_back(absl::StrCat("parallelism.zero_stage=", c.stage));
      const std::string what = absl::StrCat(absl::StrJoin(set, " "), " world ", world);
      RunResult run = Train(world, set);
      ExpectSameParameters(run, *reference_, what);
      ASSERT_EQ(run.state_bytes.size(), static_cast<size_t>(world));
      int64_t total = 0;
      // ZeRO-1 cuts the padded flat space in N; ZeRO-2/3 cut each unit (at most one per
      // tensor of the MLP's 6) padded to a multiple of N x 16: the optimizer's 2 moments of
      // a rank are then at most 1/N of the whole plus 16 floats per unit.
      const int64_t slack = c.stage == 1 ? 2 * 16 * 4 * world : 2 * 4 * 16 * 6;
      for (int64_t b : run.state_bytes) {
        EXPECT_LE(b, reference_->state_bytes[0] / world + slack) << what;
        total += b;
      }
      if (c.stage == 1) {
        EXPECT_EQ(total, reference_->state_bytes[0]) << what;
      } else {
        EXPECT_GE(total, reference_->state_bytes[0] - 2 * 4 * 16 * world) << what;
        EXPECT_LE(total, reference_->state_bytes[0] + world * slack) << what;
      }
      // The parameters and gradients each rank allocated: the whole under ZeRO-1, 1/N of it
      // (plus unit padding) under ZeRO-2 and 3; ZeRO-2 also keeps the whole compute copy.
      const int64_t whole = reference_->parameter_bytes[0];
      for (int r = 0; r < world; ++r) {
        const int64_t shard_bound = whole / world + 4 * 16 * 6;
        EXPECT_EQ(reference_->gradient_bytes[0], whole);
        if (c.stage == 1) {  // the whole, padded to a multiple of N x 16
          EXPECT_NEAR(run.parameter_bytes[r], whole, 4 * 16 * world) << what;
          EXPECT_NEAR(run.gradient_bytes[r], whole, 4 * 16 * world) << what;
        } else {
          EXPECT_LE(run.gradient_bytes[r], shard_bound) << what << " rank " << r;
          EXPECT_LE(run.parameter_bytes[r] - (c.stage == 2 ? whole : 0), shard_bound)
              << what << " rank " << r;
          EXPECT_GT(run.unit_buffer_bytes[r], 0) << what << " rank " << r;
        }
      }
    }
  }
}

// LAMB's trust ratios over tensors cut between ranks, bf16 and fp16 (its loss scaler voting
// over every shard) and the evaluation's batches (uneven between the ranks: every rank still
// joins every gather) under ZeRO-3, against plain data parallelism on as many ranks (half
// precision rounds each rank's gradients: one rank would round others). A bf16 reduction
// rounds the sums too: its tolerance is bf16's.
TEST(TrainerZero3, LambHalfPrecisionAndEvaluationMatchDataParallelism) {
  struct Case {
    std::vector<std::string> set;
    std::vector<std::string> zero3;  // set on top for ZeRO-3 only
    double absolute, relative;
  };
  const std::vector<Case> cases = {
      {{"optimizer.lamb.eps=1e-6"}, {}, 2e-5, 1e-4},
      {{"precision.compute=bf16"}, {}, 2e-5, 1e-4},
      {{"precision.compute=bf16"}, {"precision.reduce=bf16"}, 2e-3, 2e-2},
      {{"precision.compute=fp16"}, {}, 2e-5, 1e-4},
  };
  for (const Case& c : cases) {
    const RunResult dp = Train(2, c.set, kSpec, 0, Gradients::kTcp, /*evaluate=*/true);
    std::vector<std::string> set = c.set;
    set.insert(set.end(), c.zero3.begin(), c.zero3.end());
    set.push_back("parallelism.zero_stage=3");
    set.push_back("parallelism.fsdp.wrap=layer");
    const std::string what = absl::StrJoin(set, " ");
    const RunResult sharded = Train(2, set, kSpec, 0, Gradients::kTcp, /*evaluate=*/true);
    ExpectCloseParameters(sharded, dp, c.absolute, c.relative, what);
    EXPECT_GE(dp.eval_accuracy, 0) << what;
    EXPECT_NEAR(sharded.eval_accuracy, dp.eval_accuracy, 2.0 / 513) << what;
    EXPECT_NEAR(sharded.eval_loss, dp.eval_loss, 1e-2 * std::fabs(dp.eval_loss)) << what;
  }
}

TEST_F(TrainerTest, ResumesAtAnotherWorldSizeAsIfNeverInterrupted) {
  // Save at step 3 on N ranks (a drain), resume on M ranks, finish: the same parameters as
  // 6 uninterrupted steps, for plain data parallelism and ZeRO on either side.
  struct Case {
    int from, to;
    int zero_from, zero_to;
  };
  for (const Case& c : {Case{2, 3, 0, 0}, Case{3, 1, 1, 0}, Case{1, 2, 0, 2}, Case{2, 2, 2, 1},
                        Case{2, 3, 3, 3}, Case{3, 2, 3, 0}, Case{2, 3, 1, 3}, Case{3, 2, 2, 3}}) {
    const std::string dir = comm::testing::FreshStoreDir() + "-checkpoints";
    const std::string what =
        absl::StrCat(c.from, " ranks ZeRO-", c.zero_from, " -> ", c.to, " ranks ZeRO-", c.zero_to);
    RunResult first = Train(
        c.from, {"checkpoint.dir=" + dir, absl::StrCat("parallelism.zero_stage=", c.zero_from)},
        kSpec, 3);
    ASSERT_FALSE(first.params.empty()) << what;
    EXPECT_EQ(first.steps, 3) << what;
    RunResult resumed =
        Train(c.to, {"checkpoint.dir=" + dir, absl::StrCat("parallelism.zero_stage=", c.zero_to)});
    EXPECT_EQ(resumed.resumed_from_step, 3) << what;
    EXPECT_EQ(resumed.steps, 6) << what;
    ExpectSameParameters(resumed, *reference_, what);
  }
}

constexpr char kResnetSpec[] = R"(
name: trainer_test_resnet
seed: 4
steps: 4
model: {resnet18: {width: 2, sync_batchnorm: true}}
data: {fashion_mnist: {}, eval_every_epoch: false}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05, weight_decay: 0.01}
batch: {global: 12}
parallelism: {bucket_mb: 0.002}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

// The BatchNorm running statistics (the table's last values: train/nn/resnet.h) that are
// neither their initial 0 nor 1: they moved.
int MovedRunningStatistics(const RunResult& run) {
  constexpr size_t kBuffers = 2 * 4800 / 32;  // width 2: 150 channels, mean and variance
  int moved = 0;
  for (size_t i = run.params.size() - kBuffers; i < run.params.size(); ++i) {
    moved += run.params[i] != 0.0f && run.params[i] != 1.0f;
  }
  return moved;
}

// Synchronized BatchNorm makes training independent of the world size (the statistics are
// the global batch's), so a run checkpointed on N ranks and resumed on M ends where one rank
// ends, running statistics included; the last micro-batch of 3 ranks with a global batch of
// 2 is empty and still takes part in the sums.
TEST(ResnetTraining, SynchronizedBatchNormResumesAtAnotherWorldSize) {
  const RunResult reference = Train(1, {}, kResnetSpec);
  ASSERT_FALSE(reference.params.empty());
  EXPECT_GT(MovedRunningStatistics(reference), 250);
  for (const auto& [from, to] : {std::pair{2, 3}, std::pair{3, 1}}) {
    const std::string what = absl::StrCat(from, " ranks -> ", to, " ranks");
    const std::string dir = comm::testing::FreshStoreDir() + "-checkpoints";
    RunResult first = Train(from, {"checkpoint.dir=" + dir}, kResnetSpec, 2);
    EXPECT_EQ(first.steps, 2) << what;
    RunResult resumed = Train(to, {"checkpoint.dir=" + dir}, kResnetSpec);
    EXPECT_EQ(resumed.resumed_from_step, 2) << what;
    ExpectCloseParameters(resumed, reference, 1e-5, 1e-4, what);
  }
  const RunResult tiny = Train(3, {"batch.global=2"}, kResnetSpec);
  EXPECT_EQ(tiny.steps, 4);
  ExpectCloseParameters(tiny, Train(1, {"batch.global=2"}, kResnetSpec), 1e-5, 1e-4,
                        "global batch 2 on 3 ranks");
  // Accumulation with uneven shares (4, 3 and 3 samples in micro-batches of at most 2): every
  // rank takes part in every micro-batch's sums, an empty one included.
  const RunResult accumulated = Train(3, {"batch.global=10", "batch.micro_max=2"}, kResnetSpec);
  EXPECT_EQ(accumulated.steps, 4);
  EXPECT_TRUE(std::isfinite(accumulated.final_loss));
}

// Per-rank statistics (PyTorch DDP's default): the ranks keep rank 0's running statistics
// (the fingerprints compare them every step), which a checkpoint keeps; a run differs from
// the synchronized one.
TEST(ResnetTraining, PerRankBatchNormKeepsRankZerosStatisticsThroughACheckpoint) {
  const std::vector<std::string> per_rank = {"model.resnet18.sync_batchnorm=false"};
  const RunResult whole = Train(2, per_rank, kResnetSpec);
  ASSERT_FALSE(whole.params.empty());
  EXPECT_GT(MovedRunningStatistics(whole), 250);
  const std::string dir = comm::testing::FreshStoreDir() + "-checkpoints";
  std::vector<std::string> saving = per_rank;
  saving.push_back("checkpoint.dir=" + dir);
  EXPECT_EQ(Train(2, saving, kResnetSpec, 2).steps, 2);
  const RunResult resumed = Train(2, saving, kResnetSpec);
  EXPECT_EQ(resumed.resumed_from_step, 2);
  ExpectCloseParameters(resumed, whole, 0, 0, "resumed per-rank run");
  // ZeRO-1 (each rank updates a shard, then the parameters are gathered) keeps them alike.
  std::vector<std::string> zero1 = per_rank;
  zero1.push_back("parallelism.zero_stage=1");
  ExpectCloseParameters(Train(2, zero1, kResnetSpec), whole, 1e-6, 1e-5, "per-rank ZeRO-1");
  const RunResult synchronized = Train(2, {}, kResnetSpec);
  int differ = 0;
  for (size_t i = 0; i < whole.params.size(); ++i)
    differ += whole.params[i] != synchronized.params[i];
  EXPECT_GT(differ, 1000);
}

TEST_F(TrainerTest, Fp16OverflowSkipsTheStepAndBacksOff) {
  RunResult run = Train(2, {"precision.compute=fp16", "precision.loss_scale.initial=1e30",
                            "precision.loss_scale.backoff_factor=1e-12"});
  EXPECT_GE(run.skipped_steps, 1);
  EXPECT_LT(run.skipped_steps, 6);  // the scale came down and later steps were applied
  EXPECT_TRUE(std::isfinite(run.final_loss));
}

TEST(GptTraining, WorldSizesZeroAndActivationCheckpointingAgree) {
  RunResult one = Train(1, {}, kGptSpec);
  ASSERT_FALSE(one.params.empty());
  ExpectSameParameters(Train(2, {}, kGptSpec), one, "gpt world 2");
  ExpectSameParameters(
      Train(3, {"parallelism.zero_stage=1", "parallelism.activation_checkpointing_every=1"},
            kGptSpec),
      one, "gpt world 3, ZeRO-1, checkpointing every block");
  ExpectSameParameters(Train(2, {"parallelism.zero_stage=3"}, kGptSpec), one,
                       "gpt world 2, ZeRO-3");
  ExpectSameParameters(
      Train(3,
            {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer",
             "parallelism.activation_checkpointing_every=1", "batch.accumulation=2"},
            kGptSpec),
      one, "gpt world 3, ZeRO-3 by layer, checkpointing, accumulation");
  ExpectSameParameters(Train(2, {"parallelism.zero_stage=2"}, kGptSpec), one,
                       "gpt world 2, ZeRO-2");
}

// model.gpt2 (GPT-2's vocabulary of 50,257 and the LM head tied to wte) trains to one rank's
// parameters under data parallelism, ZeRO-1/2/3 (the embeddings' unit kept gathered for the
// head: by block and by layer, with checkpointing and accumulation), tensor parallelism,
// ZeRO-3 over tensor-parallel shards and pipelines; the table has no lm_head.
// kGptSpec's job as model.gpt2, on the CPU (kept by the test binary for Train's spec_text).
const char* Gpt2Spec() {
  static const std::string* spec = new std::string(absl::StrReplaceAll(
      kGptSpec, {{"model: {gpt:", "device: cpu\nmodel: {gpt2:"}, {"steps: 4", "steps: 3"}}));
  return spec->c_str();
}

TEST(GptTraining, Gpt2WithItsTiedHeadMatchesOneRankUnderEveryDataAndTensorLayout) {
  const RunResult one = Train(1, {}, Gpt2Spec(), 0, Gradients::kTcp, /*evaluate=*/true);
  ASSERT_FALSE(one.params.empty());
  // wte, wpe, 2 blocks of 12 w^2 + 13 w, lnf; no lm_head.
  constexpr int64_t w = 16;
  EXPECT_EQ(one.summary.parameters(), 50257 * w + 8 * w + 2 * (12 * w * w + 13 * w) + 2 * w);
  const std::vector<std::pair<int, std::vector<std::string>>> cases = {
      {2, {}},
      {2, {"parallelism.zero_stage=1"}},
      {2, {"parallelism.zero_stage=2"}},
      {2, {"parallelism.zero_stage=3"}},
      {3,
       {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer",
        "parallelism.activation_checkpointing_every=1", "batch.accumulation=2"}},
      {2, {"parallelism.zero_stage=3", "parallelism.fsdp.prefetch=forward"}},
      {2, {"parallelism.mesh.tp=2"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer"}},
      // Pipelines: the last stage's copy of wte summed with the first stage's gradient.
      {2, {"parallelism.mesh.pp=2"}},
      {4,
       {"parallelism.mesh.pp=2", "parallelism.mesh.tp=2",
        "parallelism.pipeline.schedule=zero_bubble"}},
      {4, {"parallelism.mesh.pp=2", "parallelism.zero_stage=1"}},
  };
  for (const auto& [world, overrides] : cases) {
    const std::string what = absl::StrCat("gpt2 world ", world, " ", absl::StrJoin(overrides, " "));
    const RunResult run = Train(world, overrides, Gpt2Spec(), 0, Gradients::kTcp, true);
    ExpectSameParameters(run, one, what);
    EXPECT_NEAR(run.eval_loss, one.eval_loss, 1e-5 * std::abs(one.eval_loss)) << what;
  }
  // LAMB's per-tensor norms count wte once (the copy is a duplicate range); clipping's norm
  // too (kGptSpec clips to 1).
  const RunResult lamb = Train(1, {"optimizer.lamb.eps=1e-6"}, Gpt2Spec());
  ExpectSameParameters(
      Train(4, {"optimizer.lamb.eps=1e-6", "parallelism.mesh.pp=2", "parallelism.mesh.tp=2"},
            Gpt2Spec()),
      lamb, "gpt2 LAMB, tp 2 x pp 2");
}

// Pipeline parallelism (parallelism.mesh.pp, train/pipeline_parallel.h): every schedule, with
// and without data parallelism across the pipelines (ZeRO-0 and 1), activation checkpointing
// and bf16, trains the GPT to the parameters of one rank with the same global batch, and
// evaluates it to the same loss.
// kGptSpec's job with 4 blocks (up to 4 stages), and `overrides`; on the CPU (device: auto
// would take a GPU where there is one, under --config=cudaemu an emulated one per rank, many
// times slower: trainer_mesh_gpu_test holds the layouts on GPUs to these CPU runs).
std::vector<std::string> Pipelined(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"model.gpt.layers=4", "device=cpu"});
  return overrides;
}

TEST(GptTraining, PipelineLayoutsMatchOneRank) {
  const RunResult one = Train(1, Pipelined({}), kGptSpec, 0, Gradients::kTcp, /*evaluate=*/true);
  ASSERT_FALSE(one.params.empty());
  ASSERT_GT(one.eval_loss, 0);
  struct Case {
    int world;
    std::vector<std::string> overrides;
  };
  const std::vector<Case> cases = {
      {2, {"parallelism.mesh.pp=2"}},
      {4,
       {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=gpipe",
        "parallelism.pipeline.micro_batches=3"}},
      {4, {"parallelism.mesh.pp=4", "parallelism.pipeline.schedule=zero_bubble"}},
      {2,
       {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=interleaved_1f1b",
        "parallelism.pipeline.virtual_stages=2", "parallelism.pipeline.micro_batches=4"}},
      {4,
       {"parallelism.mesh.pp=2", "parallelism.zero_stage=1",
        "parallelism.activation_checkpointing_every=1", "parallelism.pipeline.micro_batches=6"}},
      // Tensor parallelism (heads and MLP split), alone, with data and with pipeline
      // parallelism.
      {2, {"parallelism.mesh.tp=2"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=1", "batch.accumulation=2"}},
      {4,
       {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2",
        "parallelism.pipeline.schedule=zero_bubble"}},
      // ZeRO-3 along dp over tensor-parallel shards (FSDP + TP): alone, over 2 replicas with
      // per-layer units and accumulation, and with forward prefetch and checkpointing.
      {2, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"}},
      {4,
       {"parallelism.mesh.tp=2", "parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer",
        "batch.accumulation=2"}},
      {4,
       {"parallelism.mesh.tp=2", "parallelism.zero_stage=3", "parallelism.fsdp.prefetch=forward",
        "parallelism.activation_checkpointing_every=1"}},
      // ZeRO-2 along dp (the stages' gradients reduce-scattered), with pp and with tp.
      {4, {"parallelism.mesh.pp=2", "parallelism.zero_stage=2"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=2", "batch.accumulation=2"}},
      // 8 ranks: all three (tp 2 x pp 2 x dp 2, ZeRO-1 along dp), and pp 4 x dp 2.
      {8,
       {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2", "parallelism.zero_stage=1",
        "parallelism.pipeline.micro_batches=3"}},
      {8,
       {"parallelism.mesh.pp=4", "parallelism.pipeline.schedule=gpipe",
        "parallelism.pipeline.micro_batches=2"}},
  };
  for (const Case& c : cases) {
    const std::string what = absl::StrCat("world ", c.world, " ", absl::StrJoin(c.overrides, " "));
    const RunResult run =
        Train(c.world, Pipelined(c.overrides), kGptSpec, 0, Gradients::kTcp, true);
    ExpectSameParameters(run, one, what);
    EXPECT_NEAR(run.final_loss, one.final_loss, 1e-5 * std::abs(one.final_loss)) << what;
    EXPECT_NEAR(run.eval_loss, one.eval_loss, 1e-5 * std::abs(one.eval_loss)) << what;
  }
  // bf16: the stages round where the whole model rounds, each micro-batch's gradients as
  // one rank's accumulation of the same micro-batches (pp 2's default is 4 of them).
  const RunResult bf16 =
      Train(1, Pipelined({"precision.compute=bf16", "batch.accumulation=4"}), kGptSpec);
  ExpectSameParameters(
      Train(2, Pipelined({"parallelism.mesh.pp=2", "precision.compute=bf16"}), kGptSpec), bf16,
      "pp 2 in bf16");
  // Tensor parallelism in bf16 with activation checkpointing, against one rank's bf16.
  const RunResult bf16_one = Train(
      1, Pipelined({"precision.compute=bf16", "parallelism.activation_checkpointing_every=1"}),
      kGptSpec);
  ExpectSameParameters(Train(2,
                             Pipelined({"parallelism.mesh.tp=2", "precision.compute=bf16",
                                        "parallelism.activation_checkpointing_every=1"}),
                             kGptSpec),
                       bf16_one, "tp 2 in bf16 with checkpointing");
}

// LAMB's per-tensor norms over tensor-parallel shards: each shard's squares summed over its
// group, a replicated tensor's counted on the group's rank 0 only (Optimizer::
// set_duplicate_ranges), so every layout takes one rank's steps.
TEST(GptTraining, LambUnderTensorParallelismMatchesOneRank) {
  const RunResult one = Train(1, Pipelined({"optimizer.lamb.eps=1e-6"}), kGptSpec);
  ASSERT_FALSE(one.params.empty());
  const std::vector<std::pair<int, std::vector<std::string>>> cases = {
      {2, {"parallelism.mesh.tp=2"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=1"}},
      {4, {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}},
  };
  for (const auto& [world, overrides] : cases) {
    std::vector<std::string> o = overrides;
    o.push_back("optimizer.lamb.eps=1e-6");
    const std::string what = absl::StrCat("world ", world, " ", absl::StrJoin(o, " "));
    ExpectSameParameters(Train(world, Pipelined(o), kGptSpec), one, what);
  }
}

// Rank 0's summary lists every rank's figures: under tp 2 x pp 2 each rank's coordinates,
// its share of the blocks' parameters, and its traffic by group, the pipeline's exactly
// (each micro-batch's activation or its gradient, rows x width floats, once a step).
TEST(GptTraining, RanksReportTheirPartsAndTraffic) {
  // 4 blocks of width 16; a block has 12 w^2 + 13 w parameters, of which the two
  // LayerNorms (4 w) and the row-parallel projections' biases (2 w) are replicated under
  // tensor parallelism.
  constexpr int64_t kWidth = 16, kLayers = 4;  // Pipelined()'s
  constexpr int64_t kBlocks = kLayers * (12 * kWidth * kWidth + 13 * kWidth);
  const RunResult one = Train(1, Pipelined({}), kGptSpec);
  ASSERT_EQ(one.summary.ranks_size(), 1);
  EXPECT_EQ(one.summary.block_parameters(), kBlocks);
  EXPECT_EQ(one.summary.ranks(0).block_parameters(), kBlocks);
  EXPECT_EQ(one.summary.pipeline_bytes_per_step(), 0);
  EXPECT_EQ(one.summary.tensor_parallel_bytes_per_step(), 0);

  const RunResult mesh =
      Train(4, Pipelined({"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}), kGptSpec);
  ASSERT_EQ(mesh.summary.ranks_size(), 4);
  // The default 2 x pp = 4 micro-batches of 12 / 4 = 3 sequences of 8 tokens, a [24, 16]
  // float activation (stage 0) or its gradient (stage 1) each; 2 sums of [24, 16] a block in
  // forward and 2 in backward, 2 blocks a stage (a sum over 2 ranks sends its size once).
  // Both groups also carry the gradient norm's partial sum: one double a step.
  constexpr double kRowBytes = (3 * 8) * kWidth * 4;
  constexpr double kPipelineBytes = 4 * kRowBytes + 8;
  constexpr double kTensorParallelBytes = 4 * 2 * 4 * kRowBytes + 8;
  double blocks = 0;
  for (int r = 0; r < 4; ++r) {
    const ::ringmaster::train::RankResult& rr = mesh.summary.ranks(r);
    const std::string what = absl::StrCat("rank ", r, ": ", rr.DebugString());
    EXPECT_EQ(rr.rank(), r) << what;
    EXPECT_EQ(rr.pp_rank(), r / 2) << what;  // pp outermost, tp innermost
    EXPECT_EQ(rr.tp_rank(), r % 2) << what;
    EXPECT_EQ(rr.dp_rank(), 0) << what;
    EXPECT_EQ(rr.pipeline_bytes_per_step(), kPipelineBytes) << what;
    EXPECT_EQ(rr.tensor_parallel_bytes_per_step(), kTensorParallelBytes) << what;
    EXPECT_GE(rr.comm_bytes_per_step(),
              rr.pipeline_bytes_per_step() + rr.tensor_parallel_bytes_per_step())
        << what;
    EXPECT_GT(rr.parameter_bytes(), 0) << what;
    EXPECT_GT(rr.peak_rss_bytes(), 0) << what;
    EXPECT_GT(rr.pipeline_peak_in_flight(), 0) << what;
    // Two blocks a stage, half of them on each tensor-parallel rank but the replicated part.
    EXPECT_EQ(rr.block_parameters(), (kBlocks / 2 + 2 * 6 * kWidth) / 2) << what;
    blocks += rr.block_parameters();
  }
  EXPECT_EQ(blocks, kBlocks + kLayers * 6 * kWidth);
  EXPECT_EQ(mesh.summary.block_parameters(), mesh.summary.ranks(0).block_parameters());

  // ZeRO-2 along dp reduce-scatters the stages' gradients where ZeRO-1 all-reduces them (both
  // all-gather the parameters after the update): two thirds of ZeRO-1's data-parallel bytes.
  auto dp_bytes = [](const RunResult& run) {
    double bytes = 0;
    for (const auto& r : run.summary.ranks()) {
      bytes += r.comm_bytes_per_step() - r.pipeline_bytes_per_step() -
               r.tensor_parallel_bytes_per_step();
    }
    return bytes;
  };
  const double zero1 = dp_bytes(
      Train(4, Pipelined({"parallelism.mesh.pp=2", "parallelism.zero_stage=1"}), kGptSpec));
  const double zero2 = dp_bytes(
      Train(4, Pipelined({"parallelism.mesh.pp=2", "parallelism.zero_stage=2"}), kGptSpec));
  EXPECT_NEAR(zero2 / zero1, 2.0 / 3, 0.03) << zero2 << " vs " << zero1;

  // Tensor parallelism alone runs its accumulation's micro-batches one at a time, as data
  // parallelism does: one micro-batch's activations held at once.
  const RunResult tp =
      Train(2, Pipelined({"parallelism.mesh.tp=2", "batch.accumulation=3"}), kGptSpec);
  ASSERT_EQ(tp.summary.ranks_size(), 2);
  for (const auto& r : tp.summary.ranks()) {
    EXPECT_EQ(r.pipeline_peak_in_flight(), 1) << r.DebugString();
    EXPECT_EQ(r.pipeline_bytes_per_step(), 0) << r.DebugString();
  }
}

// A checkpoint saved under one mesh resumes under another (the stages save their tensors in
// the whole model's coordinates): pp 2 x dp 2 -> dp 3 -> pp 2 x dp 2 with ZeRO-1 -> pp 4, and
// dp 2 with ZeRO-1 -> pp 2 (interleaved).
TEST(GptTraining, CheckpointsMoveBetweenMeshes) {
  const RunResult one = Train(1, Pipelined({"steps=6"}), kGptSpec);
  ASSERT_FALSE(one.params.empty());
  struct Leg {
    int world;
    std::vector<std::string> overrides;
    int64_t stop_at;
  };
  const std::vector<std::vector<Leg>> journeys = {
      // The issue's: tp 2 x dp 2 (ZeRO-2 along dp) -> pp 2 x dp 2 -> dp 3 -> tp 2 x pp 2.
      {{4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=2"}, 2},
       {4, {"parallelism.mesh.pp=2"}, 3},
       {3, {}, 4},
       {4, {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}, 0}},
      {{4, {"parallelism.mesh.pp=2"}, 2},
       {3, {}, 3},
       {4, {"parallelism.mesh.pp=2", "parallelism.zero_stage=1"}, 5},
       {4, {"parallelism.mesh.pp=4"}, 0}},
      {{2, {"parallelism.zero_stage=1"}, 3},
       {2,
        {"parallelism.mesh.pp=2", "parallelism.pipeline.schedule=interleaved_1f1b",
         "parallelism.pipeline.virtual_stages=2", "parallelism.pipeline.micro_batches=2"},
        0}},
      // ZeRO-3 over tensor-parallel shards in and out: tp 2 x dp 2 -> dp 3 (ZeRO-3) -> tp 2.
      {{4, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"}, 2},
       {3, {"parallelism.zero_stage=3"}, 4},
       {2, {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"}, 0}},
  };
  for (const std::vector<Leg>& journey : journeys) {
    const std::string dir = comm::testing::FreshStoreDir() + "-checkpoints";
    RunResult last;
    std::string what;
    for (const Leg& leg : journey) {
      std::vector<std::string> o = leg.overrides;
      o.push_back("steps=6");
      o.push_back("checkpoint.dir=" + dir);
      absl::StrAppend(&what, what.empty() ? "" : " -> ", "world ", leg.world, " ",
                      absl::StrJoin(leg.overrides, " "));
      last = Train(leg.world, Pipelined(o), kGptSpec, leg.stop_at);
      ASSERT_FALSE(last.params.empty()) << what;
      EXPECT_EQ(last.steps, leg.stop_at > 0 ? leg.stop_at : 6) << what;
    }
    ExpectSameParameters(last, one, what);
  }
}

// A tied LM head's checkpoints hold wte once (the last stage's copy is not saved) and fill
// the copy on restore: pp 2 -> dp 2 (ZeRO-3, the embeddings' unit kept) -> tp 2 x pp 2
// trains as one rank.
TEST(GptTraining, ATiedHeadsCheckpointsMoveBetweenMeshes) {
  const std::vector<std::string> tied = {"steps=6", "model.gpt.tied_head=true"};
  const RunResult one = Train(1, Pipelined(tied), kGptSpec);
  ASSERT_FALSE(one.params.empty());
  const std::string dir = comm::testing::FreshStoreDir() + "-checkpoints";
  const std::vector<std::tuple<int, std::vector<std::string>, int64_t>> legs = {
      {2, {"parallelism.mesh.pp=2"}, 2},
      {2, {"parallelism.zero_stage=3"}, 4},
      {4, {"parallelism.mesh.tp=2", "parallelism.mesh.pp=2"}, 0}};
  RunResult last;
  std::string what = "tied head";
  for (const auto& [world, overrides, stop_at] : legs) {
    std::vector<std::string> o = tied;
    o.insert(o.end(), overrides.begin(), overrides.end());
    o.push_back("checkpoint.dir=" + dir);
    absl::StrAppend(&what, " -> world ", world, " ", absl::StrJoin(overrides, " "));
    last = Train(world, Pipelined(o), kGptSpec, stop_at);
    ASSERT_FALSE(last.params.empty()) << what;
  }
  ExpectSameParameters(last, one, what);
}

// What a pipeline job cannot be run as is refused naming the field.
TEST(GptTraining, PipelineMisfitsAreNamed) {
  auto run = [](int world, std::vector<std::string> overrides) {
    absl::Status status;
    MultiProcOptions mp;
    mp.world_size = world;
    auto results = RunRanks(mp, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
      auto spec = spec::LoadJobSpecText(kGptSpec, Pipelined(overrides));
      if (!spec.ok()) return spec.status();
      std::unique_ptr<data::Dataset> data = SyntheticText();
      TrainerOptions o;
      o.config = Config(*spec);
      o.comm = &comm;
      o.op_timeout = absl::Seconds(30);
      o.train_data = data.get();
      const absl::Status s = RunTraining(o).status();
      // Whether it is marked permanent (a payload, which stays in this process) travels in
      // the message.
      return IsPermanent(s) ? absl::Status(s.code(), absl::StrCat("[permanent] ", s.message()))
                            : s;
    });
    return results[0].status;
  };
  absl::Status s = run(3, {"parallelism.mesh.pp=2"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("parallelism.mesh")) << s;
  EXPECT_THAT(s.message(), HasSubstr("multiple of 2")) << s;
  // Issue 36 point 10: a configuration error at setup is permanent and named so (the
  // coordinator fails the job at once instead of restarting it into the same error).
  EXPECT_THAT(std::string(s.message()), StartsWith("[permanent] configuration error: ")) << s;
  s = run(2, {"parallelism.mesh.pp=2", "batch.micro_max=2"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("raise micro_batches to 6")) << s;
  EXPECT_THAT(std::string(s.message()), StartsWith("[permanent] configuration error: ")) << s;
}

// The GPU path (train/device.h). The same GPT job trained on the CPU and on the GPU: one
// rank, then two ranks sharing the GPU (their gradients staged through the host by the TCP
// backend), then one rank over NCCL, each against the CPU's one-rank run. SGD with momentum,
// so the parameters differ only by the gradients' float rounding (AdamW's first steps would
// turn a rounding difference in a near-zero gradient into a whole learning rate):
// |gpu - cpu| <= 2e-5 + 1e-4 |cpu|, as between CPU world sizes. Skips without a GPU.
constexpr char kGpuSpec[] = R"(
name: trainer_test_gpu
seed: 5
steps: 4
model: {gpt: {layers: 2, heads: 2, width: 32, context: 8}}
data: {text: {path: unused}}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05, clip_grad_norm: 1.0}
batch: {global: 12}
parallelism: {bucket_mb: 0.01}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

// The job of `spec` on the GPU (one rank over TCP, two ranks sharing the GPU over TCP staging
// although NCCL could be bootstrapped, one rank over NCCL) against the CPU's one-rank run,
// which it returns.
RunResult ExpectGpuRunsMatchTheCpu(const char* spec, const std::string& what) {
  const RunResult cpu = Train(1, {"device=cpu"}, spec);
  EXPECT_FALSE(cpu.params.empty());
  const RunResult tcp1 = Train(1, {"device=cuda"}, spec);
  EXPECT_EQ(tcp1.gradient_backend, "tcp");
  ExpectSameParameters(tcp1, cpu, what + " on the gpu, 1 rank, tcp");
  const RunResult shared = Train(2, {"device=cuda"}, spec, 0, Gradients::kNccl);
  EXPECT_EQ(shared.gradient_backend, "tcp");
  ExpectSameParameters(shared, cpu, what + " on the gpu, 2 ranks sharing it over tcp staging");
  const RunResult nccl = Train(1, {"device=cuda"}, spec, 0, Gradients::kNccl);
  EXPECT_EQ(nccl.gradient_backend, "nccl");
  ExpectSameParameters(nccl, cpu, what + " on the gpu, 1 rank, nccl");
  return cpu;
}

TEST(TrainerOnGpu, MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const RunResult cpu = ExpectGpuRunsMatchTheCpu(kGpuSpec, "gpt");
  ASSERT_FALSE(cpu.params.empty());
  ExpectSameParameters(Train(2, {"device=cuda", "parallelism.zero_stage=2"}, kGpuSpec), cpu,
                       "gpu, 2 ranks, ZeRO-2");
  ExpectSameParameters(Train(1, {"device=cuda", "parallelism.overlap=false"}, kGpuSpec), cpu,
                       "gpu, overlap off");
  ExpectSameParameters(
      Train(1, {"device=cuda", "parallelism.activation_checkpointing_every=1"}, kGpuSpec), cpu,
      "gpu, activation checkpointing");
}

// A tied LM head on the GPU (model.gpt with tied_head: GPT-2's head on a vocabulary small
// enough for the emulated GPU): one rank, and ZeRO-3 on two ranks sharing it (the
// embeddings' unit kept gathered in device memory for the head), train as on the CPU.
TEST(TrainerOnGpu, ATiedHeadMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> tied = {"model.gpt.tied_head=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), tied.begin(), tied.end());
    return more;
  };
  const RunResult cpu = Train(1, with({"device=cpu"}), kGpuSpec);
  ASSERT_FALSE(cpu.params.empty());
  ExpectSameParameters(Train(1, with({"device=cuda"}), kGpuSpec), cpu, "tied head on the gpu");
  ExpectSameParameters(Train(2, with({"device=cuda", "parallelism.zero_stage=3"}), kGpuSpec), cpu,
                       "tied head on the gpu, 2 ranks, ZeRO-3");
}

// One rank of `spec` with `overrides` fails with `code` and a message holding `text`; the same
// job with device: auto then trains (on the CPU).
void ExpectCudaFailsAndAutoTrains(const char* spec_text, std::vector<std::string> overrides,
                                  absl::StatusCode code, const std::string& text) {
  auto spec = spec::LoadJobSpecText(spec_text, overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::unique_ptr<data::Dataset> data = DataFor(*spec);
  MultiProcOptions mp;
  mp.world_size = 1;
  auto results = RunRanks(mp, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    TrainerOptions o;
    o.config = Config(*spec);
    o.comm = &comm;
    o.train_data = data.get();
    absl::Status s = RunTraining(o).status();
    if (s.code() != code || !absl::StrContains(s.message(), text)) {
      return absl::InternalError(absl::StrCat("want ", absl::StatusCodeToString(code), " naming '",
                                              text, "', got ", s.ToString()));
    }
    o.config.device = TrainConfig::Device::kAuto;
    return RunTraining(o).status();
  });
  EXPECT_TRUE(results[0].status.ok()) << results[0].status;
}

// The classifiers' GPU path (train/nn/sequential_cuda.h) as the GPT's above: an MLP trained
// on the CPU and on the GPU at one rank, two ranks sharing the GPU over TCP staging, and
// NCCL, with the same bound. In bf16 and fp16 (with the loss scaler) against the CPU's
// emulation of the same precision: the same values rounded at the same places, so the
// parameters agree within 2e-4 + 2e-3 |p| (a rounding that lands one ulp apart after sums in
// another order carries on; dropping a layer's rounding moves them by about 1e-3), and the
// same steps are skipped.
constexpr char kGpuMlpSpec[] = R"(
name: trainer_test_gpu_mlp
seed: 5
steps: 4
model: {mlp: {hidden: [32, 16]}}
data: {fashion_mnist: {}, eval_every_epoch: false}
optimizer: {sgd: {momentum: 0.9}, lr: 0.05, clip_grad_norm: 1.0}
batch: {global: 60}
parallelism: {bucket_mb: 0.002}
diagnostics: {fingerprint_every: 1, log_every: 1}
)";

TEST(TrainerOnGpu, ClassifierMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectGpuRunsMatchTheCpu(kGpuMlpSpec, "mlp");

  for (const std::string precision : {"bf16", "fp16"}) {
    const std::string compute = absl::StrCat("precision.compute=", precision);
    const RunResult cpu = Train(1, {"device=cpu", compute}, kGpuMlpSpec);
    const RunResult gpu = Train(1, {"device=cuda", compute}, kGpuMlpSpec);
    ExpectCloseParameters(gpu, cpu, 2e-4, 2e-3, "mlp in " + precision + " on the gpu");
    EXPECT_EQ(gpu.skipped_steps, cpu.skipped_steps) << precision;
  }
}

// bf16 on the GPU (one head of 64 channels, which the bf16 attention takes) against fp32 on
// the CPU: bf16 activations put about 1e-2 of relative error into each gradient, and four
// SGD steps of lr 0.05 with clipping to norm 1 move each parameter by at most 0.2, so the
// parameters agree within 1e-3 + 1e-2 |p| and the losses within 2%.
TEST(TrainerOnGpu, Bf16ApproximatesFp32) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> one_head = {"model.gpt.width=64", "model.gpt.heads=1"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), one_head.begin(), one_head.end());
    return more;
  };
  const RunResult cpu = Train(1, with({"device=cpu"}), kGpuSpec);
  const RunResult bf16 = Train(1, with({"device=cuda", "precision.compute=bf16"}), kGpuSpec);
  ExpectCloseParameters(bf16, cpu, 1e-3, 1e-2, "gpu bf16 vs cpu fp32");
  EXPECT_NEAR(bf16.final_loss, cpu.final_loss, 0.02 * std::fabs(cpu.final_loss));
  const RunResult bf16x2 = Train(2, with({"device=cuda", "precision.compute=bf16"}), kGpuSpec);
  ExpectCloseParameters(bf16x2, cpu, 1e-3, 1e-2, "gpu bf16, 2 ranks sharing it");
}

// fp16 on the GPU with the loss scaler (issue 7: "loss scaling under fp16 with an injected
// overflow"). The overflow is injected through the scale: at 2^24 the logits' gradient,
// (softmax - onehot) x scale / 96 tokens, reaches about 1.7e5 > 65504, fp16's largest, so it
// becomes inf, the fp32 gradients non-finite, and the step is skipped.
//   - A safe scale (1024: nothing overflows) trains as fp32 does, within the bf16 bounds
//     (fp16 keeps more mantissa than bf16), and skips nothing.
//   - Fixed at 2^24: every step overflows and is skipped.
//   - Dynamic from 2^24: steps are skipped while the scale halves (at least the first two:
//     at 2^23 the gradient is still 8.7e4), then training goes on with a finite loss.
TEST(TrainerOnGpu, Fp16LossScalingSkipsOverflowsAndBacksOff) {
  SKIP_WITHOUT_GPU();
  auto with = [](std::vector<std::string> more) {
    more.insert(more.end(), {"model.gpt.width=64", "model.gpt.heads=1", "steps=8"});
    return more;
  };
  const RunResult cpu = Train(1, with({"device=cpu"}), kGpuSpec);
  const RunResult safe =
      Train(1, with({"device=cuda", "precision.compute=fp16", "precision.loss_scale.initial=1024"}),
            kGpuSpec);
  EXPECT_EQ(safe.skipped_steps, 0);
  ExpectCloseParameters(safe, cpu, 1e-3, 1e-2, "gpu fp16 vs cpu fp32");

  const RunResult fixed =
      Train(1,
            with({"device=cuda", "precision.compute=fp16", "precision.loss_scale.mode=fixed",
                  "precision.loss_scale.initial=16777216"}),
            kGpuSpec);
  EXPECT_EQ(fixed.steps, 8);
  EXPECT_EQ(fixed.skipped_steps, 8) << "every step overflows at a fixed scale of 2^24";

  const RunResult dynamic = Train(
      1, with({"device=cuda", "precision.compute=fp16", "precision.loss_scale.initial=16777216"}),
      kGpuSpec);
  EXPECT_EQ(dynamic.steps, 8);
  EXPECT_GE(dynamic.skipped_steps, 2);
  EXPECT_LT(dynamic.skipped_steps, 8);
  EXPECT_TRUE(std::isfinite(dynamic.final_loss));
}

TEST(TrainerOnGpu, DeviceCudaWithoutAGpuSaysWhy) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is here: MatchesTheCpu runs instead";
  ExpectCudaFailsAndAutoTrains(kGpuSpec, {"device=cuda"}, absl::StatusCode::kFailedPrecondition,
                               "device: cuda");
}

// ZeRO-2 and ZeRO-3 on the GPU (train/fsdp.h's strategy in device memory: the step buffers
// hold a rank's pieces, the units are gathered and reduce-scattered there): the GPT job of
// MatchesTheCpu on one rank and on two ranks sharing the GPU over TCP staging, for each
// wrapping, with and without prefetch, with accumulation and activation checkpointing, against
// the CPU's one-rank run with MatchesTheCpu's bound; bf16 (the units gathered in 16 bits)
// against fp32 on the CPU with Bf16ApproximatesFp32's. The MLP with ZeRO-3 in fp16 (the loss
// scaler's vote over the shards) against the CPU's fp16 with ClassifierMatchesTheCpu's bound,
// evaluated at the end through the strategy's host copies (the CPU's loss within 1%).
TEST(TrainerOnGpu, ShardedMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const RunResult cpu = Train(1, {"device=cpu"}, kGpuSpec);
  ASSERT_FALSE(cpu.params.empty());
  const std::vector<std::vector<std::string>> cases = {
      {"parallelism.zero_stage=2"},
      {"parallelism.zero_stage=3"},  // wrap block, prefetch both
      {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=layer", "parallelism.fsdp.prefetch=none",
       "batch.accumulation=2"},
      {"parallelism.zero_stage=3", "parallelism.fsdp.wrap=model",
       "parallelism.fsdp.reshard_after_forward=false",
       "parallelism.activation_checkpointing_every=1"},
  };
  for (const std::vector<std::string>& c : cases) {
    for (int world : {1, 2}) {
      std::vector<std::string> set = c;
      set.push_back("device=cuda");
      const std::string what = absl::StrCat("gpu, ", world, " rank(s), ", absl::StrJoin(c, " "));
      const RunResult run = Train(world, set, kGpuSpec);
      ExpectSameParameters(run, cpu, what);
      ASSERT_EQ(run.gradient_bytes.size(), static_cast<size_t>(world)) << what;
      // A rank's gradients: its pieces of every unit, not the whole flat buffer.
      if (world == 2) {
        EXPECT_LT(run.gradient_bytes[0], cpu.gradient_bytes[0] * 0.6) << what;
      }
    }
  }

  const std::vector<std::string> bf16 = {"model.gpt.width=64", "model.gpt.heads=1",
                                         "precision.compute=bf16"};
  const RunResult cpu32 =
      Train(1, {"device=cpu", "model.gpt.width=64", "model.gpt.heads=1"}, kGpuSpec);
  std::vector<std::string> set = bf16;
  set.insert(set.end(), {"device=cuda", "parallelism.zero_stage=3", "precision.reduce=bf16"});
  ExpectCloseParameters(Train(2, set, kGpuSpec), cpu32, 1e-3, 1e-2, "gpu ZeRO-3 bf16, 2 ranks");

  const std::vector<std::string> fp16 = {"precision.compute=fp16", "parallelism.zero_stage=3",
                                         "parallelism.fsdp.wrap=layer"};
  std::vector<std::string> on_cpu = fp16, on_gpu = fp16;
  on_cpu.push_back("device=cpu");
  on_gpu.push_back("device=cuda");
  const RunResult mlp_cpu = Train(2, on_cpu, kGpuMlpSpec, 0, Gradients::kTcp, /*evaluate=*/true);
  const RunResult mlp_gpu = Train(2, on_gpu, kGpuMlpSpec, 0, Gradients::kTcp, /*evaluate=*/true);
  ExpectCloseParameters(mlp_gpu, mlp_cpu, 2e-4, 2e-3, "mlp, ZeRO-3 fp16 on the gpu");
  EXPECT_EQ(mlp_gpu.skipped_steps, mlp_cpu.skipped_steps);
  ASSERT_GE(mlp_cpu.eval_accuracy, 0);
  EXPECT_NEAR(mlp_gpu.eval_accuracy, mlp_cpu.eval_accuracy, 0.01);
  EXPECT_NEAR(mlp_gpu.eval_loss, mlp_cpu.eval_loss, 1e-2 * std::fabs(mlp_cpu.eval_loss));
}

// backend: auto on the CPU stays on TCP even when the trainer could bootstrap NCCL;
// backend: nccl there fails on every rank, naming the field and the rank that stops it.
TEST(TrainerBackend, NcclNeedsEveryRankOnItsOwnGpu) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is here: TrainerOnGpu covers the choice";
  const RunResult run = Train(2, {"steps=2"}, kSpec, 0, Gradients::kNccl);
  EXPECT_EQ(run.gradient_backend, "tcp");
  EXPECT_EQ(run.steps, 2);

  auto spec = spec::LoadJobSpecText(kSpec, {"backend=nccl", "steps=2"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto data = Synthetic();
  const std::string dir = comm::testing::FreshStoreDir();
  MultiProcOptions mp;
  mp.world_size = 2;
  auto results = RunRanks(mp, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Store> store, comm::FileStore::Create({dir}));
    TrainerOptions o;
    o.config = Config(*spec);
    o.comm = &comm;
    o.train_data = data.get();
    o.nccl_store = store.get();
    o.nccl_prefix = "nccl";
    absl::Status s = RunTraining(o).status();
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(s.message(),
                           "backend: nccl needs every rank on its own GPU, but "
                           "rank 0 trains on the CPU")) {
      return absl::InternalError(
          absl::StrCat("want FAILED_PRECONDITION naming backend: ", s.ToString()));
    }
    // Without a Store the trainer cannot bootstrap NCCL at all, and says so.
    o.nccl_store = nullptr;
    s = RunTraining(o).status();
    if (!absl::StrContains(s.message(), "backend: nccl, but this trainer was given no Store")) {
      return absl::InternalError(absl::StrCat("without a store: ", s.ToString()));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].status.ok()) << r << ": " << results[r].status;
}

// Issue 4: a full disk during training. Saves of steps 4 and 6 fail with ENOSPC (their
// shard writes); training goes on to the end, the failures are counted and reported, no
// partial checkpoint is visible, and the saves before and after (space freed) commit.
// The options of a rank forked by RunRanks: every rank on this host, collectives that give
// up after 20 s, and `data` to train on.
TrainerOptions ForkedRankOptions(const JobSpec& spec, TcpCommunicator& comm,
                                 const data::Dataset* data) {
  TrainerOptions o;
  o.config = Config(spec);
  o.comm = &comm;
  o.local_ranks = comm.size();
  o.op_timeout = absl::Seconds(20);
  o.train_data = data;
  return o;
}

// A peer fails after step 6 of 10 (the last checkpoint is step 4). The survivors keep their
// state in memory; the next epoch (3 ranks: rank 0 a replacement with nothing in memory)
// restores step 6 from the first survivor's memory, reads no checkpoint, trains steps 7-10,
// and ends with the parameters of 10 uninterrupted steps.
TEST_F(TrainerTest, SurvivorsRestoreFromMemoryAndLoseNoStep) {
  const std::string root = comm::testing::FreshStoreDir() + "-ckpt";
  const std::string store_dir = comm::testing::FreshStoreDir() + "-epoch2";
  const std::string out_dir = comm::testing::FreshStoreDir() + "-out";
  ASSERT_EQ(mkdir(out_dir.c_str(), 0755), 0);
  const std::vector<std::string> overrides = {"steps=10", absl::StrCat("checkpoint.dir=", root),
                                              "checkpoint.every_steps=4", "resume=auto"};
  MultiProcOptions options;
  options.world_size = 3;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec = spec::LoadJobSpecText(kSpec, overrides);
    if (!spec.ok()) return spec.status();
    auto train_data = Synthetic();
    ResidentState resident;
    TrainerOptions o = ForkedRankOptions(*spec, comm, train_data.get());
    o.resident = &resident;
    // Epoch 1: rank 2 fails (its communicator aborts) once step 6 is done.
    o.on_step = [&](const StepReport& r) {
      if (comm.rank() == 2 && r.step == 6) comm.Abort();
    };
    auto first = RunTraining(o);
    if (first.ok()) return absl::InternalError("epoch 1 should have failed");
    if (resident.step != 6) {
      return absl::InternalError(
          absl::StrCat("epoch 1 kept step ", resident.step, ": ", first.status().ToString()));
    }
    // Epoch 2: rank 0 is a replacement with nothing in memory.
    if (comm.rank() == 0) resident.Clear();
    comm::FileStoreOptions so;
    so.directory = store_dir;
    RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileStore> store, comm::FileStore::Create(so));
    comm::TcpCommunicatorOptions co;
    co.rank = comm.rank();
    co.size = 3;
    co.store = store.get();
    co.prefix = "epoch2";
    RM_ASSIGN_OR_RETURN(std::unique_ptr<TcpCommunicator> comm2, TcpCommunicator::Create(co));
    std::string params;
    o.comm = comm2.get();
    o.on_step = nullptr;
    o.on_finish = [&](const state::TensorTable& table, const state::FlatBuffer& p) {
      for (const state::TensorSpec& t : table.tensors()) {
        params.append(reinterpret_cast<const char*>(p.data() + t.offset), t.numel * 4);
      }
    };
    auto second = RunTraining(o);
    if (!second.ok()) return second.status();
    if (second->resumed_from_step() != 6 || second->resumed_from_memory_of() != 1 ||
        second->steps() != 10) {
      return absl::InternalError(absl::StrCat("resumed from step ", second->resumed_from_step(),
                                              " of rank ", second->resumed_from_memory_of(), ", ",
                                              second->steps(), " steps"));
    }
    return WriteFileAtomically(absl::StrCat(out_dir, "/rank", comm.rank(), ".params"), params);
  });
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
  // The checkpoint at step 4 was there and was not the one used.
  EXPECT_EQ(checkpoint::ReadLatest(Env::Default(), root + "/trainer_test").value_or(-1), 10);
  RunResult reference = Train(1, {"steps=10"});
  RunResult restored;
  auto params = ReadFile(out_dir + "/rank0.params");
  ASSERT_TRUE(params.ok()) << params.status();
  restored.params.resize(params->size() / 4);
  memcpy(restored.params.data(), params->data(), params->size());
  ExpectSameParameters(restored, reference,
                       "3 ranks, a failure after step 6, restored from memory");
}

TEST(TrainerDiskFull, TrainingGoesOnAndNoPartialCheckpointIsVisible) {
  const std::string root = comm::testing::FreshStoreDir() + "-ckpt";
  MultiProcOptions options;
  options.world_size = 1;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec =
        spec::LoadJobSpecText(kSpec, {"steps=8", absl::StrCat("checkpoint.dir=", root),
                                      "checkpoint.every_steps=2", "checkpoint.keep_last=10"});
    if (!spec.ok()) return spec.status();
    FaultInjectionEnv env(Env::Default(), [](const FileOp& op) -> absl::Status {
      const bool full =
          absl::StrContains(op.path, "step-4") || absl::StrContains(op.path, "step-6");
      if (op.kind != FileOp::Kind::kPWrite || !full) return absl::OkStatus();
      return ::ringmaster::ErrnoToStatus(ENOSPC, absl::StrCat("pwrite of ", op.path));
    });
    auto train_data = Synthetic();
    std::vector<std::string> lines;
    TrainerOptions o;
    o.config = Config(*spec);
    o.comm = &comm;
    o.train_data = train_data.get();
    o.checkpoint_env = &env;
    o.progress = [&](const std::string& line) { lines.push_back(line); };
    auto result = RunTraining(o);
    if (!result.ok()) return result.status();
    if (result->steps() != 8) return absl::InternalError(absl::StrCat("steps ", result->steps()));
    if (result->checkpoint_failures() != 2 || result->checkpoints_saved() != 2) {
      return absl::InternalError(absl::StrCat("saved ", result->checkpoints_saved(), ", failed ",
                                              result->checkpoint_failures()));
    }
    // Each report names a failed save (step 4 or 6) and its error, even when a later save
    // (step 8) has succeeded by the time the failure is reported.
    int reports = 0;
    for (const std::string& l : lines) {
      if (!absl::StrContains(l, "failed (training goes on)")) continue;
      ++reports;
      if (!(absl::StrContains(l, "checkpoint of step 4 ") ||
            absl::StrContains(l, "checkpoint of step 6 ")) ||
          absl::EndsWith(l, ": OK")) {
        return absl::InternalError(absl::StrCat("a report that names no failure: ", l));
      }
    }
    if (reports == 0) return absl::InternalError("the failed saves were not reported");
    return absl::OkStatus();
  });
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  const std::string job_dir = root + "/trainer_test";
  auto steps = checkpoint::ListCommittedSteps(Env::Default(), job_dir);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, (std::vector<int64_t>{2, 8})) << "4 and 6 failed; 2 and 8 committed";
  // Nothing else is visible in the job directory: no temporary or half-written step.
  std::vector<std::string> children;
  for (const auto& e : std::filesystem::directory_iterator(job_dir)) {
    children.push_back(e.path().filename().string());
  }
  std::sort(children.begin(), children.end());
  EXPECT_EQ(children, (std::vector<std::string>{"LATEST", "step-2", "step-8"}));
  // What is there verifies and loads.
  for (const char* step : {"step-2", "step-8"}) {
    auto verified = checkpoint::VerifyCheckpoint(Env::Default(), job_dir + "/" + step);
    EXPECT_TRUE(verified.ok()) << step << ": " << verified.status();
  }
}

struct DiskFullRun {
  std::string job_dir;
  std::vector<RankResult> results;  // one per rank
  std::string rank0;  // rank 0's progress lines, the commits it heard of and the failures
};

// Rank 1 can write nothing of the save of step 4: neither its shard, nor its report, nor
// the marker that says it failed.
absl::Status NothingOfStep4(const FileOp& op) {
  const bool writes = op.kind == FileOp::Kind::kPWrite || (op.kind == FileOp::Kind::kOpenWrite &&
                                                           absl::StrContains(op.path, ".failed-"));
  if (!writes || !absl::StrContains(op.path, "tmp-step-4-")) return absl::OkStatus();
  return ::ringmaster::ErrnoToStatus(ENOSPC, absl::StrCat("pwrite of ", op.path));
}

// 8 steps on 2 ranks, saving every 2 (on_busy: wait), rank 1's checkpoints through `disk`.
// Steps this (forked) rank has done, as its last StepReport said: a disk hook that must
// outlast a decision of the trainer waits for it instead of guessing how long steps take.
std::atomic<int64_t> g_steps_done{0};

DiskFullRun TrainWithRank1sDisk(const FileOpHook& disk, const std::string& on_failure,
                                absl::Duration op_timeout = absl::Seconds(20)) {
  const std::string root = comm::testing::FreshStoreDir() + "-ckpt";
  const std::string out_dir = comm::testing::FreshStoreDir() + "-out";
  EXPECT_EQ(mkdir(out_dir.c_str(), 0755), 0);
  MultiProcOptions options;
  options.world_size = 2;
  options.timeout = absl::Seconds(90);
  DiskFullRun run;
  run.job_dir = root + "/trainer_test";
  run.results =
      RunRanks(options, [&](TcpCommunicator& comm, absl::Duration* elapsed) -> absl::Status {
        auto spec = spec::LoadJobSpecText(
            kSpec, {"steps=8", absl::StrCat("checkpoint.dir=", root), "checkpoint.every_steps=2",
                    "checkpoint.keep_last=10", "checkpoint.on_busy=wait",
                    "checkpoint.on_failure=" + on_failure});
        if (!spec.ok()) return spec.status();
        FaultInjectionEnv env(Env::Default(), disk);
        auto train_data = Synthetic();
        std::vector<std::string> lines;
        std::vector<int64_t> commits;
        TrainerOptions o = ForkedRankOptions(*spec, comm, train_data.get());
        o.op_timeout = op_timeout;
        if (comm.rank() == 1) o.checkpoint_env = &env;
        o.progress = [&](const std::string& line) { lines.push_back(line); };
        StepReport last;
        o.on_step = [&](const StepReport& r) {
          last = r;
          g_steps_done.store(r.step);
        };
        o.on_checkpoint = [&](const CommittedCheckpoint& c) {
          commits.push_back(c.step);
          if (c.path != absl::StrCat(root, "/trainer_test/step-", c.step) || c.world_size != 2 ||
              c.bytes <= 0) {
            lines.push_back(absl::StrCat("bad commit report: ", c.path, " ", c.world_size));
          }
        };
        const absl::Time start = absl::Now();
        auto result = RunTraining(o);
        *elapsed = absl::Now() - start;
        RM_RETURN_IF_ERROR(WriteFileAtomically(
            absl::StrCat(out_dir, "/rank", comm.rank(), ".txt"),
            absl::StrCat(absl::StrJoin(lines, "\n"), "\ncommits ", absl::StrJoin(commits, ","),
                         "\nfailures ", result.ok() ? result->checkpoint_failures() : -1,
                         "\nstep report: failed save of step ", last.checkpoint_error_step, ": ",
                         last.checkpoint_error, "\n")));
        if (!result.ok() && !IsPermanent(result.status())) {
          return absl::InternalError(
              absl::StrCat("not marked permanent: ", result.status().ToString()));
        }
        return result.status();
      });
  EXPECT_EQ(run.results.size(), 2u);
  run.results.resize(2);
  run.rank0 = ReadFile(out_dir + "/rank0.txt").value_or("");
  return run;
}

std::string JobDirEntries(const std::string& job_dir) {
  std::vector<std::string> children;
  for (const auto& e : std::filesystem::directory_iterator(job_dir)) {
    children.push_back(e.path().filename().string());
  }
  std::sort(children.begin(), children.end());
  return absl::StrJoin(children, " ");
}

// The ranks tell each other, so rank 0 fails that save within about a step (it waited out
// the writer's 5-minute commit timeout before, while on_busy: wait held the next save and
// rank 1 timed out in its all-reduce): training goes on, the failure is said with its cause
// and file, the next saves commit, no temporary is left, and on_checkpoint hears of each
// commit.
TEST(TrainerDiskFull, ARankThatCannotReportItsFailureStallsNoOne) {
  const DiskFullRun run = TrainWithRank1sDisk(NothingOfStep4, "continue");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(run.results[r].status.ok()) << "rank " << r << ": " << run.results[r].status;
    // No one waited out the 20 s op_timeout (the run takes ~1 s, ~12 s under cudaemu).
    EXPECT_LT(run.results[r].elapsed, absl::Seconds(19)) << "rank " << r;
  }
  const std::string& rank0 = run.rank0;
  EXPECT_TRUE(absl::StrContains(rank0, "checkpoint of step 4 failed (training goes on)")) << rank0;
  EXPECT_TRUE(absl::StrContains(rank0, "tmp-step-4-")) << rank0;
  EXPECT_TRUE(absl::StrContains(rank0, "shard-1-of-2.bin: No space left on device")) << rank0;
  EXPECT_TRUE(absl::StrContains(rank0, "commits 2,6,8\nfailures 1\n")) << rank0;
  // What the elastic trainer sends the coordinator for the job's status.
  EXPECT_TRUE(absl::StrContains(rank0, "step report: failed save of step 4: RESOURCE_EXHAUSTED"))
      << rank0;
  EXPECT_FALSE(absl::StrContains(rank0, "bad commit report")) << rank0;
  EXPECT_EQ(JobDirEntries(run.job_dir), "LATEST step-2 step-6 step-8");
  for (const char* step : {"step-2", "step-6", "step-8"}) {
    auto verified = checkpoint::VerifyCheckpoint(Env::Default(), run.job_dir + "/" + step);
    EXPECT_TRUE(verified.ok()) << step << ": " << verified.status();
  }
}

// checkpoint.on_failure: fail: every rank stops with the failure, permanent, naming the
// step, the rank, the cause and the file; nothing of the failed save is left.
TEST(TrainerDiskFull, OnFailureFailStopsEveryRankWithTheCause) {
  const DiskFullRun run = TrainWithRank1sDisk(NothingOfStep4, "fail");
  for (int r = 0; r < 2; ++r) {
    const absl::Status& s = run.results[r].status;
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << "rank " << r << ": " << s;
    EXPECT_TRUE(absl::StrContains(
        s.message(), "checkpoint.on_failure is fail and the checkpoint of step 4 failed on rank 1"))
        << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "No space left on device")) << s;
    EXPECT_LT(run.results[r].elapsed, absl::Seconds(15)) << "rank " << r;
  }
  EXPECT_EQ(JobDirEntries(run.job_dir), "LATEST step-2");
}

// Rank 1's disk holds its shard of step 4 until rank 1 is past step 6, whose save would
// wait for it longer than half the 10 s op_timeout: that save is skipped on every rank and
// said so (rank 1 blocked in it while rank 0's collective timed out before); the last save,
// once the disk is done, commits. (The disk waits for the step, not for a fixed time, so
// that slow steps, e.g. under --config=cudaemu, cannot let it finish before step 6.)
TEST(TrainerDiskFull, ASaveThatASlowDiskWouldHoldUpIsSkippedEverywhere) {
  const DiskFullRun run = TrainWithRank1sDisk(
      [](const FileOp& op) {
        if (op.kind == FileOp::Kind::kPWrite && absl::StrContains(op.path, "tmp-step-4-") &&
            absl::StrContains(op.path, "shard-1-of-2")) {
          const absl::Time give_up = absl::Now() + absl::Seconds(60);
          while (g_steps_done.load() < 6 && absl::Now() < give_up) {
            absl::SleepFor(absl::Milliseconds(10));
          }
        }
        return absl::OkStatus();
      },
      "continue", absl::Seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(run.results[r].status.ok()) << "rank " << r << ": " << run.results[r].status;
  }
  EXPECT_TRUE(absl::StrContains(run.rank0,
                                "checkpoint of step 6 skipped: 1 rank(s) still write "
                                "their shard of the previous save"))
      << run.rank0;
  EXPECT_TRUE(absl::StrContains(run.rank0, "commits 2,4,8\nfailures 0\n")) << run.rank0;
  EXPECT_EQ(JobDirEntries(run.job_dir), "LATEST step-2 step-4 step-8");
}

// lr 1e6 diverges: the job fails at the first step whose gradient or loss is not finite
// (fp32 has no loss scaler to skip such steps), on every rank alike, permanently, naming
// the step and what was not finite. (It "succeeded" with 118 of 120 steps skipped.)
TEST(TrainerDivergence, ANonFiniteLossOrGradientFailsTheJob) {
  MultiProcOptions options;
  options.world_size = 2;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec = spec::LoadJobSpecText(kSpec, {"steps=30", "optimizer.lr=1e6"});
    if (!spec.ok()) return spec.status();
    auto train_data = Synthetic();
    auto result = RunTraining(ForkedRankOptions(*spec, comm, train_data.get()));
    if (result.ok()) {
      return absl::InternalError(absl::StrCat("succeeded: ", result->skipped_steps(),
                                              " steps skipped, final loss ", result->final_loss()));
    }
    if (!IsPermanent(result.status())) {
      return absl::InternalError(absl::StrCat("not permanent: ", result.status().ToString()));
    }
    return result.status();
  });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status, results[1].status);
  const absl::Status& s = results[0].status;
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "training diverged at step ")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the loss is") ||
              absl::StrContains(s.message(), "the gradient norm is"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "lower optimizer.lr (1e+06)")) << s;
}

// The summary is JSON whatever the numbers: what is not finite or not measured is null.
TEST(TrainResultJson, IsOneLineOfJsonWithoutWhatIsNotFinite) {
  TrainResult r;
  r.set_steps(120);
  r.set_skipped_steps(118);
  r.set_final_loss(-std::nan(""));
  r.set_world_size(2);
  r.set_drained(true);
  r.set_parameters(7e9);
  const std::string text = TrainResultJson(r);
  ASSERT_TRUE(nlohmann::json::accept(text)) << text;
  const nlohmann::json json = nlohmann::json::parse(text);
  // Not finite, and not measured: left out.
  EXPECT_FALSE(json.contains("final_loss")) << text;
  EXPECT_FALSE(json.contains("eval_accuracy")) << text;
  EXPECT_FALSE(json.contains("eval_loss")) << text;
  EXPECT_EQ(json["steps"], 120);
  EXPECT_EQ(json["skipped_steps"], 118);
  EXPECT_EQ(json["drained"], true);
  EXPECT_EQ(json["parameters"], 7e9) << "a number, not protobuf's string for an int64";
  for (const char* key :
       {"samples_per_second", "tokens_per_second", "world_size", "parameters", "comm_seconds",
        "exposed_comm_seconds", "elapsed_seconds", "activation_bytes_peak", "optimizer_state_bytes",
        "resumed_from_step", "checkpoints_saved", "checkpoint_failures"}) {
    EXPECT_TRUE(json.contains(key)) << key;
    EXPECT_TRUE(json[key].is_number()) << key;
  }
  // Flat and compact, one line, and it reads back.
  EXPECT_TRUE(absl::StrContains(text, "\"world_size\":2,")) << text;
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  TrainResult back;
  ASSERT_TRUE(FromJson(text, &back, "summary").ok());
  EXPECT_EQ(back.steps(), 120);
  EXPECT_FALSE(back.has_final_loss());
}

// metrics.jsonl is the job's history: a second run (a resume, a recovery) appends to it
// instead of truncating it, after dropping a last line cut short; every line is JSON and
// carries its step. Rank 0's progress lines show the time elapsed and the time left.
TEST(TrainerMetrics, AppendsToTheJobsHistoryAndShowsElapsedAndEta) {
  const std::string dir = comm::testing::FreshStoreDir() + "-metrics";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/metrics.jsonl";
  ASSERT_TRUE(WriteFileAtomically(path, "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"lo").ok());
  MultiProcOptions options;
  options.world_size = 1;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec = spec::LoadJobSpecText(kSpec, {"steps=3", "metrics.jsonl=" + path});
    if (!spec.ok()) return spec.status();
    auto train_data = Synthetic();
    TrainerOptions o = ForkedRankOptions(*spec, comm, train_data.get());
    std::vector<std::string> lines;
    o.progress = [&](const std::string& line) { lines.push_back(line); };
    RM_RETURN_IF_ERROR(RunTraining(o).status());
    for (const std::string& line : lines) {
      if (!absl::StartsWith(line, "step ")) continue;
      if (!absl::StrContains(line, " elapsed ") || !absl::StrContains(line, " eta ")) {
        return absl::InternalError(absl::StrCat("no elapsed time or ETA: ", line));
      }
      if (absl::StartsWith(line, "step 3/3") && !absl::EndsWith(line, " eta 0s")) {
        return absl::InternalError(absl::StrCat("the last step has time left: ", line));
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  const std::string text = ReadFile(path).value_or("");
  std::vector<int64_t> steps;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ASSERT_TRUE(nlohmann::json::accept(line)) << line;
    steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 1, 2, 3})) << text;
  EXPECT_TRUE(absl::EndsWith(text, "\n"));
}

// Every metrics record carries rank 0's own gradient norm, the records of data epochs' ends
// too (the step that ends an epoch is logged, so it measures the norm; it used to measure it
// on log_every's steps only, and the epoch ends' records said 0). 250 samples and batches of
// 60: epochs end after steps 5 and 10 (the last batch of an epoch is short).
TEST(TrainerMetrics, EveryRecordHasTheLocalGradientNormEpochEndsToo) {
  const std::string dir = comm::testing::FreshStoreDir() + "-local-norm";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/metrics.jsonl";
  MultiProcOptions options;
  options.world_size = 2;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    RM_ASSIGN_OR_RETURN(JobSpec spec,
                        spec::LoadJobSpecText(kSpec, {"steps=10", "diagnostics.log_every=100",
                                                      "metrics.jsonl=" + path}));
    auto train_data = Synthetic();
    return RunTraining(ForkedRankOptions(spec, comm, train_data.get())).status();
  });
  for (const auto& r : results) ASSERT_TRUE(r.status.ok()) << r.status;
  const std::string text = ReadFile(path).value_or("");
  std::vector<int64_t> steps;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const nlohmann::json record = nlohmann::json::parse(line);
    steps.push_back(record["step"].get<int64_t>());
    EXPECT_GT(record.value("local_grad_norm", 0.0), 0) << line;
  }
  // The first step, the epochs' ends (the second is the last step).
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 5, 10})) << text;
}

// The training throughput counts the training steps only: an evaluation after the last step
// that takes far longer than the steps (a large test set) leaves samples_per_second as the
// steps' pace, and is timed apart (eval_seconds, final_eval_seconds, a line of its own).
// data.final_eval: false skips it; with data.eval_every_steps it skips only the evaluation
// after the last step that no multiple of K asked for.
TEST(TrainerEvaluation, ThroughputCountsTheTrainingStepsAndTheEvaluationIsTimedApart) {
  struct Outcome {
    TrainResult result;
    double steps_seconds = 0;   // the Step() calls, timed here
    double finish_seconds = 0;  // Run() after the last step: the final evaluation
    bool evaluation_line = false;
  };
  auto run = [](std::vector<std::string> overrides, int64_t test_samples) {
    const std::string dir = comm::testing::FreshStoreDir() + "-eval";
    EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
    MultiProcOptions options;
    options.world_size = 1;
    auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
      overrides.push_back("diagnostics.fingerprint_every=0");
      // On the CPU in every build: under --config=cudaemu an emulated GPU's steps are slower
      // than this evaluation, and the test needs the evaluation to be the longer part.
      overrides.push_back("device=cpu");
      RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, overrides));
      auto train_data = Synthetic();
      auto test_data = Synthetic(test_samples);
      TrainerOptions o = ForkedRankOptions(spec, comm, train_data.get());
      o.test_data = test_data.get();
      bool line = false;
      o.progress = [&](const std::string& l) {
        line = line || absl::StartsWith(l, "evaluation after step ");
      };
      // From before Create: whatever the trainer counts as training lies between here and
      // the end of the last Step(), and the final evaluation after it.
      const absl::Time start = absl::Now();
      RM_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(o));
      while (!trainer->finished()) RM_RETURN_IF_ERROR(trainer->Step());
      const absl::Time steps_end = absl::Now();
      RM_ASSIGN_OR_RETURN(TrainResult result, trainer->Run());
      const std::string text = absl::StrCat(
          TrainResultJson(result), absl::ToDoubleSeconds(steps_end - start), " ",
          absl::ToDoubleSeconds(absl::Now() - steps_end), " ", line ? 1 : 0, "\n");
      return WriteFileAtomically(dir + "/outcome", text);
    });
    EXPECT_TRUE(results[0].status.ok()) << results[0].status;
    Outcome out;
    const std::vector<std::string> lines =
        absl::StrSplit(ReadFile(dir + "/outcome").value_or(""), '\n');
    if (lines.size() < 2) return out;
    EXPECT_TRUE(FromJson(lines[0], &out.result, "result").ok()) << lines[0];
    int line = 0;
    sscanf(lines[1].c_str(), "%lf %lf %d", &out.steps_seconds, &out.finish_seconds, &line);
    out.evaluation_line = line != 0;
    return out;
  };
  // 40 steps of a wider MLP; one evaluation, of 200,000 samples, after the last (some 0.5 s
  // here, longer under load). No ratio of times is assumed (the machine is shared): the
  // training time must lie within the steps' span, which the evaluation follows.
  const Outcome final_eval =
      run({"steps=40", "model.mlp.hidden=[512, 512]", "parallelism.bucket_mb=25"}, 200000);
  const TrainResult& r = final_eval.result;
  ASSERT_EQ(r.steps(), 40);
  ASSERT_GT(r.final_eval_seconds(), 0.05)
      << "the evaluation must take a measurable time for this test to mean anything";
  // 250 samples in batches of 60: an epoch is 4 full batches and one of 10; 40 steps are 8
  // epochs.
  const double samples = 8 * 250;
  EXPECT_LE(r.training_seconds(), final_eval.steps_seconds + 0.01)
      << "the throughput counted the evaluation: " << TrainResultJson(r)
      << "steps took " << final_eval.steps_seconds << " s, the end " << final_eval.finish_seconds
      << " s";
  EXPECT_GE(r.samples_per_second(), 0.99 * samples / (final_eval.steps_seconds + 0.01));
  EXPECT_NEAR(r.samples_per_second() * r.training_seconds(), samples, 1e-6 * samples);
  EXPECT_EQ(r.evaluations(), 1);
  EXPECT_EQ(r.eval_step(), 40);
  EXPECT_TRUE(r.has_eval_accuracy());
  EXPECT_GT(r.final_eval_seconds(), 0.5 * final_eval.finish_seconds);
  EXPECT_LE(r.final_eval_seconds(), final_eval.finish_seconds);
  EXPECT_DOUBLE_EQ(r.eval_seconds(), r.final_eval_seconds());
  EXPECT_GE(r.elapsed_seconds(), r.training_seconds() + r.eval_seconds());
  EXPECT_TRUE(final_eval.evaluation_line) << "no line for the evaluation after the last step";

  const Outcome none = run({"data.final_eval=false"}, 513);
  EXPECT_EQ(none.result.steps(), 6);
  EXPECT_EQ(none.result.evaluations(), 0);
  EXPECT_EQ(none.result.eval_seconds(), 0);
  EXPECT_FALSE(none.result.has_eval_accuracy());
  EXPECT_FALSE(none.evaluation_line);

  // Every 4 steps of 6: after step 4, and after step 6 only with data.final_eval.
  const Outcome by_steps = run({"data.eval_every_steps=4"}, 513);
  EXPECT_EQ(by_steps.result.evaluations(), 2);
  EXPECT_EQ(by_steps.result.eval_step(), 6);
  EXPECT_GT(by_steps.result.final_eval_seconds(), 0);
  const Outcome by_steps_only = run({"data.eval_every_steps=4", "data.final_eval=false"}, 513);
  EXPECT_EQ(by_steps_only.result.evaluations(), 1);
  EXPECT_EQ(by_steps_only.result.eval_step(), 4);
  EXPECT_EQ(by_steps_only.result.final_eval_seconds(), 0);
}

// Runs one rank of kSpec, changed by `change`, with `on_restored`; the status it ends with,
// INTERNAL when an error it returns is not marked permanent.
absl::Status TrainOneRank(const std::function<void(JobSpec*)>& change,
                          std::function<absl::Status(int64_t)> on_restored = nullptr) {
  MultiProcOptions options;
  options.world_size = 1;
  auto results = RunRanks(options, [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
    auto spec = spec::LoadJobSpecText(kSpec, {});
    if (!spec.ok()) return spec.status();
    change(&*spec);
    auto train_data = Synthetic();
    TrainerOptions o = ForkedRankOptions(*spec, comm, train_data.get());
    o.on_restored = on_restored;
    absl::Status s = RunTraining(o).status();
    if (!s.ok() && !IsPermanent(s)) {
      return absl::InternalError(absl::StrCat("not marked permanent: ", s.ToString()));
    }
    return s;
  });
  EXPECT_TRUE(results[0].reported) << results[0].exit_detail;
  return results[0].status;
}

// A job that ended is trained longer: submitted again with more steps, it resumes from
// its last checkpoint only with `resume: extend` (else the refusal names the field that
// differs and what to do), trains to the new length, and its learning rate from there on
// is the new length's schedule. A change of anything else is still refused, by name.
TEST(TrainerExtend, ALongerJobResumesAtItsLastStepWhenAskedAndNamesWhatDiffers) {
  const std::string dir = comm::testing::FreshStoreDir() + "-extend";
  // Trains kSpec (warm-up 2 steps, cosine decay, lr 0.01) with `overrides` on one rank;
  // `check` looks at the result and the progress lines in the rank's process.
  auto run = [&](std::vector<std::string> overrides,
                 const std::function<absl::Status(const TrainResult&,
                                                  const std::vector<std::string>&)>& check) {
    MultiProcOptions options;
    options.world_size = 1;
    overrides.push_back("checkpoint.dir=" + dir);
    return RunRanks(options,
                    [&](TcpCommunicator& comm, absl::Duration*) -> absl::Status {
                      RM_ASSIGN_OR_RETURN(JobSpec spec, spec::LoadJobSpecText(kSpec, overrides));
                      auto train_data = Synthetic();
                      TrainerOptions o = ForkedRankOptions(spec, comm, train_data.get());
                      std::vector<std::string> lines;
                      o.progress = [&](const std::string& line) { lines.push_back(line); };
                      RM_ASSIGN_OR_RETURN(TrainResult result, RunTraining(o));
                      return check(result, lines);
                    })[0]
        .status;
  };
  auto ok = [](const TrainResult&, const std::vector<std::string>&) { return absl::OkStatus(); };
  ASSERT_TRUE(run({"steps=3"}, ok).ok());

  absl::Status refused = run({"steps=6"}, ok);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("was written with another spec: the fields that differ: steps: 3 in "
                        "the checkpoint, 6 here (to train this job longer from its checkpoint, "
                        "submit it with resume: extend, or ringctl submit --extend)"));

  // p = (3 - warm-up 2) / (6 - 2) of the cosine decay from 0.01 to 0.
  const std::string lr = absl::StrFormat("lr %g at step 3", 0.01 * (1 + std::cos(M_PI / 4)) / 2);
  absl::Status extended = run(
      {"steps=6", "resume=extend"},
      [&](const TrainResult& r, const std::vector<std::string>& lines) -> absl::Status {
        if (r.resumed_from_step() != 3 || r.steps() != 6) {
          return absl::InternalError(absl::StrCat("resumed from step ", r.resumed_from_step(),
                                                  ", trained to step ", r.steps()));
        }
        for (const std::string& line : lines) {
          if (absl::StrContains(line, "resume: extend: the checkpoint's job was steps: 3 -> 6") &&
              absl::StrContains(line, lr)) {
            return absl::OkStatus();
          }
        }
        return absl::InternalError(
            absl::StrCat("no line says \"", lr, "\": ", absl::StrJoin(lines, "\n")));
      });
  EXPECT_TRUE(extended.ok()) << extended;

  refused = run({"steps=9", "resume=extend", "optimizer.lr=0.02"}, ok);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("the fields that differ: optimizer.lr: 0.01 in the checkpoint, 0.02 here"));
  EXPECT_THAT(std::string(refused.message()), Not(HasSubstr("steps:")));
}

// model.mlp.hidden: [1000000, 1000000] (10^12 parameters): a named RESOURCE_EXHAUSTED that
// no restart repeats, saying how much and what, not an uncaught std::bad_alloc.
TEST(TrainerMemory, AModelTooBigForThisMachineIsPermanentlyResourceExhausted) {
  absl::Status s = TrainOneRank([](JobSpec* spec) {
    spec->mutable_model()->mutable_mlp()->clear_hidden();
    spec->mutable_model()->mutable_mlp()->add_hidden(1000000);
    spec->mutable_model()->mutable_mlp()->add_hidden(1000000);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // 48·10^6 + 10^6 + 10^12 + 10^6 + 10·10^6 + 10: weights and biases of 48-10^6-10^6-10.
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "out of memory: the model's 1000060000010 parameters "
                                "need 1.49e+04 GiB on each rank"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "for the 1 rank(s) on this host, which has")) << s;
}

// An allocation that fails anywhere on the training thread ends the run with a named,
// permanent RESOURCE_EXHAUSTED instead of killing the process.
TEST(TrainerMemory, AnyBadAllocIsPermanentlyResourceExhausted) {
  absl::Status s =
      TrainOneRank([](JobSpec*) {}, [](int64_t) -> absl::Status { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "out of memory while allocating the trainer's "
                                "working memory"))
      << s;
}

}  // namespace
}  // namespace ringmaster::train
