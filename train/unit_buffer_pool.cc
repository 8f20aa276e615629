#include "train/unit_buffer_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster::train {

absl::StatusOr<UnitBufferPool::Taken> UnitBufferPool::Take(int64_t elements) {
  if (elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("UnitBufferPool::Take: ", elements,
                                                   " elements (must be > 0)"));
  }
  absl::MutexLock lock(&mu_);
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    if (!e.in_use && e.buffer.size() >= elements &&
        (best == nullptr || e.buffer.size() < best->buffer.size())) {
      best = &e;
    }
  }
  if (best != nullptr) {
    best->in_use = true;
    return Taken{best->buffer.data(), best->token};
  }
  // Every free buffer is too small: free them first, so that the pool holds at most as many
  // buffers as are in use at once (OpsBuffer's release waits for the device).
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->in_use ? std::next(it) : entries_.erase(it);
  }
  RM_ASSIGN_OR_RETURN(OpsBuffer buffer, ops_->Allocate(elements));
  entries_.push_back({std::move(buffer), true, kNoToken});
  int64_t held = 0;
  for (const Entry& e : entries_) held += e.buffer.size() * static_cast<int64_t>(sizeof(float));
  peak_ = std::max(peak_, held);
  return Taken{entries_.back().buffer.data(), kNoToken};
}

absl::Status UnitBufferPool::Give(float* data, int token) {
  absl::MutexLock lock(&mu_);
  for (Entry& e : entries_) {
    if (e.buffer.data() != data) continue;
    if (!e.in_use) return absl::InternalError("UnitBufferPool::Give: a buffer given twice");
    e.in_use = false;
    e.token = token;
    return absl::OkStatus();
  }
  return absl::InternalError("UnitBufferPool::Give: a buffer the pool did not hand out");
}

int64_t UnitBufferPool::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int UnitBufferPool::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

int UnitBufferPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.in_use; }));
}

}  // namespace ringmaster::train
