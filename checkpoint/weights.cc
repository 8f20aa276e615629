#include "checkpoint/weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "common/status_macros.h"

namespace ringmaster::checkpoint {
namespace {

constexpr absl::string_view kPrefix = "transformer.";
constexpr absl::string_view kHead = "lm_head.weight";

// [rows, cols] row-major `from` into [cols, rows] `to`.
void Transpose(absl::Span<const float> from, int64_t rows, int64_t cols, absl::Span<float> to) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) to[c * rows + r] = from[r * cols + c];
  }
}

std::vector<int64_t> Gpt2Shape(const state::TensorSpec& t, bool transposed) {
  if (!transposed) return t.shape;
  return {t.shape[1], t.shape[0]};
}

// Whether `name` (prefix stripped) is one of the attention-mask buffers GPT-2 files carry.
bool IsAttentionMask(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "h.")) return false;
  const size_t dot = name.find('.');
  int64_t layer = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer))
    return false;
  const absl::string_view rest = name.substr(dot + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

// The model kind a checkpoint's recorded spec names ("gpt" for "model.gpt.layers: 4"); ""
// when it records none.
std::string ModelKind(const Manifest& manifest) {
  for (absl::string_view line : absl::StrSplit(manifest.training_spec(), '\n')) {
    if (!absl::ConsumePrefix(&line, "model.")) continue;
    return std::string(line.substr(0, line.find_first_of(".:")));
  }
  return "";
}

// A checkpoint's parameters, read tensor by tensor.
struct CheckpointParams {
  OpenedCheckpoint opened;
  state::TensorTable table;
};

absl::StatusOr<CheckpointParams> OpenParams(Env* env, const std::string& path) {
  CheckpointParams p;
  if (env->FileExists(absl::StrCat(path, "/", kManifestName)).ok()) {
    p.opened.dir = path;
  } else {
    absl::StatusOr<std::string> dir = ResolveCheckpointDir(env, path, std::nullopt);
    if (absl::IsNotFound(dir.status())) {
      return absl::NotFoundError(absl::StrCat(
          path, " is a directory but neither a checkpoint (no ", kManifestName,
          ") nor a job directory with committed checkpoints; give checkpoint.dir/<job> or one "
          "of its step-<N>"));
    }
    RM_RETURN_IF_ERROR(dir.status());
    p.opened.dir = *dir;
  }
  RM_ASSIGN_OR_RETURN(p.opened.manifest, ReadManifest(env, p.opened.dir));
  p.opened.state = FromProto(p.opened.manifest.training());
  if (p.opened.manifest.tensors().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(p.opened.dir,
                     " records no tensor table (written without one), so its parameters "
                     "cannot be read by tensor"));
  }
  for (const TensorEntry& t : p.opened.manifest.tensors()) {
    if (std::any_of(t.shape().begin(), t.shape().end(), [](int64_t d) { return d <= 0; })) {
      return absl::DataLossError(
          absl::StrCat(p.opened.dir, ": tensor ", t.name(), " has a non-positive dimension"));
    }
    if (p.table.Find(t.name()).ok()) {
      return absl::DataLossError(absl::StrCat(p.opened.dir, ": tensor ", t.name(), " twice"));
    }
    p.table.Add(t.name(), std::vector<int64_t>(t.shape().begin(), t.shape().end()));
  }
  // The offsets are the table's own (the layout rule), or the checkpoint is not ours.
  if (absl::Status s = CheckTensorTable(p.opened.manifest, p.table); !s.ok()) {
    return absl::DataLossError(absl::StrCat(p.opened.dir, ": ", s.message()));
  }
  return p;
}

absl::Status ReadParamsTensor(Env* env, const CheckpointParams& p, int index,
                              absl::Span<float> out) {
  const state::TensorSpec& t = p.table.tensor(index);
  LoadOptions lo;
  lo.env = env;
  const LoadTarget target{"params", {t.offset, t.offset + t.numel}, out};
  return ReadBuffers(lo, p.opened, {&target, 1}).status();
}

std::string Shape(absl::Span<const int64_t> shape) { return state::ShapeString(shape); }

// The common part of both sources: every table tensor found (by `find`), shaped as the
// table's, read (by `read`) and received; a head the table does not have checked against wte;
// every other source tensor refused.
struct Source {
  std::string what;  // "<path>" for messages
  // The source's tensors by the names the table's map to, with their shapes there.
  std::map<std::string, std::vector<int64_t>> shapes;
  // The source name of table tensor `name` and whether it is stored transposed.
  std::function<absl::StatusOr<Gpt2Tensor>(const std::string& name)> name_of;
  std::function<absl::Status(const std::string& source_name, absl::Span<float> out)> read;
  std::set<std::string> ignored;  // source tensors skipped on purpose
};

