// Flat training state: a tensor table over flat buffers (ARCHITECTURE.md "Training state is
// flat").
//
// A TensorTable lays named tensors out one after another in a flat index space; every
// tensor starts at a multiple of kAlignElements so that kernels see aligned rows and a
// bucket or ZeRO shard boundary can be put between any two tensors. Parameters, gradients
// and each optimizer moment are separate FlatBuffers with the same table, so "the gradient
// of tensor i" is grads.data() + table.tensor(i).offset.
//
// Order matters: models add their tensors in forward order, so backward finishes them from
// the highest offset down, and "every gradient at offset >= x is final" is a single number
// (see train/model.h).
//
// Thread-safety: a TensorTable is immutable after building; FlatBuffer is a plain array.
#ifndef RINGMASTER_STATE_TENSOR_H_
#define RINGMASTER_STATE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ringmaster::state {

// 16 floats = 64 bytes, one cache line and one AVX-512 register.
inline constexpr int64_t kAlignElements = 16;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, a multiple of kAlignElements
  int64_t numel = 0;   // product of shape
};

std::string ShapeString(absl::Span<const int64_t> shape);

class TensorTable {
 public:
  // Appends a tensor and returns its index. CHECK-fails on a duplicate name or a
  // non-positive dimension (both are programming errors of the model that adds them).
  int Add(absl::string_view name, std::vector<int64_t> shape);

  int size() const { return static_cast<int>(tensors_.size()); }
  const TensorSpec& tensor(int i) const { return tensors_[i]; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // Elements of a flat buffer holding every tensor, padding included.
  int64_t total_elements() const { return total_; }
  // Elements in tensors, padding excluded (the model's parameter count).
  int64_t parameter_count() const { return parameters_; }
  // NOT_FOUND naming the tensor.
  absl::StatusOr<int> Find(absl::string_view name) const;

 private:
  std::vector<TensorSpec> tensors_;
  absl::flat_hash_map<std::string, int> by_name_;
  int64_t total_ = 0;
  int64_t parameters_ = 0;
};

// A zero-initialised, 64-byte aligned array of floats.
class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(int64_t elements);

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(float); }
  absl::Span<float> span() { return {data_.get(), static_cast<size_t>(size_)}; }
  absl::Span<const float> span() const { return {data_.get(), static_cast<size_t>(size_)}; }
  absl::Span<float> tensor(const TensorSpec& t) {
    return {data_.get() + t.offset, static_cast<size_t>(t.numel)};
  }
  absl::Span<const float> tensor(const TensorSpec& t) const {
    return {data_.get() + t.offset, static_cast<size_t>(t.numel)};
  }
  void Zero();

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  int64_t size_ = 0;
};

}  // namespace ringmaster::state

#endif  // RINGMASTER_STATE_TENSOR_H_
