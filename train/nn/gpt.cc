#include "train/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/precision.h"
#include "train/nn/random.h"
#include "train/nn/sequential.h"

namespace ringmaster::train::nn {
namespace {

using kernels::OutputMode;

constexpr float kInitStd = 0.02f;

// A block's tensors, in table order from its first.
enum BlockTensor : int {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kProjWeight,
  kProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kFcProjWeight,
  kFcProjBias,
  kBlockTensors,
};

absl::Status CheckPositive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; want > 0"));
}

// Uniform in (0, 1]: 53 random bits, so that the log below is finite.
double UnitInterval(SplitMix64& rng) {
  return static_cast<double>((rng.Next() >> 11) + 1) * 0x1p-53;
}

// Fills `out` with normal(0, std) values, in order: Box–Muller on pairs of uniforms from
// `rng`, both values of a pair used, computed in double and rounded to float (so that the
// last-bit differences between platforms' log, cos and sin almost never show).
void FillNormal(SplitMix64& rng, double std, absl::Span<float> out) {
  for (size_t i = 0; i < out.size(); i += 2) {
    const double radius = std * std::sqrt(-2 * std::log(UnitInterval(rng)));
    const double angle = 2 * std::numbers::pi * UnitInterval(rng);
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

// A pipeline stage's slice trains through the Slice* calls.
absl::Status CheckWhole(const GptModel& model) {
  if (model.is_whole()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", model.Describe(),
      "' is a pipeline stage's slice: run it with SliceForward/SliceBackward (GptStage)"));
}

}  // namespace

// Where backward writes one group's parameter gradients (the LM head, lnf, a layer of a
// block, the embeddings) and how they are finished, as in SequentialClassifier: straight
// into `grads` (overwriting, or adding in fp32), rounded there in place under half
// precision; or, under half precision with accumulate, into a stage whose rounded values
// are then added; or, with a ParameterStore, into the store's buffer for the group.
class GptModel::GradWriter {
 public:
  GradWriter(const GptModel& model, const ForwardBackwardOptions& options, float* grads,
             float* stage)
      : model_(model),
        table_(model.table_),
        options_(options),
        grads_(grads),
        stage_(stage),
        half_(IsHalf(options.precision)),
        staged_(half_ && options.accumulate) {}

  // Starts the group of tensors [first, end) (a parameter group of the model).
  void Begin(int first, int end) {
    first_ = first;
    end_ = end;
    base_ = options_.store != nullptr ? options_.store->Gradients(model_.group_of_tensor_[first])
                                      : grads_;
  }
  // For kernels that take an OutputMode.
  OutputMode mode() const {
    return options_.accumulate && !half_ ? OutputMode::kAccumulate : OutputMode::kOverwrite;
  }
  float* operator[](int tensor) const {
    DCHECK(tensor >= first_ && tensor < end_);
    const int64_t offset = table_.tensor(tensor).offset;
    return staged_ ? stage_ + (offset - table_.tensor(first_).offset) : base_ + offset;
  }
  // For kernels that always add (LayerNorm, embedding): the target, zeroed unless the
  // gradient is to be added to `grads` in fp32.
  float* Summed(int tensor) const {
    float* target = (*this)[tensor];
    if (mode() == OutputMode::kOverwrite) std::fill_n(target, table_.tensor(tensor).numel, 0.0f);
    return target;
  }
  // The group's gradients are final: rounds them (or adds the rounded stage) and announces
  // them. The group's parameters must not be read after this.
  void Finish() {
    if (half_) {
      for (int i = first_; i < end_; ++i) {
        const state::TensorSpec& t = table_.tensor(i);
        float* sum = base_ + t.offset;
        if (staged_) {
          kernels::AddRounded(HalfFormatOf(options_.precision), (*this)[i], sum, t.numel);
        } else {
          kernels::RoundTo(HalfFormatOf(options_.precision), sum, sum, t.numel);
        }
      }
    }
    if (options_.store != nullptr) options_.store->GradientsDone(model_.group_of_tensor_[first_]);
    if (options_.on_grads_ready) options_.on_grads_ready(table_.tensor(first_).offset);
  }

 private:
  const GptModel& model_;
  const state::TensorTable& table_;
  const ForwardBackwardOptions& options_;
  float* grads_;
  float* stage_;
  bool half_;
  bool staged_;
  int first_ = 0;
  int end_ = 0;
  float* base_ = nullptr;
};

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptOptions& o) {
  RM_RETURN_IF_ERROR(CheckPositive("gpt.layers", o.layers));
  RM_RETURN_IF_ERROR(CheckPositive("gpt.heads", o.heads));
  RM_RETURN_IF_ERROR(CheckPositive("gpt.width", o.width));
  RM_RETURN_IF_ERROR(CheckPositive("gpt.context", o.context));
  RM_RETURN_IF_ERROR(CheckPositive("gpt.vocab", o.vocab));
  if (o.width % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt.heads is ", o.heads, "; want a divisor of gpt.width (", o.width, ")"));
  }
  if (o.vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt.vocab is ", o.vocab, "; token ids are int32, want at most 2^31 - 1"));
  }
  if (o.checkpoint_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt.checkpoint_every is ", o.checkpoint_every,
                                                   "; want >= 0 (0 = no checkpointing)"));
  }
  if (o.tp_size < 1 || o.heads % o.tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt tp_size is ", o.tp_size, "; want a divisor of gpt.heads (", o.heads,
                     "): each tensor-parallel rank computes whole heads"));
  }
  if (o.tp_rank < 0 || o.tp_rank >= o.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt tp_rank is ", o.tp_rank, "; want 0 <= tp_rank < tp_size (", o.tp_size, ")"));
  }
  const int64_t end = o.end_block == -1 ? o.layers : o.end_block;
  if (o.first_block < 0 || o.first_block >= o.layers || end <= o.first_block || end > o.layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt slice [first_block ", o.first_block, ", end_block ", o.end_block, ") of ", o.layers,
        " layers; want 0 <= first_block < end_block <= layers (end_block -1: to the last)"));
  }
  return absl::WrapUnique(new GptModel(o));
}

