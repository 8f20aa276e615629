#include "train/optim/vector_ops.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/half.h"

namespace ringmaster::train {

OpsBuffer::~OpsBuffer() {
  if (data_ != nullptr) ops_->Release(data_);
}

OpsBuffer::OpsBuffer(OpsBuffer&& other) noexcept
    : ops_(std::exchange(other.ops_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

OpsBuffer& OpsBuffer::operator=(OpsBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ops_->Release(data_);
    ops_ = std::exchange(other.ops_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<OpsBuffer> VectorOps::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: n must be >= 0, got ", n));
  if (n == 0) return OpsBuffer();
  absl::StatusOr<float*> data = AllocateRaw(n);
  if (!data.ok()) return data.status();
  return OpsBuffer(this, *data, n);
}

namespace {

class Host final : public VectorOps {
 public:
  const char* name() const override { return "host"; }
  bool device_memory() const override { return false; }

  absl::Status CopyToHost(absl::Span<const float> from, float* host) override {
    if (!from.empty()) std::memcpy(host, from.data(), from.size() * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(const float* host, absl::Span<float> to) override {
    if (!to.empty()) std::memcpy(to.data(), host, to.size() * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Copy(absl::Span<const float> from, absl::Span<float> to) override {
    return CopyFromHost(from.data(), to);
  }
  absl::Status Zero(absl::Span<float> x) override {
    if (!x.empty()) std::memset(x.data(), 0, x.size() * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Add(absl::Span<const float> from, absl::Span<float> to) override {
    for (size_t i = 0; i < to.size(); ++i) to[i] += from[i];
    return absl::OkStatus();
  }
  absl::Status ToHalf(bool bf16, absl::Span<const float> from, uint16_t* to) override {
    if (bf16) {
      for (size_t i = 0; i < from.size(); ++i) to[i] = kernels::FloatToBFloat16(from[i]);
    } else {
      for (size_t i = 0; i < from.size(); ++i) to[i] = kernels::FloatToFloat16(from[i]);
    }
    return absl::OkStatus();
  }
  absl::Status FromHalf(bool bf16, const uint16_t* from, absl::Span<float> to) override {
    if (bf16) {
      for (size_t i = 0; i < to.size(); ++i) to[i] = kernels::BFloat16ToFloat(from[i]);
    } else {
      for (size_t i = 0; i < to.size(); ++i) to[i] = kernels::Float16ToFloat(from[i]);
    }
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status SgdStep(const kernels::SgdStepArgs& args, absl::Span<float> params,
                       absl::Span<const float> grads, absl::Span<float> momentum) override {
    kernels::SgdStep(args, params, grads, momentum);
    return absl::OkStatus();
  }
  absl::Status AdamWStep(const kernels::AdamMomentArgs& moments, float lr, float weight_decay,
                         absl::Span<float> params, absl::Span<const float> grads,
                         absl::Span<float> exp_avg, absl::Span<float> exp_avg_sq) override {
    kernels::AdamWStep(moments, lr, weight_decay, params, grads, exp_avg, exp_avg_sq);
    return absl::OkStatus();
  }
  absl::StatusOr<kernels::LambSquareSums> LambSquares(
      const kernels::AdamMomentArgs& moments, float weight_decay, absl::Span<const float> params,
      absl::Span<const float> grads, absl::Span<const float> exp_avg,
      absl::Span<const float> exp_avg_sq) override {
    return kernels::LambSquares(moments, weight_decay, params, grads, exp_avg, exp_avg_sq);
  }
  absl::Status LambStep(const kernels::AdamMomentArgs& moments, float weight_decay,
                        float scaled_lr, absl::Span<float> params, absl::Span<const float> grads,
                        absl::Span<float> exp_avg, absl::Span<float> exp_avg_sq) override {
    kernels::LambStep(moments, weight_decay, scaled_lr, params, grads, exp_avg, exp_avg_sq);
    return absl::OkStatus();
  }
  absl::StatusOr<double> SumOfSquares(absl::Span<const float> x) override {
    return kernels::SumOfSquares(x);
  }
  absl::StatusOr<bool> ScaleAndFindNonFinite(absl::Span<float> x, float factor) override {
    return kernels::ScaleAndFindNonFinite(x, factor);
  }

 protected:
  absl::StatusOr<float*> AllocateRaw(int64_t n) override {
    // 64-byte aligned, as FlatBuffer (the AVX2 kernels' loads stay within cache lines).
    const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void Release(float* data) override { std::free(data); }
};

}  // namespace

VectorOps* HostVectorOps() {
  static Host* const host = new Host;
  return host;
}

}  // namespace ringmaster::train
