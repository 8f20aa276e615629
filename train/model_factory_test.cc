#include "train/model_factory.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/data/fashion_mnist.h"
#include "train/data/test_files.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kPixels = data::kFashionMnistRows * data::kFashionMnistCols;

// A Fashion-MNIST directory under TEST_TMPDIR with `n` training and `n` test images whose
// pixel j of image i is (i * 31 + j) % 256, labelled i % 10.
std::string MakeFashionMnist(const std::string& name, uint32_t n) {
  mkdir(absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name).c_str(), 0755);
  std::string images = data::IdxHeader(0x00000803, {n, 28, 28});
  std::string labels = data::IdxHeader(0x00000801, {n});
  for (uint32_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < kPixels; ++j) images.push_back(static_cast<char>((i * 31 + j) % 256));
    labels.push_back(static_cast<char>(i % 10));
  }
  for (const char* split : {"train", "t10k"}) {
    data::WriteTestFile(absl::StrCat(name, "/", split, "-images-idx3-ubyte.gz"), images,
                        data::Compression::kGzip);
    data::WriteTestFile(absl::StrCat(name, "/", split, "-labels-idx1-ubyte.gz"), labels,
                        data::Compression::kGzip);
  }
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TrainConfig ImageJob(const std::string& dir) {
  TrainConfig c;
  c.data.kind = DataConfig::Kind::kFashionMnist;
  c.data.fashion_mnist_dir = dir;
  return c;
}

TrainConfig TextJob(const std::string& path, int64_t context) {
  TrainConfig c;
  c.data.kind = DataConfig::Kind::kText;
  c.data.text_path = path;
  c.model.kind = ModelConfig::Kind::kGpt;
  c.model.gpt.layers = 1;
  c.model.gpt.heads = 2;
  c.model.gpt.width = 16;
  c.model.gpt.context = context;
  return c;
}

// The description of the data without reading it is what reading it finds.
void ExpectDescribed(const TrainConfig& config, const data::DatasetInfo& loaded) {
  const data::DatasetInfo described = DescribeJobData(config);
  EXPECT_EQ(described.feature_dim, loaded.feature_dim);
  EXPECT_EQ(described.num_classes, loaded.num_classes);
  EXPECT_EQ(described.context, loaded.context);
  EXPECT_EQ(described.vocab_size, loaded.vocab_size);
}

TEST(ModelFactory, MlpForImages) {
  TrainConfig config = ImageJob(MakeFashionMnist("mlp", 5));
  config.model.kind = ModelConfig::Kind::kMlp;
  config.model.mlp_hidden = {7, 3};
  absl::StatusOr<JobData> d = LoadJobData(config);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(d->train, nullptr);
  ASSERT_NE(d->test, nullptr);
  EXPECT_EQ(d->train, d->owned_train.get());
  EXPECT_EQ(d->train->size(), 5);
  EXPECT_EQ(d->test->size(), 5);
  ExpectDescribed(config, d->train->info());
  ExpectDescribed(config, d->test->info());

  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(config.model, d->train->info());
  ASSERT_TRUE(m.ok()) << m.status();
  // Weights and biases of 784-7-3-10.
  EXPECT_EQ((*m)->table().parameter_count(), 784 * 7 + 7 + 7 * 3 + 3 + 3 * 10 + 10);
  EXPECT_EQ((*m)->LossTermsPerSample(), 1);
}

TEST(ModelFactory, CnnForImages) {
  TrainConfig config = ImageJob(MakeFashionMnist("cnn", 3));
  config.model.kind = ModelConfig::Kind::kCnn;
  config.model.cnn_channels = {2, 3};
  config.model.cnn_fc = 5;
  absl::StatusOr<JobData> d = LoadJobData(config);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(config.model, d->train->info());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT((*m)->Describe(), StartsWith("cnn"));
  // The head ends in the data's 10 classes: the last tensor is the output bias.
  const state::TensorTable& t = (*m)->table();
  EXPECT_EQ(t.tensor(t.size() - 1).shape, std::vector<int64_t>{10});
}

TEST(ModelFactory, Resnet18ForImages) {
  data::DatasetInfo images;
  images.feature_dim = kPixels;
  images.num_classes = 10;
  ModelConfig resnet;
  resnet.kind = ModelConfig::Kind::kResnet18;
  resnet.resnet18_width = 4;
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(resnet, images);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->Describe(), "resnet18 width 4 on 32x32 images (28x28 padded), 10 classes");
  EXPECT_GT((*m)->buffer_range().size(), 0);
  images.feature_dim = 100;
  m = CreateModel(resnet, images);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("model.resnet18 needs 28x28 images"));
}

TEST(ModelFactory, GptForText) {
  const std::string path = data::WriteTestFile(
      "corpus.txt", std::string(1000, 'a') + "the quick brown fox", data::Compression::kNone);
  TrainConfig config = TextJob(path, 8);
  absl::StatusOr<JobData> d = LoadJobData(config);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(d->train, nullptr);
  EXPECT_EQ(d->test, nullptr);  // a text job has no evaluation set
  EXPECT_EQ(d->train->size(), (1019 - 1) / 8);
  ExpectDescribed(config, d->train->info());

  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(config.model, d->train->info());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->LossTermsPerSample(), 8);
  EXPECT_THAT((*m)->Describe(), StartsWith("gpt 1 layers"));
}

