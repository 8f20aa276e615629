// ProbeGpus in a --config=cuda build: the CUDA runtime's view, and the driver's library
// loaded the way the runtime loads it (by its soname) to tell a missing driver from an old
// one.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "worker/gpu_check.h"

namespace ringmaster::worker {

GpuProbe ProbeGpus() {
  GpuProbe probe;
  probe.cuda_build = true;
  probe.runtime_version = CUDART_VERSION;
  // Left loaded: the runtime uses the same handle.
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); driver != nullptr) {
    probe.driver_loaded = true;
    using DriverGetVersion = int (*)(int*);  // CUresult cuDriverGetVersion(int*)
    if (auto get = reinterpret_cast<DriverGetVersion>(dlsym(driver, "cuDriverGetVersion"));
        get != nullptr && get(&probe.driver_version) != 0) {
      probe.driver_version = 0;
    }
  }
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    probe.error = absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    cudaGetLastError();
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (const cudaError_t err = cudaGetDeviceProperties(&prop, i); err != cudaSuccess) {
      probe.error =
          absl::StrCat("GPU ", i, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
      cudaGetLastError();
      continue;
    }
    probe.devices.push_back({.name = prop.name,
                             .compute_capability = prop.major * 10 + prop.minor,
                             .memory_bytes = static_cast<int64_t>(prop.totalGlobalMem)});
  }
  return probe;
}

}  // namespace ringmaster::worker
