#include "worker/gpu_check.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kGiB = int64_t{1} << 30;

GpuDevice H200() {
  return {.name = "NVIDIA H200", .compute_capability = 90, .memory_bytes = 141 * kGiB};
}
GpuDevice T4() { return {.name = "Tesla T4", .compute_capability = 75, .memory_bytes = 15 * kGiB}; }

// A CUDA 13.0 build on a machine whose driver is for CUDA 13.0, with `devices` visible.
GpuProbe Healthy(std::vector<GpuDevice> devices) {
  GpuProbe p;
  p.cuda_build = true;
  p.runtime_version = 13000;
  p.driver_loaded = true;
  p.driver_version = 13000;
  p.devices = std::move(devices);
  return p;
}

GpuCheckOptions Required(int slots) {
  return {.policy = GpuPolicy::kRequired, .slots = slots, .min_compute_capability = 80};
}

// The message of a check that must fail with FAILED_PRECONDITION.
std::string Refusal(const GpuCheckOptions& options, const GpuProbe& probe) {
  absl::StatusOr<std::string> r = CheckGpus(options, probe);
  EXPECT_FALSE(r.ok()) << *r;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--gpus=required"));
  return std::string(r.status().message());
}

TEST(ParseGpuPolicyTest, TheThreeWordsAndNothingElse) {
  EXPECT_EQ(*ParseGpuPolicy("none"), GpuPolicy::kNone);
  EXPECT_EQ(*ParseGpuPolicy("auto"), GpuPolicy::kAuto);
  EXPECT_EQ(*ParseGpuPolicy("required"), GpuPolicy::kRequired);
  for (const char* bad : {"yes", "", "Required", "8"}) {
    absl::StatusOr<GpuPolicy> p = ParseGpuPolicy(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()),
                AllOf(HasSubstr("--gpus"), HasSubstr("none, auto, required")));
  }
}

TEST(CheckGpusTest, EnoughGpusPassAndAreDescribed) {
  absl::StatusOr<std::string> r =
      CheckGpus(Required(8), Healthy(std::vector<GpuDevice>(8, H200())));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r,
            "8 GPU(s) for 8 slot(s): 8 x NVIDIA H200 (sm_90, 141 GiB); driver CUDA 13.0, "
            "runtime CUDA 13.0");
  // More GPUs than slots is fine: the trainers use the first ones.
  EXPECT_TRUE(CheckGpus(Required(2), Healthy(std::vector<GpuDevice>(4, H200()))).ok());
}

TEST(CheckGpusTest, ABuildWithoutCudaIsRefused) {
  const std::string why = Refusal(Required(8), GpuProbe{});
  EXPECT_THAT(why, AllOf(HasSubstr("built without CUDA"), HasSubstr("--config=cuda"),
                         HasSubstr("Dockerfile.gpu")));
}

TEST(CheckGpusTest, AMissingDriverIsNamed) {
  GpuProbe p = Healthy({});
  p.driver_loaded = false;
  p.driver_version = 0;
  p.error =
      "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
  const std::string why = Refusal(Required(8), p);
  EXPECT_THAT(
      why, AllOf(HasSubstr("driver is missing"), HasSubstr("libcuda.so.1"),
                 HasSubstr("cudaErrorInsufficientDriver"), HasSubstr("NVIDIA Container Toolkit")));
}

TEST(CheckGpusTest, AnOldDriverIsNamedWithBothVersions) {
  GpuProbe p = Healthy({});
  p.driver_version = 12080;
  p.error =
      "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
  const std::string why = Refusal(Required(1), p);
  EXPECT_THAT(why, AllOf(HasSubstr("supports CUDA 12.8"), HasSubstr("runtime is CUDA 13.0"),
                         HasSubstr("update the host's driver")));
  // A newer minor version of the runtime's major one is compatible (CUDA's minor version
  // compatibility): that is not the driver's fault.
  p.driver_version = 13000;
  p.runtime_version = 13020;
  EXPECT_THAT(Refusal(Required(1), p),
              AllOf(HasSubstr("no GPU is visible"), Not(HasSubstr("update the host's driver"))));
}