GptModel::GptModel(const GptOptions& o)
    : options_(o),
      first_block_(o.first_block),
      end_block_(o.end_block == -1 ? o.layers : o.end_block),
      segment_(o.checkpoint_every == 0 ? end_block_ - first_block_
                                       : std::min(o.checkpoint_every, end_block_ - first_block_)),
      segments_((end_block_ - first_block_ + segment_ - 1) / segment_),
      loss_(o.vocab) {
  options_.end_block = end_block_;
  description_ = absl::StrCat("gpt ", o.layers, " layers x ", o.heads, " heads x ", o.width,
                              " wide, context ", o.context, ", vocab ", o.vocab);
  if (!is_whole()) {
    absl::StrAppend(&description_, ", pipeline stage of blocks ", first_block_, "..",
                    end_block_ - 1, has_embeddings() ? " with the embeddings" : "",
                    has_head() ? " with the head" : "");
  }
  if (o.checkpoint_every > 0) {
    absl::StrAppend(&description_, ", checkpointing every ", o.checkpoint_every, " blocks");
  }
  if (!o.memory_efficient_attention) {
    absl::StrAppend(&description_, ", attention keeping probabilities");
  }
  if (o.tied_head) {
    absl::StrAppend(&description_, ", LM head tied to wte");
    if (has_head() && !has_embeddings()) absl::StrAppend(&description_, " (a copy of it)");
  }

  const int64_t c = o.width;
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(o.layers));
  const int64_t t = o.tp_size, r = o.tp_rank;
  attn_width_ = c / t;
  heads_local_ = o.heads / t;
  hidden_ = 4 * c / t;
  if (t > 1) {
    absl::StrAppend(&description_, ", tensor-parallel rank ", r, " of ", t);
  }
  // The tensor-parallel shards: rows [lo, hi) of each of `blocks` equal row blocks of a
  // [rows, cols] tensor, or its columns [lo, hi).
  auto rows_of = [&](int64_t rows, int64_t cols, int64_t blocks) {
    TensorShard sh{{}, 0, cols, rows, cols};
    const int64_t per = rows / blocks;
    for (int64_t b = 0; b < blocks; ++b) {
      sh.row_ranges.push_back({b * per + r * per / t, b * per + (r + 1) * per / t});
    }
    return sh;
  };
  auto cols_of = [&](int64_t rows, int64_t cols) {
    return TensorShard{{{0, rows}}, r * cols / t, (r + 1) * cols / t, rows, cols};
  };
  // Column-parallel (rows of W and b, in `blocks` row blocks: Q, K, V) and row-parallel
  // (columns of W, the bias whole) linear layers.
  auto column_parallel = [&](const std::string& name, int64_t in, int64_t out, int64_t blocks) {
    AddTensor(name + ".weight", {out, in}, kInitStd, 0, rows_of(out, in, blocks));
    AddTensor(name + ".bias", {out}, 0, 0, rows_of(out, 1, blocks));
  };
  auto row_parallel = [&](const std::string& name, int64_t in, int64_t out) {
    AddTensor(name + ".weight", {out, in}, residual_std, 0, cols_of(out, in));
    AddTensor(name + ".bias", {out}, 0, 0);
  };
  auto layer_norm = [&](const std::string& name) {
    AddTensor(name + ".weight", {c}, 0, 1);
    AddTensor(name + ".bias", {c}, 0, 0);
  };
  // The whole model's tensors in order; a slice keeps its own (AddTensor with `keep_`).
  // A tied head's last stage keeps its own copy of wte, first in its table.
  keep_ = has_embeddings() || (o.tied_head && has_head());
  wte_ = AddTensor("wte", {o.vocab, c}, kInitStd, 0);
  keep_ = has_embeddings();
  wpe_ = AddTensor("wpe", {o.context, c}, kInitStd, 0);
  for (int64_t l = 0; l < o.layers; ++l) {
    keep_ = l >= first_block_ && l < end_block_;
    const std::string h = absl::StrCat("h", l, ".");
    if (keep_) blocks_.push_back(table_.size());
    layer_norm(h + "ln1");
    column_parallel(h + "attn.qkv", c, 3 * c, 3);
    row_parallel(h + "attn.proj", c, c);
    layer_norm(h + "ln2");
    column_parallel(h + "mlp.fc", c, 4 * c, 1);
    row_parallel(h + "mlp.proj", 4 * c, c);
    if (keep_) CHECK_EQ(table_.size() - blocks_.back(), kBlockTensors);
  }
  keep_ = has_head();
  lnf_ = table_.size();
  layer_norm("lnf");
  lm_head_ = o.tied_head ? wte_ : AddTensor("lm_head.weight", {o.vocab, c}, kInitStd, 0);
  keep_ = true;

  // Backward reads no group's parameters once it has asked for its gradient buffer (the
  // input gradient comes first; LayerNorm's sums wait in a scratch), and writes every
  // gradient: gradients_over_parameters, but for a tied wte, which the head reads again.
  auto group = [&](const std::string& name, int first, int end, int block,
                   const std::string& block_name) {
    groups_.push_back({name, first, end, block, block_name});
    groups_.back().gradients_over_parameters = true;
  };
  const int head_block = static_cast<int>(o.layers + 1);
  if (has_embeddings()) {
    group("embeddings", wte_, wpe_ + 1, 0, "embeddings");
    // Only the tied head's backward reads wte (the embedding makes no input gradient).
    groups_.back().backward_reads_parameters = head_is_wte();
    groups_.back().read_again_by_head = head_is_wte();
    groups_.back().gradients_over_parameters = !head_is_wte();
  } else if (o.tied_head && has_head()) {
    group("wte (the tied head's copy)", wte_, wte_ + 1, head_block, "head");
    groups_.back().gradients_over_parameters = false;
  }
  static constexpr const char* kLayers[] = {"ln1", "attn.qkv", "attn.proj",
                                            "ln2", "mlp.fc",   "mlp.proj"};
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t l = first_block_ + static_cast<int64_t>(i);
    const std::string h = absl::StrCat("h", l);
    for (int k = 0; k < kBlockTensors / 2; ++k) {
      const int first = blocks_[i] + 2 * k;
      group(absl::StrCat(h, ".", kLayers[k]), first, first + 2, static_cast<int>(l + 1), h);
    }
  }
  if (has_head()) {
    group("lnf", lnf_, lnf_ + 2, head_block, "head");
    if (!o.tied_head) group("lm_head", lm_head_, lm_head_ + 1, head_block, "head");
  }
  group_of_tensor_.resize(table_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int i = groups_[g].first_tensor; i < groups_[g].end_tensor; ++i) {
      group_of_tensor_[i] = static_cast<int>(g);
    }
  }
  auto span = [&](int first, int end) {
    const state::TensorSpec& last = table_.tensor(end - 1);
    return last.offset + last.numel - table_.tensor(first).offset;
  };
  largest_group_ = 0;
  for (const ParameterGroup& g : groups_) {
    largest_group_ = std::max(largest_group_, span(g.first_tensor, g.end_tensor));
  }
  slots_.resize(segment_);
  streams_.resize(segments_ + segment_);
}

