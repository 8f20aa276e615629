#include "train/nn/device_arena.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace ringmaster::train::nn {
namespace {

constexpr int64_t kAlignBytes = 256;  // every piece starts on this boundary

}  // namespace

void* DeviceArena::Layout::Take(int64_t bytes) {
  char* p = base_ == nullptr ? nullptr : base_ + used_;
  used_ += (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  return p;
}

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);  // waits for the device
}

absl::Status DeviceArena::Fit(const std::function<void(Layout&)>& place, const std::string& what) {
  Layout measure(nullptr);
  place(measure);
  if (measure.used_ > bytes_) {
    if (base_ != nullptr) {
      RM_RETURN_IF_ERROR(
          CudaToStatus(cudaStreamSynchronize(stream_), absl::StrCat(what, ": stream").c_str()));
      cudaFree(base_);
      base_ = nullptr;
      bytes_ = 0;
    }
    void* base = nullptr;
    RM_RETURN_IF_ERROR(
        CudaToStatus(cudaMalloc(&base, measure.used_),
                     absl::StrCat(what, ": cudaMalloc of ", measure.used_, " bytes").c_str()));
    base_ = base;
    bytes_ = measure.used_;
  }
  Layout assign(static_cast<char*>(base_));
  place(assign);
  return absl::OkStatus();
}

}  // namespace ringmaster::train::nn
