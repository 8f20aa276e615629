// Where a part of the GPT a rank holds (a pipeline stage, a tensor-parallel shard, or both)
// is in the whole model's flat space: the trainer's optimizer, checkpoints and
// initialisation work in the whole model's coordinates (any mesh loads any checkpoint),
// while a rank's buffers hold its parts back to back, each in its slice's layout.
//
// A tensor held whole is one run; a tensor-parallel shard (nn::TensorShard: some rows of the
// whole tensor, cut to some columns) is a run per whole row it holds, consecutive ones
// merged. A tensor that every tensor-parallel rank holds whole (LayerNorms, the biases of
// row-parallel layers, embeddings, the head) is `replicated`: it counts once, on the group's
// rank 0, where each rank's copies would otherwise be summed or saved twice. The last
// pipeline stage's copy of wte for a tied LM head (nn::GptOptions::tied_head) is a `tied_copy`:
// it counts on the first stage, which holds wte itself.
#ifndef RINGMASTER_TRAIN_TENSOR_PLACES_H_
#define RINGMASTER_TRAIN_TENSOR_PLACES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/nn/gpt.h"

namespace ringmaster::train {

struct TensorPlace {
  state::FlatRange whole;   // in the whole model's flat space
  int64_t local = 0;        // where the run starts in the rank's buffers
  bool replicated = false;  // held whole by every tensor-parallel rank
  bool tied_copy = false;   // a last stage's copy of wte (counted on the first stage)
};

// Appends the runs of `part`'s tensors (its table laid out from `base` in the rank's
// buffers), found by name in `whole`; `tensor_parallel`: the job splits tensors over a
// tensor-parallel group (so whole tensors are replicated). Keeps `places` in increasing
// local order when parts are appended in increasing `base`. INTERNAL when a tensor is not
// a part of the whole model's.
absl::Status AppendTensorPlaces(const nn::GptModel& part, const state::TensorTable& whole,
                                int64_t base, bool tensor_parallel,
                                std::vector<TensorPlace>* places);

// The pieces of the whole flat space inside `local` (buffer offsets), each `at` counted from
// `origin`. With `replicas` false, replicated runs count on tensor-parallel rank 0 only
// (`tp_rank` is this rank's) and tied copies not at all.
std::vector<state::PlacedRange> MapTensorPlaces(const std::vector<TensorPlace>& places,
                                                state::FlatRange local, int64_t origin,
                                                bool replicas, int tp_rank);

// `whole` (the whole model's flat space) zeroed, then every run copied from `local` (the
// rank's buffer the places index), a replicated one on tensor-parallel rank 0 only, a tied
// copy never: summed over the groups that split the model, it is the whole model.
void ScatterToWhole(const std::vector<TensorPlace>& places, const float* local, int tp_rank,
                    absl::Span<float> whole);

// The runs inside `window` (buffer offsets) that another rank counts, as offsets from its
// start (the optimizer's duplicate ranges): on tensor-parallel ranks other than 0 the
// replicated ones (counted on rank 0), and a tied copy (counted on the first stage).
std::vector<state::FlatRange> ReplicatedRanges(const std::vector<TensorPlace>& places,
                                               state::FlatRange window, int tp_rank);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TENSOR_PLACES_H_
