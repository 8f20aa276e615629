// A classifier that is a stack of layers (train/nn/layers.h) under a softmax cross-entropy
// loss: the Model implementation shared by MlpClassifier and CnnClassifier.
//
// Activations: each layer's output has its own buffer (in-place layers such as ReLU share
// their input's, so the layer before one must not need its own output in backward; none of
// Linear, Conv2d and MaxPool2d does), and backward uses two ping-pong gradient buffers as large as
// the largest output. They grow to the largest batch seen and are then reused, so steady-state
// steps allocate nothing; MemoryStats.activation_bytes_peak is their total with the layers' scratch
// (pool argmax, im2col) and the per-sample loss arrays. Not counted there: with bf16 or fp16
// compute, the rounded copy of the parameters (the "half-precision weights" of the mixed-precision
// memory formula) and, with accumulate, the staging buffer for one layer's parameter gradients.
//
// Mixed precision (train/model.h): with kBFloat16 or kFloat16 the master parameters are
// rounded once per call into the compute copy; the input, every layer output, the logits'
// gradient, every input gradient and every parameter gradient are rounded to the format as
// they are produced. Products accumulate in fp32 (as tensor cores do) and the softmax
// cross-entropy runs in fp32 (as autocast does). A gradient produced in half precision is
// rounded before it is added into fp32 `grads` under accumulate.
//
// Not thread-safe (one call at a time); on_grads_ready runs on the calling thread.
#ifndef RINGMASTER_TRAIN_NN_SEQUENTIAL_H_
#define RINGMASTER_TRAIN_NN_SEQUENTIAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/precision.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/grow_buffer.h"
#include "train/nn/layers.h"

namespace ringmaster::train::nn {

// Emulated mixed precision (train/model.h) and the loss options' check, shared by this
// package's models (SequentialClassifier, GptModel).
// kBFloat16 or kFloat16 for a half `precision`.
kernels::HalfFormat HalfFormatOf(Precision precision);
// Rounds values just produced to `precision` (nothing to do for fp32).
void RoundToPrecision(Precision precision, float* values, int64_t n);
// INVALID_ARGUMENT naming options.loss_scale or options.loss_divisor when either is not
// finite and positive.
absl::Status CheckLossOptions(const ForwardBackwardOptions& options);

// INVALID_ARGUMENT naming the field for a batch a classifier taking `input_size` features
// and `classes` classes cannot take (batch.size, batch.feature_dim, batch.features,
// batch.labels[i]); SequentialClassifier's and its CUDA twin's check.
absl::Status CheckClassifierBatch(const Batch& batch, const std::string& description,
                                  int64_t input_size, int64_t classes);

class SequentialClassifier : public Model {
 public:
  std::string Describe() const override { return description_; }
  const state::TensorTable& table() const override { return table_; }
  // Each parameter tensor in table order from one SplitMix64 stream seeded with `seed`
  // (uniform in [-init_bound, init_bound)).
  void InitTensors(uint64_t seed, const TensorSink& sink) const override;
  int64_t LossTermsPerSample() const override { return 1; }

  // INVALID_ARGUMENT naming the field for a batch that does not fit (batch.size,
  // batch.feature_dim, batch.features, batch.labels[i]) or for options.loss_scale or
  // options.loss_divisor that are not finite and positive. `params` and `grads` must have
  // table().total_elements() floats (CHECK). Announces each layer's parameter gradients as
  // soon as they are final: on_grads_ready(offset of the layer's first tensor), in
  // decreasing order, the last with 0. Gradient padding between tensors is left untouched.
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch, const state::FlatBuffer& params,
                                            state::FlatBuffer& grads,
                                            const ForwardBackwardOptions& options) override;
  using Model::Evaluate;
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, const state::FlatBuffer& params,
                                     Precision precision, ParameterStore* store) override;
  // One group per layer with parameters (its Describe()), each its own block.
  std::vector<ParameterGroup> parameter_groups() const override { return groups_; }
  MemoryStats memory() const override;

  int64_t input_size() const { return layers_.front()->input_size(); }
  int64_t classes() const { return loss_.classes(); }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

 protected:
  // The subclass's constructor adds its layers (they add their parameters to
  // mutable_table()), the first taking `input_size` floats per sample; the last layer's
  // output size is the number of classes.
  SequentialClassifier(std::string description, int64_t classes);
  state::TensorTable& mutable_table() { return table_; }
  // CHECKs that the layer takes what the previous one makes.
  void Add(std::unique_ptr<Layer> layer);

 private:
  absl::Status CheckBatch(const Batch& batch) const;
  // The parameters the layers read: `params` itself, or its rounded compute copy (null with
  // a store: layers ask it).
  const float* ComputeParams(const state::FlatBuffer& params, Precision precision,
                             ParameterStore* store);
  // Layer i's parameter base: `params`, or the store's for the layer's group.
  const float* LayerParams(size_t i, const float* params, ParameterStore* store) const;
  // Runs every layer; returns the logits.
  const float* Forward(const Batch& batch, const float* params, Precision precision,
                       ParameterStore* store);
  // From dlogits (in grad_[0]) down to the first layer.
  void Backward(const float* params, int64_t n, state::FlatBuffer& grads,
                const ForwardBackwardOptions& options);
  // Writes the layer's parameter gradients (group `group`: into the store's buffer when
  // options.store is set).
  void BackwardParams(Layer& layer, int group, const float* x, const float* dy, int64_t n,
                      state::FlatBuffer& grads, const ForwardBackwardOptions& options);
  const float* LayerInput(size_t i) const { return i == 0 ? input_ : outputs_[i - 1]; }

  std::string description_;
  state::TensorTable table_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParameterGroup> groups_;
  std::vector<int> layer_group_;  // per layer: its group, -1 without parameters
  SoftmaxCrossEntropy loss_;

  // Activations of the current call: the input and each layer's output.
  const float* input_ = nullptr;
  std::vector<float*> outputs_;
  std::vector<GrowBuffer<float>> output_buffers_;  // one per layer; in-place ones stay empty
  GrowBuffer<float> input_copy_;                   // the rounded input, for half precision
  GrowBuffer<float> grad_[2];                      // ping-pong activation gradients
  int64_t largest_output_ = 0;

  state::FlatBuffer compute_params_;  // rounded parameters, for half precision
  GrowBuffer<float> staged_grads_;  // one layer's half-precision gradients, for accumulate
  int64_t largest_parameter_span_ = 0;
  std::vector<float*> grad_targets_;  // per parameter of the layer in backward
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_SEQUENTIAL_H_
