#include "checkpoint/weights.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/testing.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kLayers = 2, kWidth = 8, kVocab = 11, kContext = 5;

// A GPT's table as train/nn/gpt.h lays it out; `head`: untied (model.gpt) or tied (gpt2).
state::TensorTable GptTable(bool head, int64_t width = kWidth, int64_t context = kContext) {
  state::TensorTable t;
  const int64_t c = width;
  t.Add("wte", {kVocab, c});
  t.Add("wpe", {context, c});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string h = absl::StrCat("h", l, ".");
    t.Add(h + "ln1.weight", {c});
    t.Add(h + "ln1.bias", {c});
    t.Add(h + "attn.qkv.weight", {3 * c, c});
    t.Add(h + "attn.qkv.bias", {3 * c});
    t.Add(h + "attn.proj.weight", {c, c});
    t.Add(h + "attn.proj.bias", {c});
    t.Add(h + "ln2.weight", {c});
    t.Add(h + "ln2.bias", {c});
    t.Add(h + "mlp.fc.weight", {4 * c, c});
    t.Add(h + "mlp.fc.bias", {4 * c});
    t.Add(h + "mlp.proj.weight", {c, 4 * c});
    t.Add(h + "mlp.proj.bias", {c});
  }
  t.Add("lnf.weight", {c});
  t.Add("lnf.bias", {c});
  if (head) t.Add("lm_head.weight", {kVocab, c});
  return t;
}

// Distinct values per element (padding 0), from a formula.
std::vector<float> Pattern(const state::TensorTable& table, float salt = 0) {
  std::vector<float> p(table.total_elements(), 0.0f);
  for (const state::TensorSpec& t : table.tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) p[t.offset + i] = 0.001f * (t.offset + i) - 0.5f + salt;
  }
  return p;
}

