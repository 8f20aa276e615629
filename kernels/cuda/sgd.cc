// Argument checks of kernels/cuda/sgd.h; the kernel is in sgd.cu.
#include "kernels/cuda/sgd.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/sgd_launch.h"

namespace ringmaster::kernels::cuda {

absl::Status SgdStep(const SgdStepArgs& args, float* params, const float* grads,
                     float* momentum_buffer, int64_t n, cudaStream_t stream) {
  auto invalid = [](const auto&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("SgdStep (CUDA): ", parts...));
  };
  if (n < 0) return invalid("n must be >= 0, got ", n);
  if (n > 0 && params == nullptr) return invalid("params is null");
  if (n > 0 && grads == nullptr) return invalid("grads is null");
  if (args.momentum != 0 && n > 0 && momentum_buffer == nullptr) {
    return invalid("momentum ", args.momentum, " needs a momentum_buffer");
  }
  if (args.momentum == 0 && momentum_buffer != nullptr) {
    return invalid("momentum_buffer given with momentum 0");
  }
  internal::SgdArgs a;
  a.lr = args.lr;
  a.momentum = args.momentum;
  a.weight_decay = args.weight_decay;
  a.d_coef = args.nesterov ? 1.0f : 0.0f;
  a.buf_coef = args.nesterov ? args.momentum : 1.0f;
  return CudaToStatus(internal::LaunchSgd(a, params, grads, momentum_buffer, n, stream),
                      "SgdStep (CUDA) launch");
}

}  // namespace ringmaster::kernels::cuda