int GptModel::AddTensor(const std::string& name, std::vector<int64_t> shape, float std, float value,
                        std::optional<TensorShard> shard) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  if (!shard) shard = TensorShard{{{0, rows}}, 0, cols, rows, cols};
  std::vector<int64_t> local = shape;
  if (!shard->whole()) {
    int64_t local_rows = 0;
    for (const auto& [lo, hi] : shard->row_ranges) local_rows += hi - lo;
    local[0] = local_rows;
    if (local.size() > 1) local[1] = shard->col_end - shard->col_begin;
  }
  const int index = keep_ ? table_.Add(name, std::move(local)) : -1;
  if (index >= 0) shards_.push_back(*shard);
  init_.push_back({numel, {std, value}, index});
  return index;
}

std::string GptModel::Describe() const { return description_; }

void GptModel::InitTensors(uint64_t seed, const TensorSink& sink) const {
  SplitMix64 rng(seed);
  std::vector<float> values;
  for (const InitEntry& e : init_) {
    if (e.tensor < 0) {
      // Another stage's tensor: its draws (two uniforms per pair of values) are skipped.
      if (e.rule.std > 0) {
        for (int64_t i = 0; i < (e.numel + 1) / 2 * 2; ++i) rng.Next();
      }
      continue;
    }
    values.resize(e.numel);
    if (e.rule.std > 0) {
      FillNormal(rng, e.rule.std, absl::MakeSpan(values));
    } else {
      std::fill(values.begin(), values.end(), e.rule.value);
    }
    const TensorShard& sh = shards_[e.tensor];
    if (sh.whole()) {
      sink(e.tensor, values);
      continue;
    }
    std::vector<float> part;  // this tensor-parallel rank's rows and columns of it
    for (const auto& [lo, hi] : sh.row_ranges) {
      for (int64_t row = lo; row < hi; ++row) {
        const float* from = values.data() + row * sh.whole_cols;
        part.insert(part.end(), from + sh.col_begin, from + sh.col_end);
      }
    }
    sink(e.tensor, part);
  }
}

absl::Status GptModel::CheckBatch(const Batch& batch) const {
  if (batch.size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.size is ", batch.size, "; want at least 1 sample"));
  }
  if (batch.context != options_.context) {
    return absl::InvalidArgumentError(absl::StrCat("batch.context is ", batch.context, "; model '",
                                                   description_, "' reads ", options_.context,
                                                   " tokens per sample"));
  }
  const int64_t row = options_.context + 1;
  const int64_t ids = static_cast<int64_t>(batch.tokens.size());
  if (ids % row != 0 || ids / row != batch.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.tokens holds ", ids,
                     " ids; want batch.size * (context + 1) = ", batch.size, " * ", row));
  }
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= options_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("batch.tokens[", i, "] is ", batch.tokens[i],
                                                     "; want a token id in 0..",
                                                     options_.vocab - 1));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GptModel::Pass> GptModel::Prepare(const Batch& batch, absl::Span<const float> params,
                                                 Precision precision, ParameterStore* store,
                                                 bool rounded) {
  RM_RETURN_IF_ERROR(CheckBatch(batch));
  Pass pass{.params = store != nullptr ? nullptr : params.data(),
            .store = store,
            .precision = precision,
            .batch = batch.size,
            .rows = batch.size * options_.context};
  const int64_t elements = static_cast<int64_t>(params.size());
  if (store == nullptr) CHECK_GE(elements, table_.total_elements());
  if (store == nullptr && IsHalf(precision) && !rounded) {
    if (compute_params_.size() != elements) compute_params_ = state::FlatBuffer(elements);
    kernels::RoundTo(HalfFormatOf(precision), params.data(), compute_params_.data(), elements);
    pass.params = compute_params_.data();
  }
  PlaceActivations(pass.batch);
  int32_t* inputs = tokens_.Reserve(2 * pass.rows);
  int32_t* targets = inputs + pass.rows;
  const int64_t t = options_.context;
  for (int64_t b = 0; b < pass.batch; ++b) {
    const int32_t* sample = batch.tokens.data() + b * (t + 1);
    std::copy_n(sample, t, inputs + b * t);
    std::copy_n(sample + 1, t, targets + b * t);
  }
  attention_scratch_.Reserve(kernels::AttentionScratchFloats(t));
  return pass;
}

