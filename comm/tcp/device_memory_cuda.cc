// The --config=cuda build: device buffers are recognised and staged with cudaMemcpy.
#include <cuda_runtime_api.h>

#include "comm/tcp/device_memory.h"
#include "common/cuda_status.h"

namespace ringmaster::comm::tcp {

bool IsDevicePointer(const void* ptr) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error for unregistered host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes) {
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes) {
  RM_RETURN_IF_CUDA_ERROR(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace ringmaster::comm::tcp
