#include "train/nn/classifiers.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringmaster::train::nn {
namespace {

absl::Status CheckPositive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; want > 0"));
}

absl::Status CheckAllPositive(absl::string_view field, const std::vector<int64_t>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (absl::Status s = CheckPositive(absl::StrCat(field, "[", i, "]"), values[i]); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckClasses(absl::string_view field, int64_t classes) {
  if (classes >= 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", classes, "; want >= 2"));
}

// Passes `add` a [Linear -> ReLU] pair per hidden width, then the final Linear.
template <typename AddLayer>
void AddFullyConnected(state::TensorTable& table, int64_t inputs,
                       const std::vector<int64_t>& hidden, int64_t classes, AddLayer add) {
  int64_t width = inputs;
  for (size_t i = 0; i < hidden.size(); ++i) {
    add(std::make_unique<Linear>(table, absl::StrCat("fc", i + 1), width, hidden[i]));
    add(std::make_unique<Relu>(hidden[i]));
    width = hidden[i];
  }
  add(std::make_unique<Linear>(table, absl::StrCat("fc", hidden.size() + 1), width, classes));
}

std::string MlpDescription(const MlpOptions& o) {
  return absl::StrCat("mlp ", o.inputs, "-", absl::StrJoin(o.hidden, "-"),
                      o.hidden.empty() ? "" : "-", o.classes);
}

std::string CnnDescription(const CnnOptions& o) {
  std::string d = absl::StrCat("cnn ", o.channels, "x", o.height, "x", o.width);
  if (!o.conv_channels.empty()) {
    absl::StrAppend(&d, " conv", absl::StrJoin(o.conv_channels, "-conv"));
  }
  if (o.kernel_size != 3) absl::StrAppend(&d, " k", o.kernel_size);
  absl::StrAppend(&d, " fc");
  for (int64_t h : o.hidden) absl::StrAppend(&d, h, "-");
  absl::StrAppend(&d, o.classes);
  return d;
}

}  // namespace

MlpClassifier::MlpClassifier(const MlpOptions& o)
    : SequentialClassifier(MlpDescription(o), o.classes) {
  AddFullyConnected(mutable_table(), o.inputs, o.hidden, o.classes,
                    [this](std::unique_ptr<Layer> layer) { Add(std::move(layer)); });
}

absl::StatusOr<std::unique_ptr<MlpClassifier>> MlpClassifier::Create(const MlpOptions& o) {
  if (absl::Status s = CheckPositive("mlp.inputs", o.inputs); !s.ok()) return s;
  if (absl::Status s = CheckAllPositive("mlp.hidden", o.hidden); !s.ok()) return s;
  if (absl::Status s = CheckClasses("mlp.classes", o.classes); !s.ok()) return s;
  return absl::WrapUnique(new MlpClassifier(o));
}

CnnClassifier::CnnClassifier(const CnnOptions& o)
    : SequentialClassifier(CnnDescription(o), o.classes) {
  int64_t channels = o.channels, height = o.height, width = o.width;
  for (size_t i = 0; i < o.conv_channels.size(); ++i) {
    Add(std::make_unique<Conv2d>(mutable_table(), absl::StrCat("conv", i + 1), channels,
                                 o.conv_channels[i], height, width, o.kernel_size));
    channels = o.conv_channels[i];
    Add(std::make_unique<Relu>(channels * height * width));
    Add(std::make_unique<MaxPool2d>(channels, height, width));
    height /= 2;
    width /= 2;
  }
  AddFullyConnected(mutable_table(), channels * height * width, o.hidden, o.classes,
                    [this](std::unique_ptr<Layer> layer) { Add(std::move(layer)); });
}

absl::StatusOr<std::unique_ptr<CnnClassifier>> CnnClassifier::Create(const CnnOptions& o) {
  if (absl::Status s = CheckPositive("cnn.channels", o.channels); !s.ok()) return s;
  if (absl::Status s = CheckPositive("cnn.height", o.height); !s.ok()) return s;
  if (absl::Status s = CheckPositive("cnn.width", o.width); !s.ok()) return s;
  if (absl::Status s = CheckAllPositive("cnn.conv_channels", o.conv_channels); !s.ok()) return s;
  if (o.kernel_size <= 0 || o.kernel_size % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cnn.kernel_size is ", o.kernel_size, "; want an odd number >= 1"));
  }
  if (absl::Status s = CheckAllPositive("cnn.hidden", o.hidden); !s.ok()) return s;
  if (absl::Status s = CheckClasses("cnn.classes", o.classes); !s.ok()) return s;
  // Each block halves the image (rounding down); every block needs at least 2x2.
  const int64_t blocks = static_cast<int64_t>(o.conv_channels.size());
  const int64_t need = int64_t{1} << std::min<int64_t>(blocks, 62);
  for (auto [field, size] : {std::pair{"cnn.height", o.height}, std::pair{"cnn.width", o.width}}) {
    if (size < need) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", size, "; ", blocks, " pooling blocks need at least ", need));
    }
  }
  return absl::WrapUnique(new CnnClassifier(o));
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options) {
  switch (options.kind) {
    case ModelKind::kMlp:
      return MlpClassifier::Create(options.mlp);
    case ModelKind::kCnn:
      return CnnClassifier::Create(options.cnn);
  }
  return absl::InvalidArgumentError("kind is not a known model kind");
}

}  // namespace ringmaster::train::nn