// Loads `path` into a fresh flat space of `table`.
absl::StatusOr<std::vector<float>> Load(const std::string& path, const state::TensorTable& table) {
  std::vector<float> out(table.total_elements(), 0.0f);
  std::vector<int> seen;
  absl::Status s = ReadWeights(path, table, [&](int i, absl::Span<const float> v) {
    const state::TensorSpec& t = table.tensor(i);
    if (static_cast<int64_t>(v.size()) != t.numel) return absl::InternalError("size");
    std::copy(v.begin(), v.end(), out.begin() + t.offset);
    seen.push_back(i);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  if (static_cast<int>(seen.size()) != table.size()) return absl::InternalError("not every tensor");
  return out;
}

absl::Status Export(const state::TensorTable& table, const std::vector<float>& params,
                    const std::string& path, const std::vector<SafetensorsTensor>& extra = {},
                    const std::string& prefix = "") {
  auto tensors = Gpt2Tensors(table, params);
  if (!tensors.ok()) return tensors.status();
  for (SafetensorsTensor& t : *tensors) t.name = prefix + t.name;
  tensors->insert(tensors->end(), extra.begin(), extra.end());
  return WriteSafetensors(path, *tensors, {});
}

SafetensorsTensor Constant(const std::string& name, std::vector<int64_t> shape, float value) {
  return {name, std::move(shape), [value](absl::Span<float> out) {
            std::fill(out.begin(), out.end(), value);
            return absl::OkStatus();
          }};
}

std::vector<float> ReadTensor(const std::string& path, const std::string& name) {
  auto r = SafetensorsReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status();
  const SafetensorsEntry* e = (*r)->Find(name);
  EXPECT_NE(e, nullptr) << name;
  std::vector<float> v(e->numel());
  EXPECT_TRUE((*r)->ReadFloats(*e, absl::MakeSpan(v)).ok());
  return v;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(Gpt2Names, EveryGptTensorHasItsGpt2NameAndLayout) {
  struct Want {
    const char* ours;
    const char* theirs;
    bool transposed;
  };
  for (const Want& w : std::vector<Want>{{"wte", "wte.weight", false},
                                         {"wpe", "wpe.weight", false},
                                         {"h0.ln1.weight", "h.0.ln_1.weight", false},
                                         {"h11.ln1.bias", "h.11.ln_1.bias", false},
                                         {"h3.attn.qkv.weight", "h.3.attn.c_attn.weight", true},
                                         {"h3.attn.qkv.bias", "h.3.attn.c_attn.bias", false},
                                         {"h3.attn.proj.weight", "h.3.attn.c_proj.weight", true},
                                         {"h3.attn.proj.bias", "h.3.attn.c_proj.bias", false},
                                         {"h3.ln2.weight", "h.3.ln_2.weight", false},
                                         {"h3.mlp.fc.weight", "h.3.mlp.c_fc.weight", true},
                                         {"h3.mlp.fc.bias", "h.3.mlp.c_fc.bias", false},
                                         {"h3.mlp.proj.weight", "h.3.mlp.c_proj.weight", true},
                                         {"h3.mlp.proj.bias", "h.3.mlp.c_proj.bias", false},
                                         {"lnf.weight", "ln_f.weight", false},
                                         {"lnf.bias", "ln_f.bias", false},
                                         {"lm_head.weight", "lm_head.weight", false}}) {
    auto t = Gpt2TensorFor(w.ours);
    ASSERT_TRUE(t.ok()) << w.ours << ": " << t.status();
    EXPECT_EQ(t->name, w.theirs);
    EXPECT_EQ(t->transposed, w.transposed) << w.ours;
  }
  for (const char* bad : {"fc1.weight", "h.0.ln1.weight", "hx.ln1.weight", "h0.ln1.gain",
                          "h0.attn.qkv", "lnf", "wte.weight"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(Gpt2TensorFor(bad).status())) << bad;
  }
}

TEST(Gpt2Weights, ImportThenExportIsBitExact) {
  const std::string dir = testing::FreshDir("weights_round_trip");
  for (bool head : {true, false}) {
    const state::TensorTable table = GptTable(head);
    const std::vector<float> params = Pattern(table);
    const std::string a = absl::StrCat(dir, "/a", head, ".safetensors");
    const std::string b = absl::StrCat(dir, "/b", head, ".safetensors");
    ASSERT_TRUE(Export(table, params, a).ok());
    auto loaded = Load(a, table);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(BitEqual(*loaded, params)) << "head " << head;
    ASSERT_TRUE(Export(table, *loaded, b).ok());
    EXPECT_EQ(*ReadFile(a), *ReadFile(b)) << "head " << head;
    // The file holds lm_head only for the untied model.
    auto r = SafetensorsReader::Open(a);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)->Find("lm_head.weight") != nullptr, head);
    EXPECT_EQ((*r)->tensors().size(), static_cast<size_t>(table.size()));
  }
}

// Conv1D's [in, out]: element [i][o] of c_attn.weight is row o, column i of our qkv weight.
TEST(Gpt2Weights, LinearWeightsAreStoredTransposed) {
  const std::string dir = testing::FreshDir("weights_transposed");
  const state::TensorTable table = GptTable(true);
  const std::vector<float> params = Pattern(table);
  ASSERT_TRUE(Export(table, params, dir + "/m.safetensors").ok());
  auto r = SafetensorsReader::Open(dir + "/m.safetensors");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Find("h.1.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{kWidth, 3 * kWidth}));
  EXPECT_EQ((*r)->Find("h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{4 * kWidth, kWidth}));
  const std::vector<float> c_attn = ReadTensor(dir + "/m.safetensors", "h.1.attn.c_attn.weight");
  const state::TensorSpec& qkv = table.tensor(*table.Find("h1.attn.qkv.weight"));
  for (int64_t i = 0; i < kWidth; ++i) {
    for (int64_t o = 0; o < 3 * kWidth; ++o) {
      ASSERT_EQ(c_attn[i * 3 * kWidth + o], params[qkv.offset + o * kWidth + i]) << i << " " << o;
    }
  }
  const std::vector<float> wte = ReadTensor(dir + "/m.safetensors", "wte.weight");
  const state::TensorSpec& ours = table.tensor(*table.Find("wte"));
  EXPECT_TRUE(BitEqual(wte, std::vector<float>(params.begin() + ours.offset,
                                               params.begin() + ours.offset + ours.numel)));
}

// A GPT2LMHeadModel's save: "transformer." names, the attention masks, a head tied to wte.
TEST(Gpt2Weights, ReadsHuggingFaceFilesWithPrefixMasksAndTiedHead) {
  const std::string dir = testing::FreshDir("weights_hf");
  const state::TensorTable tied = GptTable(false);
  const std::vector<float> params = Pattern(tied);
  const state::TensorSpec& wte = tied.tensor(*tied.Find("wte"));
  const std::vector<float> wte_values(params.begin() + wte.offset,
                                      params.begin() + wte.offset + wte.numel);
  std::vector<SafetensorsTensor> extra;
  for (int l = 0; l < kLayers; ++l) {
    extra.push_back(
        Constant(absl::StrCat("transformer.h.", l, ".attn.bias"), {1, 1, kContext, kContext}, 1));
    extra.push_back(Constant(absl::StrCat("transformer.h.", l, ".attn.masked_bias"), {}, -1e4f));
  }
  extra.push_back({"lm_head.weight", {kVocab, kWidth}, [&](absl::Span<float> out) {
                     std::copy(wte_values.begin(), wte_values.end(), out.begin());
                     return absl::OkStatus();
                   }});
  const std::string path = dir + "/hf.safetensors";
  ASSERT_TRUE(Export(tied, params, path, extra, "transformer.").ok());
  auto loaded = Load(path, tied);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(BitEqual(*loaded, params));

  // A head that is not wte does not load into a tied model.
  extra.back().fill = [](absl::Span<float> out) {
    std::fill(out.begin(), out.end(), 0.5f);
    return absl::OkStatus();
  };
  ASSERT_TRUE(Export(tied, params, path, extra, "transformer.").ok());
  auto untied_head = Load(path, tied);
  EXPECT_TRUE(absl::IsFailedPrecondition(untied_head.status()));
  EXPECT_THAT(std::string(untied_head.status().message()),
              AllOf(HasSubstr(path), HasSubstr("lm_head.weight [11, 8] is not its wte.weight"),
                    HasSubstr("model.gpt2")));

  // A tied model's file (no lm_head) does not load into an untied model.
  ASSERT_TRUE(Export(tied, params, path).ok());
  auto no_head = Load(path, GptTable(true));
  EXPECT_TRUE(absl::IsFailedPrecondition(no_head.status()));
  EXPECT_THAT(std::string(no_head.status().message()),
              AllOf(HasSubstr(path), HasSubstr("has no tensor lm_head.weight"),
                    HasSubstr("loads into model.gpt2")));
}

TEST(Gpt2Weights, WrongShapesMissingAndUnknownTensorsAreNamed) {
  const std::string dir = testing::FreshDir("weights_errors");
  const state::TensorTable table = GptTable(true);
  const std::string path = dir + "/m.safetensors";

  // Another width: the first tensor that differs, with both shapes.
  const state::TensorTable wider = GptTable(true, 2 * kWidth);
  ASSERT_TRUE(Export(wider, Pattern(wider), path).ok());
  auto s = Load(path, table).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr("tensor wte.weight is [11, 16]"),
                    HasSubstr("ringmaster's wte [11, 8] needs [11, 8]")));

  // A transposed weight stored the wrong way round names the Conv1D layout.
  {
    auto tensors = Gpt2Tensors(table, Pattern(table));
    ASSERT_TRUE(tensors.ok());
    for (SafetensorsTensor& t : *tensors) {
      if (t.name == "h.0.mlp.c_fc.weight") t.shape = {4 * kWidth, kWidth};
    }
    ASSERT_TRUE(WriteSafetensors(path, *tensors, {}).ok());
    s = Load(path, table).status();
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("tensor h.0.mlp.c_fc.weight is [32, 8]"),
                      HasSubstr("ringmaster's h0.mlp.fc.weight [32, 8] needs [8, 32]"),
                      HasSubstr("Conv1D layout, [in, out]")));
  }
  // A missing tensor.
  {
    auto tensors = Gpt2Tensors(table, Pattern(table));
    ASSERT_TRUE(tensors.ok());
    tensors->erase(tensors->begin() + 5);  // h.0.attn.c_attn.bias
    ASSERT_TRUE(WriteSafetensors(path, *tensors, {}).ok());
    s = Load(path, table).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr(path), HasSubstr("has no tensor h.0.attn.c_attn.bias"),
                      HasSubstr("ringmaster's h0.attn.qkv.bias [24]")));
  }
  // More layers than the model: the extra tensors are named.
  ASSERT_TRUE(Export(table, Pattern(table), path, {Constant("h.2.ln_1.weight", {kWidth}, 1)}).ok());
  s = Load(path, table).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr("1 tensor(s) this model does not have: "
                                               "h.2.ln_1.weight [8]")));
  ASSERT_TRUE(Export(table, Pattern(table), path).ok());
  // A model that is not a GPT cannot read GPT-2's names.
  s = Load(path, testing::TestTable(1)).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr("embed is not one of a GPT's"),
                    HasSubstr("a ringmaster checkpoint directory loads into any model")));
  // Damage and absence are the reader's errors.
  EXPECT_TRUE(absl::IsNotFound(Load(dir + "/absent.safetensors", table).status()));
  auto bytes = ReadFile(path);
  ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, bytes->size() - 7)).ok());
  s = Load(path, table).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr("tensor \"wte.weight\""), HasSubstr("truncated")));
}

