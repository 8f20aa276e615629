// A grow-only, 64-byte aligned array for activations and scratch: Reserve(n) allocates only
// when n exceeds what it already holds, so once batch shapes are stable a training step
// allocates nothing. Not thread-safe; move-only.
#ifndef RINGMASTER_TRAIN_NN_GROW_BUFFER_H_
#define RINGMASTER_TRAIN_NN_GROW_BUFFER_H_

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

namespace ringmaster::train::nn {

template <typename T>
class GrowBuffer {
  static_assert(std::is_trivial_v<T>);

 public:
  // At least n elements. The contents are unspecified after a call that grew the buffer
  // (the old ones are not copied); otherwise they are kept.
  T* Reserve(int64_t n) {
    if (n > capacity_) {
      data_.reset();  // free first: peak memory is the new size, not old + new
      data_.reset(static_cast<T*>(::operator new(n * sizeof(T), kAlign)));
      capacity_ = n;
    }
    return data_.get();
  }

  T* data() { return data_.get(); }
  int64_t bytes() const { return capacity_ * static_cast<int64_t>(sizeof(T)); }

 private:
  static constexpr std::align_val_t kAlign{64};
  struct Free {
    void operator()(T* p) const { ::operator delete(p, kAlign); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t capacity_ = 0;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_GROW_BUFFER_H_
