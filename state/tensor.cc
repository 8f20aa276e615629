#include "state/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace ringmaster::state {

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int TensorTable::Add(absl::string_view name, std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    CHECK_GT(d, 0) << "tensor " << name << " has shape " << ShapeString(shape);
    numel *= d;
  }
  const int index = size();
  CHECK(by_name_.emplace(std::string(name), index).second) << "duplicate tensor " << name;
  TensorSpec spec;
  spec.name = std::string(name);
  spec.shape = std::move(shape);
  spec.offset = total_;
  spec.numel = numel;
  total_ += (numel + kAlignElements - 1) / kAlignElements * kAlignElements;
  parameters_ += numel;
  tensors_.push_back(std::move(spec));
  return index;
}

absl::StatusOr<int> TensorTable::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor named '", name, "'"));
  }
  return it->second;
}

void FlatBuffer::Free::operator()(float* p) const { std::free(p); }

FlatBuffer::FlatBuffer(int64_t elements) : size_(elements) {
  CHECK_GE(elements, 0);
  size_t bytes = (static_cast<size_t>(elements) * sizeof(float) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  data_.reset(static_cast<float*>(p));
}

void FlatBuffer::Zero() {
  if (size_ > 0) std::memset(data_.get(), 0, bytes());
}

}  // namespace ringmaster::state
