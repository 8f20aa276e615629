// The node agent's start-up check of its GPUs (ringworker --gpus): an agent that was given
// GPUs it cannot use exits at once, naming the cause, instead of registering its slots and
// letting trainers with `device: auto` train on the CPU.
//
// Two halves, apart so that the decision can be tested with any machine's answers:
//   ProbeGpus()  asks the CUDA runtime what this process sees (a build without
//                --config=cuda sees nothing and says so); never fails;
//   CheckGpus()  decides from a GpuProbe whether the agent may start (no I/O).
// Thread-safe: ProbeGpus initializes the CUDA runtime (call it once, from main); CheckGpus
// is a pure function.
#ifndef RINGMASTER_WORKER_GPU_CHECK_H_
#define RINGMASTER_WORKER_GPU_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster::worker {

// What the agent demands of the node's GPUs.
enum class GpuPolicy {
  kNone,      // CPU slots: no GPU is probed or wanted
  kAuto,      // use the GPUs that work; say so when there are none (trainers use the CPU)
  kRequired,  // one usable GPU per slot at least, or the agent does not start
};

// "none", "auto" or "required"; INVALID_ARGUMENT naming --gpus otherwise.
absl::StatusOr<GpuPolicy> ParseGpuPolicy(absl::string_view text);

struct GpuDevice {
  std::string name;            // "NVIDIA H200"
  int compute_capability = 0;  // major * 10 + minor: 90 for sm_90
  int64_t memory_bytes = 0;
};

// What this process sees of CUDA.
struct GpuProbe {
  // Built with --config=cuda (the CUDA runtime is linked); false: nothing else was probed.
  bool cuda_build = false;
  // CUDA version of the runtime linked in (CUDART_VERSION: 13000 for 13.0); 0 without CUDA.
  int runtime_version = 0;
  // The driver's libcuda.so.1 could be loaded (on Kubernetes the NVIDIA Container Toolkit
  // mounts the host's; the bundle never carries it), and the CUDA version it supports
  // (cuDriverGetVersion; 0 when not loaded).
  bool driver_loaded = false;
  int driver_version = 0;
  // cudaGetDeviceCount's error ("cudaErrorNoDevice: no CUDA-capable device is detected"),
  // empty when it succeeded.
  std::string error;
  std::vector<GpuDevice> devices;  // as the process sees them (CUDA_VISIBLE_DEVICES applies)
};

// Probes the GPUs through the CUDA runtime; a default build returns {cuda_build = false}.
GpuProbe ProbeGpus();

struct GpuCheckOptions {
  GpuPolicy policy = GpuPolicy::kAuto;
  // GPUs the node must have under kRequired: the agent's --slots (one trainer per GPU).
  int slots = 1;
  // The oldest GPU this build's kernels run on (tools/cuda.bzl: sm_90 code and compute_80
  // PTX, so 80); an older GPU is not usable.
  int min_compute_capability = 80;
};

// Whether the agent may start with the GPUs `probe` saw. OK: a line for the log that says
// what the trainers will train on. FAILED_PRECONDITION (kRequired only) naming the cause
// and the fix: a build without CUDA, the NVIDIA driver missing or older than the runtime,
// no GPU visible, fewer usable GPUs than slots, or GPUs too old for the build's kernels.
absl::StatusOr<std::string> CheckGpus(const GpuCheckOptions& options, const GpuProbe& probe);

// "CUDA 13.0" for 13000.
std::string CudaVersionText(int version);

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_GPU_CHECK_H_
