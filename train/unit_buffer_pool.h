// UnitBufferPool: the buffers of sharded data parallelism's gathered units and unreduced
// gradients (train/fsdp.h, on the CPU or a GPU), in a VectorOps' memory.
#ifndef RINGMASTER_TRAIN_UNIT_BUFFER_POOL_H_
#define RINGMASTER_TRAIN_UNIT_BUFFER_POOL_H_

#include <cstdint>
#include <list>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

// Unit buffers in a VectorOps' memory (host memory for HostVectorOps, device memory for
// CudaVectorOps), reused so that steady-state steps allocate nothing: a freed buffer serves
// the next request it is large enough for (the smallest such); a request no free buffer fits
// first frees those (all too small) and then allocates, so the pool never holds more buffers
// than were in use at once, and its bytes are at most that count times the largest request.
//
// Ordering with the stream that last used a buffer: Give(buffer, token) hands it back with a
// VectorOps mark (ops->Mark() on the stream whose enqueued work may still read or write it,
// or kNoToken when that work is complete); Take returns the buffer with the token its last
// user gave, and a writer on another stream or thread must ops->Wait(token) before writing
// (train/fsdp.h; host memory has no streams: HostVectorOps' marks wait for nothing).
// Freeing a buffer (OpsBuffer's destructor: cudaFree) waits for the device itself.
//
// Thread-safe.
class UnitBufferPool {
 public:
  static constexpr int kNoToken = -1;
  struct Taken {
    float* data = nullptr;
    int token = kNoToken;  // wait on it (on `ops`) before writing data from another stream
  };

  // Buffers come from `ops` (not owned; outlives the pool).
  explicit UnitBufferPool(VectorOps* ops) : ops_(ops) {}

  // A buffer of at least `elements` floats (> 0); its contents are whatever its last user left
  // (zero when new). RESOURCE_EXHAUSTED when the memory is not there.
  absl::StatusOr<Taken> Take(int64_t elements);
  // Hands back a buffer Take returned (INTERNAL for one it did not, or one given twice).
  absl::Status Give(float* data, int token = kNoToken);

  // Bytes held at most so far (the buffers, in use or free).
  int64_t peak_bytes() const;
  // Buffers held now and in use now.
  int held() const;
  int in_use() const;

 private:
  struct Entry {
    OpsBuffer buffer;
    bool in_use = false;
    int token = kNoToken;
  };
  VectorOps* const ops_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // a list: entries never move
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_UNIT_BUFFER_POOL_H_
