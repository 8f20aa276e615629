#include "bench/train_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::bench {
namespace {

// Records as the trainer writes them (fields it has that we do not read included).
constexpr char kTrainerMetrics[] =
    R"({"step":1,"epoch":0,"loss":2.3,"samples_per_second":3487.5,"comm_seconds":0.002,)"
    R"("exposed_comm_seconds":0.007,"window_seconds":0.0367,"loss_scale":1,"skipped_steps":0}
{"step":10,"epoch":0,"loss":2.3,"samples_per_second":9000,"comm_seconds":0.02,)"
    R"("exposed_comm_seconds":0.01,"window_seconds":0.128,"loss_scale":1,"skipped_steps":0}
{"step":20,"epoch":0,"loss":2.2,"samples_per_second":10000,"comm_seconds":0.03,)"
    R"("exposed_comm_seconds":0.01,"window_seconds":0.128,"loss_scale":1,"skipped_steps":0}

{"step":30,"epoch":0,"loss":2.1,"samples_per_second":16000,"comm_seconds":0.01,)"
    R"("exposed_comm_seconds":0.005,"window_seconds":0.08,"loss_scale":1,"skipped_steps":0}
)";

TEST(ParseTrainMetrics, ReadsTheTrainersRecords) {
  auto w = ParseTrainMetrics(kTrainerMetrics);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->size(), 4u);
  EXPECT_EQ((*w)[0].step, 1);
  EXPECT_DOUBLE_EQ((*w)[1].samples_per_second, 9000);
  EXPECT_DOUBLE_EQ((*w)[2].comm_seconds, 0.03);
  EXPECT_DOUBLE_EQ((*w)[3].exposed_comm_seconds, 0.005);
  EXPECT_DOUBLE_EQ((*w)[3].window_seconds, 0.08);
}

TEST(ParseTrainMetrics, CommFieldsAreOptionalOthersAreNot) {
  auto peer = ParseTrainMetrics(R"({"step":10,"samples_per_second":5,"window_seconds":1})");
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_LT((*peer)[0].comm_seconds, 0);
  auto null_comm = ParseTrainMetrics(
      R"({"step":10,"samples_per_second":5,"window_seconds":1,"comm_seconds":null})");
  ASSERT_TRUE(null_comm.ok());
  EXPECT_LT((*null_comm)[0].comm_seconds, 0);

  auto missing = ParseTrainMetrics("{\"step\":1,\"window_seconds\":1}\n{\"step\":2}");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "line 1"));
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "samples_per_second"));
  auto bad = ParseTrainMetrics(R"({"step":1,"samples_per_second":"x","window_seconds":1})");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "samples_per_second"));
}

TEST(SummarizeWindows, SkipsWarmUpAndTakesMedians) {
  auto w = ParseTrainMetrics(kTrainerMetrics);
  ASSERT_TRUE(w.ok());
  auto s = SummarizeWindows(*w, 10);  // the windows ending at steps 20 and 30 count
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->windows, 2);
  EXPECT_EQ(s->steps, 20);
  EXPECT_DOUBLE_EQ(s->samples_per_second, 13000);
  EXPECT_DOUBLE_EQ(s->min_samples_per_second, 10000);
  EXPECT_DOUBLE_EQ(s->max_samples_per_second, 16000);
  EXPECT_DOUBLE_EQ(s->step_ms, (12.8 + 8.0) / 2);
  EXPECT_NEAR(s->comm_fraction, 0.04 / 0.208, 1e-12);
  EXPECT_NEAR(s->exposed_comm_fraction, 0.015 / 0.208, 1e-12);
  EXPECT_NEAR(s->comm_ms, 1000 * 0.04 / 20, 1e-9);  // per step, over the 20 counted steps
  EXPECT_NEAR(s->exposed_comm_ms, 1000 * 0.015 / 20, 1e-9);

  // Step 1's window is one step, step 10's nine.
  auto all = SummarizeWindows(*w, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->windows, 4);
  EXPECT_EQ(all->steps, 30);
  EXPECT_DOUBLE_EQ(all->samples_per_second, 9500);

  EXPECT_EQ(SummarizeWindows(*w, 30).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SummarizeWindows, PoolsRunsAndLeavesUnreportedCommOut) {
  // Two runs of the peer one after the other: the second starts again at step 1.
  auto w = ParseTrainMetrics(
      "{\"step\":1,\"samples_per_second\":1,\"window_seconds\":1}\n"
      "{\"step\":5,\"samples_per_second\":100,\"window_seconds\":0.4}\n"
      "{\"step\":1,\"samples_per_second\":1,\"window_seconds\":1}\n"
      "{\"step\":5,\"samples_per_second\":300,\"window_seconds\":0.2}\n");
  ASSERT_TRUE(w.ok());
  auto s = SummarizeWindows(*w, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->windows, 2);
  EXPECT_EQ(s->steps, 8);
  EXPECT_DOUBLE_EQ(s->samples_per_second, 200);
  EXPECT_DOUBLE_EQ(s->step_ms, (100 + 50) / 2.0);
  EXPECT_LT(s->comm_fraction, 0);
  EXPECT_LT(s->exposed_comm_fraction, 0);
  EXPECT_LT(s->comm_ms, 0);
  EXPECT_LT(s->exposed_comm_ms, 0);
}

