// Internal to tools/cuda_emu: what the emulated grid, cuBLASLt and NCCL ask of the emulated
// runtime (cudart.cc).
#ifndef RINGMASTER_TOOLS_CUDA_EMU_INTERNAL_H_
#define RINGMASTER_TOOLS_CUDA_EMU_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace rm_emu {

// Sets the calling thread's last error (cudaGetLastError returns and clears it).
void SetLastError(cudaError_t error);
// The dynamic shared memory a kernel may use, as cudaFuncSetAttribute raised it (0 if not).
size_t MaxDynamicShared(const void* kernel);

// Marks the device as used by this process and says whether it may be: false in a child
// forked after its parent used CUDA (CUDA's rule; every call there fails with
// cudaErrorInitializationError).
bool DeviceUsable();

// The index of the emulated node's GPU this process sees: the first of CUDA_VISIBLE_DEVICES
// (0 when unset). The device's UUID (cudaGetDeviceProperties) says which it is.
int VisibleGpu();

// Queues `work` on `stream` (null, cudaStreamLegacy or cudaStreamPerThread: the legacy
// default stream): it runs on the stream's worker thread after the stream's earlier work and,
// as CUDA orders them, after earlier legacy-stream work (for a blocking stream) or earlier
// blocking-stream work (for the legacy stream). Returns cudaErrorInvalidResourceHandle for
// an unknown stream and cudaErrorInitializationError where DeviceUsable() is false.
cudaError_t Enqueue(cudaStream_t stream, std::function<void()> work);

}  // namespace rm_emu

#endif  // RINGMASTER_TOOLS_CUDA_EMU_INTERNAL_H_
