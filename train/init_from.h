// Starting a job from given weights (JobSpec.init_from, TrainConfig::init_from): the whole
// model's tensors, read from a GPT-2 safetensors file or a ringmaster checkpoint
// (checkpoint/weights.h), copied into whatever part of the flat parameter space this rank
// holds: the whole space (data parallelism, ZeRO-0/1) or its pieces (ZeRO-2/3 units,
// pipeline stages, tensor-parallel shards: the same PlacedRanges a checkpoint restore reads
// into). Weights only: the optimizer's state, the step and the data order are untouched.
//
// Every rank reads the file itself (as every rank reads its part of a checkpoint), one
// tensor at a time, so a rank holds at most one whole tensor besides its own buffers.
#ifndef RINGMASTER_TRAIN_INIT_FROM_H_
#define RINGMASTER_TRAIN_INIT_FROM_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/env.h"
#include "state/range.h"
#include "state/tensor.h"

namespace ringmaster::train {

struct InitFromOptions {
  std::string path;                           // TrainConfig::init_from
  const state::TensorTable* table = nullptr;  // the whole model's. Not owned.
  // The rank's parameters: with `pieces` empty, the whole flat space (at the table's
  // offsets); else the buffer the pieces place flat ranges in. Not owned.
  state::FlatBuffer* params = nullptr;
  std::vector<state::PlacedRange> pieces;
  Env* env = Env::Default();  // not owned
  // Rank 0's line for the user (what was read). May be null.
  std::function<void(const std::string&)> say;
};

// Fills the rank's parameters from options.path; blocks on the reads. Errors name
// "init_from", the file and the tensor (checkpoint/weights.h); a file that is missing or
// damaged is marked node-local (another node may have it whole), a mismatch between the
// file and the model permanent (common/status_macros.h). INVALID_ARGUMENT for pieces that
// do not fit `params`, before anything is read.
absl::Status LoadInitialWeights(const InitFromOptions& options);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_INIT_FROM_H_
