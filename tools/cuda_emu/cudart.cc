// The CUDA runtime calls ringmaster makes, emulated on the CPU: one device ("cuda_emu"),
// device memory from the host heap (so kernels and ASan can dereference it), and streams that
// are asynchronous as on a GPU: each stream has a worker thread running its work in order,
// with CUDA's implicit ordering between the legacy default stream and blocking streams,
// events that complete when the stream reaches them, and cudaMemcpyAsync's rules for
// pageable memory (staged at the call going to the device, synchronous coming back). Each
// piece of work waits a random 0..RM_CUDA_EMU_JITTER_US microseconds first (default 50;
// 0 turns it off), so that a host read without a synchronization, or a stream waiting on the
// wrong event, sees stale data in tests instead of winning the race by luck.
//
// Copies and memsets check that the device side lies inside one live allocation, which a
// real GPU only reports as a fault later, if at all. A process forked after its parent used
// CUDA (cudaGetDeviceCount included: it initializes the driver) gets
// cudaErrorInitializationError from every call, as from the real driver.
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "tools/cuda_emu/internal.h"

namespace rm_emu {
namespace {

constexpr size_t kDeviceBytes = size_t{80} << 30;

int JitterMicros() {
  static const int jitter = [] {
    constexpr int kDefault = 50;
    const char* v = std::getenv("RM_CUDA_EMU_JITTER_US");
    if (v == nullptr) return kDefault;
    char* end = nullptr;
    const long us = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || us < 0 || us > 1000000) {
      std::fprintf(stderr,
                   "cuda_emu: RM_CUDA_EMU_JITTER_US=\"%s\" is not a whole number of "
                   "microseconds in 0..1000000 (0 turns the delay off); using %d\n",
                   v, kDefault);
      return kDefault;
    }
    return static_cast<int>(us);
  }();
  return jitter;
}

// One stream's work, in order, on its own thread (started with the first piece of work).
class Queue {
 public:
  // Returns the ticket Wait() takes to wait for this piece of work.
  uint64_t Push(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { Loop(); });
    work_.push_back(std::move(work));
    cv_.notify_all();
    return ++pushed_;
  }
  void Wait(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= ticket; });
  }
  uint64_t Tail() {
    std::lock_guard<std::mutex> lock(mu_);
    return pushed_;
  }
  void Drain() { Wait(Tail()); }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ == pushed_;
  }
  ~Queue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
  }

 private:
  void Loop() {
    std::minstd_rand random(std::random_device{}());
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // stopped, and everything ran
      std::function<void()> work = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      if (const int jitter = JitterMicros(); jitter > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % (jitter + 1)));
      }
      work();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  uint64_t pushed_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

struct Ticket {
  std::shared_ptr<Queue> queue;
  uint64_t number = 0;
  void Wait() const {
    if (queue != nullptr) queue->Wait(number);
  }
};

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;  // generations
  std::chrono::steady_clock::time_point when;
  void WaitFor(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

}  // namespace
}  // namespace rm_emu

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<rm_emu::Queue> queue = std::make_shared<rm_emu::Queue>();
};
struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<rm_emu::EventState> state = std::make_shared<rm_emu::EventState>();
};