void GptModel::PlaceActivations(int64_t batch) {
  const int64_t rows = batch * options_.context, c = options_.width;
  const int64_t stats = options_.memory_efficient_attention
                            ? kernels::AttentionLseFloats(batch, options_.context, heads_local_)
                            : kernels::AttentionProbsFloats(batch, options_.context, heads_local_);
  float* base = nullptr;
  int64_t used = 0;
  // Measures the layout (base null), then assigns it.
  auto take = [&](int64_t n) {
    float* p = base == nullptr ? nullptr : base + used;
    used += (n + state::kAlignElements - 1) / state::kAlignElements * state::kAlignElements;
    return p;
  };
  auto place = [&] {
    for (float*& s : streams_) s = take(rows * c);
    for (BlockActivations& a : slots_) {
      a = {.ln1 = take(rows * c),
           .ln1_mean = take(rows),
           .ln1_rstd = take(rows),
           .qkv = take(rows * 3 * attn_width_),
           .attention = take(rows * attn_width_),
           .attention_stats = take(stats),
           .residual = take(rows * c),
           .ln2 = take(rows * c),
           .ln2_mean = take(rows),
           .ln2_rstd = take(rows),
           .fc = take(rows * hidden_),
           .gelu = take(rows * hidden_)};
    }
    if (has_head()) {
      lnf_out_ = take(rows * c);
      lnf_mean_ = take(rows);
      lnf_rstd_ = take(rows);
      logits_ = take(rows * options_.vocab);
    }
  };
  place();
  // ArenaFloats plans the same layout without a model's pass (train/memory_plan.h).
  CHECK_EQ(used, ArenaFloats(batch)) << "GptModel::ArenaFloats differs from the layout";
  base = arena_.Reserve(used);
  used = 0;
  place();
}

int64_t GptModel::ArenaFloats(int64_t batch) const {
  const int64_t rows = batch * options_.context, c = options_.width;
  const int64_t stats = options_.memory_efficient_attention
                            ? kernels::AttentionLseFloats(batch, options_.context, heads_local_)
                            : kernels::AttentionProbsFloats(batch, options_.context, heads_local_);
  auto aligned = [](int64_t n) {
    return (n + state::kAlignElements - 1) / state::kAlignElements * state::kAlignElements;
  };
  // PlaceActivations' buffers, in its order.
  const int64_t stream = aligned(rows * c);
  const int64_t slot = 3 * aligned(rows * c) + 4 * aligned(rows) + aligned(rows * 3 * attn_width_) +
                       aligned(rows * attn_width_) + aligned(stats) + 2 * aligned(rows * hidden_);
  int64_t floats =
      static_cast<int64_t>(streams_.size()) * stream + static_cast<int64_t>(slots_.size()) * slot;
  if (has_head()) floats += aligned(rows * c) + 2 * aligned(rows) + aligned(rows * options_.vocab);
  return floats;
}

int64_t GptModel::ActivationBytesFor(int64_t batch, ActivationRun run) const {
  const int64_t rows = batch * options_.context, c = options_.width;
  constexpr int64_t kFloat = sizeof(float), kInt = sizeof(int32_t);
  // What memory() sums after the pass: the arena, tokens_ (inputs and targets), the
  // attention's scratch, loss_'s per-token loss and prediction, dresidual_ and dsmall_,
  // dbig_, layer_norm_sums_ and, with a tied head, tied_grad_.
  int64_t bytes = ArenaFloats(batch) * kFloat + 2 * rows * kInt +
                  kernels::AttentionScratchFloats(options_.context) * kFloat;
  if (has_head()) bytes += rows * (kFloat + kInt);
  bytes += 2 * rows * c * kFloat;
  bytes += rows * std::max({hidden_, 3 * attn_width_, options_.vocab}) * kFloat;
  // ForwardBackward holds LayerNorm's sums whether or not it has a store; a slice's pass
  // sums them only into a store, which a pipeline stage does not have.
  if (run == ActivationRun::kForwardBackward) bytes += 2 * c * kFloat;
  if (head_is_wte()) bytes += options_.vocab * c * kFloat;
  if (run == ActivationRun::kSliceDeferringWeights) bytes += DeferredFloats(rows) * kFloat;
  return bytes;
}

int64_t GptModel::DeferredFloats(int64_t rows) const {
  // Each linear layer's output gradient, and with checkpointing its input too.
  const int64_t c = options_.width;
  const int64_t outs = c + hidden_ + c + 3 * attn_width_, ins = hidden_ + c + attn_width_ + c;
  int64_t per_row = static_cast<int64_t>(blocks_.size()) * (outs + (segments_ > 1 ? ins : 0));
  if (has_head()) per_row += options_.vocab + (segments_ > 1 ? c : 0);
  return rows * per_row;
}

float* GptModel::Stream(int64_t block) const {
  if (block == static_cast<int64_t>(blocks_.size())) return streams_.back();
  if (block % segment_ == 0) return streams_[block / segment_];
  return streams_[segments_ + block % segment_ - 1];
}

