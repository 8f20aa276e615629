// Host staging for CUDA device buffers handed to the TCP backend: several ranks can then
// share one GPU (NCCL refuses that) at the price of two copies over PCIe.
//
// In builds without --config=cuda no pointer is a device pointer and nothing is staged.
#ifndef RINGMASTER_COMM_TCP_DEVICE_MEMORY_H_
#define RINGMASTER_COMM_TCP_DEVICE_MEMORY_H_

#include <cstddef>

#include "absl/status/status.h"

namespace ringmaster::comm::tcp {

// True when `ptr` points into CUDA device memory (not host or managed memory).
bool IsDevicePointer(const void* ptr);

// Blocking copies between host and device. INTERNAL with CUDA's error text on failure;
// FAILED_PRECONDITION in a build without CUDA.
absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes);
absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes);

}  // namespace ringmaster::comm::tcp

#endif  // RINGMASTER_COMM_TCP_DEVICE_MEMORY_H_