namespace rm_emu {
namespace {

struct Registry {
  std::mutex mu;
  std::map<const char*, size_t> device;  // base -> bytes
  std::map<const char*, size_t> pinned;
  size_t allocated = 0;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  std::map<const void*, size_t> max_shared;
  std::shared_ptr<Queue> legacy = std::make_shared<Queue>();
};

Registry& R() {
  static Registry* r = new Registry;  // never destroyed: its workers may outlive main()
  return *r;
}

thread_local cudaError_t last_error = cudaSuccess;
std::atomic<bool> used{false};      // this process has called into CUDA
std::atomic<bool> poisoned{false};  // forked after the parent had

[[maybe_unused]] const int fork_handler = [] {
  pthread_atfork(nullptr, nullptr, [] {
    if (used.load()) poisoned.store(true);
  });
  return 0;
}();

cudaError_t Fail(cudaError_t e, const char* call, const char* why) {
  std::fprintf(stderr, "cuda_emu: %s: %s\n", call, why);
  last_error = e;
  return e;
}

// For every entry point: the fork rule.
#define RM_EMU_ENTER(call)                                                          \
  if (!::rm_emu::DeviceUsable()) {                                                  \
    return Fail(cudaErrorInitializationError, call,                                 \
                "CUDA was initialized in the parent before fork(); a forked child " \
                "cannot use it");                                                   \
  }

bool IsLegacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

// Queues work as Enqueue() does and returns its ticket (queue null: an unknown stream).
Ticket Push(cudaStream_t stream, std::function<void()> work) {
  Registry& r = R();
  std::unique_lock<std::mutex> lock(r.mu);
  if (IsLegacy(stream)) {
    // After every blocking stream's work so far.
    std::vector<std::pair<std::shared_ptr<Queue>, uint64_t>> before;
    for (CUstream_st* s : r.streams) {
      if (!(s->flags & cudaStreamNonBlocking)) before.emplace_back(s->queue, s->queue->Tail());
    }
    std::shared_ptr<Queue> legacy = r.legacy;
    lock.unlock();
    const uint64_t n = legacy->Push([before = std::move(before), work = std::move(work)] {
      for (const auto& [queue, ticket] : before) queue->Wait(ticket);
      work();
    });
    return {legacy, n};
  }
  if (r.streams.count(stream) == 0) return {};
  std::shared_ptr<Queue> queue = stream->queue;
  if (stream->flags & cudaStreamNonBlocking) {
    lock.unlock();
    return {queue, queue->Push(std::move(work))};
  }
  // A blocking stream: after the legacy stream's work so far.
  std::shared_ptr<Queue> legacy = r.legacy;
  const uint64_t legacy_tail = legacy->Tail();
  lock.unlock();
  return {queue, queue->Push([legacy, legacy_tail, work = std::move(work)] {
            legacy->Wait(legacy_tail);
            work();
          })};
}

void SynchronizeDevice() {
  std::vector<std::shared_ptr<Queue>> queues;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    queues.push_back(R().legacy);
    for (CUstream_st* s : R().streams) queues.push_back(s->queue);
  }
  for (const auto& q : queues) q->Drain();
}

// Whether [p, p + bytes) lies in one allocation of `m` (mu held).
bool Inside(const std::map<const char*, size_t>& m, const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

bool IsDevice(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(R().mu);
  return Inside(R().device, p, bytes);
}

bool IsPinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(R().mu);
  return Inside(R().pinned, p, bytes);
}

// cudaStreamCreateWithFlags and cudaEventCreateWithFlags: a handle registered in `live`.
template <typename Handle>
cudaError_t Create(Handle** out, unsigned flags, std::set<Handle*> Registry::*live) {
  auto* h = new Handle;
  h->flags = flags;
  std::lock_guard<std::mutex> lock(R().mu);
  (R().*live).insert(h);
  *out = h;
  return cudaSuccess;
}

// cudaStreamDestroy and cudaEventDestroy. Work queued before keeps what it needs (the
// stream's queue, the event's state) through shared pointers and still runs.
template <typename Handle>
cudaError_t Destroy(Handle* h, std::set<Handle*> Registry::*live, const char* call) {
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (h == nullptr || (R().*live).erase(h) == 0) {
      return Fail(cudaErrorInvalidResourceHandle, call, "unknown handle");
    }
  }
  delete h;
  return cudaSuccess;
}

bool ValidEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(R().mu);
  return e != nullptr && R().events.count(e) > 0;
}

