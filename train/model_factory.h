// Building what a job trains from its options: the data sets it names, loaded, and the model
// it describes for that data (ARCHITECTURE.md "trainer").
#ifndef RINGMASTER_TRAIN_MODEL_FACTORY_H_
#define RINGMASTER_TRAIN_MODEL_FACTORY_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/config.h"
#include "train/data/dataset.h"
#include "train/model.h"

namespace ringmaster::train {

// The training and (when the task has one) evaluation data a job names, loaded; for callers
// that run several trainings on the same data (an elastic trainer's epochs) and pass it as
// TrainerOptions::train_data / test_data.
struct JobData {
  std::unique_ptr<data::Dataset> owned_train, owned_test;
  const data::Dataset* train = nullptr;
  const data::Dataset* test = nullptr;
};
// NOT_FOUND / DATA_LOSS from the files; RESOURCE_EXHAUSTED (permanent) when they do not fit
// in memory. Text samples are model.gpt.context + 1 bytes.
absl::StatusOr<JobData> LoadJobData(const TrainConfig& config);

// The model `model` describes, for `data` (input sizes, classes or vocabulary), uninitialised.
// INVALID_ARGUMENT naming the field when the model does not fit the data (model.mlp needs
// image data, model.gpt text).
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& model,
                                                   const data::DatasetInfo& data);

// What the data sets of `config` look like (feature size, classes, context, vocabulary),
// without reading them.
data::DatasetInfo DescribeJobData(const TrainConfig& config);

// RESOURCE_EXHAUSTED, marked permanent (a restart finds no more memory): out of memory while
// allocating `what`.
absl::Status OutOfMemory(absl::string_view what);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MODEL_FACTORY_H_
