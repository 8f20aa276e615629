// NCCL emulated on the CPU for cuda_emu: one rank only, so that the NCCL code paths of
// comm/nccl run in tests without a GPU. Every collective of a one-rank communicator is a copy
// of sendbuff to recvbuff (a sum, product, min, max or average over one rank is the value
// itself), checked at the call and done on the stream's worker thread in the stream's order
// (tools/cuda_emu/cudart.cc).
//
// What NCCL leaves undefined or would hang on is an error here, with a message on stderr
// (and from ncclGetLastError): more than one rank (ncclInvalidUsage), an id not made by
// ncclGetUniqueId, a communicator used after ncclCommDestroy or ncclCommAbort, after
// ncclCommFinalize, partly overlapping buffers, and a send or receive to self (which needs a
// matching call in a group: groups are not emulated).
//
// Non-blocking communicators (config->blocking = 0) behave as NCCL documents: init and
// finalize return ncclInProgress, and ncclCommGetAsyncError then reports ncclSuccess.
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "tools/cuda_emu/internal.h"

struct ncclComm {
  bool blocking;
  bool finalized = false;
};

namespace {

constexpr char kIdTag[] = "cuda_emu nccl unique id";

std::mutex& Mutex() {
  static std::mutex mu;
  return mu;
}

// Communicators made and not yet destroyed or aborted, guarded by Mutex().
std::set<const ncclComm*>& Live() {
  static auto* live = new std::set<const ncclComm*>;
  return *live;
}

thread_local std::string last_error;

template <typename... Args>
ncclResult_t Fail(ncclResult_t result, const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  last_error = out.str();
  std::fprintf(stderr, "cuda_emu NCCL: %s (%s)\n", last_error.c_str(), ncclGetErrorString(result));
  return result;
}

size_t TypeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// ncclSuccess when `comm` is live; with `usable`, also not finalized.
ncclResult_t CheckComm(const char* fn, ncclComm_t comm, bool usable = true) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, fn, ": comm is null");
  std::lock_guard<std::mutex> lock(Mutex());
  if (Live().count(comm) == 0) {
    return Fail(ncclInvalidArgument, fn, ": comm ", comm,
                " is not a live communicator (destroyed or aborted?)");
  }
  if (usable && comm->finalized) {
    return Fail(ncclInvalidUsage, fn, ": the communicator was finalized");
  }
  return ncclSuccess;
}

ncclResult_t CheckOp(const char* fn, ncclRedOp_t op) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= ncclNumOps) {
    return Fail(ncclInvalidArgument, fn, ": reduction op ", op,
                " is not a built-in op (custom ops are not emulated)");
  }
  return ncclSuccess;
}

// A collective over one rank: recvbuff = sendbuff, `count` elements of `type`.
ncclResult_t CopyCollective(const char* fn, const void* send, void* recv, size_t count,
                            ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = CheckComm(fn, comm); r != ncclSuccess) return r;
  const size_t bytes = TypeBytes(type);
  if (bytes == 0) return Fail(ncclInvalidArgument, fn, ": datatype ", type, " is not valid");
  if (count == 0) return ncclSuccess;
  if (send == nullptr || recv == nullptr) {
    return Fail(ncclInvalidArgument, fn, ": sendbuff or recvbuff is null with count ", count);
  }
  if (send == recv) {  // in place: nothing to move, but the stream still orders the call
    const cudaError_t queued = rm_emu::Enqueue(stream, [] {});
    return queued == cudaSuccess
               ? ncclSuccess
               : Fail(ncclUnhandledCudaError, fn, ": the stream cannot take work");
  }
  const auto s = reinterpret_cast<uintptr_t>(send), d = reinterpret_cast<uintptr_t>(recv);
  if (s < d + count * bytes && d < s + count * bytes) {
    return Fail(ncclInvalidArgument, fn,
                ": sendbuff and recvbuff overlap without being in place (undefined in NCCL)");
  }
  const cudaError_t queued =
      rm_emu::Enqueue(stream, [recv, send, n = count * bytes] { std::memcpy(recv, send, n); });
  if (queued != cudaSuccess) {
    return Fail(ncclUnhandledCudaError, fn, ": the stream cannot take work (",
                cudaGetErrorName(queued), ")");
  }
  return ncclSuccess;
}