TEST(CheckGpusTest, NoVisibleGpuIsNamed) {
  GpuProbe p = Healthy({});
  p.error = "cudaErrorNoDevice: no CUDA-capable device is detected";
  const std::string why = Refusal(Required(8), p);
  EXPECT_THAT(why, AllOf(HasSubstr("no GPU is visible"), HasSubstr("cudaErrorNoDevice"),
                         HasSubstr("nvidia.com/gpu"), Not(HasSubstr("fabricmanager"))));
  p.error = "cudaErrorSystemNotReady: system not yet initialized";
  EXPECT_THAT(Refusal(Required(8), p), HasSubstr("nvidia-fabricmanager"));
}

TEST(CheckGpusTest, FewerGpusThanSlotsAreCounted) {
  const std::string why = Refusal(Required(8), Healthy(std::vector<GpuDevice>(4, H200())));
  EXPECT_THAT(
      why, AllOf(HasSubstr("4 usable GPU(s) for --slots=8"),
                 HasSubstr("4 x NVIDIA H200 (sm_90, 141 GiB) visible"), Not(HasSubstr("too old"))));
}

TEST(CheckGpusTest, GpusOlderThanTheKernelsAreNotUsable) {
  const std::string why = Refusal(Required(2), Healthy({H200(), T4()}));
  EXPECT_THAT(why,
              AllOf(HasSubstr("1 usable GPU(s) for --slots=2"),
                    HasSubstr("1 x NVIDIA H200 (sm_90, 141 GiB), 1 x Tesla T4 (sm_75, 15 GiB)"),
                    HasSubstr("need sm_80 or newer: GPU 1 Tesla T4")));
}

TEST(CheckGpusTest, TheDevicesDecideWhateverTheDriverProbeSaid) {
  // A runtime that found its devices (libcuda.so.1 loaded under another name, or an
  // emulation) is not refused for the dlopen probe's answer.
  GpuProbe p = Healthy({H200()});
  p.driver_loaded = false;
  EXPECT_TRUE(CheckGpus(Required(1), p).ok());
}

TEST(CheckGpusTest, AutoSaysWhatHappensInsteadOfFailing) {
  GpuCheckOptions autod = Required(8);
  autod.policy = GpuPolicy::kAuto;
  absl::StatusOr<std::string> cpu = CheckGpus(autod, GpuProbe{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_THAT(*cpu, AllOf(HasSubstr("--gpus=auto"), HasSubstr("built without CUDA"),
                          HasSubstr("train on the CPU")));
  absl::StatusOr<std::string> shared = CheckGpus(autod, Healthy({H200(), H200()}));
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_THAT(*shared, AllOf(HasSubstr("2 usable GPU(s) for --slots=8"),
                             HasSubstr("trainers share the usable GPUs")));
}

TEST(CheckGpusTest, NoneProbesNothing) {
  GpuCheckOptions none = Required(8);
  none.policy = GpuPolicy::kNone;
  absl::StatusOr<std::string> r = CheckGpus(none, GpuProbe{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, HasSubstr("--gpus=none"));
}

TEST(CudaVersionTextTest, MajorAndMinor) {
  EXPECT_EQ(CudaVersionText(13000), "CUDA 13.0");
  EXPECT_EQ(CudaVersionText(12080), "CUDA 12.8");
  EXPECT_EQ(CudaVersionText(11040), "CUDA 11.4");
}

// The real probe in this build: a default build has no CUDA runtime to ask; a CUDA build
// reports its runtime and a device list that agrees with its error.
TEST(ProbeGpusTest, AgreesWithThisBuild) {
  const GpuProbe p = ProbeGpus();
  if (!p.cuda_build) {
    EXPECT_EQ(p.runtime_version, 0);
    EXPECT_FALSE(p.driver_loaded);
    EXPECT_TRUE(p.devices.empty());
    EXPECT_THAT(Refusal(Required(1), p), HasSubstr("built without CUDA"));
    return;
  }
  EXPECT_GE(p.runtime_version, 12000);
  if (!p.error.empty()) {
    EXPECT_TRUE(p.devices.empty()) << p.error;
  }
  for (const GpuDevice& d : p.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.compute_capability, 0);
  }
}

}  // namespace
}  // namespace ringmaster::worker
