#include "cli/estimate.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "train/memory_plan.h"

namespace ringmaster::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

nlohmann::json Document(const EstimateSpecFlags& flags) {
  absl::StatusOr<std::string> text = EstimateSpecMemory(flags, OutputFormat::kJson);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? nlohmann::json::parse(*text) : nlohmann::json();
}

std::string TempFile(const std::string& name, const std::string& contents) {
  const char* dir = getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  EXPECT_TRUE(WriteFileAtomically(path, contents).ok());
  return path;
}

// The example GPT on 4 ranks: a row per configuration; the sharded stages divide the
// parameters, gradients and optimizer state by the ranks, ZeRO-2 keeps a whole compute copy,
// and every row has the same measured activations.
TEST(EstimateSpecMemory, EveryStageAndWrappingOfTheExampleGpt) {
  const nlohmann::json doc = Document({.spec_file = "examples/tiny_gpt.yaml", .world = 4});
  EXPECT_EQ(doc["job"], "tiny_gpt");
  EXPECT_EQ(doc["world"], 4);
  EXPECT_EQ(doc["precision"], "bf16");
  EXPECT_EQ(doc["optimizer"], "adamw");
  EXPECT_THAT(doc["batch"].get<std::string>(), HasSubstr("W=4"));
  const nlohmann::json& rows = doc["per_rank"];
  std::vector<std::string> names;
  for (const nlohmann::json& r : rows) {
    names.push_back(r["configuration"]);
    EXPECT_EQ(r["total_bytes"].get<int64_t>(),
              r["parameter_bytes"].get<int64_t>() + r["compute_copy_bytes"].get<int64_t>() +
                  r["gradient_bytes"].get<int64_t>() + r["optimizer_bytes"].get<int64_t>() +
                  r["unit_buffer_bytes"].get<int64_t>() + r["activation_bytes"].get<int64_t>());
    EXPECT_EQ(r["activation_bytes"], rows[0]["activation_bytes"]);
  }
  EXPECT_THAT(names, ElementsAre("ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3 layer", "ZeRO-3 block",
                                 "ZeRO-3 model"));
  const double parameters = doc["parameters"].get<double>();
  const double whole = rows[0]["parameter_bytes"].get<double>();
  EXPECT_NEAR(whole, 4 * parameters, 0.01 * 4 * parameters);
  EXPECT_EQ(rows[0]["compute_copy_bytes"].get<double>(), whole);  // bf16: the rounded copy
  EXPECT_EQ(rows[0]["optimizer_bytes"].get<double>(), 2 * rows[0]["gradient_bytes"].get<double>());
  EXPECT_NEAR(rows[1]["optimizer_bytes"].get<double>(), whole / 2, 64);  // 2 moments / 4
  for (int r = 2; r < 6; ++r) {
    EXPECT_NEAR(rows[r]["gradient_bytes"].get<double>(), whole / 4, 0.01 * whole) << r;
  }
  for (int r = 3; r < 6; ++r) {
    EXPECT_NEAR(rows[r]["parameter_bytes"].get<double>(), whole / 4, 0.01 * whole) << r;
    EXPECT_EQ(rows[r]["compute_copy_bytes"], 0) << r;
    EXPECT_EQ(rows[r]["wrap"], std::vector<std::string>({"layer", "block", "model"})[r - 3]);
  }
  EXPECT_GE(rows[2]["compute_copy_bytes"].get<double>(), 4 * parameters);
  // The whole model as one unit gathers it whole: more buffers than a block at a time.
  EXPECT_GT(rows[5]["unit_buffer_bytes"].get<double>(), rows[4]["unit_buffer_bytes"].get<double>());
  EXPECT_GT(rows[0]["activation_bytes"].get<double>(), 0);
  EXPECT_EQ(rows[0]["activation_method"], "computed");
}