TEST(ThreadsPerRank, SharesTheCoresAtLeastOne) {
  EXPECT_EQ(ThreadsPerRank(2, 1), 2);
  EXPECT_EQ(ThreadsPerRank(2, 2), 1);
  EXPECT_EQ(ThreadsPerRank(2, 4), 1);
  EXPECT_EQ(ThreadsPerRank(16, 4), 4);
}

TEST(DescribeMlp, InputsHiddenClasses) {
  EXPECT_EQ(DescribeMlp({512, 512}), "784-512-512-10");
  EXPECT_EQ(DescribeMlp({1024, 1024, 1024, 1024}), "784-1024-1024-1024-1024-10");
}

TEST(BenchRowsToCsv, OneLinePerRowUnknownsEmpty) {
  BenchRow ours;
  ours.section = "throughput";
  ours.impl = "ringmaster";
  ours.config.world = 2;
  ours.stats.samples_per_second = 25000;
  ours.stats.comm_fraction = 0.25;
  ours.stats.exposed_comm_fraction = 0.1;
  ours.ratio = 1.5;
  ours.efficiency = 0.8;
  BenchRow peer = ours;
  peer.impl = "pytorch";
  peer.stats.comm_fraction = peer.stats.exposed_comm_fraction = -1;
  peer.ratio = -1;
  const std::string csv = BenchRowsToCsv({ours, peer});
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  const size_t columns = std::vector<std::string>(absl::StrSplit(lines[0], ',')).size();
  for (const std::string& line : lines) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(line, ',')).size(), columns) << line;
  }
  EXPECT_TRUE(absl::StartsWith(lines[1], "throughput,ringmaster,784-512-512-10,2,"));
  EXPECT_TRUE(absl::StrContains(lines[1], ",true,25,")) << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[1], ",0.2500,0.1000,1.5000,0.8000,,")) << lines[1];
  // The peer has no overlap or bucket setting and no comm figures.
  EXPECT_TRUE(absl::StrContains(lines[2], ",200,,,,")) << lines[2];
  EXPECT_TRUE(absl::StrContains(lines[2], ",,,0.8000,,")) << lines[2];
}

TEST(RunRingmaster, MissingRingctlIsAPreconditionNamingTheBuild) {
  RingmasterOptions o;
  o.ringctl = "/nonexistent/ringctl";
  o.work_dir = "/tmp";
  auto r = RunRingmaster(o, TrainConfig{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "bazel build //cli:ringctl"));
}