cudaError_t Copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream,
                 bool synchronous, const char* call) {
  RM_EMU_ENTER(call);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue, call, "null pointer");
  const bool dst_device = IsDevice(dst, count), src_device = IsDevice(src, count);
  if (kind == cudaMemcpyDefault) {
    kind = dst_device ? (src_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                      : (src_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (!dst_device) return Fail(cudaErrorInvalidValue, call, "dst is not device memory");
      if (IsDevice(src, 1)) return Fail(cudaErrorInvalidValue, call, "src is device memory");
      break;
    case cudaMemcpyDeviceToHost:
      if (!src_device) return Fail(cudaErrorInvalidValue, call, "src is not device memory");
      if (IsDevice(dst, 1)) return Fail(cudaErrorInvalidValue, call, "dst is device memory");
      break;
    case cudaMemcpyDeviceToDevice:
      if (!dst_device || !src_device) {
        return Fail(cudaErrorInvalidValue, call, "a side is not (all) device memory");
      }
      break;
    case cudaMemcpyHostToHost:
      break;
    default:
      return Fail(cudaErrorInvalidMemcpyDirection, call, "unknown direction");
  }
  const bool pageable_src = kind == cudaMemcpyHostToDevice && !IsPinned(src, count);
  const bool pageable_dst = kind == cudaMemcpyDeviceToHost && !IsPinned(dst, count);
  Ticket ticket;
  if (pageable_src) {
    // Staged now: the caller may reuse its buffer as soon as the call returns.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + count);
    ticket = Push(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    ticket = Push(stream, [dst, src, count] { std::memmove(dst, src, count); });
  }
  if (ticket.queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, call, "unknown stream");
  }
  // Into pageable memory the copy is done when the call returns; cudaMemcpy always waits.
  if (synchronous || pageable_dst || kind == cudaMemcpyHostToHost) ticket.Wait();
  return cudaSuccess;
}

cudaError_t Set(void* p, int value, size_t count, cudaStream_t stream, const char* call) {
  RM_EMU_ENTER(call);
  if (count == 0) return cudaSuccess;
  if (!IsDevice(p, count)) {
    return Fail(cudaErrorInvalidValue, call, "the range is not (all) device memory");
  }
  if (Push(stream, [p, value, count] { std::memset(p, value, count); }).queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, call, "unknown stream");
  }
  return cudaSuccess;
}

}  // namespace

void SetLastError(cudaError_t error) { last_error = error; }

size_t MaxDynamicShared(const void* kernel) {
  std::lock_guard<std::mutex> lock(R().mu);
  auto it = R().max_shared.find(kernel);
  return it == R().max_shared.end() ? 0 : it->second;
}

int VisibleGpu() {
  static const int gpu = [] {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    if (v == nullptr || *v == '\0') return 0;
    char* end = nullptr;
    const long index = std::strtol(v, &end, 10);
    if (end == v || (*end != '\0' && *end != ',') || index < 0 || index > 9999) {
      std::fprintf(stderr,
                   "cuda_emu: CUDA_VISIBLE_DEVICES=\"%s\" does not start with a GPU index in "
                   "0..9999 (GPU UUIDs are not emulated); the process sees GPU 0\n",
                   v);
      return 0;
    }
    if (*end == ',') {
      std::fprintf(stderr,
                   "cuda_emu: CUDA_VISIBLE_DEVICES=\"%s\" names several GPUs; one is emulated, "
                   "GPU %ld\n",
                   v, index);
    }
    return static_cast<int>(index);
  }();
  return gpu;
}

bool DeviceUsable() {
  used.store(true);
  return !poisoned.load();
}

cudaError_t Enqueue(cudaStream_t stream, std::function<void()> work) {
  if (!DeviceUsable()) return cudaErrorInitializationError;
  return Push(stream, std::move(work)).queue == nullptr ? cudaErrorInvalidResourceHandle
                                                        : cudaSuccess;
}

}  // namespace rm_emu