TEST(EstimateSpecMemory, TheTableForPeople) {
  absl::StatusOr<std::string> text =
      EstimateSpecMemory({.spec_file = "examples/fashion_mnist_mlp.yaml", .world = 2},
                         OutputFormat::kTable);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("fashion_mnist_mlp: mlp 784-512-512-10 (669706 parameters) on 2"));
  EXPECT_THAT(*text, HasSubstr("PER RANK (MiB)   PARAMETERS   GRADIENTS   OPTIMIZER   "
                               "UNIT BUFFERS   ACTIVATIONS   TOTAL"));
  EXPECT_THAT(*text, HasSubstr("\nZeRO-3 block "));
  EXPECT_THAT(*text, HasSubstr("fp32, sgd with momentum; B=512 W=2"));
  // Which figures came from where: an MLP's activations are measured; the unit buffers
  // are planned for the device the trainer would take (auto: the CPU in the default build, the
  // emulated GPU under --config=cudaemu).
  EXPECT_THAT(*text, HasSubstr("ACTIVATIONS: measured on one micro-batch."));
  const bool gpu = train::PlannedDevice(train::TrainConfig()) == train::TrainConfig::Device::kCuda;
  EXPECT_THAT(*text, HasSubstr(absl::StrCat("unit buffers for ", gpu ? "GPU" : "CPU",
                                            " ranks (device auto, as the trainer")));
  const absl::StatusOr<std::string> gpt = EstimateSpecMemory(
      {.spec_file = "examples/tiny_gpt.yaml", .world = 2}, OutputFormat::kTable);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_THAT(*gpt, HasSubstr("ACTIVATIONS: computed from the GPT's buffer sizes"));
}

// A job with a mesh: a row per (pp, tp) coordinate, each with its stages' share; the first
// pipeline rank holds more micro-batches in flight under 1F1B than the last.
TEST(EstimateSpecMemory, AMeshGetsARowPerCoordinate) {
  const nlohmann::json doc = Document(
      {.spec_file = "examples/tiny_gpt.yaml",
       .overrides = {"parallelism.mesh.pp=2", "parallelism.mesh.tp=2", "precision.compute=fp32"},
       .world = 4});
  const nlohmann::json& rows = doc["per_rank"];
  ASSERT_EQ(rows.size(), 4u) << doc.dump();
  const nlohmann::json whole = Document(
      {.spec_file = "examples/tiny_gpt.yaml", .overrides = {"precision.compute=fp32"}, .world = 1});
  const double parameters = whole["per_rank"][0]["parameter_bytes"].get<double>();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(rows[r]["pp_rank"], r / 2);
    EXPECT_EQ(rows[r]["tp_rank"], r % 2);
    // A quarter of the model, and a little more: replicated LayerNorms, biases, embeddings.
    EXPECT_GT(rows[r]["parameter_bytes"].get<double>(), parameters / 4);
    EXPECT_LT(rows[r]["parameter_bytes"].get<double>(), parameters / 2);
    EXPECT_GT(rows[r]["activation_bytes"].get<double>(), 0);
  }
  EXPECT_EQ(rows[0]["peak_in_flight"], 2);
  EXPECT_EQ(rows[2]["peak_in_flight"], 1);
  const absl::StatusOr<std::string> text = EstimateSpecMemory(
      {.spec_file = "examples/tiny_gpt.yaml", .overrides = {"parallelism.mesh.pp=2"}, .world = 4},
      OutputFormat::kTable);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("mesh pp 2 x dp 2 x tp 1; 1f1b over 2 stage-rank(s), 4 "
                               "micro-batches; ZeRO-0 along dp"));
  EXPECT_THAT(*text, HasSubstr("\npp 1 tp 0 "));
  // ZeRO-3 over tensor-parallel shards: the unit buffers' column, each rank a dp-th of its
  // shard's parameters.
  const absl::StatusOr<std::string> zero3 =
      EstimateSpecMemory({.spec_file = "examples/tiny_gpt.yaml",
                          .overrides = {"parallelism.mesh.tp=2", "parallelism.zero_stage=3"},
                          .world = 4},
                         OutputFormat::kTable);
  ASSERT_TRUE(zero3.ok()) << zero3.status();
  EXPECT_THAT(*zero3, HasSubstr("each tensor-parallel shard fully sharded along dp (ZeRO-3"));
  EXPECT_THAT(*zero3, HasSubstr("UNIT BUFFERS"));
}

