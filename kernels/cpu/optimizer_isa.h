// The kernels of kernels/optimizer.h over raw pointers, as each build of
// cpu/optimizer_impl.inc defines them: `generic` (any x86-64) and `avx2` (only on a processor
// with AVX2 and FMA). cpu/optimizer.cc checks the spans and picks one; the test compares them.
#ifndef RINGMASTER_KERNELS_CPU_OPTIMIZER_ISA_H_
#define RINGMASTER_KERNELS_CPU_OPTIMIZER_ISA_H_

#include <cstddef>

#include "kernels/optimizer.h"

#define RM_DECLARE_OPTIMIZER_KERNELS(ns)                                                    \
  namespace ns {                                                                            \
  void SgdStep(const SgdStepArgs&, float*, const float*, float*, size_t);                   \
  void AdamWStep(const AdamMomentArgs&, float, float, float*, const float*, float*, float*, \
                 size_t);                                                                   \
  LambSquareSums LambSquares(const AdamMomentArgs&, float, const float*, const float*,      \
                             const float*, const float*, size_t);                           \
  void LambStep(const AdamMomentArgs&, float, float, float*, const float*, float*, float*,  \
                size_t);                                                                    \
  double SumOfSquares(const float*, size_t);                                                \
  bool ScaleAndFindNonFinite(float*, size_t, float);                                        \
  }

namespace ringmaster::kernels {
RM_DECLARE_OPTIMIZER_KERNELS(generic)
RM_DECLARE_OPTIMIZER_KERNELS(avx2)
}  // namespace ringmaster::kernels

#undef RM_DECLARE_OPTIMIZER_KERNELS

#endif  // RINGMASTER_KERNELS_CPU_OPTIMIZER_ISA_H_
