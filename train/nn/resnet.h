// ResNet-18 for 32x32 images (the CIFAR variant of He et al. 2016: a 3x3 stem convolution, no
// max-pool, four stages of two basic blocks with width, 2·width, 4·width and 8·width
// channels, stride 2 and a 1x1 projection shortcut at the start of stages 2-4, global average
// pooling and a fully connected layer), built from train/nn/layers.h's StridedConv2d,
// BatchNorm2d, GlobalAvgPool and Linear.
//
// Input: Batch::features of square single-channel images (Fashion-MNIST's 28x28) are padded
// with zeros to 32x32 (centred) and the channel repeated three times, inside the model.
//
// Parameter names follow the common PyTorch CIFAR ResNet ("conv1.weight", "bn1.weight",
// "layer2.0.conv1.weight", "layer2.0.shortcut.0.weight" (the projection),
// "layer2.0.shortcut.1.bias" (its BatchNorm), "linear.weight"); the BatchNorm running statistics
// ("bn1.running_mean", "layer1.0.bn2.running_var", ...) are buffers (train/model.h): they come
// after every trained tensor in the table, in forward order, so that they are one contiguous range.
// Initialisation: convolutions and the linear layer uniform in ±1/sqrt(fan_in) (PyTorch's
// default), BatchNorm weight 1 and bias 0, running mean 0 and variance 1.
//
// BatchNorm (PyTorch's semantics, momentum 0.1, eps 1e-5): a training forward normalises by
// the batch's statistics (biased variance) and moves the running statistics towards them
// (running = 0.9 · running + 0.1 · batch, with the unbiased variance); evaluation
// normalises by the running statistics. With ForwardBackwardOptions::sum_across_replicas
// the batch statistics are those of every replica's batch together (torch.nn.SyncBatchNorm:
// the per-channel sums and counts are summed in forward, and the sums the input gradient
// needs in backward). Every micro-batch's forward moves the running statistics, as each
// PyTorch forward does.
//
// fp32 only, on the CPU, with whole flat buffers (no ParameterStore). Not thread-safe.
#ifndef RINGMASTER_TRAIN_NN_RESNET_H_
#define RINGMASTER_TRAIN_NN_RESNET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/grow_buffer.h"
#include "train/nn/layers.h"

namespace ringmaster::train::nn {

struct ResNetOptions {
  int64_t image_side = 28;  // input images are image_side² floats, one channel; at most 32
  int64_t width = 64;       // channels of the first stage (then 2x, 4x, 8x)
  int64_t classes = 10;
};

class ResNet18 final : public Model {
 public:
  // INVALID_ARGUMENT naming the field (resnet18.image_side, resnet18.width,
  // resnet18.classes).
  static absl::StatusOr<std::unique_ptr<ResNet18>> Create(const ResNetOptions& options);
  ~ResNet18() override;

  std::string Describe() const override;  // "resnet18 width 64, 32x32 (28x28 padded), 10 classes"
  const state::TensorTable& table() const override { return table_; }
  void InitTensors(uint64_t seed, const TensorSink& sink) const override;
  int64_t LossTermsPerSample() const override { return 1; }

  // INVALID_ARGUMENT naming the field for a batch that does not fit (batch.feature_dim,
  // batch.features, batch.labels[i]), for options.loss_scale or options.loss_divisor, for a
  // precision other than fp32 (options.precision) or a ParameterStore (options.store). An
  // empty batch (batch.size 0) is allowed: it gives zero gradients and takes part in the
  // synchronized statistics' sums. Announces gradients by residual block:
  // on_grads_ready(offset of the block's first tensor), from the head down to 0.
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const state::FlatBuffer& params,
                                            state::FlatBuffer& grads,
                                            const ForwardBackwardOptions& options) override;
  using Model::Evaluate;
  // Normalises by the running statistics in `params`; runs 32 samples at a time.
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                     Precision precision, ParameterStore* store) override;
  // One group per convolution, BatchNorm and the linear layer; blocks: the stem, each
  // residual block, the head, and the running statistics last.
  std::vector<ParameterGroup> parameter_groups() const override { return groups_; }
  MemoryStats memory() const override;
  state::FlatRange buffer_range() const override { return buffers_; }
  // The last ForwardBackward's logits, [batch.size, classes] (for comparisons with other
  // implementations).
  const float* logits() { return logits_.data(); }
  void UpdateBuffers(absl::Span<float> params) override;

 private:
  struct ConvBn;
  struct Block;
  explicit ResNet18(const ResNetOptions& options);

  absl::Status CheckBatch(const Batch& batch, bool allow_empty) const;
  // The padded, 3-channel input of n images into input_.
  void PrepareInput(const float* features, int64_t n);
  // The network up to the logits, training (batch statistics) or evaluation.
  absl::Status Forward(const float* params, int64_t n, bool training, const ReplicaSum& sum);
  absl::Status Backward(const float* params, int64_t n, float* grads,
                        const ForwardBackwardOptions& options);
  // Adds a group for tensors [first, end) in block `block`.
  void AddGroup(std::string name, int first, int end, int block, std::string block_name);
  // Adds the convolution and its BatchNorm, with their groups.
  std::unique_ptr<ConvBn> AddConvBn(absl::string_view conv_name, absl::string_view bn_name,
                                    int64_t in_channels, int64_t out_channels, int64_t side,
                                    int64_t kernel_size, int64_t stride, int block,
                                    const std::string& block_name);

  ResNetOptions options_;
  state::TensorTable table_;
  std::vector<ParameterGroup> groups_;
  // Per tensor: uniform in ±init_bound_ when positive, else the constant init_value_.
  std::vector<float> init_bound_;
  std::vector<float> init_value_;
  std::unique_ptr<ConvBn> stem_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<GlobalAvgPool> pool_;
  std::unique_ptr<Linear> fc_;
  SoftmaxCrossEntropy loss_;
  state::FlatRange buffers_;
  int64_t largest_activation_ = 0;  // floats per sample

  // Running statistics moved by the training forwards since the last UpdateBuffers
  // (buffers_.size() floats at the buffers' offsets - buffers_.begin).
  std::vector<float> pending_;
  bool pending_valid_ = false;

  GrowBuffer<float> input_;
  GrowBuffer<float> stem_out_;  // after the stem's ReLU
  GrowBuffer<float> pooled_;
  GrowBuffer<float> logits_;
  GrowBuffer<float> work_[4];  // backward's gradients and forward's temporaries
  // Every convolution's scratch: they run one at a time.
  GrowBuffer<float> conv_scratch_;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_RESNET_H_
