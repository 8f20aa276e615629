// The CUDA twin of kernels::SgdStep (kernels/optimizer.h): SGD with momentum, PyTorch's
// formula, the CPU kernel's float operations one by one (no contraction into FMA), so a GPU
// rank and a CPU rank update alike. Device pointers; `momentum_buffer` is null exactly when
// args.momentum is 0. Enqueues on `stream` and returns; INVALID_ARGUMENT names a bad
// argument (negative n, a null pointer with n > 0, a momentum buffer with momentum 0 or
// none with momentum > 0); INTERNAL carries a CUDA launch error.
#ifndef RINGMASTER_KERNELS_CUDA_SGD_H_
#define RINGMASTER_KERNELS_CUDA_SGD_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/optimizer.h"

namespace ringmaster::kernels::cuda {

absl::Status SgdStep(const SgdStepArgs& args, float* params, const float* grads,
                     float* momentum_buffer, int64_t n, cudaStream_t stream);

}  // namespace ringmaster::kernels::cuda

#endif  // RINGMASTER_KERNELS_CUDA_SGD_H_
