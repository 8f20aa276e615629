#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace ringmaster::comm {
namespace {

// The wait loop spins this long, then sleeps from kNapMin doubling up to kNapMax.
constexpr absl::Duration kSpin = absl::Microseconds(100);
constexpr absl::Duration kNapMin = absl::Microseconds(10);
constexpr absl::Duration kNapMax = absl::Microseconds(200);
// Initialization and finalization take milliseconds or more: poll less often.
constexpr absl::Duration kSlowPoll = absl::Milliseconds(1);

// Makes `device` current for the calling thread while in scope, then restores the
// caller's device (NCCL and CUDA calls below act on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) {
      status_ = CudaToStatus(cudaSetDevice(device), "cudaSetDevice");
      restore_ = status_.ok() && saved_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (restore_) (void)cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  int saved_ = -1;
  bool restore_ = false;
  absl::Status status_;
};

std::string OpName(OpKind kind) { return absl::StrCat("nccl ", OpKindName(kind)); }

// An asynchronous NCCL error breaks the communicator: a remote or system error means a
// peer or the network failed (UNAVAILABLE), anything else is INTERNAL.
absl::Status AsyncErrorToStatus(absl::string_view what, ncclResult_t res) {
  std::string message = absl::StrCat(what, ": NCCL error ", res, ": ", ncclGetErrorString(res));
  if (res == ncclRemoteError || res == ncclSystemError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// No GPU or no driver is a property of the machine: a person must fix it.
absl::Status DeviceQueryToStatus(cudaError_t err, const char* expr) {
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(
        absl::StrCat(expr, ": no usable CUDA GPU (", cudaGetErrorName(err),
                     "); the NCCL backend needs one GPU per rank"));
  }
  return CudaToStatus(err, expr);
}

absl::StatusOr<ncclDataType_t> ToNcclType(absl::string_view op, DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUint8:
      return ncclUint8;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": type ", static_cast<int>(type), " is not a DataType"));
}

absl::StatusOr<ncclRedOp_t> ToNcclOp(absl::string_view op_name, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProd:
      return ncclProd;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op_name, ": op ", static_cast<int>(op), " is not a ReduceOp"));
}

// count * elements * DataTypeSize(type), or INVALID_ARGUMENT when it overflows.
absl::StatusOr<size_t> Bytes(absl::string_view op, size_t count, size_t elements, DataType type) {
  const size_t element = DataTypeSize(type);
  if (count > std::numeric_limits<size_t>::max() / elements / element) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": count ", count, " is too large"));
  }
  return count * elements * element;
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

const char* At(const void* base, size_t offset) { return static_cast<const char*>(base) + offset; }

}  // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, int device, absl::Duration finalize_timeout,
                                   std::shared_ptr<Family> family)
    : rank_(rank),
      size_(size),
      device_(device),
      finalize_timeout_(finalize_timeout),
      family_(std::move(family)) {
  absl::MutexLock lock(&family_->mu);
  family_->members.push_back(this);
}