absl::Status LoadFrom(const Source& source, const state::TensorTable& table,
                      const WeightReceiver& receive, std::vector<std::string>* notes) {
  std::set<std::string> used;
  std::vector<float> raw, values;
  std::optional<std::string> wte_source;
  for (int i = 0; i < table.size(); ++i) {
    const state::TensorSpec& t = table.tensor(i);
    RM_ASSIGN_OR_RETURN(const Gpt2Tensor where, source.name_of(t.name));
    const std::vector<int64_t> want = Gpt2Shape(t, where.transposed);
    auto it = source.shapes.find(where.name);
    if (it == source.shapes.end()) {
      std::string hint;
      if (t.name == kHead) {
        hint =
            "; a model whose head is tied to wte (GPT-2's own files have no lm_head) loads "
            "into model.gpt2";
      }
      return absl::FailedPreconditionError(
          absl::StrCat(source.what, " has no tensor ", where.name, " (ringmaster's ", t.name, " ",
                       Shape(t.shape), ", wanted as ", Shape(want), ")", hint));
    }
    // Position embeddings for more positions than the model's context: the model uses the
    // first ones, and computes for its positions what the longer one would (causal).
    const bool fewer_positions = t.name == "wpe" && it->second.size() == 2 &&
                                 it->second[1] == want[1] && it->second[0] > want[0];
    if (fewer_positions) {
      notes->push_back(absl::StrCat(where.name, ": the first ", want[0], " of its ", it->second[0],
                                    " positions"));
    }
    if (it->second != want && !fewer_positions) {
      return absl::FailedPreconditionError(
          absl::StrCat(source.what, ": tensor ", where.name, " is ", Shape(it->second),
                       "; ringmaster's ", t.name, " ", Shape(t.shape), " needs ", Shape(want),
                       where.transposed ? " there (GPT-2's Conv1D layout, [in, out])" : " there"));
    }
    used.insert(where.name);
    if (t.name == "wte") wte_source = where.name;
    raw.resize(fewer_positions ? it->second[0] * it->second[1] : t.numel);
    RM_RETURN_IF_ERROR(source.read(where.name, absl::MakeSpan(raw)));
    if (where.transposed) {
      values.resize(t.numel);
      Transpose(raw, t.shape[1], t.shape[0], absl::MakeSpan(values));
      RM_RETURN_IF_ERROR(receive(i, values));
    } else {
      RM_RETURN_IF_ERROR(receive(i, absl::MakeConstSpan(raw).first(t.numel)));
    }
  }
  std::vector<std::string> unknown;
  for (const auto& [name, shape] : source.shapes) {
    if (used.count(name) || source.ignored.count(name)) continue;
    if (name == kHead && !table.Find(kHead).ok() && wte_source) {
      // A tied model saved with its head: only the same values as wte.
      const std::vector<int64_t>& wte_shape = source.shapes.at(*wte_source);
      bool same = shape == wte_shape;
      if (same) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        raw.resize(n);
        values.resize(n);
        RM_RETURN_IF_ERROR(source.read(name, absl::MakeSpan(raw)));
        RM_RETURN_IF_ERROR(source.read(*wte_source, absl::MakeSpan(values)));
        same = std::equal(raw.begin(), raw.end(), values.begin(),
                          [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; });
      }
      if (!same) {
        return absl::FailedPreconditionError(
            absl::StrCat(source.what, ": its ", kHead, " ", Shape(shape), " is not its ",
                         *wte_source, " ", Shape(wte_shape),
                         ", and this model ties its head to wte (model.gpt2); a model with "
                         "its own head is model.gpt"));
      }
      continue;
    }
    unknown.push_back(absl::StrCat(name, " ", Shape(shape)));
  }
  if (!unknown.empty()) {
    const size_t shown = std::min<size_t>(unknown.size(), 5);
    return absl::FailedPreconditionError(absl::StrCat(
        source.what, " has ", unknown.size(), " tensor(s) this model does not have: ",
        absl::StrJoin(unknown.begin(), unknown.begin() + shown, ", "),
        unknown.size() > shown ? ", ..." : "", " (is it another model, or another size?)"));
  }
  return absl::OkStatus();
}

