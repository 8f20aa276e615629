#include "comm/tcp/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::comm::tcp {

namespace {
constexpr uint64_t kRingMagic = 0x524d53484d524e47ull;  // "RMSHMRNG"
}  // namespace

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  uint64_t nonce;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> consumer_waiting;
  alignas(64) std::atomic<uint32_t> producer_waiting;
};

namespace {

constexpr size_t kHeaderBytes = 4096;  // keeps the data page-aligned
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);

// Closes a descriptor on every path.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

ShmRing::ShmRing(std::string name, void* base, size_t mapped, size_t capacity)
    : name_(std::move(name)),
      base_(base),
      mapped_(mapped),
      capacity_(capacity),
      header_(static_cast<Header*>(base)),
      data_(static_cast<char*>(base) + kHeaderBytes) {}

ShmRing::~ShmRing() {
  Unlink();
  munmap(base_, mapped_);
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(size_t capacity) {
  CHECK(capacity >= 4096 && (capacity & (capacity - 1)) == 0) << capacity;
  std::random_device device;
  const uint64_t nonce = (static_cast<uint64_t>(device()) << 32) ^ device();
  std::string name = absl::StrCat("/ringmaster-", getpid(), "-", absl::Hex(nonce));
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  FdCloser closer{fd};
  const size_t mapped = kHeaderBytes + capacity;
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(mapped));
  if (rc != 0) {
    shm_unlink(name.c_str());
    if (rc == ENOSPC) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room in /dev/shm for a ", mapped, "-byte ring (", name, "); enlarge /dev/shm"));
    }
    return ErrnoToStatus(rc, absl::StrCat("posix_fallocate ", name));
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    shm_unlink(name.c_str());
    return ErrnoToStatus(err, absl::StrCat("mmap ", name));
  }
  auto* h = new (base) Header;
  h->magic = kRingMagic;
  h->capacity = capacity;
  h->nonce = nonce;
  h->head.store(0);
  h->tail.store(0);
  h->consumer_waiting.store(0);
  h->producer_waiting.store(0);
  std::unique_ptr<ShmRing> ring(new ShmRing(std::move(name), base, mapped, capacity));
  ring->linked_ = true;
  return ring;
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Open(const std::string& name, size_t capacity,
                                                       uint64_t nonce) {
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory ring ", name, " offered with bad capacity ", capacity));
  }
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no shared-memory ring ", name, " on this host"));
    }
    return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  }
  FdCloser closer{fd};
  const size_t mapped = kHeaderBytes + capacity;
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", name));
  if (static_cast<size_t>(st.st_size) != mapped) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory ring ", name, " has ",
                                                      st.st_size, " bytes, expected ", mapped));
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("mmap ", name));
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kRingMagic || h->capacity != capacity || h->nonce != nonce) {
    munmap(base, mapped);
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory file ", name, " is not the ring the peer offered"));
  }
  return std::unique_ptr<ShmRing>(new ShmRing(name, base, mapped, capacity));
}

void ShmRing::Unlink() {
  if (!linked_) return;
  linked_ = false;
  shm_unlink(name_.c_str());
}

uint64_t ShmRing::nonce() const { return header_->nonce; }

size_t ShmRing::Space() const {
  return capacity_ - (header_->head.load(std::memory_order_relaxed) -
                      header_->tail.load(std::memory_order_acquire));
}

void ShmRing::WriteAt(size_t past_head, const void* data, size_t bytes) {
  const size_t pos = (header_->head.load(std::memory_order_relaxed) + past_head) & (capacity_ - 1);
  const size_t first = std::min(bytes, capacity_ - pos);
  std::memcpy(data_ + pos, data, first);
  if (first < bytes) std::memcpy(data_, static_cast<const char*>(data) + first, bytes - first);
}

namespace {

// The consumer's flag: not waiting, waiting in poll() (wake with a byte on the socket), or
// waiting on the flag word as a futex (wake with FUTEX_WAKE).
constexpr uint32_t kNotWaiting = 0;
constexpr uint32_t kPollWait = 1;
constexpr uint32_t kFutexWait = 2;

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

bool ShmRing::Publish(size_t bytes) {
  header_->head.store(header_->head.load(std::memory_order_relaxed) + bytes,
                      std::memory_order_seq_cst);
  if (header_->consumer_waiting.load(std::memory_order_seq_cst) == kNotWaiting) return false;
  const uint32_t was = header_->consumer_waiting.exchange(kNotWaiting, std::memory_order_seq_cst);
  if (was == kFutexWait) {
    Futex(&header_->consumer_waiting, FUTEX_WAKE, 1, nullptr);
    return false;
  }
  return was == kPollWait;
}

bool ShmRing::ArmConsumerFutexWait() {
  header_->consumer_waiting.store(kFutexWait, std::memory_order_seq_cst);
  if (header_->head.load(std::memory_order_seq_cst) !=
      header_->tail.load(std::memory_order_relaxed)) {
    DisarmConsumerWait();
    return false;
  }
  return true;
}

bool ShmRing::FutexWaitConsumer(absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  // Returns at once (EAGAIN) when a publisher has already cleared the flag.
  const long rc = Futex(&header_->consumer_waiting, FUTEX_WAIT, kFutexWait, &ts);
  return !(rc != 0 && errno == ETIMEDOUT);
}

size_t ShmRing::Available() const {
  return header_->head.load(std::memory_order_acquire) -
         header_->tail.load(std::memory_order_relaxed);
}

const char* ShmRing::Peek(size_t past_tail, size_t* contiguous) const {
  const size_t pos = (header_->tail.load(std::memory_order_relaxed) + past_tail) & (capacity_ - 1);
  *contiguous = capacity_ - pos;
  return data_ + pos;
}

void ShmRing::ReadAt(size_t past_tail, void* out, size_t bytes) const {
  size_t contiguous;
  const char* p = Peek(past_tail, &contiguous);
  const size_t first = std::min(bytes, contiguous);
  std::memcpy(out, p, first);
  if (first < bytes) std::memcpy(static_cast<char*>(out) + first, data_, bytes - first);
}

bool ShmRing::Release(size_t bytes) {
  header_->tail.store(header_->tail.load(std::memory_order_relaxed) + bytes,
                      std::memory_order_seq_cst);
  return header_->producer_waiting.load(std::memory_order_seq_cst) != 0 &&
         header_->producer_waiting.exchange(0, std::memory_order_seq_cst) != 0;
}

bool ShmRing::ArmConsumerWait() {
  header_->consumer_waiting.store(kPollWait, std::memory_order_seq_cst);
  if (header_->head.load(std::memory_order_seq_cst) !=
      header_->tail.load(std::memory_order_relaxed)) {
    DisarmConsumerWait();
    return false;
  }
  return true;
}

bool ShmRing::ArmProducerWait() {
  header_->producer_waiting.store(1, std::memory_order_seq_cst);
  // The sender publishes whole elements (at most 8 bytes): less room is no room.
  if (header_->head.load(std::memory_order_relaxed) -
          header_->tail.load(std::memory_order_seq_cst) + 8 <=
      capacity_) {
    DisarmProducerWait();
    return false;
  }
  return true;
}

void ShmRing::DisarmConsumerWait() {
  header_->consumer_waiting.store(0, std::memory_order_seq_cst);
}

void ShmRing::DisarmProducerWait() {
  header_->producer_waiting.store(0, std::memory_order_seq_cst);
}

}  // namespace ringmaster::comm::tcp