absl::Status NcclCommunicator::AllocateResources() {
  RM_RETURN_IF_ERROR(CudaToStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags"));
  RM_RETURN_IF_ERROR(CudaToStatus(
      cudaMalloc(reinterpret_cast<void**>(&barrier_buffer_), sizeof(int32_t)), "cudaMalloc"));
  return CudaToStatus(cudaMemset(barrier_buffer_, 0, sizeof(int32_t)), "cudaMemset");
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options) {
  if (options.size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicatorOptions.size must be positive, got ", options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicatorOptions.rank ", options.rank,
                                                   " is outside [0, ", options.size, ")"));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("NcclCommunicatorOptions.store is null");
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("NcclCommunicatorOptions.prefix is empty");
  }
  if (options.device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicatorOptions.device must be a CUDA ordinal or -1, got ", options.device));
  }
  if (options.init_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NcclCommunicatorOptions.init_timeout must be positive");
  }
  const std::string key = absl::StrCat(options.prefix, "/unique_id");
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicatorOptions.prefix: ", s.message()));
  }
  const absl::Time deadline = absl::Now() + options.init_timeout;

  // Peers fetch the id before touching CUDA: a rank waiting for its root costs nothing.
  ncclUniqueId id;
  if (options.rank != 0) {
    RM_ASSIGN_OR_RETURN(std::string hex, options.store->Get(key, deadline));
    if (hex.size() != 2 * sizeof(id.internal) ||
        !std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
      return absl::InternalError(absl::StrCat("store key ", key, " holds ", hex.size(),
                                              " bytes that are not a hex NCCL unique id"));
    }
    const std::string raw = absl::HexStringToBytes(hex);
    std::copy(raw.begin(), raw.end(), id.internal);
  }

  int device_count = 0;
  RM_RETURN_IF_ERROR(DeviceQueryToStatus(cudaGetDeviceCount(&device_count), "cudaGetDeviceCount"));
  int device = options.device;
  if (device == -1) {
    RM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  } else if (device >= device_count) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicatorOptions.device ", device,
                                                   " is outside [0, ", device_count, ")"));
  }
  DeviceGuard guard(device);
  RM_RETURN_IF_ERROR(guard.status());

  if (options.rank == 0) {
    RM_RETURN_IF_NCCL_ERROR(ncclGetUniqueId(&id));
    RM_RETURN_IF_ERROR(options.store->Set(
        key, absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)))));
  }

  auto comm = absl::WrapUnique(new NcclCommunicator(
      options.rank, options.size, device, options.finalize_timeout, std::make_shared<Family>()));
  // On failure below, record the error so that the destructor aborts what was made.
  auto fail = [&comm](absl::Status status) { return comm->Break(std::move(status)); };
  if (absl::Status s = comm->AllocateResources(); !s.ok()) return fail(s);

  // Non-blocking: initialization runs in NCCL's threads while we poll it against the
  // deadline, so a missing peer cannot hang Create().
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  absl::MutexLock lock(&comm->comm_mu_);
  ncclResult_t res = ncclCommInitRankConfig(&comm->comm_, options.size, id, options.rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    return fail(res == ncclInvalidArgument || res == ncclInvalidUsage
                    ? NcclToStatus(res, "ncclCommInitRankConfig")
                    : AsyncErrorToStatus("ncclCommInitRankConfig", res));
  }
  while (true) {
    ncclResult_t state = ncclSuccess;
    res = ncclCommGetAsyncError(comm->comm_, &state);
    if (res != ncclSuccess) return fail(AsyncErrorToStatus("ncclCommGetAsyncError", res));
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      return fail(AsyncErrorToStatus("NCCL communicator initialization", state));
    }
    if (absl::Now() >= deadline) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "NCCL communicator initialization (rank ", options.rank, " of ", options.size,
          ", store prefix ", options.prefix, ") did not finish within init_timeout ",
          absl::FormatDuration(options.init_timeout), ": are all ranks running?")));
    }
    absl::SleepFor(kSlowPoll);
  }
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  queue_.Stop();  // no queued operation may outlive what follows
  {
    absl::MutexLock lock(&family_->mu);
    std::erase(family_->members, this);
  }
  DeviceGuard guard(device_);
  const bool healthy = GetAsyncError().ok();
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ != nullptr && !comm_aborted_) {
      ncclResult_t state = ncclInternalError;
      if (healthy) {
        // ncclCommFinalize flushes outstanding work; on a non-blocking communicator it
        // returns at once and we poll it, bounded, before the local ncclCommDestroy.
        const absl::Time deadline = absl::Now() + finalize_timeout_;
        state = ncclCommFinalize(comm_);
        while (state == ncclInProgress && absl::Now() < deadline) {
          absl::SleepFor(kSlowPoll);
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
        }
      }
      if (state == ncclSuccess) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
      comm_aborted_ = true;
    }
  }
  if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status NcclCommunicator::Break(absl::Status status) const {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = std::move(status);
  return error_;
}

void NcclCommunicator::AbortComm() const {
  absl::MutexLock lock(&comm_mu_);
  if (comm_ == nullptr || comm_aborted_) return;
  DeviceGuard guard(device_);  // ncclCommAbort switches devices; restore the caller's.
  (void)ncclCommAbort(comm_);
  comm_aborted_ = true;
}

void NcclCommunicator::Abort() {
  BreakFamily(absl::AbortedError("nccl: communicator aborted by Abort() (the epoch is changing)"));
}

void NcclCommunicator::BreakFamily(const absl::Status& status) {
  absl::MutexLock lock(&family_->mu);
  for (NcclCommunicator* member : family_->members) {
    if (absl::IsAborted(status)) {
      member->abort_requested_.store(true, std::memory_order_release);
    }
    member->Break(status).IgnoreError();
    member->AbortComm();
  }
}

