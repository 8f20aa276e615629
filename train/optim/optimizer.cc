#include "train/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/optimizer.h"
#include "train/optim/settings.h"

namespace ringmaster::train {
namespace {

// The decay mask of the options, or the default rule when it is empty.
absl::StatusOr<std::vector<bool>> ResolveDecayMask(const state::TensorTable& table,
                                                   const std::vector<bool>& mask) {
  if (mask.empty()) return DecayMatrices(table);
  if (static_cast<int>(mask.size()) != table.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decay_mask has ", mask.size(), " entries for ", table.size(), " tensors"));
  }
  return mask;
}

class Sgd final : public Optimizer {
 public:
  Sgd(const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
      int64_t local_elements, const SgdOptions& options, const std::vector<bool>& decay_mask)
      : Optimizer(table, pieces, local_elements, options.weight_decay, decay_mask,
                  options.momentum != 0 ? std::vector<std::string>{"momentum"}
                                        : std::vector<std::string>{}),
        options_(options) {}

  std::string Describe() const override {
    return absl::StrCat("SGD(momentum=", options_.momentum, options_.nesterov ? ", nesterov" : "",
                        ", ", DecayString(), ")");
  }

 private:
  absl::Status Update(int64_t, float lr, absl::Span<float> params, absl::Span<const float> grads,
                      const SumAcrossRanks&) override {
    for (const Piece& p : pieces()) {
      const kernels::SgdStepArgs args{.lr = lr,
                                      .momentum = static_cast<float>(options_.momentum),
                                      .weight_decay = p.weight_decay,
                                      .nesterov = options_.nesterov};
      RM_RETURN_IF_ERROR(
          ops()->SgdStep(args, Part(params, p), Part(grads, p),
                         options_.momentum != 0 ? state(0, p) : absl::Span<float>()));
    }
    return absl::OkStatus();
  }

  const SgdOptions options_;
};

// AdamW and LAMB: the same moments, options and validation.
template <typename Options>
absl::Status CheckAdamOptions(const Options& o) {
  RM_RETURN_IF_ERROR(settings::CheckDecayRate("beta1", o.beta1));
  RM_RETURN_IF_ERROR(settings::CheckDecayRate("beta2", o.beta2));
  RM_RETURN_IF_ERROR(settings::CheckPositive("eps", o.eps));
  return settings::CheckAtLeast("weight_decay", o.weight_decay, 0);
}

// The state and settings AdamW and LAMB share.
template <typename Options>
class AdamFamily : public Optimizer {
 public:
  AdamFamily(const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
             int64_t local_elements, const Options& options, const std::vector<bool>& decay_mask)
      : Optimizer(table, pieces, local_elements, options.weight_decay, decay_mask,
                  {"exp_avg", "exp_avg_sq"}),
        options_(options) {}

 protected:
  static constexpr int kExpAvg = 0;
  static constexpr int kExpAvgSq = 1;

  kernels::AdamMomentArgs MomentArgs(int64_t step) const {
    return {.beta1 = static_cast<float>(options_.beta1),
            .beta2 = static_cast<float>(options_.beta2),
            .eps = static_cast<float>(options_.eps),
            .step = step};
  }

  std::string AdamString() const {
    return absl::StrCat("beta1=", options_.beta1, ", beta2=", options_.beta2,
                        ", eps=", options_.eps, ", ", DecayString());
  }

  const Options options_;
};

class AdamW final : public AdamFamily<AdamWOptions> {
 public:
  using AdamFamily::AdamFamily;

  std::string Describe() const override { return absl::StrCat("AdamW(", AdamString(), ")"); }

 private:
  absl::Status Update(int64_t step, float lr, absl::Span<float> params,
                      absl::Span<const float> grads, const SumAcrossRanks&) override {
    const kernels::AdamMomentArgs args = MomentArgs(step);
    for (const Piece& p : pieces()) {
      RM_RETURN_IF_ERROR(ops()->AdamWStep(args, lr, p.weight_decay, Part(params, p),
                                          Part(grads, p), state(kExpAvg, p),
                                          state(kExpAvgSq, p)));
    }
    return absl::OkStatus();
  }
};

class Lamb final : public AdamFamily<LambOptions> {
 public:
  using AdamFamily::AdamFamily;

  std::string Describe() const override {
    return absl::StrCat("LAMB(", AdamString(), ", weight norm in [", options_.min_weight_norm, ", ",
                        options_.max_weight_norm, "])");
  }

