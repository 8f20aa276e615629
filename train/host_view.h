// The host's view of a rank's parameters and optimizer state (ARCHITECTURE.md "trainer").
#ifndef RINGMASTER_TRAIN_HOST_VIEW_H_
#define RINGMASTER_TRAIN_HOST_VIEW_H_

#include <vector>

#include "absl/status/status.h"
#include "state/tensor.h"
#include "train/device.h"
#include "train/optim/optimizer.h"

namespace ringmaster::train {

// The host's view of a rank's parameters and optimizer state. On the CPU it is that state
// itself. With a TrainingDevice the step works on the device's buffers and the host holds
// copies: Pull refreshes them (before a save, a fingerprint, an evaluation, keeping the
// state between epochs), Push sends them back (after a restore).
class HostView {
 public:
  enum class What { kParams, kEverything };

  // `params` (padded), the optimizer and the device (null: the CPU) outlive the view.
  HostView(state::FlatBuffer& params, Optimizer& optimizer, TrainingDevice* device);

  // The optimizer's state buffers in host memory (the ranges and names of the optimizer's).
  std::vector<StateBuffer>& optimizer() { return host_; }

  // The device's state has moved on (an optimizer step).
  void Invalidate() { params_current_ = optimizer_current_ = device_ == nullptr; }

  // Copies the device's state to the host copies that are stale (kParams: the parameters
  // only).
  absl::Status Pull(What what);
  // Copies the host's state to the device (after a restore).
  absl::Status Push();

 private:
  state::FlatBuffer& params_;
  Optimizer& optimizer_;
  TrainingDevice* device_;
  std::vector<state::FlatBuffer> owned_;  // with a device: the host copies of the state buffers
  std::vector<StateBuffer> host_;
  bool params_current_ = true;
  bool optimizer_current_ = true;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_HOST_VIEW_H_