absl::Status NcclCommunicator::GetAsyncError() const {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  // Never blocks: when an operation holds the NCCL communicator, its own polling will
  // see the error. Aborting is left to the next operation, Abort() or the destructor.
  ncclResult_t state = ncclSuccess;
  if (comm_mu_.TryLock()) {
    if (comm_ != nullptr && !comm_aborted_ && ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
      state = ncclInternalError;
    }
    comm_mu_.Unlock();
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    return Break(AsyncErrorToStatus("nccl: asynchronous error", state));
  }
  return absl::OkStatus();
}

Counters NcclCommunicator::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::Status NcclCommunicator::CheckHealthy() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status NcclCommunicator::Finish(OpKind kind, absl::Time start, absl::Status status,
                                      uint64_t sent, uint64_t received, uint64_t payload,
                                      uint64_t formula) {
  {
    absl::MutexLock lock(&mu_);
    OpCounters& c = counters_.of(kind);
    ++c.calls;
    c.time += absl::Now() - start;
    if (status.ok()) {
      c.bytes_sent += sent;
      c.bytes_received += received;
      c.payload_bytes += payload;
      c.formula_bytes_sent += formula;
      return status;
    }
    ++c.errors;
    if (absl::IsInvalidArgument(status)) return status;
  }
  // Any other error breaks the family. Abort NCCL before returning, so that no kernel of
  // this operation still touches the caller's buffers.
  status = Break(std::move(status));
  BreakFamily(status);
  return status;
}

absl::Status NcclCommunicator::CheckDevicePointer(absl::string_view op, absl::string_view what,
                                                  const void* ptr) const {
  cudaPointerAttributes attributes = {};
  cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err == cudaErrorInvalidValue) {  // an unknown pointer, before CUDA 11
    (void)cudaGetLastError();
    attributes.type = cudaMemoryTypeUnregistered;
  } else if (err != cudaSuccess) {
    return CudaToStatus(err, "cudaPointerGetAttributes");
  }
  switch (attributes.type) {
    case cudaMemoryTypeManaged:
      return absl::OkStatus();
    case cudaMemoryTypeDevice:
      if (attributes.device != device_) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": ", what, " buffer is on CUDA device ", attributes.device,
                         " but this communicator uses device ", device_));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", what,
                       " buffer is host memory; the NCCL backend needs device memory on "
                       "CUDA device ",
                       device_, " (use the TCP backend for host buffers)"));
  }
}

template <typename Enqueue>
absl::Status NcclCommunicator::Run(absl::string_view op, absl::Time deadline, Enqueue enqueue) {
  DeviceGuard guard(device_);
  RM_RETURN_IF_ERROR(guard.status());
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_aborted_) return absl::AbortedError(absl::StrCat(op, ": communicator aborted"));
    RM_RETURN_IF_ERROR(enqueue(comm_));
  }
  return Wait(op, deadline);
}

absl::Status NcclCommunicator::Wait(absl::string_view op, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::Duration nap = kNapMin;
  while (true) {
    if (abort_requested_.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat(op, ": aborted by Abort()"));
    }
    // Done when NCCL has launched the work (state no longer ncclInProgress) and the
    // stream has drained: the stream is empty before the launch.
    ncclResult_t state = ncclSuccess;
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_aborted_) return absl::AbortedError(absl::StrCat(op, ": communicator aborted"));
      ncclResult_t res = ncclCommGetAsyncError(comm_, &state);
      if (res != ncclSuccess) {
        return AsyncErrorToStatus(absl::StrCat(op, ": ncclCommGetAsyncError"), res);
      }
    }
    if (state == ncclSuccess) {
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) {
        // Drained; but the work may have failed between the check above and now (a peer
        // gone mid-operation): only a state still clean is success.
        absl::MutexLock lock(&comm_mu_);
        if (comm_aborted_) return absl::AbortedError(absl::StrCat(op, ": communicator aborted"));
        ncclResult_t after = ncclSuccess;
        const ncclResult_t res = ncclCommGetAsyncError(comm_, &after);
        if (res != ncclSuccess) {
          return AsyncErrorToStatus(absl::StrCat(op, ": ncclCommGetAsyncError"), res);
        }
        if (after != ncclSuccess && after != ncclInProgress) return AsyncErrorToStatus(op, after);
        return absl::OkStatus();
      }
      if (err != cudaErrorNotReady) {
        return CudaToStatus(err, absl::StrCat(op, ": cudaStreamQuery").c_str());
      }
    } else if (state != ncclInProgress) {
      return AsyncErrorToStatus(op, state);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          op, ": not complete at the deadline, after ", absl::FormatDuration(now - start),
          "; a peer is stopped, slow or not calling the same operation. Communicator aborted"));
    }
    if (now - start >= kSpin) {
      absl::SleepFor(std::min(nap, deadline - now));
      nap = std::min(2 * nap, kNapMax);
    }
  }
}