 private:
  // Pass 1 sums ||w||^2 and ||r||^2 of this rank's tensor pieces into per-tensor slots (2
  // per tensor of the table, so every rank's vector has the same layout; a tensor in two
  // placed pieces adds both); the ranks add them up; pass 2 applies each tensor's trust
  // ratio. Nothing changes before pass 2.
  absl::Status Update(int64_t step, float lr, absl::Span<float> params,
                      absl::Span<const float> grads, const SumAcrossRanks& sum) override {
    const kernels::AdamMomentArgs args = MomentArgs(step);
    std::vector<double> squares(2 * num_tensors(), 0.0);
    for (const Piece& piece : pieces()) {
      for (const Piece& p : Counted(piece)) {
        RM_ASSIGN_OR_RETURN(
            const kernels::LambSquareSums s,
            ops()->LambSquares(args, p.weight_decay, Part(absl::Span<const float>(params), p),
                               Part(grads, p), state(kExpAvg, p), state(kExpAvgSq, p)));
        squares[2 * p.tensor] += s.params;
        squares[2 * p.tensor + 1] += s.update;
      }
    }
    RM_RETURN_IF_ERROR(sum(absl::MakeSpan(squares)));
    for (const Piece& p : pieces()) {
      const double weight_norm = std::sqrt(squares[2 * p.tensor]);
      const double update_norm = std::sqrt(squares[2 * p.tensor + 1]);
      const double ratio =
          weight_norm > 0 && update_norm > 0
              ? std::clamp(weight_norm, options_.min_weight_norm, options_.max_weight_norm) /
                    update_norm
              : 1.0;
      RM_RETURN_IF_ERROR(ops()->LambStep(args, p.weight_decay, static_cast<float>(lr * ratio),
                                         Part(params, p), Part(grads, p), state(kExpAvg, p),
                                         state(kExpAvgSq, p)));
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Optimizer>> Create(const state::TensorTable& table,
                                                  absl::Span<const state::PlacedRange> pieces,
                                                  int64_t local_elements, const SgdOptions& o) {
  RM_RETURN_IF_ERROR(settings::CheckDecayRate("momentum", o.momentum));
  if (o.nesterov && o.momentum == 0) {
    return absl::InvalidArgumentError("nesterov needs a momentum > 0");
  }
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("weight_decay", o.weight_decay, 0));
  RM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveDecayMask(table, o.decay_mask));
  return std::make_unique<Sgd>(table, pieces, local_elements, o, mask);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Create(const state::TensorTable& table,
                                                  absl::Span<const state::PlacedRange> pieces,
                                                  int64_t local_elements, const AdamWOptions& o) {
  RM_RETURN_IF_ERROR(CheckAdamOptions(o));
  RM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveDecayMask(table, o.decay_mask));
  return std::make_unique<AdamW>(table, pieces, local_elements, o, mask);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Create(const state::TensorTable& table,
                                                  absl::Span<const state::PlacedRange> pieces,
                                                  int64_t local_elements, const LambOptions& o) {
  RM_RETURN_IF_ERROR(CheckAdamOptions(o));
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("min_weight_norm", o.min_weight_norm, 0));
  RM_RETURN_IF_ERROR(settings::CheckReal("max_weight_norm", o.max_weight_norm, o.min_weight_norm,
                                         settings::Bound::kClosed, settings::kInfinity,
                                         settings::Bound::kClosed));
  RM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveDecayMask(table, o.decay_mask));
  return std::make_unique<Lamb>(table, pieces, local_elements, o, mask);
}

}  // namespace

std::vector<bool> DecayMatrices(const state::TensorTable& table) {
  std::vector<bool> mask;
  mask.reserve(table.size());
  for (const state::TensorSpec& t : table.tensors()) mask.push_back(t.shape.size() >= 2);
  return mask;
}

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
                     int64_t local_elements, double weight_decay,
                     const std::vector<bool>& decay_mask, std::vector<std::string> state_names)
    : placement_(pieces.begin(), pieces.end()),
      local_elements_(local_elements),
      range_(pieces.empty() ? state::FlatRange{}
                            : state::FlatRange{pieces.front().range.begin, pieces.back().range.end}),
      num_tensors_(table.size()),
      weight_decay_(weight_decay) {
  CHECK_EQ(static_cast<int>(decay_mask.size()), table.size());
  decayed_tensors_ = static_cast<int>(std::count(decay_mask.begin(), decay_mask.end(), true));
  for (const state::PlacedRange& placed : placement_) {
    for (const state::TensorPiece& piece : state::PiecesInRange(table, placed.range)) {
      pieces_.push_back(
          {.tensor = piece.tensor,
           .offset = placed.at + (piece.begin - placed.range.begin),
           .size = piece.end - piece.begin,
           .weight_decay = decay_mask[piece.tensor] ? static_cast<float>(weight_decay) : 0.0f});
    }
  }
  state_names_ = std::move(state_names);
}