void GptModel::Forward(const Pass& pass) {
  EmbeddingsForward(pass);
  BlocksForward(pass);
  HeadForward(pass);
}

void GptModel::EmbeddingsForward(const Pass& pass) {
  float* x = Stream(0);
  kernels::EmbeddingForward(x, tokens_.data(), Tensor(pass, wte_), Tensor(pass, wpe_), pass.batch,
                            options_.context, options_.width, options_.vocab);
  RoundToPrecision(pass.precision, x, pass.rows * options_.width);
}

void GptModel::BlocksForward(const Pass& pass) {
  for (int64_t l = 0; l < static_cast<int64_t>(blocks_.size()); ++l) {
    BlockForward(pass, l);
    BlockOutputForward(pass, l);
  }
}

void GptModel::HeadForward(const Pass& pass) {
  const int64_t rows = pass.rows, c = options_.width;
  kernels::LayerNormForward(lnf_out_, lnf_mean_, lnf_rstd_, Stream(blocks_.size()),
                            Tensor(pass, lnf_), Tensor(pass, lnf_ + 1), rows, c);
  RoundToPrecision(pass.precision, lnf_out_, rows * c);
  kernels::LinearForward(lnf_out_, Tensor(pass, lm_head_), nullptr, logits_, rows, c,
                         options_.vocab);
  RoundToPrecision(pass.precision, logits_, rows * options_.vocab);
}

void GptModel::BlockForward(const Pass& pass, int64_t block) {
  const int64_t rows = pass.rows, c = options_.width;
  const int first = blocks_[block];
  auto w = [&](BlockTensor t) { return Tensor(pass, first + t); };
  const BlockActivations& a = Slot(block);
  const float* x = Stream(block);
  const Precision precision = pass.precision;

  kernels::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w(kLn1Weight), w(kLn1Bias), rows, c);
  RoundToPrecision(precision, a.ln1, rows * c);
  const int64_t ca = attn_width_;  // this tensor-parallel rank's heads' width
  kernels::LinearForward(a.ln1, w(kQkvWeight), w(kQkvBias), a.qkv, rows, c, 3 * ca);
  RoundToPrecision(precision, a.qkv, rows * 3 * ca);
  if (options_.memory_efficient_attention) {
    kernels::AttentionForwardLse(a.attention, a.attention_stats, a.qkv, attention_scratch_.data(),
                                 pass.batch, options_.context, ca, heads_local_);
  } else {
    kernels::AttentionForward(a.attention, a.attention_stats, a.qkv, pass.batch, options_.context,
                              ca, heads_local_);
  }
  RoundToPrecision(precision, a.attention, rows * ca);
  RowParallelForward(a.attention, w(kProjWeight), w(kProjBias), a.residual, rows, ca, c);
  RoundToPrecision(precision, a.residual, rows * c);
  kernels::ResidualForward(a.residual, a.residual, x, rows * c);
  RoundToPrecision(precision, a.residual, rows * c);
  kernels::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual, w(kLn2Weight), w(kLn2Bias),
                            rows, c);
  RoundToPrecision(precision, a.ln2, rows * c);
  kernels::LinearForward(a.ln2, w(kFcWeight), w(kFcBias), a.fc, rows, c, hidden_);
  RoundToPrecision(precision, a.fc, rows * hidden_);
  kernels::GeluForward(a.gelu, a.fc, rows * hidden_);
  RoundToPrecision(precision, a.gelu, rows * hidden_);
}

void GptModel::BlockOutputForward(const Pass& pass, int64_t block) {
  const int64_t rows = pass.rows, c = options_.width;
  const int first = blocks_[block];
  const BlockActivations& a = Slot(block);
  float* out = Stream(block + 1);
  RowParallelForward(a.gelu, Tensor(pass, first + kFcProjWeight), Tensor(pass, first + kFcProjBias),
                     out, rows, hidden_, c);
  RoundToPrecision(pass.precision, out, rows * c);
  kernels::ResidualForward(out, out, a.residual, rows * c);
  RoundToPrecision(pass.precision, out, rows * c);
}

absl::StatusOr<StepStats> GptModel::Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                             Precision precision, ParameterStore* store) {
  RM_RETURN_IF_ERROR(CheckWhole(*this));
  RM_ASSIGN_OR_RETURN(const Pass pass, Prepare(batch, params.span(), precision, store));
  Forward(pass);
  RM_RETURN_IF_ERROR(TakeTensorParallelError());
  return loss_.Forward(logits_, tokens_.data() + pass.rows, pass.rows);
}

absl::StatusOr<StepStats> GptModel::ForwardBackward(const Batch& batch,
                                                    const state::FlatBuffer& params,
                                                    state::FlatBuffer& grads,
                                                    const ForwardBackwardOptions& options) {
  RM_RETURN_IF_ERROR(CheckWhole(*this));
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  if (options.store != nullptr && options.accumulate) {
    return absl::InvalidArgumentError(
        "ForwardBackwardOptions: accumulate with a ParameterStore (the store sums micro-batches)");
  }
  RM_ASSIGN_OR_RETURN(const Pass pass,
                      Prepare(batch, params.span(), options.precision, options.store));
  if (options.store == nullptr) CHECK_GE(grads.size(), table_.total_elements());
  Forward(pass);
  if (options.store != nullptr) options.store->BeginBackward();

  const int64_t rows = pass.rows, c = options_.width;
  dresidual_.Reserve(rows * c);
  dsmall_.Reserve(rows * c);
  layer_norm_sums_.Reserve(2 * c);  // used with a store only; held alike with or without
  float* dlogits = dbig_.Reserve(rows * std::max({hidden_, 3 * attn_width_, options_.vocab}));
  const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
  const StepStats stats =
      loss_.ForwardBackward(logits_, tokens_.data() + rows, rows, scale, dlogits);
  RoundToPrecision(options.precision, dlogits, rows * options_.vocab);
  GradWriter writer(*this, options, grads.data(),
                    options.accumulate && IsHalf(options.precision)
                        ? staged_grads_.Reserve(largest_group_)
                        : nullptr);
  Backward(pass, writer);
  RM_RETURN_IF_ERROR(TakeTensorParallelError());
  return stats;
}