// GPT-2's 1024 positions into a model with a shorter context: the first ones.
TEST(Gpt2Weights, AShorterContextTakesTheFirstPositions) {
  const std::string dir = testing::FreshDir("weights_context");
  const state::TensorTable longer = GptTable(true, kWidth, 2 * kContext);
  const std::vector<float> params = Pattern(longer);
  ASSERT_TRUE(Export(longer, params, dir + "/m.safetensors").ok());
  const state::TensorTable table = GptTable(true);
  std::vector<float> out(table.total_elements(), 0.0f);
  std::string said;
  ASSERT_TRUE(ReadWeights(
                  dir + "/m.safetensors", table,
                  [&](int i, absl::Span<const float> v) {
                    std::copy(v.begin(), v.end(), out.begin() + table.tensor(i).offset);
                    return absl::OkStatus();
                  },
                  Env::Default(), [&](const std::string& line) { said = line; })
                  .ok());
  EXPECT_THAT(said, HasSubstr("wpe.weight: the first 5 of its 10 positions"));
  for (const state::TensorSpec& t : table.tensors()) {
    const state::TensorSpec& from = longer.tensor(*longer.Find(t.name));
    EXPECT_TRUE(std::equal(out.begin() + t.offset, out.begin() + t.offset + t.numel,
                           params.begin() + from.offset))
        << t.name;
  }
  // Fewer positions than the context is a wrong shape.
  auto s = Load(dir + "/m.safetensors", GptTable(true, kWidth, 3 * kContext)).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor wpe.weight is [10, 8]; ringmaster's wpe [15, 8] needs [15, 8]"));
}

