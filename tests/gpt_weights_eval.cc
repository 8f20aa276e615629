// gpt_weights_eval: ringmaster's side of the PyTorch peer check (tests/gpt2_peer.py): loads
// a GPT's weights (a GPT-2 safetensors file or a checkpoint directory, through
// checkpoint/weights.h as init_from does) into train/nn/gpt.h's model and evaluates one batch
// in fp32 on the CPU.
//
//   gpt_weights_eval --weights PATH --layers L --heads H --width W --context C --vocab V
//                    --tokens FILE --out FILE.json
//
// FILE holds n samples of context + 1 token ids, int32 little-endian. Writes a JSON object:
//   loss           the mean next-token loss over the n * context positions
//   correct        positions whose highest logit is the next token
//   sample_loss    each sample's mean loss
//   last_logprobs  per sample, the log-softmax of the logits at its last position, for every
//                  token id: the logits up to the one constant a softmax ignores. The model
//                  does not hand out its logits, so they are measured through the loss: with
//                  only the last target changed to j, the loss changes by exactly that
//                  position's term, -log p(j), the earlier positions' terms being the same
//                  computations (causal attention; the last target is no input).
// Exit status: 0 done, 1 an error (printed), 2 bad usage.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/weights.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "train/nn/gpt.h"

namespace ringmaster {
namespace {

struct Args {
  std::string weights, tokens, out;
  train::nn::GptOptions gpt;
};

absl::Status Evaluate(const Args& a) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<train::nn::GptModel> model,
                      train::nn::GptModel::Create(a.gpt));
  const state::TensorTable& table = model->table();
  state::FlatBuffer params(table.total_elements());
  RM_RETURN_IF_ERROR(
      checkpoint::ReadWeights(a.weights, table, [&](int i, absl::Span<const float> v) {
        std::copy(v.begin(), v.end(), params.tensor(table.tensor(i)).begin());
        return absl::OkStatus();
      }));
  RM_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(a.tokens));
  const int64_t per = a.gpt.context + 1;
  if (bytes.size() % (4 * per) != 0 || bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        a.tokens, ": ", bytes.size(), " bytes are not samples of ", per, " int32 ids"));
  }
  train::Batch batch;
  batch.size = static_cast<int64_t>(bytes.size() / (4 * per));
  batch.context = a.gpt.context;
  batch.tokens.resize(batch.size * per);
  std::memcpy(batch.tokens.data(), bytes.data(), bytes.size());
  RM_ASSIGN_OR_RETURN(train::StepStats all,
                      model->Evaluate(batch, params, train::Precision::kFloat32));
  nlohmann::json out;
  out["loss"] = all.loss_sum / static_cast<double>(all.loss_terms);
  out["correct"] = all.correct;
  out["sample_loss"] = nlohmann::json::array();
  out["last_logprobs"] = nlohmann::json::array();
  for (int64_t s = 0; s < batch.size; ++s) {
    train::Batch one;
    one.size = 1;
    one.context = a.gpt.context;
    one.tokens.assign(batch.tokens.begin() + s * per, batch.tokens.begin() + (s + 1) * per);
    RM_ASSIGN_OR_RETURN(train::StepStats own,
                        model->Evaluate(one, params, train::Precision::kFloat32));
    out["sample_loss"].push_back(own.loss_sum / static_cast<double>(own.loss_terms));
    std::vector<double> minus_loss(a.gpt.vocab);
    double top = -INFINITY;
    for (int64_t j = 0; j < a.gpt.vocab; ++j) {
      one.tokens.back() = static_cast<int32_t>(j);
      RM_ASSIGN_OR_RETURN(train::StepStats t,
                          model->Evaluate(one, params, train::Precision::kFloat32));
      minus_loss[j] = -t.loss_sum;
      top = std::max(top, minus_loss[j]);
    }
    double sum = 0;
    for (double m : minus_loss) sum += std::exp(m - top);
    const double lse = top + std::log(sum);
    std::vector<double> logprobs(a.gpt.vocab);
    for (int64_t j = 0; j < a.gpt.vocab; ++j) logprobs[j] = minus_loss[j] - lse;
    out["last_logprobs"].push_back(logprobs);
  }
  return WriteFileAtomically(a.out, out.dump());
}

int Main(int argc, char** argv) {
  Args a;
  int64_t tied = 0;  // --tied 1: the LM head is wte (model.gpt2, or model.gpt's tied_head)
  std::map<std::string, int64_t*> ints = {
      {"--layers", &a.gpt.layers},   {"--heads", &a.gpt.heads}, {"--width", &a.gpt.width},
      {"--context", &a.gpt.context}, {"--vocab", &a.gpt.vocab}, {"--tied", &tied}};
  std::map<std::string, std::string*> strings = {
      {"--weights", &a.weights}, {"--tokens", &a.tokens}, {"--out", &a.out}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    if (auto it = ints.find(key); it != ints.end() && absl::SimpleAtoi(value, it->second)) continue;
    if (auto it = strings.find(key); it != strings.end() && !value.empty()) {
      *it->second = value;
      continue;
    }
    fprintf(stderr,
            "gpt_weights_eval: bad argument %s (see the top of tests/gpt_weights_eval.cc)\n",
            arg.c_str());
    return 2;
  }
  if (a.weights.empty() || a.tokens.empty() || a.out.empty()) {
    fprintf(stderr, "gpt_weights_eval: --weights, --tokens and --out are required\n");
    return 2;
  }
  a.gpt.tied_head = tied != 0;
  if (absl::Status s = Evaluate(a); !s.ok()) {
    fprintf(stderr, "gpt_weights_eval: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) { return ringmaster::Main(argc, argv); }