absl::Status NcclCommunicator::AllReduceNow(const void* send, void* recv, size_t count, DataType type,
                                         ReduceOp op, absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kAllReduce;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidateBuffers(name, send, recv, count));
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, ToNcclOp(name, op));
    RM_ASSIGN_OR_RETURN(const size_t bytes, Bytes(name, count, 1, type));
    if (count == 0) return absl::OkStatus();
    if (send != recv && Overlap(send, bytes, recv, bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": send and recv overlap without being the same buffer"));
    }
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "send", send));
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "recv", recv));
    return Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(ncclAllReduce(send, recv, count, nccl_type, nccl_op, comm, stream_),
                          "ncclAllReduce");
    });
  }();
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  const uint64_t ring = RingAllReduceBytes(bytes, size_);
  return Finish(kKind, start, std::move(status), ring, ring, bytes, ring);
}

absl::Status NcclCommunicator::AllGatherNow(const void* send, void* recv, size_t count, DataType type,
                                         absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kAllGather;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidateBuffers(name, send, recv, count));
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_ASSIGN_OR_RETURN(const size_t total, Bytes(name, count, size_, type));
    if (count == 0) return absl::OkStatus();
    const size_t bytes = total / size_;
    // NCCL is in place when send is this rank's block of recv. send == recv (our in-place
    // form) is made so by copying send's block first; the blocks are disjoint for rank > 0.
    const void* slot = At(recv, rank_ * bytes);
    const bool copy_first = send == recv && slot != send;
    if (send != slot && !copy_first && Overlap(send, bytes, recv, total)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": send overlaps recv without being recv or recv's block of this rank"));
    }
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "send", send));
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "recv", recv));
    return Run(name, deadline, [&](ncclComm_t comm) -> absl::Status {
      if (copy_first) {
        RM_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(const_cast<char*>(At(recv, rank_ * bytes)), send,
                                                bytes, cudaMemcpyDeviceToDevice, stream_));
      }
      return NcclToStatus(
          ncclAllGather(copy_first ? slot : send, recv, count, nccl_type, comm, stream_),
          "ncclAllGather");
    });
  }();
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  const uint64_t ring = RingGatherBytes(bytes * size_, size_);
  return Finish(kKind, start, std::move(status), ring, ring, bytes * size_, ring);
}

absl::Status NcclCommunicator::ReduceScatterNow(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op, absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kReduceScatter;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidateBuffers(name, send, recv, count));
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_ASSIGN_OR_RETURN(const ncclRedOp_t nccl_op, ToNcclOp(name, op));
    RM_ASSIGN_OR_RETURN(const size_t total, Bytes(name, count, size_, type));
    if (count == 0) return absl::OkStatus();
    const size_t bytes = total / size_;
    // NCCL is in place when recv is this rank's block of send. recv == send (our in-place
    // form) reduces into that block, then copies it to the front.
    void* slot = const_cast<char*>(At(send, rank_ * bytes));
    const bool copy_after = recv == send && slot != recv;
    if (recv != slot && !copy_after && Overlap(send, total, recv, bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": recv overlaps send without being send or send's block of this rank"));
    }
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "send", send));
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "recv", recv));
    RM_RETURN_IF_ERROR(Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(ncclReduceScatter(send, copy_after ? slot : recv, count, nccl_type,
                                            nccl_op, comm, stream_),
                          "ncclReduceScatter");
    }));
    if (!copy_after) return absl::OkStatus();
    return Run(name, deadline, [&](ncclComm_t) -> absl::Status {
      RM_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(recv, slot, bytes, cudaMemcpyDeviceToDevice, stream_));
      return absl::OkStatus();
    });
  }();
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  const uint64_t ring = RingGatherBytes(bytes * size_, size_);
  return Finish(kKind, start, std::move(status), ring, ring, bytes * size_, ring);
}

