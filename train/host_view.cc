#include "train/host_view.h"

#include "common/status_macros.h"

namespace ringmaster::train {

HostView::HostView(state::FlatBuffer& params, Optimizer& optimizer, TrainingDevice* device)
    : params_(params), optimizer_(optimizer), device_(device) {
  if (device == nullptr) {
    host_ = optimizer.state_buffers();
    return;
  }
  // A FlatBuffer owns its memory through a pointer: the spans survive the vector growing.
  for (const StateBuffer& b : optimizer.state_buffers()) {
    owned_.emplace_back(b.range.size());
    host_.push_back({b.name, b.range, owned_.back().span()});
  }
}

absl::Status HostView::Pull(What what) {
  VectorOps* ops = device_ == nullptr ? nullptr : device_->ops();
  if (!params_current_) {
    RM_RETURN_IF_ERROR(ops->CopyToHost(device_->params(), params_.data()));
    params_current_ = true;
  }
  if (what == What::kEverything && !optimizer_current_) {
    std::vector<StateBuffer> on_device = optimizer_.state_buffers();
    for (size_t i = 0; i < host_.size(); ++i) {
      RM_RETURN_IF_ERROR(ops->CopyToHost(on_device[i].data, host_[i].data.data()));
    }
    optimizer_current_ = true;
  }
  return absl::OkStatus();
}

absl::Status HostView::Push() {
  if (device_ == nullptr) return absl::OkStatus();
  VectorOps* ops = device_->ops();
  RM_RETURN_IF_ERROR(ops->CopyFromHost(params_.data(), device_->params()));
  std::vector<StateBuffer> on_device = optimizer_.state_buffers();
  for (size_t i = 0; i < host_.size(); ++i) {
    RM_RETURN_IF_ERROR(ops->CopyFromHost(host_[i].data.data(), on_device[i].data));
  }
  params_current_ = optimizer_current_ = true;
  return absl::OkStatus();
}

}  // namespace ringmaster::train