// Removes `comm` from the live set and frees it: ncclCommDestroy and ncclCommAbort.
ncclResult_t Release(const char* fn, ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (Live().erase(comm) == 0) {
      return Fail(ncclInvalidArgument, fn, ": comm ", comm,
                  " is not a live communicator (destroyed or aborted twice?)");
    }
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t SendRecv(const char* fn, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm) {
  if (ncclResult_t r = CheckComm(fn, comm); r != ncclSuccess) return r;
  if (TypeBytes(type) == 0)
    return Fail(ncclInvalidArgument, fn, ": datatype ", type, " is not valid");
  if (peer != 0) {
    return Fail(ncclInvalidArgument, fn, ": peer ", peer,
                " is not a rank of a 1-rank communicator");
  }
  return Fail(ncclInvalidUsage, fn, ": ", count,
              " elements to or from self need the matching call in one "
              "ncclGroupStart/ncclGroupEnd, which cuda_emu does not emulate (alone, it never "
              "completes on a GPU)");
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument (cuda_emu: see stderr or ncclGetLastError)";
    case ncclInvalidUsage:
      return "invalid usage (cuda_emu: see stderr or ncclGetLastError)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t /*comm*/) { return last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  static std::atomic<uint64_t> next{1};
  const uint64_t serial = next.fetch_add(1);
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kIdTag, sizeof(kIdTag));
  std::memcpy(id->internal + sizeof(kIdTag), &serial, sizeof(serial));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  const char* fn = "ncclCommInitRankConfig";
  if (comm == nullptr) return Fail(ncclInvalidArgument, fn, ": comm is null");
  *comm = nullptr;
  if (!rm_emu::DeviceUsable()) {
    return Fail(ncclUnhandledCudaError, fn,
                ": CUDA was initialized in the parent before fork(); a forked child cannot use it");
  }
  if (config != nullptr && config->magic != 0xcafebeef) {
    return Fail(ncclInvalidArgument, fn,
                ": config was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, fn, ": rank ", rank, " of nranks ", nranks, " is invalid");
  }
  if (std::memcmp(id.internal, kIdTag, sizeof(kIdTag)) != 0) {
    return Fail(ncclInvalidArgument, fn,
                ": commId was not made by ncclGetUniqueId (not passed on from rank 0?)");
  }
  if (nranks > 1) {
    return Fail(ncclInvalidUsage, fn, ": cuda_emu NCCL emulates one rank only, asked for ", nranks,
                " ranks");
  }
  // blocking is NCCL_CONFIG_UNDEF_INT unless set: blocking by default.
  const bool blocking = config == nullptr || config->blocking != 0;
  auto* c = new ncclComm{blocking};
  {
    std::lock_guard<std::mutex> lock(Mutex());
    Live().insert(c);
  }
  *comm = c;
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (ncclResult_t r = CheckComm("ncclCommGetAsyncError", comm, /*usable=*/false);
      r != ncclSuccess) {
    return r;
  }
  if (async_error == nullptr) return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: null");
  *async_error = ncclSuccess;  // all work is done at enqueue
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = CheckComm("ncclCommFinalize", comm); r != ncclSuccess) return r;
  std::lock_guard<std::mutex> lock(Mutex());
  comm->finalized = true;
  return comm->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return Release("ncclCommDestroy", comm); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return Release("ncclCommAbort", comm); }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = CheckOp("ncclAllReduce", op); r != ncclSuccess) return r;
  return CopyCollective("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0) {
    return Fail(ncclInvalidArgument, "ncclBroadcast: root ", root,
                " is not a rank of a 1-rank communicator");
  }
  return CopyCollective("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  // recvbuff holds nranks * sendcount = sendcount elements; in place is sendbuff == recvbuff.
  return CopyCollective("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (ncclResult_t r = CheckOp("ncclReduceScatter", op); r != ncclSuccess) return r;
  return CopyCollective("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, comm, stream);
}

ncclResult_t ncclSend(const void* /*sendbuff*/, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t /*stream*/) {
  return SendRecv("ncclSend", count, datatype, peer, comm);
}

ncclResult_t ncclRecv(void* /*recvbuff*/, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t /*stream*/) {
  return SendRecv("ncclRecv", count, datatype, peer, comm);
}

}  // extern "C"