absl::Status NcclCommunicator::BroadcastNow(const void* send, void* recv, size_t count, DataType type,
                                         int root, absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kBroadcast;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  const bool is_root = root == rank_;
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidatePeer(name, "root", root, rank_, size_, /*allow_self=*/true));
    // `send` matters only on the root.
    RM_RETURN_IF_ERROR(ValidateBuffers(name, is_root ? send : recv, recv, count));
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_ASSIGN_OR_RETURN(const size_t bytes, Bytes(name, count, 1, type));
    if (count == 0) return absl::OkStatus();
    if (is_root && send != recv && Overlap(send, bytes, recv, bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": send and recv overlap without being the same buffer"));
    }
    if (is_root) RM_RETURN_IF_ERROR(CheckDevicePointer(name, "send", send));
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "recv", recv));
    return Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(
          ncclBroadcast(is_root ? send : recv, recv, count, nccl_type, root, comm, stream_),
          "ncclBroadcast");
    });
  }();
  // Ring from the root: every rank but the root receives, every rank but the last sends.
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  const int position = root >= 0 && root < size_ ? (rank_ - root + size_) % size_ : 0;
  const uint64_t sent = position != size_ - 1 ? bytes : 0;
  return Finish(kKind, start, std::move(status), sent, position != 0 ? bytes : 0, bytes, sent);
}

absl::Status NcclCommunicator::SendNow(const void* buf, size_t count, DataType type, int peer,
                                    absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kSend;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidatePeer(name, "peer", peer, rank_, size_, /*allow_self=*/false));
    if (buf == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": buf is null but count is ", count));
    }
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_RETURN_IF_ERROR(Bytes(name, count, 1, type).status());
    if (count == 0) return absl::OkStatus();
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "buf", buf));
    return Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(ncclSend(buf, count, nccl_type, peer, comm, stream_), "ncclSend");
    });
  }();
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  return Finish(kKind, start, std::move(status), bytes, 0, bytes, 0);
}

absl::Status NcclCommunicator::RecvNow(void* buf, size_t count, DataType type, int peer,
                                    absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kRecv;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidatePeer(name, "peer", peer, rank_, size_, /*allow_self=*/false));
    if (buf == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": buf is null but count is ", count));
    }
    RM_ASSIGN_OR_RETURN(const ncclDataType_t nccl_type, ToNcclType(name, type));
    RM_RETURN_IF_ERROR(Bytes(name, count, 1, type).status());
    if (count == 0) return absl::OkStatus();
    RM_RETURN_IF_ERROR(CheckDevicePointer(name, "buf", buf));
    return Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(ncclRecv(buf, count, nccl_type, peer, comm, stream_), "ncclRecv");
    });
  }();
  const uint64_t bytes = uint64_t{count} * DataTypeSize(type);
  return Finish(kKind, start, std::move(status), 0, bytes, bytes, 0);
}

absl::Status NcclCommunicator::SendRecvNow(absl::Span<const PointToPoint> ops,
                                           absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kSendRecv;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  uint64_t sent = 0, received = 0;
  for (const PointToPoint& op : ops) {
    const bool known = static_cast<uint8_t>(op.type) <= static_cast<uint8_t>(DataType::kUint8);
    const uint64_t bytes = known ? uint64_t{op.count} * DataTypeSize(op.type) : 0;
    (op.kind == PointToPoint::Kind::kSend ? sent : received) += bytes;
  }
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    RM_RETURN_IF_ERROR(ValidateBatch(ops, rank_, size_));
    std::vector<ncclDataType_t> types(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      const std::string op_name = BatchOpName(i);
      RM_ASSIGN_OR_RETURN(types[i], ToNcclType(op_name, op.type));
      if (op.count == 0) continue;  // as Send/Recv: nothing goes to NCCL
      const bool sends = op.kind == PointToPoint::Kind::kSend;
      RM_RETURN_IF_ERROR(
          CheckDevicePointer(op_name, sends ? "send" : "recv", sends ? op.send : op.recv));
    }
    if (sent + received == 0) return absl::OkStatus();
    return Run(name, deadline, [&](ncclComm_t comm) -> absl::Status {
      // One group: NCCL progresses every send and receive of it together.
      RM_RETURN_IF_ERROR(NcclToStatus(ncclGroupStart(), "ncclGroupStart"));
      absl::Status queued = absl::OkStatus();
      for (size_t i = 0; i < ops.size() && queued.ok(); ++i) {
        const PointToPoint& op = ops[i];
        if (op.count == 0) continue;
        queued = op.kind == PointToPoint::Kind::kSend
                     ? NcclToStatus(ncclSend(op.send, op.count, types[i], op.peer, comm, stream_),
                                    "ncclSend")
                     : NcclToStatus(ncclRecv(op.recv, op.count, types[i], op.peer, comm, stream_),
                                    "ncclRecv");
      }
      // Closed even after a failed call, so that this thread leaves group mode.
      const absl::Status ended = NcclToStatus(ncclGroupEnd(), "ncclGroupEnd");
      RM_RETURN_IF_ERROR(queued);
      return ended;
    });
  }();
  return Finish(kKind, start, std::move(status), sent, received, sent + received, 0);
}

