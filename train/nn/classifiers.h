// Image classifiers for Fashion-MNIST-like data, and the factory the trainer builds its
// model with. Both are SequentialClassifiers (train/nn/sequential.h), so the loss
// convention, on_grads_ready, emulated mixed precision and memory accounting are the same.
//
// Parameter names follow PyTorch ("fc1.weight", "conv2.bias", ...), and initialisation is
// PyTorch's default for nn.Linear / nn.Conv2d (weights and biases uniform in
// ±1/sqrt(fan_in)), drawn from SplitMix64 so that it is the same on every platform.
#ifndef RINGMASTER_TRAIN_NN_CLASSIFIERS_H_
#define RINGMASTER_TRAIN_NN_CLASSIFIERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "train/model.h"
#include "train/nn/sequential.h"

namespace ringmaster::train::nn {

struct MlpOptions {
  int64_t inputs = 784;
  std::vector<int64_t> hidden = {512, 512};  // each: Linear + ReLU
  int64_t classes = 10;
};

// inputs -> [Linear -> ReLU] per hidden width -> Linear -> classes logits.
// Describe(): "mlp 784-512-512-10".
class MlpClassifier final : public SequentialClassifier {
 public:
  // INVALID_ARGUMENT naming the field (mlp.inputs, mlp.hidden[i], mlp.classes).
  static absl::StatusOr<std::unique_ptr<MlpClassifier>> Create(const MlpOptions& options);

 private:
  explicit MlpClassifier(const MlpOptions& options);
};

struct CnnOptions {
  // Input images, [channels, height, width] per sample (NCHW rows of Batch::features).
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  // Each block: Conv2d (stride 1, same padding) -> ReLU -> 2x2 max-pool, halving the size.
  std::vector<int64_t> conv_channels = {16, 32};
  int64_t kernel_size = 3;              // odd
  std::vector<int64_t> hidden = {128};  // then Linear + ReLU per width on the flattened maps
  int64_t classes = 10;
};

// Describe(): "cnn 1x28x28 conv16-conv32 fc128-10".
class CnnClassifier final : public SequentialClassifier {
 public:
  // INVALID_ARGUMENT naming the field (cnn.channels, cnn.height, cnn.width,
  // cnn.conv_channels[i], cnn.kernel_size, cnn.hidden[i], cnn.classes); an image too small
  // for its pooling blocks names cnn.height or cnn.width.
  static absl::StatusOr<std::unique_ptr<CnnClassifier>> Create(const CnnOptions& options);

 private:
  explicit CnnClassifier(const CnnOptions& options);
};

enum class ModelKind { kMlp, kCnn };

struct ModelOptions {
  ModelKind kind = ModelKind::kMlp;
  MlpOptions mlp;  // used when kind == kMlp
  CnnOptions cnn;  // used when kind == kCnn
};

// The model `options` describe, uninitialised (call Init). INVALID_ARGUMENT as above.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options);

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_CLASSIFIERS_H_