TEST(OpenWorkDir, MakesATemporaryOneOrTheOneAskedFor) {
  auto own = OpenWorkDir("", "trainbench_test");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(own->own);
  EXPECT_TRUE(absl::StartsWith(own->path, "/tmp/trainbench_test-")) << own->path;
  EXPECT_EQ(access(own->path.c_str(), W_OK), 0);
  const std::string asked = own->path + "/a/b";
  auto given = OpenWorkDir(asked, "trainbench_test");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_FALSE(given->own);  // a directory the user named is never removed
  EXPECT_EQ(given->path, asked);
  EXPECT_EQ(access(asked.c_str(), W_OK), 0);
  auto bad = OpenWorkDir("/proc/version/x", "trainbench_test");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--work_dir")) << bad.status();
  CloseWorkDir(*given, /*keep=*/false);
  EXPECT_EQ(access(asked.c_str(), F_OK), 0);
  CloseWorkDir(*own, /*keep=*/false);
  EXPECT_NE(access(own->path.c_str(), F_OK), 0);
}

TEST(RunTorch, MissingPythonNamesTheInstallCommand) {
  TorchOptions o;
  o.python = "/nonexistent/python3";
  o.script = "/proc/self/exe";  // readable; the missing interpreter is what is reported
  o.work_dir = "/tmp";
  auto r = RunTorch(o, TrainConfig{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), kTorchInstallCommand));
}

// A file of `bytes` bytes in the test's temporary directory.
std::string TextFile(const std::string& name, size_t bytes) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  FILE* f = fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  fwrite(std::string(bytes, 'a').data(), 1, bytes, f);
  fclose(f);
  return path;
}

TEST(CheckGptFlags, NamesTheFlagThatIsWrong) {
  GptShape shape;
  shape.text = TextFile("gpt_text", 4097);  // 16 windows of 257 bytes at context 256
  EXPECT_TRUE(CheckGptFlags(shape, 8, 30, 5, 5, 2).ok());
  struct Case {
    const char* flag;
    GptShape shape;
    int64_t batch = 8, steps = 30;
    int max_world = 2;
  };
  std::vector<Case> cases;
  for (const char* flag : {"gpt_layers", "gpt_width", "gpt_heads", "gpt_context"}) {
    Case c{flag, shape};
    if (std::string(flag) == "gpt_layers") c.shape.layers = 0;
    if (std::string(flag) == "gpt_width") c.shape.width = -1;
    if (std::string(flag) == "gpt_heads") c.shape.heads = 0;
    if (std::string(flag) == "gpt_context") c.shape.context = 0;
    cases.push_back(c);
  }
  Case heads{"gpt_heads", shape};
  heads.shape.heads = 3;  // does not divide 256
  cases.push_back(heads);
  cases.push_back(Case{"gpt_batch", shape, 0});
  cases.push_back(Case{"gpt_steps", shape, 8, 9});  // 5 warm-up + 5 a window = 10
  Case missing{"gpt_text", shape};
  missing.shape.text = "/nonexistent/text";
  cases.push_back(missing);
  cases.push_back(Case{"gpt_text", shape, 8, 30, 3});  // 24 windows needed, 16 there
  for (const Case& c : cases) {
    absl::Status s = CheckGptFlags(c.shape, c.batch, c.steps, 5, 5, c.max_world);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_TRUE(absl::StartsWith(s.message(), std::string("--") + c.flag + ":")) << s;
  }
}