void GptModel::Backward(const Pass& pass, GradWriter& writer) {
  HeadBackward(pass, writer);
  BlocksBackward(pass, writer);
  EmbeddingsBackward(pass, writer);
}

void GptModel::HeadBackward(const Pass& pass, GradWriter& writer) {
  const int64_t rows = pass.rows, c = options_.width, vocab = options_.vocab;
  const Precision precision = pass.precision;
  float* dlogits = dbig_.data();
  float* dlnf = dsmall_.data();
  float* dx = dresidual_.data();

  // Each layer's input gradient first, then its weights' (gradients_over_parameters).
  kernels::LinearBackwardInput(dlogits, Tensor(pass, lm_head_), dlnf, rows, c, vocab);
  if (head_is_wte()) {
    // The head's part of wte's gradient, added to the embedding's by EmbeddingsBackward.
    kernels::LinearBackwardWeights(lnf_out_, dlogits, tied_grad_.Reserve(vocab * c), nullptr, rows,
                                   c, vocab, OutputMode::kOverwrite);
  } else {
    LinearWeights(writer, lm_head_, /*has_bias=*/false, lnf_out_, dlogits, rows, c, vocab);
  }
  RoundToPrecision(precision, dlnf, rows * c);
  if (!head_is_wte()) FinishLinear(writer);

  std::fill_n(dx, rows * c, 0.0f);
  LayerNormGradients(pass, writer, lnf_, dx, dlnf, Stream(blocks_.size()), lnf_mean_, lnf_rstd_,
                     rows);
  RoundToPrecision(precision, dx, rows * c);
  writer.Finish();
}

void GptModel::LayerNormGradients(const Pass& pass, GradWriter& writer, int gain, float* dx,
                                  const float* dy, const float* x, const float* mean,
                                  const float* rstd, int64_t rows) {
  const int64_t c = options_.width;
  if (pass.store == nullptr) {
    writer.Begin(gain, gain + 2);
    kernels::LayerNormBackward(dx, writer.Summed(gain), writer.Summed(gain + 1), dy, x,
                               Tensor(pass, gain), mean, rstd, rows, c);
    return;
  }
  // The store's buffer may be the gain's own memory, which the kernel reads: sum into a
  // scratch (as Summed's zeroed target would), then hand the sums over.
  float* sums = layer_norm_sums_.Reserve(2 * c);
  std::fill_n(sums, 2 * c, 0.0f);
  kernels::LayerNormBackward(dx, sums, sums + c, dy, x, Tensor(pass, gain), mean, rstd, rows, c);
  writer.Begin(gain, gain + 2);
  std::copy_n(sums, c, writer[gain]);
  std::copy_n(sums + c, c, writer[gain + 1]);
}

void GptModel::BlocksBackward(const Pass& pass, GradWriter& writer) {
  const int64_t blocks = static_cast<int64_t>(blocks_.size());
  for (int64_t s = segments_ - 1; s >= 0; --s) {
    const int64_t begin = s * segment_, end = std::min(begin + segment_, blocks);
    if (s != segments_ - 1) {  // the last segment's activations are still there from forward
      for (int64_t l = begin; l < end; ++l) {
        BlockForward(pass, l);
        if (l + 1 < end) BlockOutputForward(pass, l);
      }
    }
    for (int64_t l = end - 1; l >= begin; --l) BlockBackward(pass, l, writer);
  }
}

void GptModel::EmbeddingsBackward(const Pass& pass, GradWriter& writer) {
  writer.Begin(wte_, wpe_ + 1);
  float* dwte = writer.Summed(wte_);
  if (head_is_wte()) {  // the head's part first, as GptCuda adds them
    const int64_t n = options_.vocab * options_.width;
    kernels::ResidualForward(dwte, dwte, tied_grad_.data(), n);
  }
  kernels::EmbeddingBackward(dwte, writer.Summed(wpe_), dresidual_.data(), tokens_.data(),
                             pass.batch, options_.context, options_.width, options_.vocab);
  writer.Finish();
}

