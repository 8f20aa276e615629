// Model weights in and out of ringmaster, apart from training state: a GPT's tensors in
// Hugging Face GPT-2's safetensors layout (checkpoint/safetensors.h), and the parameters of
// a ringmaster checkpoint by tensor name. `ringctl export` and the spec's `init_from` use
// these; neither knows a model's classes, only its tensor table (names and shapes).
//
// GPT-2's names for ringmaster's GPT tensors (train/nn/gpt.h lists ours), <l> a block:
//   wte                     wte.weight               [vocab, width]
//   wpe                     wpe.weight               [context, width]
//   h<l>.ln1.{weight,bias}  h.<l>.ln_1.{weight,bias}
//   h<l>.attn.qkv.weight    h.<l>.attn.c_attn.weight  [width, 3 width]   transposed
//   h<l>.attn.qkv.bias      h.<l>.attn.c_attn.bias
//   h<l>.attn.proj.weight   h.<l>.attn.c_proj.weight  [width, width]     transposed
//   h<l>.ln2.*              h.<l>.ln_2.*
//   h<l>.mlp.fc.weight      h.<l>.mlp.c_fc.weight     [width, 4 width]   transposed
//   h<l>.mlp.proj.weight    h.<l>.mlp.c_proj.weight   [4 width, width]   transposed
//   (their biases by the same names)
//   lnf.*                   ln_f.*
//   lm_head.weight          lm_head.weight           [vocab, width]  (an untied model only)
// GPT-2's linear layers are Conv1D modules, whose weight is [in, out]: the transpose of
// ours, [out, in] as nn.Linear. The fused Q/K/V projection needs no other permutation: both
// put q, k and v one after another, each `width` wide, head h at [h hs, (h + 1) hs) of each
// (kernels/attention.h; GPT-2 splits c_attn's output in three, then each into heads).
//
// Reading a GPT-2 file, names may carry the "transformer." prefix (GPT2LMHeadModel's
// save_pretrained) or not (GPT2Model's, and the files on the Hub); the attention masks that
// real GPT-2 files hold as tensors (h.<l>.attn.bias, h.<l>.attn.masked_bias) are skipped. A
// model whose table has no lm_head.weight ties its head to wte (model.gpt2): a file's
// lm_head.weight is accepted only when it equals wte.weight (a tied model saved with its
// head). An untied model (model.gpt) needs the file's lm_head.weight.
//
// Every tensor of the table must be in the source with the same shape (in GPT-2's layout
// for a safetensors file), but for one exception: position embeddings (wpe) for more
// positions than the model's context, of which the first `context` are taken (GPT-2's 1024
// into a model with a shorter context, which computes the same for its positions; `say`
// tells). Every tensor of the source must be used: a missing,
// unexpected or misshapen tensor is FAILED_PRECONDITION naming the file, the tensor, and
// for a shape both shapes. Errors of the files themselves as checkpoint/safetensors.h and
// checkpoint/reader.h say (DATA_LOSS for a damaged file, NOT_FOUND for a missing one).
//
// Thread-safety: the functions may run concurrently.
#ifndef RINGMASTER_CHECKPOINT_WEIGHTS_H_
#define RINGMASTER_CHECKPOINT_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors.h"
#include "common/env.h"
#include "state/tensor.h"

namespace ringmaster::checkpoint {

// Where a ringmaster GPT tensor is in a GPT-2 file: its name there (without a prefix) and
// whether it is stored transposed (a Conv1D weight).
struct Gpt2Tensor {
  std::string name;
  bool transposed = false;
};
// INVALID_ARGUMENT when `name` is not one of a GPT's tensors.
absl::StatusOr<Gpt2Tensor> Gpt2TensorFor(absl::string_view name);

// The tensors of `table` under GPT-2's names and layout, their values taken from `params`
// (the whole flat space of `table`, at the table's offsets; it must outlive the returned
// fills). INVALID_ARGUMENT naming the tensor when the table is not a GPT's.
absl::StatusOr<std::vector<SafetensorsTensor>> Gpt2Tensors(const state::TensorTable& table,
                                                           absl::Span<const float> params);

// Called once per tensor of the table being loaded, in table order, with its whole value in
// ringmaster's layout (valid during the call). An error stops the load and is returned.
using WeightReceiver = std::function<absl::Status(int tensor, absl::Span<const float> values)>;

// Reads the weights for `table` from `path`: a GPT-2 safetensors file (any other path that
// is not a directory is read as one), or a ringmaster checkpoint directory (a step-<N>
// with a MANIFEST, or a job directory: the checkpoint its LATEST names), whose "params" are
// matched by tensor name, so a checkpoint of any model loads into a model with the same
// tensors (and a GPT's into a tied GPT-2 of the same size, when its head equals wte).
// Reads one tensor at a time. `say`, when set, gets one line saying what was read.
absl::Status ReadWeights(const std::string& path, const state::TensorTable& table,
                         const WeightReceiver& receive, Env* env = Env::Default(),
                         const std::function<void(const std::string&)>& say = nullptr);

struct ExportReport {
  std::string checkpoint_dir;  // the step-<N> read
  int64_t step = 0;
  std::string model;  // "gpt", "gpt2", ... as the checkpoint's job spec says; "" unknown
  int tensors = 0;
  int64_t parameters = 0;
  int64_t bytes = 0;  // of the file written
};

// `ringctl export`: the parameters of the checkpoint in `checkpoint_dir` (a step-<N> or a
// job directory, as ReadWeights; any world size, ZeRO stage or mesh: a checkpoint holds
// whole-model tensors) written to `out` in GPT-2's safetensors layout, fp32 by default,
// with metadata {"format": "pt"} (what transformers expects) and the job and step.
// FAILED_PRECONDITION naming the model for a checkpoint of a model other than a GPT (by its
// spec, or its tensor names when it has no spec recorded).
absl::StatusOr<ExportReport> ExportCheckpoint(const std::string& checkpoint_dir,
                                              const std::string& out,
                                              const SafetensorsWriteOptions& options);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_WEIGHTS_H_
