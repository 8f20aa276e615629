#include "kernels/reduce.h"

#include <cpuid.h>

namespace ringmaster::kernels {
namespace generic {
void Reduce(DataType, ReduceKind, void*, const void*, const void*, size_t);
void DivideBy(DataType, void*, size_t, int);
}  // namespace generic
namespace avx2 {
void Reduce(DataType, ReduceKind, void*, const void*, const void*, size_t);
void DivideBy(DataType, void*, size_t, int);
}  // namespace avx2

namespace {
bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    // F16C from CPUID (leaf 1, ECX): Clang 14's __builtin_cpu_supports does not know it.
    unsigned eax, ebx, ecx, edx;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return has;
}
}  // namespace

void Reduce(DataType type, ReduceKind kind, void* dst, const void* a, const void* b, size_t count) {
  if (HasAvx2()) return avx2::Reduce(type, kind, dst, a, b, count);
  generic::Reduce(type, kind, dst, a, b, count);
}

void DivideBy(DataType type, void* dst, size_t count, int divisor) {
  if (HasAvx2()) return avx2::DivideBy(type, dst, count, divisor);
  generic::DivideBy(type, dst, count, divisor);
}

const char* ReduceImplementation() { return HasAvx2() ? "avx2" : "generic"; }

}  // namespace ringmaster::kernels