void GptModel::BlockBackward(const Pass& pass, int64_t block, GradWriter& writer) {
  const int64_t rows = pass.rows, c = options_.width;
  const int first = blocks_[block];
  auto w = [&](BlockTensor t) { return Tensor(pass, first + t); };
  const BlockActivations& a = Slot(block);
  const Precision precision = pass.precision;
  float* dx = dresidual_.data();  // the gradient of the residual stream, added to in place
  float* dsmall = dsmall_.data();
  float* dbig = dbig_.data();

  // Each layer's input gradient first, then its weights' gradients (gradients_over_parameters).
  // MLP: out = residual + proj(gelu(fc(ln2(residual)))).
  kernels::LinearBackwardInput(dx, w(kFcProjWeight), dbig, rows, hidden_, c);
  LinearWeights(writer, first + kFcProjWeight, true, a.gelu, dx, rows, hidden_, c);
  RoundToPrecision(precision, dbig, rows * hidden_);
  FinishLinear(writer);
  kernels::GeluBackward(dbig, a.fc, dbig, rows * hidden_);
  RoundToPrecision(precision, dbig, rows * hidden_);
  kernels::LinearBackwardInput(dbig, w(kFcWeight), dsmall, rows, c, hidden_);
  LinearWeights(writer, first + kFcWeight, true, a.ln2, dbig, rows, c, hidden_);
  TensorParallelReduce(dsmall, rows * c);  // the column-parallel layer's input gradient
  RoundToPrecision(precision, dsmall, rows * c);
  FinishLinear(writer);
  LayerNormGradients(pass, writer, first + kLn2Weight, dx, dsmall, a.residual, a.ln2_mean,
                     a.ln2_rstd, rows);
  RoundToPrecision(precision, dx, rows * c);
  writer.Finish();

  // Attention: residual = x + proj(attention(qkv(ln1(x)))).
  const int64_t ca = attn_width_;
  kernels::LinearBackwardInput(dx, w(kProjWeight), dsmall, rows, ca, c);
  LinearWeights(writer, first + kProjWeight, true, a.attention, dx, rows, ca, c);
  RoundToPrecision(precision, dsmall, rows * ca);
  FinishLinear(writer);
  float* dqkv = dbig;
  if (options_.memory_efficient_attention) {
    kernels::AttentionBackwardLse(dqkv, dsmall, a.qkv, a.attention_stats, attention_scratch_.data(),
                                  pass.batch, options_.context, ca, heads_local_);
  } else {
    kernels::AttentionBackward(dqkv, dsmall, a.qkv, a.attention_stats, attention_scratch_.data(),
                               pass.batch, options_.context, ca, heads_local_);
  }
  RoundToPrecision(precision, dqkv, rows * 3 * ca);
  kernels::LinearBackwardInput(dqkv, w(kQkvWeight), dsmall, rows, c, 3 * ca);
  LinearWeights(writer, first + kQkvWeight, true, a.ln1, dqkv, rows, c, 3 * ca);
  TensorParallelReduce(dsmall, rows * c);  // the column-parallel layer's input gradient
  RoundToPrecision(precision, dsmall, rows * c);
  FinishLinear(writer);
  LayerNormGradients(pass, writer, first + kLn1Weight, dx, dsmall, Stream(block), a.ln1_mean,
                     a.ln1_rstd, rows);
  RoundToPrecision(precision, dx, rows * c);
  writer.Finish();
}

void GptModel::RowParallelForward(const float* in, const float* weight, const float* bias,
                                  float* out, int64_t rows, int64_t in_features,
                                  int64_t out_features) {
  if (options_.tp_size == 1) {
    kernels::LinearForward(in, weight, bias, out, rows, in_features, out_features);
    return;
  }
  // The rank's partial product, summed over the group, then the replicated bias once.
  kernels::LinearForward(in, weight, nullptr, out, rows, in_features, out_features);
  TensorParallelReduce(out, rows * out_features);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * out_features;
    for (int64_t j = 0; j < out_features; ++j) row[j] += bias[j];
  }
}

void GptModel::TensorParallelReduce(float* data, int64_t n) {
  if (options_.tp_size == 1 || !tp_error_.ok()) return;
  if (!tp_sum_) {
    tp_error_ = absl::FailedPreconditionError(
        absl::StrCat("'", description_, "' has no tensor-parallel sum (set_tensor_parallel_sum)"));
    return;
  }
  tp_error_ = tp_sum_(absl::MakeSpan(data, static_cast<size_t>(n)));
}

absl::Status GptModel::TakeTensorParallelError() {
  absl::Status s = std::move(tp_error_);
  tp_error_ = absl::OkStatus();
  return s;
}

void GptModel::LinearWeights(GradWriter& writer, int weight, bool has_bias, const float* in,
                             const float* dout, int64_t rows, int64_t in_features,
                             int64_t out_features) {
  if (deferring_) {
    // With activation checkpointing the input's buffer is recomputed for the next segment
    // before SliceBackwardWeights runs: keep a copy of it too.
    const float* kept_in = segments_ > 1 ? KeepForWeights(in, rows * in_features) : in;
    deferred_.push_back({.weight = weight,
                         .has_bias = has_bias,
                         .in = kept_in,
                         .dout = KeepForWeights(dout, rows * out_features),
                         .in_features = in_features,
                         .out_features = out_features});
    return;
  }
  writer.Begin(weight, weight + (has_bias ? 2 : 1));
  kernels::LinearBackwardWeights(in, dout, writer[weight], has_bias ? writer[weight + 1] : nullptr,
                                 rows, in_features, out_features, writer.mode());
}

void GptModel::FinishLinear(GradWriter& writer) {
  if (!deferring_) writer.Finish();
}

const float* GptModel::KeepForWeights(const float* from, int64_t n) {
  float* to = deferred_buffers_.data() + deferred_used_;
  deferred_used_ += n;
  CHECK_LE(deferred_used_ * static_cast<int64_t>(sizeof(float)), deferred_buffers_.bytes());
  std::copy_n(from, n, to);
  return to;
}

void GptModel::RoundParameters(Precision precision, absl::Span<const float> params,
                               absl::Span<float> rounded) {
  CHECK_EQ(params.size(), rounded.size());
  if (IsHalf(precision)) {
    kernels::RoundTo(HalfFormatOf(precision), params.data(), rounded.data(),
                     static_cast<int64_t>(params.size()));
  } else {
    std::copy(params.begin(), params.end(), rounded.begin());
  }
}