TEST(Gpt2Weights, ReadsFloat16AndBfloat16Files) {
  const std::string dir = testing::FreshDir("weights_bf16");
  const state::TensorTable table = GptTable(false);
  // Values exactly representable in bf16: the load gives them back exactly.
  std::vector<float> params = Pattern(table);
  for (float& v : params) v = Bfloat16ToFloat(FloatToBfloat16(v));
  auto tensors = Gpt2Tensors(table, params);
  ASSERT_TRUE(tensors.ok());
  SafetensorsWriteOptions o;
  o.dtype = SafetensorsWriteOptions::Dtype::kBF16;
  ASSERT_TRUE(WriteSafetensors(dir + "/m.safetensors", *tensors, o).ok());
  auto loaded = Load(dir + "/m.safetensors", table);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(BitEqual(*loaded, params));
}

// A checkpoint saved by 2 ranks: loaded by name, and exported.
TEST(CheckpointWeights, TwoRankCheckpointLoadsByNameAndExports) {
  const std::string root = testing::FreshDir("weights_checkpoint");
  const state::TensorTable table = GptTable(true);
  testing::WorldOptions w;
  w.root = root;
  w.table = &table;
  w.world = 2;
  w.zero_stage = 1;
  w.base.training_spec = "name: job\nmodel.gpt.layers: 2\nmodel.gpt.width: 8\n";
  for (const absl::Status& s : testing::SaveWorld(w, 7)) ASSERT_TRUE(s.ok()) << s;
  // The parameters as saved, from the pattern's formula.
  const int64_t elements = testing::PaddedElements(table, 2);
  const std::vector<float> saved =
      testing::PatternBuffer("params", 7, elements, table.total_elements());
  std::vector<float> want(table.total_elements(), 0.0f);
  for (const state::TensorSpec& t : table.tensors()) {
    std::copy(saved.begin() + t.offset, saved.begin() + t.offset + t.numel,
              want.begin() + t.offset);
  }
  const std::string job_dir = JobDir(root, "job");
  for (const std::string& dir : {job_dir, job_dir + "/" + StepDirName(7)}) {
    auto loaded = Load(dir, table);
    ASSERT_TRUE(loaded.ok()) << dir << ": " << loaded.status();
    EXPECT_TRUE(BitEqual(*loaded, want)) << dir;
  }
  // A tied model of the same size: the checkpoint's head is not its wte.
  auto tied = Load(job_dir, GptTable(false));
  EXPECT_TRUE(absl::IsFailedPrecondition(tied.status()));
  EXPECT_THAT(std::string(tied.status().message()),
              HasSubstr("lm_head.weight [11, 8] is not its wte"));
  // Another size names the tensor and both shapes.
  auto wider = Load(job_dir, GptTable(true, 2 * kWidth));
  EXPECT_THAT(std::string(wider.status().message()),
              AllOf(HasSubstr("step-7: tensor wte is [11, 8]"), HasSubstr("needs [11, 16]")));

  const std::string out = root + "/model.safetensors";
  auto report = ExportCheckpoint(job_dir, out, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->step, 7);
  EXPECT_EQ(report->model, "gpt");
  EXPECT_EQ(report->parameters, table.parameter_count());
  // The export is Gpt2Tensors of the saved parameters, byte for byte but the metadata; the
  // values come back exactly.
  auto back = Load(out, table);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(BitEqual(*back, want));
  auto r = SafetensorsReader::Open(out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  EXPECT_EQ((*r)->metadata().at("ringmaster.step"), "7");
}

TEST(CheckpointWeights, ExportRefusesOtherModels) {
  const std::string root = testing::FreshDir("weights_export_mlp");
  const state::TensorTable table = testing::TestTable(1);
  testing::WorldOptions w;
  w.root = root;
  w.table = &table;
  w.base.training_spec = "name: job\nmodel.mlp.hidden: [32]\n";
  for (const absl::Status& s : testing::SaveWorld(w, 3)) ASSERT_TRUE(s.ok()) << s;
  auto report = ExportCheckpoint(JobDir(root, "job"), root + "/x.safetensors", {});
  EXPECT_TRUE(absl::IsFailedPrecondition(report.status()));
  EXPECT_THAT(std::string(report.status().message()),
              AllOf(HasSubstr("a checkpoint of a model.mlp job"),
                    HasSubstr("for model.gpt and model.gpt2 only")));
  // Without a recorded spec, the tensor names tell.
  const std::string root2 = testing::FreshDir("weights_export_unknown");
  w.root = root2;
  w.base.training_spec = "";
  for (const absl::Status& s : testing::SaveWorld(w, 3)) ASSERT_TRUE(s.ok()) << s;
  report = ExportCheckpoint(JobDir(root2, "job"), root2 + "/x.safetensors", {});
  EXPECT_TRUE(absl::IsFailedPrecondition(report.status()));
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("embed is not a GPT tensor"));
  // Not a checkpoint at all.
  report = ExportCheckpoint(root2 + "/nothing", root2 + "/x.safetensors", {});
  EXPECT_TRUE(absl::IsNotFound(report.status())) << report.status();
}

}  // namespace
}  // namespace ringmaster::checkpoint