using rm_emu::Fail;
using rm_emu::R;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = rm_emu::last_error;
  rm_emu::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return rm_emu::last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return "unrecognized error code (cuda_emu)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  RM_EMU_ENTER("cudaGetDeviceCount");
  if (count == nullptr) return Fail(cudaErrorInvalidValue, "cudaGetDeviceCount", "null count");
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  RM_EMU_ENTER("cudaSetDevice");
  if (device != 0) return Fail(cudaErrorInvalidDevice, "cudaSetDevice", "one device emulated");
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  RM_EMU_ENTER("cudaGetDevice");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  RM_EMU_ENTER("cudaGetDeviceProperties");
  if (device != 0) {
    return Fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties", "one device emulated");
  }
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "cuda_emu (CPU emulation of an sm_90 GPU)");
  // The GPU's UUID: "cuda_emu-gpu" and its index in the emulated node, which
  // CUDA_VISIBLE_DEVICES picks as on a real one (so ranks given different GPUs that way have
  // different UUIDs, as ringmaster's NCCL backend requires).
  char uuid[17];
  std::snprintf(uuid, sizeof(uuid), "cuda_emu-gpu%04d", rm_emu::VisibleGpu());
  std::memcpy(prop->uuid.bytes, uuid, 16);
  prop->totalGlobalMem = rm_emu::kDeviceBytes;
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 132;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 50 << 20;
  prop->memoryBusWidth = 5120;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  RM_EMU_ENTER("cudaMemGetInfo");
  std::lock_guard<std::mutex> lock(R().mu);
  *total = rm_emu::kDeviceBytes;
  *free = rm_emu::kDeviceBytes - R().allocated;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  RM_EMU_ENTER("cudaMalloc");
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue, "cudaMalloc", "null pointer");
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (size > rm_emu::kDeviceBytes - R().allocated) {
      rm_emu::last_error = cudaErrorMemoryAllocation;
      return cudaErrorMemoryAllocation;
    }
  }
  void* p = nullptr;
  // Exactly `size` bytes (not rounded up), so ASan sees an access past the end.
  if (posix_memalign(&p, 256, size) != 0) {
    rm_emu::last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  std::memset(p, 0xa5, size);  // fresh device memory holds garbage, not zeros
  std::lock_guard<std::mutex> lock(R().mu);
  R().device[static_cast<const char*>(p)] = size;
  R().allocated += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  RM_EMU_ENTER("cudaFree");
  if (ptr == nullptr) return cudaSuccess;
  rm_emu::SynchronizeDevice();  // as CUDA: the memory may still be in use by queued work
  {
    std::lock_guard<std::mutex> lock(R().mu);
    auto it = R().device.find(static_cast<const char*>(ptr));
    if (it == R().device.end()) {
      return Fail(cudaErrorInvalidValue, "cudaFree", "not the start of a device allocation");
    }
    R().allocated -= it->second;
    R().device.erase(it);
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  RM_EMU_ENTER("cudaHostAlloc");
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size == 0 ? 1 : size) != 0) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(R().mu);
  R().pinned[static_cast<const char*>(p)] = size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  RM_EMU_ENTER("cudaFreeHost");
  if (ptr == nullptr) return cudaSuccess;
  rm_emu::SynchronizeDevice();
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (R().pinned.erase(static_cast<const char*>(ptr)) == 0) {
      return Fail(cudaErrorInvalidValue, "cudaFreeHost", "not a cudaMallocHost pointer");
    }
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  RM_EMU_ENTER("cudaPointerGetAttributes");
  std::memset(attributes, 0, sizeof(*attributes));
  std::lock_guard<std::mutex> lock(R().mu);
  if (rm_emu::Inside(R().device, ptr, 1)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (rm_emu::Inside(R().pinned, ptr, 1)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return rm_emu::Copy(dst, src, count, kind, nullptr, /*synchronous=*/true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return rm_emu::Copy(dst, src, count, kind, stream, /*synchronous=*/false, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return rm_emu::Set(ptr, value, count, nullptr, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return rm_emu::Set(ptr, value, count, stream, "cudaMemsetAsync");
}

cudaError_t cudaDeviceSynchronize(void) {
  RM_EMU_ENTER("cudaDeviceSynchronize");
  rm_emu::SynchronizeDevice();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  RM_EMU_ENTER("cudaStreamCreateWithFlags");
  return rm_emu::Create(stream, flags, &rm_emu::Registry::streams);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  RM_EMU_ENTER("cudaStreamDestroy");
  // CUDA lets queued work finish after the call returns; the queue's last owner (this
  // handle, or work on other streams waiting on it) stops its worker once it has drained.
  return rm_emu::Destroy(stream, &rm_emu::Registry::streams, "cudaStreamDestroy");
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  RM_EMU_ENTER("cudaStreamSynchronize");
  // A no-op behind the stream's work (and, for the legacy stream, every blocking stream's).
  rm_emu::Ticket t = rm_emu::Push(stream, [] {});
  if (t.queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize", "unknown stream");
  }
  t.Wait();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  RM_EMU_ENTER("cudaStreamQuery");
  std::shared_ptr<rm_emu::Queue> queue;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    if (rm_emu::IsLegacy(stream)) {
      queue = R().legacy;
    } else if (R().streams.count(stream) > 0) {
      queue = stream->queue;
    }
  }
  if (queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery", "unknown stream");
  }
  return queue->Idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  RM_EMU_ENTER("cudaStreamWaitEvent");
  if (!rm_emu::ValidEvent(event)) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent", "unknown event");
  }
  std::shared_ptr<rm_emu::EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;  // an event never recorded is complete
  }
  if (rm_emu::Push(stream, [state, generation] { state->WaitFor(generation); }).queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent", "unknown stream");
  }
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  RM_EMU_ENTER("cudaLaunchHostFunc");
  if (rm_emu::Push(stream, [fn, data] { fn(data); }).queue == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc", "unknown stream");
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  RM_EMU_ENTER("cudaEventCreateWithFlags");
  return rm_emu::Create(event, flags, &rm_emu::Registry::events);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  RM_EMU_ENTER("cudaEventDestroy");
  return rm_emu::Destroy(event, &rm_emu::Registry::events, "cudaEventDestroy");
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  RM_EMU_ENTER("cudaEventRecord");
  if (!rm_emu::ValidEvent(event)) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord", "unknown event");
  }
  std::shared_ptr<rm_emu::EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = ++state->recorded;
  }
  const rm_emu::Ticket t = rm_emu::Push(stream, [state, generation] {
    std::lock_guard<std::mutex> lock(state->mu);
    state->completed = std::max(state->completed, generation);
    state->when = std::chrono::steady_clock::now();
    state->cv.notify_all();
  });
  if (t.queue == nullptr) {
    std::lock_guard<std::mutex> lock(state->mu);
    --state->recorded;
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord", "unknown stream");
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  RM_EMU_ENTER("cudaEventSynchronize");
  if (!rm_emu::ValidEvent(event)) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize", "unknown event");
  }
  std::shared_ptr<rm_emu::EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;
  }
  state->WaitFor(generation);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  RM_EMU_ENTER("cudaEventQuery");
  if (!rm_emu::ValidEvent(event)) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventQuery", "unknown event");
  }
  std::lock_guard<std::mutex> lock(event->state->mu);
  return event->state->completed >= event->state->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  RM_EMU_ENTER("cudaEventElapsedTime");
  if (!rm_emu::ValidEvent(start) || !rm_emu::ValidEvent(end) ||
      (start->flags & cudaEventDisableTiming) || (end->flags & cudaEventDisableTiming)) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime",
                "unknown event or one without timing");
  }
  std::chrono::steady_clock::time_point a, b;
  for (auto [event, when] : {std::pair{start, &a}, std::pair{end, &b}}) {
    std::lock_guard<std::mutex> lock(event->state->mu);
    if (event->state->recorded == 0) {
      return Fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime", "event never recorded");
    }
    if (event->state->completed < event->state->recorded) return cudaErrorNotReady;
    *when = event->state->when;
  }
  *ms = std::chrono::duration<float, std::milli>(b - a).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  RM_EMU_ENTER("cudaFuncSetAttribute");
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > (227 << 10)) {
      return Fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
                  "dynamic shared memory above the device's 227 KiB");
    }
    std::lock_guard<std::mutex> lock(R().mu);
    R().max_shared[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

}  // extern "C"