absl::Status GptModel::SliceForward(const Batch& batch, absl::Span<const float> params,
                                    Precision precision, absl::Span<const float> input,
                                    absl::Span<float> output, bool params_rounded) {
  RM_ASSIGN_OR_RETURN(const Pass pass, Prepare(batch, params, precision, nullptr, params_rounded));
  const int64_t n = pass.rows * options_.width;
  const int64_t want_in = has_embeddings() ? 0 : n, want_out = has_head() ? 0 : n;
  if (static_cast<int64_t>(input.size()) != want_in ||
      static_cast<int64_t>(output.size()) != want_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SliceForward of '", description_, "' for ", pass.batch, " samples: input of ",
        input.size(), " and output of ", output.size(), " floats; want ", want_in, " and ",
        want_out, " (batch.size * context * width, none at the pipeline's ends)"));
  }
  if (has_embeddings()) {
    EmbeddingsForward(pass);
  } else {
    std::copy(input.begin(), input.end(), Stream(0));
  }
  BlocksForward(pass);
  if (has_head()) {
    HeadForward(pass);
  } else {
    std::copy_n(Stream(blocks_.size()), n, output.data());
  }
  slice_pass_ = pass;
  deferred_.clear();
  return TakeTensorParallelError();
}

absl::StatusOr<StepStats> GptModel::SliceLoss() {
  if (!has_head() || !slice_pass_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SliceLoss of '", description_, "': only the last stage, after its SliceForward"));
  }
  const int64_t rows = slice_pass_->rows;
  slice_pass_.reset();
  return loss_.Forward(logits_, tokens_.data() + rows, rows);
}

absl::StatusOr<StepStats> GptModel::SliceBackward(absl::Span<float> grads,
                                                  const ForwardBackwardOptions& options,
                                                  absl::Span<const float> output_grad,
                                                  absl::Span<float> input_grad, bool defer_weights,
                                                  bool discard) {
  RM_RETURN_IF_ERROR(CheckLossOptions(options));
  if (options.store != nullptr) {
    return absl::InvalidArgumentError("SliceBackward: a ParameterStore (not for pipeline stages)");
  }
  if (!slice_pass_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("SliceBackward of '", description_, "' before its SliceForward"));
  }
  if (options.precision != slice_pass_->precision) {
    return absl::InvalidArgumentError("SliceBackward: options.precision is not SliceForward's");
  }
  const Pass pass = *slice_pass_;
  const int64_t rows = pass.rows, c = options_.width, n = rows * c;
  const int64_t want_out = has_head() ? 0 : n, want_in = has_embeddings() ? 0 : n;
  if (static_cast<int64_t>(output_grad.size()) != want_out ||
      static_cast<int64_t>(input_grad.size()) != want_in) {
    return absl::InvalidArgumentError(absl::StrCat("SliceBackward of '", description_,
                                                   "': output gradient of ", output_grad.size(),
                                                   " and input gradient of ", input_grad.size(),
                                                   " floats; want ", want_out, " and ", want_in));
  }
  CHECK_GE(static_cast<int64_t>(grads.size()), table_.total_elements());
  ForwardBackwardOptions o = options;
  o.accumulate = true;
  o.on_grads_ready = nullptr;
  dresidual_.Reserve(rows * c);
  dsmall_.Reserve(rows * c);
  dbig_.Reserve(rows * std::max({hidden_, 3 * attn_width_, options_.vocab}));
  deferring_ = defer_weights;
  deferred_.clear();
  deferred_used_ = 0;
  if (defer_weights) deferred_buffers_.Reserve(DeferredFloats(rows));
  GradWriter writer(*this, o, grads.data(),
                    IsHalf(o.precision) ? staged_grads_.Reserve(largest_group_) : nullptr);
  StepStats stats;
  if (has_head()) {
    if (discard) {
      std::fill_n(dbig_.data(), rows * options_.vocab, 0.0f);
    } else {
      const float scale = static_cast<float>(options.loss_scale / options.loss_divisor);
      stats = loss_.ForwardBackward(logits_, tokens_.data() + rows, rows, scale, dbig_.data());
      RoundToPrecision(pass.precision, dbig_.data(), rows * options_.vocab);
    }
    HeadBackward(pass, writer);
  } else {
    std::copy(output_grad.begin(), output_grad.end(), dresidual_.data());
  }
  BlocksBackward(pass, writer);
  if (has_embeddings()) {
    EmbeddingsBackward(pass, writer);
  } else {
    std::copy_n(dresidual_.data(), n, input_grad.data());
  }
  deferring_ = false;
  if (!defer_weights) slice_pass_.reset();
  RM_RETURN_IF_ERROR(TakeTensorParallelError());
  return stats;
}

absl::Status GptModel::SliceBackwardWeights(absl::Span<float> grads,
                                            const ForwardBackwardOptions& options) {
  if (!slice_pass_.has_value() || deferred_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("SliceBackwardWeights of '", description_,
                                                      "': no SliceBackward deferred its weights"));
  }
  ForwardBackwardOptions o = options;
  o.accumulate = true;
  o.on_grads_ready = nullptr;
  o.store = nullptr;
  GradWriter writer(*this, o, grads.data(),
                    IsHalf(o.precision) ? staged_grads_.Reserve(largest_group_) : nullptr);
  for (const DeferredWeights& d : deferred_) {
    LinearWeights(writer, d.weight, d.has_bias, d.in, d.dout, slice_pass_->rows, d.in_features,
                  d.out_features);
    writer.Finish();
  }
  deferred_.clear();
  slice_pass_.reset();
  return absl::OkStatus();
}

MemoryStats GptModel::memory() const {
  return {.activation_bytes_peak = arena_.bytes() + tokens_.bytes() + attention_scratch_.bytes() +
                                   loss_.scratch_bytes() + dresidual_.bytes() + dsmall_.bytes() +
                                   dbig_.bytes() + deferred_buffers_.bytes() + tied_grad_.bytes() +
                                   layer_norm_sums_.bytes()};
}

}  // namespace ringmaster::train::nn