absl::Status Optimizer::AllocateState(VectorOps* ops) {
  ops_ = ops;
  for (const std::string& name : state_names_) {
    absl::StatusOr<OpsBuffer> buffer = ops->Allocate(local_elements_);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("optimizer state ", name, " (", local_elements_,
                                       " floats, ", ops->name(), "): ", buffer.status().message()));
    }
    state_.emplace_back(name, *std::move(buffer));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::Step(double lr, absl::Span<float> params, absl::Span<const float> grads,
                             const SumAcrossRanks& sum) {
  CHECK_EQ(static_cast<int64_t>(params.size()), local_elements_)
      << "params of " << state::RangeString(range_) << " in " << placement_.size() << " piece(s)";
  CHECK_EQ(static_cast<int64_t>(grads.size()), local_elements_)
      << "grads of " << state::RangeString(range_) << " in " << placement_.size() << " piece(s)";
  RM_RETURN_IF_ERROR(settings::CheckAtLeast("lr", lr, 0));
  RM_RETURN_IF_ERROR(Update(step_ + 1, static_cast<float>(lr), params, grads, sum));
  ++step_;
  return absl::OkStatus();
}

std::vector<StateBuffer> Optimizer::state_buffers() {
  std::vector<const state::PlacedRange*> listed;
  for (const state::PlacedRange& p : placement_) {
    if (p.range.size() > 0) listed.push_back(&p);
  }
  if (listed.empty() && !placement_.empty()) listed.push_back(&placement_.front());
  std::vector<StateBuffer> buffers;
  for (auto& [name, buffer] : state_) {
    for (const state::PlacedRange* p : listed) {
      buffers.push_back({name, p->range, buffer.span().subspan(p->at, p->range.size())});
    }
  }
  return buffers;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, buffer] : state_) bytes += buffer.size() * 4;
  return bytes;
}

absl::Status Optimizer::RestoreStep(int64_t step) {
  RM_RETURN_IF_ERROR(settings::CheckCount("step", step, 0));
  step_ = step;
  return absl::OkStatus();
}

std::string Optimizer::DecayString() const {
  return absl::StrCat("weight_decay=", weight_decay_, " on ", decayed_tensors_, " of ",
                      num_tensors_, " tensors");
}

std::vector<Optimizer::Piece> Optimizer::Counted(const Piece& piece) const {
  std::vector<Piece> parts;
  int64_t at = piece.offset;
  const int64_t end = piece.offset + piece.size;
  for (const state::FlatRange& d : duplicates_) {
    if (d.end <= at) continue;
    if (d.begin >= end) break;
    if (d.begin > at) parts.push_back({piece.tensor, at, d.begin - at, piece.weight_decay});
    at = std::max(at, d.end);
  }
  if (at < end) parts.push_back({piece.tensor, at, end - at, piece.weight_decay});
  return parts;
}

absl::Span<float> Optimizer::state(int index, const Piece& piece) {
  return state_[index].second.span().subspan(piece.offset, piece.size);
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const state::TensorTable& table,
                                                           state::FlatRange range,
                                                           const OptimizerOptions& options,
                                                           VectorOps* ops) {
  RM_RETURN_IF_ERROR(state::CheckRange(table, range));
  const state::PlacedRange piece{range, 0};
  return CreateOptimizer(table, absl::MakeConstSpan(&piece, 1), range.size(), options, ops);
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const state::TensorTable& table, absl::Span<const state::PlacedRange> pieces,
    int64_t local_elements, const OptimizerOptions& options, VectorOps* ops) {
  if (local_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer placement: local_elements must be >= 0, got ", local_elements));
  }
  if (absl::Status s = state::CheckPlacement(table, pieces, local_elements); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer placement: ", s.message()));
  }
  if (ops == nullptr) return absl::InvalidArgumentError("CreateOptimizer: ops is null");
  RM_ASSIGN_OR_RETURN(
      std::unique_ptr<Optimizer> optimizer,
      std::visit([&](const auto& o) { return Create(table, pieces, local_elements, o); },
                 options));
  RM_RETURN_IF_ERROR(optimizer->AllocateState(ops));
  return optimizer;
}

}  // namespace ringmaster::train
