#include "train/model_factory.h"

#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "train/data/fashion_mnist.h"
#include "train/data/gpt2_tokenizer.h"
#include "train/data/prepare.h"
#include "train/data/text_dataset.h"
#include "train/nn/classifiers.h"
#include "train/nn/gpt.h"
#include "train/nn/resnet.h"

namespace ringmaster::train {
namespace {

// data.text for model.gpt2: the file's text as GPT-2's tokens, <|endoftext|> first (what
// `ringctl data prepare FILE` writes). Errors name the file; the tokenizer's say to run
// tools/setup.sh when its files are missing.
absl::StatusOr<std::unique_ptr<data::Dataset>> LoadTextAsGpt2Tokens(const std::string& path,
                                                                    const nn::GptOptions& gpt) {
  RM_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<data::Gpt2Tokenizer> tokenizer,
                      data::Gpt2Tokenizer::Create());
  const std::vector<int32_t> ids = tokenizer->Encode(text);
  std::vector<uint16_t> tokens = {static_cast<uint16_t>(data::kGpt2EndOfText)};
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  RM_ASSIGN_OR_RETURN(std::unique_ptr<data::TokenDataset> dataset,
                      data::TokenDataset::Create(absl::StrCat(path, " (GPT-2 tokens)"),
                                                 std::move(tokens), gpt.context, gpt.vocab));
  return std::unique_ptr<data::Dataset>(std::move(dataset));
}

absl::StatusOr<JobData> LoadOrThrow(const TrainConfig& config) {
  JobData d;
  const DataConfig& dc = config.data;
  switch (dc.kind) {
    case DataConfig::Kind::kFashionMnist: {
      data::FashionMnistOptions fo;
      if (!dc.normalize) fo.normalization = data::PixelNormalization{};
      RM_ASSIGN_OR_RETURN(d.owned_train, data::LoadFashionMnist(dc.fashion_mnist_dir,
                                                                data::FashionMnistSplit::kTrain, fo));
      RM_ASSIGN_OR_RETURN(d.owned_test, data::LoadFashionMnist(dc.fashion_mnist_dir,
                                                               data::FashionMnistSplit::kTest, fo));
      break;
    }
    case DataConfig::Kind::kMnist: {
      data::MnistOptions mo;
      if (!dc.normalize) mo.normalization = data::PixelNormalization{};
      RM_ASSIGN_OR_RETURN(d.owned_train,
                          data::LoadMnist(dc.mnist_dir, data::FashionMnistSplit::kTrain, mo));
      RM_ASSIGN_OR_RETURN(d.owned_test,
                          data::LoadMnist(dc.mnist_dir, data::FashionMnistSplit::kTest, mo));
      break;
    }
    case DataConfig::Kind::kText: {
      if (dc.text_as_gpt2_tokens) {
        RM_ASSIGN_OR_RETURN(d.owned_train, LoadTextAsGpt2Tokens(dc.text_path, config.model.gpt));
      } else {
        RM_ASSIGN_OR_RETURN(d.owned_train,
                            data::LoadTextDataset(dc.text_path, config.model.gpt.context));
      }
      break;
    }
    case DataConfig::Kind::kTokens: {
      const nn::GptOptions& gpt = config.model.gpt;
      RM_ASSIGN_OR_RETURN(d.owned_train,
                          data::LoadTokenDataset(dc.tokens_train_path, gpt.context, gpt.vocab));
      if (!dc.tokens_validation_path.empty()) {
        RM_ASSIGN_OR_RETURN(d.owned_test, data::LoadTokenDataset(dc.tokens_validation_path,
                                                                 gpt.context, gpt.vocab));
      }
      break;
    }
  }
  d.train = d.owned_train.get();
  d.test = d.owned_test.get();
  return d;
}

}  // namespace

absl::Status OutOfMemory(absl::string_view what) {
  return MarkPermanent(absl::ResourceExhaustedError(
      absl::StrCat("out of memory while allocating ", what,
                   " (std::bad_alloc); make the model or the batch smaller, or give each "
                   "rank more memory (fewer ranks per node, parallelism.zero_stage)")));
}

absl::StatusOr<JobData> LoadJobData(const TrainConfig& config) {
  try {
    return LoadOrThrow(config);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("the job's data (data)");
  }
}

data::DatasetInfo DescribeJobData(const TrainConfig& config) {
  data::DatasetInfo shape;
  switch (config.data.kind) {
    case DataConfig::Kind::kFashionMnist:
    case DataConfig::Kind::kMnist:
      shape.feature_dim = data::kFashionMnistRows * data::kFashionMnistCols;
      shape.num_classes = data::kFashionMnistClasses;
      break;
    case DataConfig::Kind::kText:
    case DataConfig::Kind::kTokens:
      shape.context = config.model.gpt.context;
      shape.vocab_size = config.model.gpt.vocab;
      break;
  }
  return shape;
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& m,
                                                   const data::DatasetInfo& data) {
  nn::ModelOptions o;
  switch (m.kind) {
    case ModelConfig::Kind::kMlp:
      if (data.feature_dim == 0) {
        return absl::InvalidArgumentError("model.mlp needs image data (data.fashion_mnist)");
      }
      o.kind = nn::ModelKind::kMlp;
      o.mlp.inputs = data.feature_dim;
      o.mlp.classes = data.num_classes;
      o.mlp.hidden = m.mlp_hidden;
      return nn::CreateModel(o);
    case ModelConfig::Kind::kCnn:
      if (data.feature_dim != data::kFashionMnistRows * data::kFashionMnistCols) {
        return absl::InvalidArgumentError("model.cnn needs 28x28 images (data.fashion_mnist)");
      }
      o.kind = nn::ModelKind::kCnn;
      o.cnn.conv_channels = m.cnn_channels;
      o.cnn.hidden = {m.cnn_fc};
      o.cnn.classes = data.num_classes;
      return nn::CreateModel(o);
    case ModelConfig::Kind::kResnet18: {
      if (data.feature_dim != data::kFashionMnistRows * data::kFashionMnistCols) {
        return absl::InvalidArgumentError("model.resnet18 needs 28x28 images (data.fashion_mnist)");
      }
      nn::ResNetOptions ro;
      ro.image_side = data::kFashionMnistRows;
      ro.width = m.resnet18_width;
      ro.classes = data.num_classes;
      RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::ResNet18> resnet, nn::ResNet18::Create(ro));
      return std::unique_ptr<Model>(std::move(resnet));
    }
    case ModelConfig::Kind::kGpt: {
      if (data.context == 0) {
        return absl::InvalidArgumentError("model.gpt needs text data (data.text)");
      }
      RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> gpt, nn::GptModel::Create(m.gpt));
      return std::unique_ptr<Model>(std::move(gpt));
    }
  }
  return absl::InvalidArgumentError("model: set one of mlp, cnn, gpt, gpt2 or resnet18");
}

}  // namespace ringmaster::train