TEST(RingmasterJob, TheGptSpecHasTheSectionsModelDataAndOptimizer) {
  RingmasterOptions o;
  TrainConfig c;
  c.model = "gpt";
  c.gpt = GptShape{3, 96, 6, 64, "/some/text"};
  c.world = 2;
  c.threads = 1;
  c.batch_per_rank = 5;
  c.steps = 17;
  c.log_every = 4;
  c.lr = 0.002;
  LocalJobOptions job = RingmasterJob(o, c);
  EXPECT_EQ(job.world, 2);
  auto spec = spec::LoadJobSpecText(job.spec_yaml, job.overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->model().has_gpt()) << job.spec_yaml;
  ASSERT_TRUE(spec->data().has_text());
  EXPECT_EQ(spec->model().gpt().layers(), 3);
  EXPECT_EQ(spec->model().gpt().width(), 96);
  EXPECT_EQ(spec->model().gpt().heads(), 6);
  EXPECT_EQ(spec->model().gpt().context(), 64);
  EXPECT_EQ(spec->model().gpt().vocab(), 256);
  EXPECT_EQ(spec->data().text().path(), "/some/text");
  EXPECT_EQ(spec->batch().global(), 10);
  EXPECT_EQ(spec->steps(), 17);
  EXPECT_EQ(spec->parallelism().threads(), 1);
  EXPECT_EQ(spec->diagnostics().log_every(), 4);
  ASSERT_TRUE(spec->optimizer().has_adamw());
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.002);
  EXPECT_DOUBLE_EQ(spec->optimizer().adamw().beta2(), 0.95);
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(spec->optimizer().clip_grad_norm(), 1.0);
  EXPECT_EQ(spec->precision().compute(), PrecisionSpec::DTYPE_FP32);

  // The MLP's job is still the MLP on Fashion-MNIST.
  TrainConfig mlp;
  auto mlp_spec =
      spec::LoadJobSpecText(RingmasterJob(o, mlp).spec_yaml, RingmasterJob(o, mlp).overrides);
  ASSERT_TRUE(mlp_spec.ok()) << mlp_spec.status();
  EXPECT_TRUE(mlp_spec->model().has_mlp());
  EXPECT_TRUE(mlp_spec->data().has_fashion_mnist());
}

TEST(TorchCommand, TheGptPeerGetsTheSameModelAndOptimizer) {
  TorchOptions o;
  o.script = "mlp.py";
  o.gpt_script = "gpt.py";
  TrainConfig c;
  c.gpt = GptShape{3, 96, 6, 64, "/some/text"};
  c.world = 2;
  c.batch_per_rank = 5;
  c.lr = 0.002;
  const std::vector<std::string> argv = TorchCommand(o, c, "/d");
  ASSERT_FALSE(argv.empty());
  EXPECT_EQ(argv[0], "gpt.py");
  const std::string line = absl::StrJoin(argv, " ");
  for (const char* arg :
       {"--world=2", "--batch=5", "--layers=3", "--width=96", "--heads=6", "--context=64",
        "--text=/some/text", "--lr=0.002", "--beta1=0.9", "--beta2=0.95", "--weight_decay=0.1",
        "--clip_grad_norm=1", "--metrics=/d/metrics.jsonl"}) {
    EXPECT_TRUE(absl::StrContains(line, arg)) << arg << " not in " << line;
  }
  EXPECT_FALSE(absl::StrContains(line, "--hidden")) << line;
  c.gpt.reset();
  EXPECT_EQ(TorchCommand(o, c, "/d")[0], "mlp.py");
}

TEST(RingmasterJob, TheResnetSpecHasTheSectionsModel) {
  RingmasterOptions o;
  o.data_dir = "/images";
  TrainConfig c;
  c.model = "resnet18";
  c.resnet = ResnetShape{16, true};
  c.world = 2;
  c.batch_per_rank = 4;
  auto spec = spec::LoadJobSpecText(RingmasterJob(o, c).spec_yaml, RingmasterJob(o, c).overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->model().has_resnet18());
  EXPECT_EQ(spec->model().resnet18().width(), 16);
  EXPECT_TRUE(spec->model().resnet18().sync_batchnorm());
  EXPECT_EQ(spec->data().fashion_mnist().dir(), "/images");
  EXPECT_EQ(spec->batch().global(), 8);
  EXPECT_EQ(DescribeModel(c), "resnet18-w16-syncbn");
}

TEST(TorchCommand, TheResnetPeerTrainsTheSameWidth) {
  TorchOptions o;
  o.script = "mlp.py";
  o.resnet_script = "resnet.py";
  TrainConfig c;
  c.resnet = ResnetShape{16, false};
  c.world = 4;
  c.batch_per_rank = 3;
  const std::vector<std::string> argv = TorchCommand(o, c, "/d");
  ASSERT_GE(argv.size(), 2u);
  EXPECT_EQ(argv[0], "resnet.py");
  EXPECT_EQ(argv[1], "train");
  const std::string line = absl::StrJoin(argv, " ");
  for (const char* arg :
       {"--world=4", "--batch=3", "--width=16", "--mkldnn=on", "--store=/d/store"}) {
    EXPECT_TRUE(absl::StrContains(line, arg)) << arg << " not in " << line;
  }
}

