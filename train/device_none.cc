// train/device.h in builds without --config=cuda: there is no GPU to train on.
#include "train/device.h"

#include "absl/strings/str_cat.h"

namespace ringmaster::train {

namespace {

absl::Status NoCuda(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": this build has no CUDA: build ringmaster with --config=cuda (CUDA under "
      "/usr/local/cuda)"));
}

}  // namespace

int CudaDeviceCount() { return 0; }

int CudaOrdinalForSlot(int) { return 0; }

absl::StatusOr<std::string> CudaDeviceUuid(int) { return NoCuda("a GPU's UUID"); }

absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclGradients(
    const NcclGradientsOptions&) {
  return NoCuda("NCCL");
}

absl::StatusOr<std::unique_ptr<TrainingDevice>> CreateCudaDevice(const Model&, int64_t,
                                                                 const CudaDeviceOptions&) {
  return absl::FailedPreconditionError(
      "this build has no CUDA: build ringmaster with --config=cuda (CUDA under "
      "/usr/local/cuda) to train on a GPU, or set device: cpu");
}

}  // namespace ringmaster::train