absl::Status ReadSafetensors(const std::string& path, const state::TensorTable& table,
                             const WeightReceiver& receive, Env* env,
                             const std::function<void(const std::string&)>& say) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> file, SafetensorsReader::Open(path, env));
  Source source;
  source.what = path;
  std::map<std::string, const SafetensorsEntry*> by_name;  // prefix stripped
  for (const SafetensorsEntry& e : file->tensors()) {
    absl::string_view name = e.name;
    absl::ConsumePrefix(&name, kPrefix);
    if (!by_name.emplace(std::string(name), &e).second) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " has both ", name, " and ", kPrefix, name, "; which one is meant?"));
    }
    source.shapes[std::string(name)] = e.shape;
    if (IsAttentionMask(name)) source.ignored.insert(std::string(name));
  }
  source.name_of = [&](const std::string& name) -> absl::StatusOr<Gpt2Tensor> {
    absl::StatusOr<Gpt2Tensor> t = Gpt2TensorFor(name);
    if (!t.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("init from ", path,
                       ": a safetensors file is read as GPT-2's tensors, and this "
                       "model's tensor ",
                       name, " is not one of a GPT's (", t.status().message(),
                       "); a ringmaster checkpoint directory loads into any model"));
    }
    return t;
  };
  std::map<std::string, std::string> dtypes;
  source.read = [&](const std::string& name, absl::Span<float> out) {
    dtypes[name] = by_name.at(name)->dtype;
    return file->ReadFloats(*by_name.at(name), out);
  };
  std::vector<std::string> notes;
  RM_RETURN_IF_ERROR(LoadFrom(source, table, receive, &notes));
  if (say) {
    std::set<std::string> kinds;
    for (const auto& [unused, dtype] : dtypes) kinds.insert(dtype);
    say(absl::StrFormat("read %d tensors (%d parameters, %s) from %s%s", table.size(),
                        table.parameter_count(), absl::StrJoin(kinds, "/"), path,
                        notes.empty() ? "" : absl::StrCat("; ", absl::StrJoin(notes, "; "))));
  }
  return absl::OkStatus();
}