absl::Status NcclCommunicator::BarrierNow(absl::Time deadline) {
  constexpr OpKind kKind = OpKind::kBarrier;
  const absl::Time start = absl::Now();
  const std::string name = OpName(kKind);
  absl::Status status = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(CheckHealthy());
    return Run(name, deadline, [&](ncclComm_t comm) {
      return NcclToStatus(
          ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclInt32, ncclSum, comm, stream_),
          "ncclAllReduce");
    });
  }();
  return Finish(kKind, start, std::move(status), 0, 0, 0, 0);
}

template <typename Fn>
absl::Status NcclCommunicator::InOrder(OpKind kind, absl::Time deadline, Fn&& fn) {
  const absl::Time start = absl::Now();
  absl::Status drained = queue_.Drain(deadline);
  if (!drained.ok()) {
    return Finish(kind, start,
                  absl::Status(drained.code(), absl::StrCat(OpName(kind), ": ", drained.message())),
                  0, 0, 0, 0);
  }
  return fn();
}

absl::Status NcclCommunicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                         ReduceOp op, absl::Time deadline) {
  return InOrder(OpKind::kAllReduce, deadline,
                 [&] { return AllReduceNow(send, recv, count, type, op, deadline); });
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count, DataType type,
                                         absl::Time deadline) {
  return InOrder(OpKind::kAllGather, deadline,
                 [&] { return AllGatherNow(send, recv, count, type, deadline); });
}

absl::Status NcclCommunicator::ReduceScatter(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op, absl::Time deadline) {
  return InOrder(OpKind::kReduceScatter, deadline,
                 [&] { return ReduceScatterNow(send, recv, count, type, op, deadline); });
}

absl::Status NcclCommunicator::Broadcast(const void* send, void* recv, size_t count, DataType type,
                                         int root, absl::Time deadline) {
  return InOrder(OpKind::kBroadcast, deadline,
                 [&] { return BroadcastNow(send, recv, count, type, root, deadline); });
}

absl::Status NcclCommunicator::Send(const void* buf, size_t count, DataType type, int peer,
                                    absl::Time deadline) {
  return InOrder(OpKind::kSend, deadline,
                 [&] { return SendNow(buf, count, type, peer, deadline); });
}

absl::Status NcclCommunicator::SendRecv(absl::Span<const PointToPoint> ops, absl::Time deadline) {
  if (ops.empty()) return CheckHealthy();  // nothing to move, nothing to wait for
  return InOrder(OpKind::kSendRecv, deadline, [&] { return SendRecvNow(ops, deadline); });
}

absl::Status NcclCommunicator::Barrier(absl::Time deadline) {
  return InOrder(OpKind::kBarrier, deadline, [&] { return BarrierNow(deadline); });
}

absl::Status NcclCommunicator::Recv(void* buf, size_t count, DataType type, int peer,
                                    absl::Time deadline) {
  return InOrder(OpKind::kRecv, deadline,
                 [&] { return RecvNow(buf, count, type, peer, deadline); });
}

Work NcclCommunicator::AllReduceAsync(const void* send, void* recv, size_t count, DataType type,
                                      ReduceOp op, absl::Time deadline) {
  return queue_.Enqueue([=, this] { return AllReduceNow(send, recv, count, type, op, deadline); });
}

Work NcclCommunicator::AllGatherAsync(const void* send, void* recv, size_t count, DataType type,
                                      absl::Time deadline) {
  return queue_.Enqueue([=, this] { return AllGatherNow(send, recv, count, type, deadline); });
}

