// The data sets a trainer reads: a fixed number of samples, any of which can be gathered
// into a train::Batch (train/batch.h) in any order, which is what the sampler
// (train/data/sampler.h) hands out.
//
// Implementations: ImageClassificationDataset (Fashion-MNIST, train/data/fashion_mnist.h)
// and TextDataset (byte-level language modelling, train/data/text_dataset.h).
//
// Thread-safety: a Dataset is immutable after creation; Gather may be called from several
// threads at once with different batches (e.g. a prefetch thread).
#ifndef RINGMASTER_TRAIN_DATA_DATASET_H_
#define RINGMASTER_TRAIN_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "train/batch.h"

namespace ringmaster::train::data {

// What a model needs to know about a data set. Classification sets feature_dim and
// num_classes; language modelling sets context and vocab_size; the others are 0.
struct DatasetInfo {
  std::string name;  // for logs and errors, e.g. "fashion-mnist train (/usr/share/...)"
  int64_t size = 0;  // number of samples, > 0
  int64_t feature_dim = 0;
  int64_t num_classes = 0;
  int64_t context = 0;  // tokens per sample are context + 1 (inputs and shifted targets)
  int64_t vocab_size = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  const DatasetInfo& info() const { return info_; }
  int64_t size() const { return info_.size; }

  // Fills `batch` with the samples at `indices`, in that order (repeats allowed): sets
  // batch->size to indices.size(), fills the fields of this data set's kind (see
  // train/batch.h) and empties the others. Reuses the vectors' capacity.
  // INVALID_ARGUMENT naming the first index outside [0, size()); `batch` is then unchanged.
  absl::Status Gather(absl::Span<const int64_t> indices, Batch* batch) const;

 protected:
  explicit Dataset(DatasetInfo info) : info_(std::move(info)) {}

  // Gather with every index already checked to lie in [0, size()).
  virtual void GatherValid(absl::Span<const int64_t> indices, Batch& batch) const = 0;

 private:
  const DatasetInfo info_;
};

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_DATASET_H_