absl::Status ReadCheckpoint(const std::string& path, const state::TensorTable& table,
                            const WeightReceiver& receive, Env* env,
                            const std::function<void(const std::string&)>& say) {
  RM_ASSIGN_OR_RETURN(CheckpointParams p, OpenParams(env, path));
  Source source;
  source.what = p.opened.dir;
  for (const state::TensorSpec& t : p.table.tensors()) source.shapes[t.name] = t.shape;
  source.name_of = [](const std::string& name) -> absl::StatusOr<Gpt2Tensor> {
    return Gpt2Tensor{name, false};
  };
  source.read = [&](const std::string& name, absl::Span<float> out) {
    return ReadParamsTensor(env, p, *p.table.Find(name), out);
  };
  std::vector<std::string> notes;
  RM_RETURN_IF_ERROR(LoadFrom(source, table, receive, &notes));
  if (say) {
    say(absl::StrFormat(
        "read %d tensors (%d parameters) from the checkpoint %s (step %d of job %s)%s",
        table.size(), table.parameter_count(), p.opened.dir, p.opened.state.step,
        p.opened.manifest.job(),
        notes.empty() ? "" : absl::StrCat("; ", absl::StrJoin(notes, "; "))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Gpt2Tensor> Gpt2TensorFor(absl::string_view name) {
  auto not_gpt = [&] {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a GPT tensor"));
  };
  if (name == "wte" || name == "wpe") return Gpt2Tensor{absl::StrCat(name, ".weight"), false};
  if (name == kHead) return Gpt2Tensor{std::string(kHead), false};
  if (name == "lnf.weight" || name == "lnf.bias") {
    return Gpt2Tensor{absl::StrCat("ln_f", name.substr(3)), false};
  }
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "h")) return not_gpt();
  const size_t dot = rest.find('.');
  int64_t layer = 0;
  if (dot == absl::string_view::npos || dot == 0 ||
      !std::all_of(rest.begin(), rest.begin() + dot, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(rest.substr(0, dot), &layer)) {
    return not_gpt();
  }
  rest = rest.substr(dot + 1);
  static constexpr std::pair<absl::string_view, absl::string_view> kLayers[] = {
      {"ln1", "ln_1"},
      {"ln2", "ln_2"},
      {"attn.qkv", "attn.c_attn"},
      {"attn.proj", "attn.c_proj"},
      {"mlp.fc", "mlp.c_fc"},
      {"mlp.proj", "mlp.c_proj"}};
  for (const auto& [ours, theirs] : kLayers) {
    absl::string_view param = rest;
    if (!absl::ConsumePrefix(&param, ours) || !absl::ConsumePrefix(&param, ".")) continue;
    if (param != "weight" && param != "bias") return not_gpt();
    const bool linear = !absl::StartsWith(ours, "ln");
    return Gpt2Tensor{absl::StrCat("h.", layer, ".", theirs, ".", param),
                      linear && param == "weight"};
  }
  return not_gpt();
}

absl::StatusOr<std::vector<SafetensorsTensor>> Gpt2Tensors(const state::TensorTable& table,
                                                           absl::Span<const float> params) {
  if (static_cast<int64_t>(params.size()) < table.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gpt2Tensors: ", params.size(), " parameters for a table of ", table.total_elements()));
  }
  std::vector<SafetensorsTensor> out;
  for (const state::TensorSpec& t : table.tensors()) {
    RM_ASSIGN_OR_RETURN(const Gpt2Tensor where, Gpt2TensorFor(t.name));
    const absl::Span<const float> values = params.subspan(t.offset, t.numel);
    const std::vector<int64_t> shape = t.shape;
    out.push_back({where.name, Gpt2Shape(t, where.transposed),
                   [values, shape, transposed = where.transposed](absl::Span<float> to) {
                     if (transposed) {
                       Transpose(values, shape[0], shape[1], to);
                     } else {
                       std::copy(values.begin(), values.end(), to.begin());
                     }
                     return absl::OkStatus();
                   }});
  }
  return out;
}

absl::Status ReadWeights(const std::string& path, const state::TensorTable& table,
                         const WeightReceiver& receive, Env* env,
                         const std::function<void(const std::string&)>& say) {
  if (env->IsDirectory(path).ok()) return ReadCheckpoint(path, table, receive, env, say);
  return ReadSafetensors(path, table, receive, env, say);
}

absl::StatusOr<ExportReport> ExportCheckpoint(const std::string& checkpoint_dir,
                                              const std::string& out,
                                              const SafetensorsWriteOptions& options) {
  Env* env = options.env;
  if (absl::Status s = env->IsDirectory(checkpoint_dir); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(checkpoint_dir, ": not a checkpoint directory (", s.message(), ")"));
  }
  RM_ASSIGN_OR_RETURN(CheckpointParams p, OpenParams(env, checkpoint_dir));
  ExportReport report;
  report.checkpoint_dir = p.opened.dir;
  report.step = p.opened.state.step;
  report.model = ModelKind(p.opened.manifest);
  const bool gpt = report.model == "gpt" || report.model == "gpt2";
  if (!report.model.empty() && !gpt) {
    return absl::FailedPreconditionError(absl::StrCat(
        p.opened.dir, " is a checkpoint of a model.", report.model,
        " job; export writes GPT-2's safetensors layout, for model.gpt and model.gpt2 only"));
  }
  for (const state::TensorSpec& t : p.table.tensors()) {
    if (absl::Status s = Gpt2TensorFor(t.name).status(); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          p.opened.dir, ": ", s.message(),
          "; export writes GPT-2's safetensors layout, for model.gpt and model.gpt2 only"));
    }
  }
  // Each tensor is read from the checkpoint when the writer comes to it.
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < p.table.size(); ++i) {
    const state::TensorSpec& t = p.table.tensor(i);
    RM_ASSIGN_OR_RETURN(const Gpt2Tensor where, Gpt2TensorFor(t.name));
    tensors.push_back({where.name, Gpt2Shape(t, where.transposed),
                       [&, i, transposed = where.transposed](absl::Span<float> to) -> absl::Status {
                         const state::TensorSpec& t = p.table.tensor(i);
                         if (!transposed) return ReadParamsTensor(env, p, i, to);
                         std::vector<float> ours(t.numel);
                         RM_RETURN_IF_ERROR(ReadParamsTensor(env, p, i, absl::MakeSpan(ours)));
                         Transpose(ours, t.shape[0], t.shape[1], to);
                         return absl::OkStatus();
                       }});
    report.parameters += t.numel;
  }
  report.tensors = p.table.size();
  SafetensorsWriteOptions write = options;
  write.metadata.emplace("format", "pt");
  write.metadata.emplace("ringmaster.job", p.opened.manifest.job());
  write.metadata.emplace("ringmaster.step", absl::StrCat(report.step));
  if (!report.model.empty()) write.metadata.emplace("ringmaster.model", report.model);
  RM_RETURN_IF_ERROR(WriteSafetensors(out, tensors, write));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> written, env->NewRandomAccessFile(out));
  RM_ASSIGN_OR_RETURN(const uint64_t bytes, written->Size());
  report.bytes = static_cast<int64_t>(bytes);
  return report;
}

}  // namespace ringmaster::checkpoint