TEST(MakeShortTestSplitDir, LinksTheTrainingSplitAndWritesSmallTestFiles) {
  const std::string work = absl::StrCat(std::getenv("TEST_TMPDIR"), "/short");
  ASSERT_EQ(mkdir(work.c_str(), 0755), 0);
  absl::StatusOr<std::string> dir = MakeShortTestSplitDir("/the/data", work, 3);
  ASSERT_TRUE(dir.ok()) << dir.status();
  char target[64] = {};
  ASSERT_GT(readlink((*dir + "/train-images-idx3-ubyte.gz").c_str(), target, sizeof(target) - 1),
            0);
  EXPECT_EQ(std::string(target), "/the/data/train-images-idx3-ubyte.gz");
  absl::StatusOr<std::string> images = ReadFile(*dir + "/t10k-images-idx3-ubyte.gz");
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 16u + 3 * 784);
  EXPECT_EQ(images->substr(0, 16), std::string("\0\0\x08\x03\0\0\0\x03\0\0\0\x1c\0\0\0\x1c", 16));
  absl::StatusOr<std::string> labels = ReadFile(*dir + "/t10k-labels-idx1-ubyte.gz");
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, std::string("\0\0\x08\x01\0\0\0\x03\0\0\0", 11));
}

TEST(DescribeModel, MlpOrGptWithoutCommas) {
  TrainConfig c;
  EXPECT_EQ(DescribeModel(c), "784-512-512-10");
  c.gpt = GptShape{};
  EXPECT_EQ(DescribeModel(c), "gpt-6x256-4h-ctx256");
}

TEST(GptGoalLine, PassMissAndWhyNotChecked) {
  GptGoal goal;
  goal.world = 1;
  goal.ours_tokens_per_second = 5000;
  goal.torch_tokens_per_second = 2400;
  goal.ours_parameters = goal.torch_parameters = 4935680;
  EXPECT_EQ(GptGoalLine(goal),
            "goal: >= 2x PyTorch at world 1: PASS (2.08x: 5000 vs 2400 tokens/s)");
  goal.world = 2;
  goal.torch_tokens_per_second = 2600;
  EXPECT_EQ(GptGoalLine(goal),
            "goal: >= 2x PyTorch DDP at world 2: MISS (1.92x: 5000 vs 2600 tokens/s)");
  goal.torch_tokens_per_second = 2500;  // exactly 2x passes
  EXPECT_TRUE(absl::StrContains(GptGoalLine(goal), ": PASS (2.00x")) << GptGoalLine(goal);
  goal.torch_parameters = 4935681;
  EXPECT_TRUE(absl::StrContains(GptGoalLine(goal),
                                "not checked (ringmaster has 4935680 "
                                "parameters, PyTorch 4935681"))
      << GptGoalLine(goal);
  goal.torch_tokens_per_second = -1;
  EXPECT_EQ(GptGoalLine(goal),
            "goal: >= 2x PyTorch DDP at world 2: not checked (PyTorch not measured at world 2)");
  goal.ours_tokens_per_second = -1;
  EXPECT_TRUE(absl::StrContains(GptGoalLine(goal), "(ours not measured")) << GptGoalLine(goal);
  // The resnet section's: samples/s, two decimals below 100.
  goal.target = 1.3;
  goal.unit = "samples/s";
  goal.ours_tokens_per_second = 14.14;
  goal.torch_tokens_per_second = 10;
  goal.torch_parameters = goal.ours_parameters;
  EXPECT_EQ(GptGoalLine(goal),
            "goal: >= 1.3x PyTorch DDP at world 2: PASS (1.41x: 14.14 vs 10.00 samples/s)");
}

}  // namespace
}  // namespace ringmaster::bench
