// A batch of training or evaluation samples, in the layout the models read.
//
// Classification (Fashion-MNIST): `features` is [size, feature_dim] row-major floats,
// `labels` is [size] class indices. Language modelling (byte-level text): `tokens` is
// [size, context + 1] row-major; a model reads columns 0..context-1 as inputs and predicts
// columns 1..context (the targets). Unused fields are empty.
#ifndef RINGMASTER_TRAIN_BATCH_H_
#define RINGMASTER_TRAIN_BATCH_H_

#include <cstdint>
#include <vector>

namespace ringmaster::train {

struct Batch {
  int64_t size = 0;  // samples in the batch

  int64_t feature_dim = 0;
  std::vector<float> features;
  std::vector<int32_t> labels;

  int64_t context = 0;
  std::vector<int32_t> tokens;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_BATCH_H_
