// train/device.h in builds without --config=cuda: there is no GPU to train on.
#include "train/device.h"

namespace ringmaster::train {

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<TrainingDevice>> CreateCudaDevice(const Model&, int64_t,
                                                                 const CudaDeviceOptions&) {
  return absl::FailedPreconditionError(
      "this build has no CUDA: build ringmaster with --config=cuda (CUDA under "
      "/usr/local/cuda) to train on a GPU, or set device: cpu");
}

}  // namespace ringmaster::train
