// Which OpenBLAS kernels run, and the way to better ones (kernels/matmul.h).
#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/matmul.h"

namespace ringmaster::kernels {
namespace {

constexpr char kCoreTypeVariable[] = "OPENBLAS_CORETYPE";
// Set in the re-executed image, so that a second pass never re-executes again.
constexpr char kReexecMarker[] = "RINGMASTER_BLAS_REEXEC";

// 0: SSE-class kernels, 1: AVX, 2: AVX2 (and FMA), 3: AVX-512; -1: a name not listed (left
// alone). OpenBLAS 0.3.21's x86-64 names (driver/others/dynamic.c corename[]).
int Rank(const std::string& core) {
  for (const char* name : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                           "Coppermine", "Northwood", "Banias", "Opteron", "Opteron(SSE3)",
                           "Barcelona", "Nano", "Bobcat", "Unknown"}) {
    if (core == name) return 0;
  }
  for (const char* name : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"}) {
    if (core == name) return 1;
  }
  for (const char* name : {"Haswell", "Zen"}) {
    if (core == name) return 2;
  }
  for (const char* name : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (core == name) return 3;
  }
  return -1;
}

// The best class this CPU (and the kernel's saving of its registers) runs.
int CpuRank() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return 3;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
  return 0;
}

}  // namespace

BlasKernels CheckBlasKernels() {
  BlasKernels k;
  const char* name = openblas_get_corename();
  k.chosen = name != nullptr ? name : "";
  const char* set = getenv(kCoreTypeVariable);
  if (set != nullptr && *set != '\0') return k;
  const int chosen = Rank(k.chosen);
  if (chosen < 0) return k;
  const int cpu = CpuRank();
  if (cpu <= chosen) return k;
  if (cpu == 3) {
    k.suggested = "SkylakeX";
  } else if (cpu == 2) {
    k.suggested = "Haswell";
  }
  return k;
}

std::string UseBestBlasKernels(char** argv) {
  const BlasKernels k = CheckBlasKernels();
  if (getenv(kReexecMarker) != nullptr) {
    return "OpenBLAS runs " + k.chosen + " kernels (" + kCoreTypeVariable + "=" +
           (getenv(kCoreTypeVariable) ? getenv(kCoreTypeVariable) : "") +
           " chosen for this CPU, which the library did not recognise)";
  }
  if (k.suggested.empty()) return "";
  setenv(kCoreTypeVariable, k.suggested.c_str(), 1);
  setenv(kReexecMarker, k.chosen.c_str(), 1);
  execv("/proc/self/exe", argv);
  const int error = errno;
  unsetenv(kCoreTypeVariable);
  unsetenv(kReexecMarker);
  return "OpenBLAS runs " + k.chosen + " kernels on a CPU that runs " + k.suggested +
         "'s; re-executing with " + kCoreTypeVariable + "=" + k.suggested +
         " failed: " + strerror(error) + " (set it yourself before starting the program)";
}

}  // namespace ringmaster::kernels
