#include "worker/gpu_check.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringmaster::worker {
namespace {

// "NVIDIA H200 (sm_90, 140 GiB)".
std::string Describe(const GpuDevice& d) {
  return absl::StrCat(d.name, " (sm_", d.compute_capability, ", ",
                      std::llround(static_cast<double>(d.memory_bytes) / (int64_t{1} << 30)),
                      " GiB)");
}

// "8 x NVIDIA H200 (sm_90, 140 GiB)", runs of equal devices grouped.
std::string DescribeAll(const std::vector<GpuDevice>& devices) {
  std::vector<std::pair<std::string, int>> runs;
  for (const GpuDevice& d : devices) {
    std::string text = Describe(d);
    if (!runs.empty() && runs.back().first == text) {
      ++runs.back().second;
    } else {
      runs.emplace_back(std::move(text), 1);
    }
  }
  return absl::StrJoin(runs, ", ", [](std::string* out, const std::pair<std::string, int>& r) {
    absl::StrAppend(out, r.second, " x ", r.first);
  });
}

// Why the GPUs `probe` saw cannot serve `options.slots` trainers, or "" when they can.
// `usable` gets the GPUs this build's kernels run on.
std::string Problem(const GpuCheckOptions& options, const GpuProbe& probe, int* usable) {
  *usable = 0;
  std::vector<std::string> too_old;
  for (size_t i = 0; i < probe.devices.size(); ++i) {
    const GpuDevice& d = probe.devices[i];
    if (d.compute_capability >= options.min_compute_capability) {
      ++*usable;
    } else {
      too_old.push_back(absl::StrCat("GPU ", i, " ", Describe(d)));
    }
  }
  if (*usable >= options.slots) return "";
  if (!probe.cuda_build) {
    return "this ringworker was built without CUDA, so its trainers can only train on the "
           "CPU: deploy the bundle of `bazel build --config=cuda //deploy:bundle` (on "
           "Kubernetes, the image of deploy/k8s/Dockerfile.gpu)";
  }
  const std::string error = probe.error.empty() ? "" : absl::StrCat(" (", probe.error, ")");
  if (!probe.driver_loaded) {
    return absl::StrCat(
        "the NVIDIA driver is missing: libcuda.so.1 could not be loaded", error,
        ". Install the driver on the host; in a container, run with the NVIDIA Container "
        "Toolkit (on Kubernetes: the GPU Operator or the nvidia RuntimeClass), which mounts "
        "the host's driver into it");
  }
  if (probe.driver_version / 1000 < probe.runtime_version / 1000) {
    return absl::StrCat("the NVIDIA driver supports ", CudaVersionText(probe.driver_version),
                        " but this build's runtime is ", CudaVersionText(probe.runtime_version),
                        error, ": update the host's driver to one for ",
                        CudaVersionText(probe.runtime_version / 1000 * 1000), " or newer");
  }
  if (probe.devices.empty()) {
    std::string text = absl::StrCat(
        "no GPU is visible to this process", error,
        ": check nvidia-smi on the host, CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES, and on "
        "Kubernetes the pod's nvidia.com/gpu and the NVIDIA device plugin");
    if (absl::StrContains(probe.error, "cudaErrorSystemNotReady")) {
      absl::StrAppend(&text, " (an NVSwitch system needs nvidia-fabricmanager running)");
    }
    return text;
  }
  std::string text = absl::StrCat(*usable, " usable GPU(s) for --slots=", options.slots,
                                  " (one per trainer): ", DescribeAll(probe.devices), " visible");
  if (!too_old.empty()) {
    absl::StrAppend(&text, "; too old for this build's kernels, which need sm_",
                    options.min_compute_capability, " or newer: ", absl::StrJoin(too_old, ", "));
  }
  absl::StrAppend(&text,
                  ". Give the agent more GPUs (on Kubernetes: nvidia.com/gpu = --slots) or "
                  "lower --slots");
  return text;
}

}  // namespace

absl::StatusOr<GpuPolicy> ParseGpuPolicy(absl::string_view text) {
  if (text == "none") return GpuPolicy::kNone;
  if (text == "auto") return GpuPolicy::kAuto;
  if (text == "required") return GpuPolicy::kRequired;
  return absl::InvalidArgumentError(
      absl::StrCat("--gpus: \"", text, "\" is not one of none, auto, required"));
}

std::string CudaVersionText(int version) {
  return absl::StrCat("CUDA ", version / 1000, ".", version % 1000 / 10);
}

absl::StatusOr<std::string> CheckGpus(const GpuCheckOptions& options, const GpuProbe& probe) {
  if (options.policy == GpuPolicy::kNone) {
    return std::string("GPUs not probed (--gpus=none): CPU slots");
  }
  int usable = 0;
  const std::string problem = Problem(options, probe, &usable);
  if (problem.empty()) {
    return absl::StrCat(usable, " GPU(s) for ", options.slots,
                        " slot(s): ", DescribeAll(probe.devices), "; driver ",
                        CudaVersionText(probe.driver_version), ", runtime ",
                        CudaVersionText(probe.runtime_version));
  }
  if (options.policy == GpuPolicy::kRequired) {
    return absl::FailedPreconditionError(absl::StrCat("--gpus=required: ", problem));
  }
  return absl::StrCat("--gpus=auto: ", problem,
                      usable > 0 ? " (trainers share the usable GPUs)"
                                 : " (trainers with device: auto train on the CPU)");
}

}  // namespace ringmaster::worker