// data.text for model.gpt2 is GPT-2's tokens of the text (after <|endoftext|>), not its
// bytes: the ids GPT-2's tokenizer gives ("Hello world" is 15496, 995).
TEST(ModelFactory, Gpt2ReadsTextAsGpt2Tokens) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Hello world. ";
  const std::string path = data::WriteTestFile("gpt2_corpus.txt", text, data::Compression::kNone);
  TrainConfig config = TextJob(path, 4);
  config.model.gpt.vocab = 50257;
  config.model.gpt.tied_head = true;
  config.data.text_as_gpt2_tokens = true;
  absl::StatusOr<JobData> d = LoadJobData(config);
  if (!d.ok() && absl::IsFailedPrecondition(d.status())) {
    GTEST_FAIL() << d.status() << " (run tools/setup.sh: GPT-2's tokenizer files)";
  }
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train->info().vocab_size, 50257);
  Batch batch;
  ASSERT_TRUE(d->train->Gather({0}, &batch).ok());
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{50256, 15496, 995, 13, 18435}));
  // 1 + 3 tokens per sentence after the first's ("Hello", " world", "."; then " Hello").
  EXPECT_EQ(d->train->size(), (1 + 40 * 3 - 1) / 4);
}

TEST(ModelFactory, UnnormalizedPixelsAreScaledToOne) {
  TrainConfig config = ImageJob(MakeFashionMnist("raw", 2));
  for (bool normalize : {true, false}) {
    config.data.normalize = normalize;
    absl::StatusOr<JobData> d = LoadJobData(config);
    ASSERT_TRUE(d.ok()) << d.status();
    Batch batch;
    ASSERT_TRUE(d->train->Gather({0}, &batch).ok());
    // Pixel 255 of image 0 is j = 255.
    const float raw = 1.0f;
    const float standardised =
        static_cast<float>((1.0 - data::kFashionMnistMean) / data::kFashionMnistStddev);
    EXPECT_FLOAT_EQ(batch.features[255], normalize ? standardised : raw) << normalize;
  }
}

TEST(ModelFactory, AModelThatDoesNotFitItsDataNamesTheField) {
  data::DatasetInfo images;
  images.feature_dim = kPixels;
  images.num_classes = 10;
  data::DatasetInfo small_images = images;
  small_images.feature_dim = 100;
  data::DatasetInfo text;
  text.context = 8;
  text.vocab_size = 256;

  ModelConfig mlp, cnn, gpt;
  mlp.kind = ModelConfig::Kind::kMlp;
  cnn.kind = ModelConfig::Kind::kCnn;
  gpt.kind = ModelConfig::Kind::kGpt;
  struct Case {
    const ModelConfig* model;
    const data::DatasetInfo* data;
    const char* field;
  };
  for (const Case& c : {Case{&mlp, &text, "model.mlp needs image data"},
                        Case{&cnn, &text, "model.cnn needs 28x28 images"},
                        Case{&cnn, &small_images, "model.cnn needs 28x28 images"},
                        Case{&gpt, &images, "model.gpt needs text data"}}) {
    absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(*c.model, *c.data);
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << c.field << ": " << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(c.field));
  }
  // An MLP takes any image size.
  EXPECT_TRUE(CreateModel(mlp, small_images).ok());
}

TEST(ModelFactory, MissingDataNamesTheFile) {
  absl::StatusOr<JobData> d = LoadJobData(ImageJob("/nonexistent/fashion"));
  EXPECT_TRUE(absl::IsNotFound(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("/nonexistent/fashion"));

  d = LoadJobData(TextJob("/nonexistent/corpus.txt", 8));
  EXPECT_TRUE(absl::IsNotFound(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("/nonexistent/corpus.txt"));
}

TEST(ModelFactory, DescribesDataWithoutReadingIt) {
  // Nothing exists at these paths: the description needs no file.
  data::DatasetInfo images = DescribeJobData(ImageJob("/nonexistent"));
  EXPECT_EQ(images.feature_dim, kPixels);
  EXPECT_EQ(images.num_classes, data::kFashionMnistClasses);
  EXPECT_EQ(images.context, 0);
  data::DatasetInfo text = DescribeJobData(TextJob("/nonexistent", 24));
  EXPECT_EQ(text.context, 24);
  EXPECT_EQ(text.vocab_size, 256);
  EXPECT_EQ(text.feature_dim, 0);
}

TEST(ModelFactory, OutOfMemoryIsPermanentAndNamesWhat) {
  absl::Status s = OutOfMemory("the flat parameters");
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(IsPermanent(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("out of memory while allocating the flat parameters"));
}

}  // namespace
}  // namespace ringmaster::train
