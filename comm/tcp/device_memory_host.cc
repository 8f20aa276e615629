// The build without CUDA: there is no device memory.
#include "comm/tcp/device_memory.h"

namespace ringmaster::comm::tcp {

bool IsDevicePointer(const void*) { return false; }

absl::Status CopyDeviceToHost(void*, const void*, size_t) {
  return absl::FailedPreconditionError("this binary was built without CUDA (--config=cuda)");
}

absl::Status CopyHostToDevice(void*, const void*, size_t) {
  return absl::FailedPreconditionError("this binary was built without CUDA (--config=cuda)");
}

}  // namespace ringmaster::comm::tcp
