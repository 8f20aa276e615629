// The resumable training state beside the tensors: where the data sampler is and the fp16
// loss scaler's state. A checkpoint stores them (checkpoint/manifest.h) and a resume hands
// them back to train/data/sampler.h and train/optim/loss_scaler.h unchanged, on any number
// of ranks (neither depends on the world size).
#ifndef RINGMASTER_STATE_TRAINING_STATE_H_
#define RINGMASTER_STATE_TRAINING_STATE_H_

#include <cstdint>
#include <string>

namespace ringmaster::state {

// Where a job's global batch sampler is (train/data/sampler.h).
struct SamplerState {
  uint64_t epoch = 0;  // data epoch
  int64_t cursor = 0;  // samples of this epoch already consumed
  bool operator==(const SamplerState&) const = default;
};

std::string SamplerStateString(const SamplerState& state);  // "epoch 3 cursor 1200"

// The dynamic loss scaler's state (train/optim/loss_scaler.h).
struct LossScalerState {
  double scale = 0;
  int64_t good_steps = 0;     // finite steps since the last overflow or growth
  int64_t steps = 0;          // steps checked
  int64_t skipped_steps = 0;  // steps that overflowed and were skipped (= overflows)

  bool operator==(const LossScalerState&) const = default;
};

}  // namespace ringmaster::state

#endif  // RINGMASTER_STATE_TRAINING_STATE_H_