// Without --world, the spec's smallest world (elastic.min_ranks, 1 by default); --set
// changes the spec as for submit.
TEST(EstimateSpecMemory, DefaultWorldAndOverrides) {
  EXPECT_EQ(Document({.spec_file = "examples/fashion_mnist_mlp.yaml"})["world"], 1);
  EXPECT_EQ(Document({.spec_file = "examples/fashion_mnist_mlp.yaml",
                      .overrides = {"elastic.min_ranks=3", "elastic.max_ranks=3"}})["world"],
            3);
  const nlohmann::json both = Document({.spec_file = "examples/tiny_gpt.yaml", .world = 2});
  const nlohmann::json none =
      Document({.spec_file = "examples/tiny_gpt.yaml",
                .overrides = {"parallelism.zero_stage=3", "parallelism.fsdp.prefetch=none"},
                .world = 2});
  // ZeRO-3 block: no all-gather ahead, so two fewer unit buffers (one gathered, one reduced).
  EXPECT_LT(none["per_rank"][4]["unit_buffer_bytes"].get<double>(),
            both["per_rank"][4]["unit_buffer_bytes"].get<double>());
  EXPECT_EQ(none["per_rank"][0], both["per_rank"][0]);
}

TEST(EstimateSpecMemory, ErrorsNameTheFileAndTheField) {
  absl::Status s = EstimateSpecMemory({.spec_file = "/nonexistent/job.yaml", .world = 2},
                                      OutputFormat::kTable)
                       .status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--spec /nonexistent/job.yaml: "));

  const std::string bad = TempFile("bad.yaml", "name: x\nmodel: [1, 2\n");
  s = EstimateSpecMemory({.spec_file = bad, .world = 2}, OutputFormat::kTable).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("--spec ", bad, ": ")));
  EXPECT_THAT(s.message(), HasSubstr("bad.yaml:"));

  // More micro-batches than a rank has samples.
  s = EstimateSpecMemory({.spec_file = "examples/tiny_gpt.yaml",
                          .overrides = {"batch.micro_max=0", "batch.accumulation=32"},
                          .world = 4},
                         OutputFormat::kTable)
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("batch.accumulation"));
}

TEST(FormatMemoryPlans, ColumnsInMiBAndTheDocumentInBytes) {
  EstimateHeading h{.job = "j", .model = "m", .parameters = 10, .world = 2, .precision = "fp32",
                    .optimizer = "adamw", .batch = "b", .strategies = "s"};
  train::RankMemoryPlan p;
  p.world = 2;
  p.zero_stage = 3;
  p.wrap = train::FsdpConfig::Wrap::kLayer;
  p.parameter_bytes = 1 << 20;
  p.gradient_bytes = 2 << 20;
  p.optimizer_bytes = 3 << 20;
  p.unit_buffer_bytes = 1 << 19;
  p.activation_bytes = 1 << 18;
  const std::string table = FormatMemoryPlans(h, {p}, OutputFormat::kTable);
  EXPECT_THAT(table, HasSubstr("j: m (10 parameters) on 2 rank(s)\nfp32, adamw; b\ns\n"));
  EXPECT_THAT(table, HasSubstr("ZeRO-3 layer     1.00         2.00        3.00        0.50"
                               "           0.25          6.75\n"));
  const nlohmann::json doc = nlohmann::json::parse(FormatMemoryPlans(h, {p}, OutputFormat::kJson));
  EXPECT_EQ(doc["per_rank"][0]["total_bytes"], (6 << 20) + (3 << 18));
  EXPECT_EQ(doc["per_rank"][0]["wrap"], "layer");
  EXPECT_THAT(FormatMemoryPlans(h, {p}, OutputFormat::kYaml), HasSubstr("configuration: ZeRO-3 layer"));
}

}  // namespace
}  // namespace ringmaster::cli
