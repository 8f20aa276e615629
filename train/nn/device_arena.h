// DeviceArena: one device allocation carved into 256-byte-aligned pieces, for a CUDA model's
// activations (GptCuda, SequentialCuda). A layout function places every piece; Fit runs it
// once to measure and, when the arena is too small, frees it (after the stream has finished
// with it) and allocates the measured size, then runs it again to hand out the pointers.
//
//   arena.Fit([&](DeviceArena::Layout& l) { x_ = l.Floats(n); idx_ = l.Ints(n); }, "Model");
#ifndef RINGMASTER_TRAIN_NN_DEVICE_ARENA_H_
#define RINGMASTER_TRAIN_NN_DEVICE_ARENA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace ringmaster::train::nn {

class DeviceArena {
 public:
  // One pass of a layout: each call takes the next piece (null while Fit measures).
  class Layout {
   public:
    void* Take(int64_t bytes);
    float* Floats(int64_t n) { return static_cast<float*>(Take(n * 4)); }
    int32_t* Ints(int64_t n) { return static_cast<int32_t*>(Take(n * 4)); }

   private:
    friend class DeviceArena;
    explicit Layout(char* base) : base_(base) {}
    char* base_;
    int64_t used_ = 0;
  };

  // `stream` is where the pieces are used (Fit waits for it before freeing them).
  explicit DeviceArena(cudaStream_t stream) : stream_(stream) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Makes the arena hold `place`'s layout and runs `place` to assign its pointers. On error
  // (RESOURCE_EXHAUSTED or INTERNAL naming `what` and the bytes) the arena is empty and the
  // pointers `place` assigned before are dangling: the caller must call Fit again.
  absl::Status Fit(const std::function<void(Layout&)>& place, const std::string& what);

  // Bytes allocated.
  int64_t bytes() const { return bytes_; }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_DEVICE_ARENA_H_