Work NcclCommunicator::ReduceScatterAsync(const void* send, void* recv, size_t count,
                                          DataType type, ReduceOp op, absl::Time deadline) {
  return queue_.Enqueue(
      [=, this] { return ReduceScatterNow(send, recv, count, type, op, deadline); });
}

Work NcclCommunicator::BroadcastAsync(const void* send, void* recv, size_t count, DataType type,
                                      int root, absl::Time deadline) {
  return queue_.Enqueue(
      [=, this] { return BroadcastNow(send, recv, count, type, root, deadline); });
}

Work NcclCommunicator::SendAsync(const void* buf, size_t count, DataType type, int peer,
                                 absl::Time deadline) {
  return queue_.Enqueue([=, this] { return SendNow(buf, count, type, peer, deadline); });
}

Work NcclCommunicator::RecvAsync(void* buf, size_t count, DataType type, int peer,
                                 absl::Time deadline) {
  return queue_.Enqueue([=, this] { return RecvNow(buf, count, type, peer, deadline); });
}

Work NcclCommunicator::SendRecvAsync(absl::Span<const PointToPoint> ops, absl::Time deadline) {
  if (ops.empty()) return Work::Done(CheckHealthy());
  return queue_.Enqueue([ops = std::vector<PointToPoint>(ops.begin(), ops.end()), deadline, this] {
    return SendRecvNow(ops, deadline);
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(int color, int key,
                                                                      absl::Time deadline) {
  const std::string name = absl::StrCat("nccl split (color ", color, ", key ", key, ")");
  RM_RETURN_IF_ERROR(queue_.Drain(deadline));
  RM_RETURN_IF_ERROR(CheckHealthy());
  DeviceGuard guard(device_);
  RM_RETURN_IF_ERROR(guard.status());
  // Any failure from here breaks the family: ranks that did split wait for this one.
  auto fail = [&](absl::Status status) {
    status = Break(std::move(status));
    BreakFamily(status);
    return status;
  };
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  ncclResult_t res;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_aborted_) return absl::AbortedError(absl::StrCat(name, ": communicator aborted"));
    res = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  }
  if (res != ncclSuccess && res != ncclInProgress) return fail(AsyncErrorToStatus(name, res));
  // Non-blocking: the split completes in NCCL's threads; poll the parent and the child.
  while (true) {
    ncclResult_t parent_state = ncclSuccess, child_state = ncclSuccess;
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_aborted_) {
        if (child != nullptr) (void)ncclCommAbort(child);
        return absl::AbortedError(absl::StrCat(name, ": communicator aborted"));
      }
      if (ncclCommGetAsyncError(comm_, &parent_state) != ncclSuccess) {
        parent_state = ncclInternalError;
      }
    }
    if (child != nullptr && ncclCommGetAsyncError(child, &child_state) != ncclSuccess) {
      child_state = ncclInternalError;
    }
    if (parent_state == ncclSuccess && child_state == ncclSuccess) break;
    const ncclResult_t bad = parent_state != ncclInProgress && parent_state != ncclSuccess
                                 ? parent_state
                                 : child_state;
    if (bad != ncclInProgress && bad != ncclSuccess) {
      if (child != nullptr) (void)ncclCommAbort(child);
      return fail(AsyncErrorToStatus(name, bad));
    }
    if (absl::Now() >= deadline) {
      if (child != nullptr) (void)ncclCommAbort(child);
      return fail(absl::DeadlineExceededError(absl::StrCat(
          name, ": not complete at the deadline; are all ranks of the communicator splitting?")));
    }
    absl::SleepFor(kSlowPoll);
  }
  if (child == nullptr) return std::unique_ptr<Communicator>();
  int rank = -1, size = 0;
  if (absl::Status s = NcclToStatus(ncclCommUserRank(child, &rank), "ncclCommUserRank"); !s.ok()) {
    (void)ncclCommAbort(child);
    return fail(s);
  }
  if (absl::Status s = NcclToStatus(ncclCommCount(child, &size), "ncclCommCount"); !s.ok()) {
    (void)ncclCommAbort(child);
    return fail(s);
  }
  auto group = absl::WrapUnique(new NcclCommunicator(rank, size, device_, finalize_timeout_, family_));
  {
    absl::MutexLock lock(&group->comm_mu_);
    group->comm_ = child;
  }
  if (absl::Status s = group->AllocateResources(); !s.ok()) {
    group->Break(s).IgnoreError();  // the destructor aborts the child
    return s;
  }
  return group;
}

}  // namespace ringmaster::comm
