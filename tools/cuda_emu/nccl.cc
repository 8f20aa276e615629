// NCCL emulated on the CPU for cuda_emu, so that the NCCL code paths of comm/nccl run in tests
// without a GPU: N ranks in N processes of one machine.
//
// ncclGetUniqueId makes a random name; ncclCommInitRank's ranks meet under it, pairwise
// connected by Unix sockets in the abstract namespace (nccl_mesh.h; a second mesh serves
// ncclCommSplit). Each operation is checked at the call and queued on its stream like a
// kernel (tools/cuda_emu/cudart.cc); when the stream reaches it, its rank sends every peer
// the part that peer needs and computes its result on the host (nccl_reduce.h) in rank order.
// The operations of one communicator run in the order they were called, whatever their
// streams. ncclSend completes only once the peer's ncclRecv has taken the data, as on a GPU.
//
// What NCCL leaves undefined or would hang on is an error here, with a message on stderr
// (and from ncclGetLastError): an id not made by ncclGetUniqueId, or used for a second
// communicator; ranks disagreeing about nranks; two ranks on one GPU (the emulated GPU's
// UUID: CUDA_VISIBLE_DEVICES, see cudart.cc); a communicator used after ncclCommDestroy or
// ncclCommAbort, after ncclCommFinalize, or before its non-blocking initialization finished;
// partly overlapping buffers; a send or receive to self outside a group, or without its
// match in the group; and ranks calling different operations (the peer's message does not
// match: an asynchronous ncclInvalidUsage).
//
// Errors while an operation runs are asynchronous, as in NCCL: ncclCommGetAsyncError reports
// them (ncclRemoteError when a peer's connection closes: its process died or it aborted) and
// the communicator must be aborted. ncclCommAbort wakes whatever waits on the communicator
// and closes its connections, so that its peers' operations fail with ncclRemoteError.
//
// Non-blocking communicators (config->blocking = 0) behave as NCCL documents: init returns
// ncclInProgress and connects in the background; ncclCommGetAsyncError says ncclInProgress
// until it is done. Finalize returns ncclInProgress while queued operations remain.
// ncclCommSplit exchanges colors and keys over a second mesh of the parent, one split after
// another in call order, then connects the new communicator: before it returns when
// blocking; else it returns ncclInProgress (ncclSuccess for NCCL_SPLIT_NOCOLOR) at once and
// both run on a thread, which ncclCommAbort of the new communicator (or of the parent) ends.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tools/cuda_emu/internal.h"
#include "tools/cuda_emu/nccl_mesh.h"
#include "tools/cuda_emu/nccl_reduce.h"

namespace rm_emu::nccl {
namespace {

constexpr char kIdTag[] = "cuda_emu nccl unique id";
constexpr uint32_t kMessageMagic = 0x6e634d53;  // "ncMS"
constexpr size_t kNameBytes = 16;               // the id's random part

// One rank's communicator; shared with the work it has queued on streams.
struct State {
  State(int rank, int nranks, bool blocking, std::string name)
      : rank(rank), nranks(nranks), blocking(blocking), name(std::move(name)) {}

  // Set when made, or (a non-blocking ncclCommSplit's) by the init thread before `init`
  // leaves ncclInProgress; read only after.
  int rank;
  int nranks;
  const bool blocking;
  std::string name;  // the meshes' socket names start with it
  Waker waker;       // ncclCommAbort

  std::mutex mu;
  std::condition_variable cv;
  ncclResult_t init = ncclInProgress;  // ncclSuccess once connected, or why it failed
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
  bool aborted = false;
  bool finalized = false;
  uint64_t queued = 0;  // operations queued on streams
  uint64_t done = 0;    // of which finished (they run in this order)
  bool running = false;
  int splits = 0;      // ncclCommSplit calls so far (the same count on every rank)
  int split_turn = 0;  // the split whose colors go over `boot` now (they go in call order)
  std::thread init_thread;
  std::vector<std::thread> split_threads;
  std::shared_ptr<State> split_parent;  // a non-blocking split's, while its init thread runs  //
                                        // non-blocking splits this rank is left out of

  // Set by init; read-only after (without peers at one rank).
  std::unique_ptr<Mesh> data;  // the operations
  std::unique_ptr<Mesh> boot;  // ncclCommSplit's exchange (a host call, apart from streams)
};

}  // namespace
}  // namespace rm_emu::nccl

struct ncclComm {
  std::shared_ptr<rm_emu::nccl::State> state;
};

namespace rm_emu::nccl {
namespace {

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
std::string Cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
ncclResult_t Fail(ncclResult_t result, const Args&... args) {
  last_error = Cat(args...);
  std::fprintf(stderr, "cuda_emu NCCL: %s (%s)\n", last_error.c_str(), ncclGetErrorString(result));
  return result;
}

// Records an asynchronous error of `s` (the first one wins) and says so on stderr.
void FailAsync(State& s, ncclResult_t result, const std::string& why) {
  std::fprintf(stderr, "cuda_emu NCCL: rank %d of %d: %s (%s)\n", s.rank, s.nranks, why.c_str(),
               ncclGetErrorString(result));
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.async_error == ncclSuccess) {
    s.async_error = result;
    s.last_error = why;
  }
}

std::string HexName(const unsigned char* bytes, size_t n) {
  std::string hex;
  for (size_t i = 0; i < n; ++i) hex += Cat(std::hex, (bytes[i] >> 4) & 0xf, bytes[i] & 0xf);
  return Cat("rm_emu_nccl.", hex);
}

// ncclSuccess when `comm` is live; with `usable`, also initialized, not finalized and
// without an asynchronous error.
ncclResult_t CheckComm(const char* fn, ncclComm_t comm, bool usable = true) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, fn, ": comm is null");
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (Live().count(comm) == 0) {
      return Fail(ncclInvalidArgument, fn, ": comm ", comm,
                  " is not a live communicator (destroyed or aborted?)");
    }
  }
  if (!usable) return ncclSuccess;
  State& s = *comm->state;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.finalized) return Fail(ncclInvalidUsage, fn, ": the communicator was finalized");
  if (s.init == ncclInProgress) {
    return Fail(ncclInvalidUsage, fn,
                ": the communicator is still initializing (poll ncclCommGetAsyncError until it "
                "is ncclSuccess)");
  }
  if (s.init != ncclSuccess) {
    return Fail(ncclInvalidUsage, fn, ": the communicator's initialization failed");
  }
  if (s.async_error != ncclSuccess) {
    return Fail(s.async_error, fn, ": the communicator has an asynchronous error (", s.last_error,
                "); abort it");
  }
  return ncclSuccess;
}

// ncclSuccess when `comm` is live and its initialization has finished (even if finalized or
// broken since).
ncclResult_t CheckInitialized(const char* fn, ncclComm_t comm) {
  if (ncclResult_t r = CheckComm(fn, comm, /*usable=*/false); r != ncclSuccess) return r;
  std::lock_guard<std::mutex> lock(comm->state->mu);
  if (comm->state->init == ncclInProgress) {
    return Fail(ncclInvalidUsage, fn, ": the communicator is still initializing");
  }
  return ncclSuccess;
}

ncclResult_t CheckOp(const char* fn, ncclRedOp_t op, ncclDataType_t type) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= ncclNumOps) {
    return Fail(ncclInvalidArgument, fn, ": reduction op ", op,
                " is not a built-in op (custom ops are not emulated)");
  }
  if (TypeBytes(type) != 0 && !Reducible(type)) {
    return Fail(ncclInvalidArgument, fn, ": reductions of fp8 type ", type, " are not emulated");
  }
  return ncclSuccess;
}

// ---- Operations. ----

struct Op {
  Collective collective = Collective::kNone;
  bool send = false;  // point to point: ncclSend (else ncclRecv)
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // per rank (AllGather: sent; ReduceScatter: received)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // Broadcast's root, a Send's or Recv's peer
};

Header MessageOf(const Op& o, Kind kind, size_t bytes) {
  Header h;
  h.magic = kMessageMagic;
  h.kind = kind;
  h.collective = o.collective;
  h.type = static_cast<uint8_t>(o.type);
  if (o.collective == Collective::kAllReduce || o.collective == Collective::kReduceScatter) {
    h.op = static_cast<uint8_t>(o.op);
  }
  if (o.collective == Collective::kBroadcast) h.root = o.root;
  h.count = o.count;
  h.bytes = bytes;
  return h;
}

Op MakeOp(Collective collective, const void* sendbuff, void* recvbuff, size_t count,
          ncclDataType_t type, ncclRedOp_t op = ncclSum, int root = 0) {
  return {.collective = collective,
          .sendbuff = sendbuff,
          .recvbuff = recvbuff,
          .count = count,
          .type = type,
          .op = op,
          .root = root};
}

const char* At(const void* p, size_t offset) { return static_cast<const char*>(p) + offset; }
char* At(void* p, size_t offset) { return static_cast<char*>(p) + offset; }

// One group of operations on one communicator (a lone call is a group of one): what to send
// and expect, and what to compute once everything has arrived.
class Plan {
 public:
  Plan(const State& s, const std::vector<Op>& ops) : s_(s), ops_(ops), scratch_(ops.size()) {
    for (size_t i = 0; i < ops_.size(); ++i) Add(i);
  }

  ncclResult_t Run(std::string* error) {
    if (s_.data != nullptr) {
      if (ncclResult_t r =
              s_.data->Exchange(std::move(sends_), std::move(expects_), s_.waker, error);
          r != ncclSuccess) {
        return r;
      }
    }
    for (size_t i = 0; i < ops_.size(); ++i) Finish(i);
    return ncclSuccess;
  }

 private:
  size_t Bytes(const Op& o) const { return o.count * TypeBytes(o.type); }

  void Add(size_t i) {
    const Op& o = ops_[i];
    const size_t bytes = Bytes(o);
    const int n = s_.nranks, me = s_.rank;
    std::vector<std::vector<char>>& scratch = scratch_[i];
    const Header part = MessageOf(o, Kind::kCollective, bytes);
    switch (o.collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
        scratch.resize(n);
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          scratch[p].resize(bytes);
          // AllReduce: the whole buffer; ReduceScatter: the peer's block.
          const size_t offset = o.collective == Collective::kAllReduce ? 0 : p * bytes;
          sends_.push_back({p, part, At(o.sendbuff, offset)});
          expects_.push_back({p, part, scratch[p].data(), false});
        }
        break;
      case Collective::kAllGather:
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          sends_.push_back({p, part, o.sendbuff});
          expects_.push_back({p, part, At(o.recvbuff, p * bytes), false});
        }
        break;
      case Collective::kBroadcast:
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          if (me == o.root) sends_.push_back({p, part, o.sendbuff});
        }
        if (me != o.root) expects_.push_back({o.root, part, o.recvbuff, false});
        break;
      case Collective::kNone: {
        if (o.root == me) break;  // to self: matched in the group, copied in Finish
        const Header data = MessageOf(o, Kind::kData, bytes);
        if (o.send) {
          sends_.push_back({o.root, data, o.sendbuff});
          expects_.push_back({o.root, MessageOf(o, Kind::kAck, 0), nullptr, false});
        } else {
          expects_.push_back({o.root, data, o.recvbuff, /*ack=*/true});
        }
        break;
      }
    }
  }

  void Finish(size_t i) {
    const Op& o = ops_[i];
    const size_t bytes = Bytes(o);
    const int n = s_.nranks, me = s_.rank;
    switch (o.collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter: {
        std::vector<const void*> inputs(n);
        for (int p = 0; p < n; ++p) inputs[p] = scratch_[i][p].data();
        inputs[me] =
            o.collective == Collective::kAllReduce ? o.sendbuff : At(o.sendbuff, me * bytes);
        // Into a scratch buffer first: recvbuff may be (part of) an input.
        std::vector<char> result(bytes);
        Reduce(o.type, o.op, inputs, result.data(), o.count);
        std::memcpy(o.recvbuff, result.data(), bytes);
        break;
      }
      case Collective::kAllGather:
        std::memmove(At(o.recvbuff, me * bytes), o.sendbuff, bytes);
        break;
      case Collective::kBroadcast:
        if (me == o.root) std::memmove(o.recvbuff, o.sendbuff, bytes);
        break;
      case Collective::kNone:
        if (o.root == me && !o.send) {
          // The matching send to self is the first unmatched one before it in the group.
          for (size_t j = 0; j < ops_.size(); ++j) {
            const Op& s = ops_[j];
            if (s.collective == Collective::kNone && s.send && s.root == me &&
                self_sends_taken_.insert(j).second) {
              std::memmove(o.recvbuff, s.sendbuff, bytes);
              break;
            }
          }
        }
        break;
    }
  }

  const State& s_;
  const std::vector<Op>& ops_;
  std::vector<std::vector<std::vector<char>>> scratch_;  // by op, by peer
  std::vector<Mesh::Send> sends_;
  std::vector<Mesh::Expect> expects_;
  std::set<size_t> self_sends_taken_;
};

// Runs `ops` on the stream's worker thread, after the communicator's earlier operations.
void RunInOrder(const std::shared_ptr<State>& state, uint64_t ticket, const std::vector<Op>& ops) {
  State& s = *state;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.done == ticket || s.aborted; });
    if (s.aborted) return;  // never runs; nobody waits for it any more
    s.running = true;
  }
  ncclResult_t result = ncclSuccess;
  std::string error;
  bool skip;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    skip = s.async_error != ncclSuccess;  // broken: its peers are not coming
  }
  if (!skip) result = Plan(s, ops).Run(&error);
  if (result != ncclSuccess && !s.waker.signalled()) FailAsync(s, result, error);
  std::lock_guard<std::mutex> lock(s.mu);
  s.running = false;
  ++s.done;
  s.cv.notify_all();
}

ncclResult_t Queue(const char* fn, ncclComm_t comm, cudaStream_t stream, std::vector<Op> ops) {
  const std::shared_ptr<State> state = comm->state;
  // The ticket is taken and the work queued under the communicator's lock, so that
  // operations called from two threads run in the order of their tickets.
  std::lock_guard<std::mutex> lock(state->mu);
  const uint64_t ticket = state->queued;
  const cudaError_t queued = rm_emu::Enqueue(
      stream, [state, ticket, ops = std::move(ops)] { RunInOrder(state, ticket, ops); });
  if (queued != cudaSuccess) {
    return Fail(ncclUnhandledCudaError, fn, ": the stream cannot take work (",
                cudaGetErrorName(queued), ")");
  }
  ++state->queued;
  return ncclSuccess;
}

// ---- Groups (ncclGroupStart / ncclGroupEnd). ----

struct Grouped {
  ncclComm_t comm;
  cudaStream_t stream;
  Op op;
};
thread_local int group_depth = 0;
thread_local std::vector<Grouped> grouped;

ncclResult_t Submit(const char* fn, ncclComm_t comm, cudaStream_t stream, const Op& op) {
  if (group_depth > 0) {
    grouped.push_back({comm, stream, op});
    return ncclSuccess;
  }
  if (op.collective == Collective::kNone && op.root == comm->state->rank) {
    return Fail(ncclInvalidUsage, fn, ": ", op.count,
                " elements to or from self need the matching call in the same "
                "ncclGroupStart/ncclGroupEnd (alone, it never completes on a GPU)");
  }
  return Queue(fn, comm, stream, {op});
}

// A group's point-to-point calls to self must pair up: as many sends as receives, with the
// same counts and types in order.
ncclResult_t CheckSelfPairs(const std::vector<Op>& ops, int me) {
  std::vector<const Op*> sends, recvs;
  for (const Op& o : ops) {
    if (o.collective == Collective::kNone && o.root == me) (o.send ? sends : recvs).push_back(&o);
  }
  if (sends.size() != recvs.size()) {
    return Fail(ncclInvalidUsage, "ncclGroupEnd: ", sends.size(), " sends to self but ",
                recvs.size(), " receives from self in the group");
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i]->count != recvs[i]->count || sends[i]->type != recvs[i]->type) {
      return Fail(ncclInvalidUsage, "ncclGroupEnd: send to self ", i, " (", sends[i]->count,
                  " of type ", sends[i]->type, ") does not match its receive (", recvs[i]->count,
                  " of type ", recvs[i]->type, ")");
    }
  }
  return ncclSuccess;
}

// ---- Collective calls: checks, then Submit. ----

ncclResult_t CheckCall(const char* fn, ncclComm_t comm, ncclDataType_t type) {
  if (ncclResult_t r = CheckComm(fn, comm); r != ncclSuccess) return r;
  if (TypeBytes(type) == 0)
    return Fail(ncclInvalidArgument, fn, ": datatype ", type, " is not valid");
  return ncclSuccess;
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// A collective whose send buffer holds `send_blocks` and whose receive buffer `recv_blocks`
// blocks of `count` elements; in place when `in_place_at` (the offset of the smaller buffer
// within the larger, in blocks) is where the smaller one starts.
ncclResult_t Collect(const char* fn, ncclComm_t comm, cudaStream_t stream, const Op& op,
                     size_t send_blocks, size_t recv_blocks, size_t in_place_at) {
  if (ncclResult_t r = CheckCall(fn, comm, op.type); r != ncclSuccess) return r;
  if (op.count == 0) return ncclSuccess;
  const size_t block = op.count * TypeBytes(op.type);
  const bool needs_send = op.collective != Collective::kBroadcast || comm->state->rank == op.root;
  if ((needs_send && op.sendbuff == nullptr) || op.recvbuff == nullptr) {
    return Fail(ncclInvalidArgument, fn, ": sendbuff or recvbuff is null with count ", op.count);
  }
  if (needs_send) {
    const void* in_place = send_blocks >= recv_blocks ? At(op.sendbuff, in_place_at * block)
                                                      : At(op.recvbuff, in_place_at * block);
    const void* smaller = send_blocks >= recv_blocks ? op.recvbuff : op.sendbuff;
    if (smaller != in_place &&
        Overlap(op.sendbuff, send_blocks * block, op.recvbuff, recv_blocks * block)) {
      return Fail(ncclInvalidArgument, fn,
                  ": sendbuff and recvbuff overlap without being in place (undefined in NCCL)");
    }
  }
  return Submit(fn, comm, stream, op);
}

ncclResult_t PointToPoint(const char* fn, bool send, const void* sendbuff, void* recvbuff,
                          size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  if (ncclResult_t r = CheckCall(fn, comm, type); r != ncclSuccess) return r;
  const int n = comm->state->nranks;
  if (peer < 0 || peer >= n) {
    return Fail(ncclInvalidArgument, fn, ": peer ", peer, " is not a rank of a ", n,
                "-rank communicator");
  }
  if (count > 0 && (send ? sendbuff == nullptr : recvbuff == nullptr)) {
    return Fail(ncclInvalidArgument, fn, ": the buffer is null with count ", count);
  }
  Op op;
  op.send = send;
  op.sendbuff = sendbuff;
  op.recvbuff = recvbuff;
  op.count = count;
  op.type = type;
  op.root = peer;
  return Submit(fn, comm, stream, op);
}

// ---- Lifecycle. ----

// The GPU this process's rank runs on, as the emulated runtime names it.
void GpuUuid(char uuid[16]) {
  cudaDeviceProp prop;
  std::memset(uuid, 0, 16);
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::memcpy(uuid, prop.uuid.bytes, 16);
}

// Connects `s`'s meshes; records the outcome in s.init.
void Connect(State& s) {
  char uuid[16];
  GpuUuid(uuid);
  Hello mine;
  mine.nranks = s.nranks;
  mine.rank = s.rank;
  std::memcpy(mine.gpu_uuid, uuid, 16);
  std::unique_ptr<Mesh> data, boot;
  std::vector<Hello> peers;
  std::string error;
  ncclResult_t r =
      Mesh::Connect(s.name + ".d", s.rank, s.nranks, mine, s.waker, &data, &peers, &error);
  for (int p = 0; r == ncclSuccess && p < s.nranks; ++p) {
    if (p != s.rank && std::memcmp(peers[p].gpu_uuid, uuid, 16) == 0) {
      error = Cat("ranks ", std::min(p, s.rank), " and ", std::max(p, s.rank),
                  " are on the same GPU; NCCL needs a GPU per rank (cuda_emu gives each "
                  "process the GPU that CUDA_VISIBLE_DEVICES names)");
      r = ncclInvalidUsage;
    }
  }
  if (r == ncclSuccess) {
    r = Mesh::Connect(s.name + ".b", s.rank, s.nranks, mine, s.waker, &boot, &peers, &error);
  }
  if (r != ncclSuccess && !s.waker.signalled()) {
    std::fprintf(stderr, "cuda_emu NCCL: rank %d of %d: initialization: %s (%s)\n", s.rank,
                 s.nranks, error.c_str(), ncclGetErrorString(r));
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (r == ncclSuccess) {
    s.data = std::move(data);
    s.boot = std::move(boot);
  } else {
    s.last_error = error;
  }
  s.init = r;
  s.cv.notify_all();
}

// Makes `c` live and hands it out.
void Publish(ncclComm* c, ncclComm_t* comm) {
  {
    std::lock_guard<std::mutex> lock(Mutex());
    Live().insert(c);
  }
  *comm = c;
}

// A new communicator's handle: connected now (blocking) or in the background.
ncclResult_t Start(const char* fn, std::shared_ptr<State> state, ncclComm_t* comm) {
  auto* c = new ncclComm{state};
  if (state->blocking || state->nranks == 1) {  // one rank: nothing to wait for
    Connect(*state);
    if (state->init != ncclSuccess) {
      const ncclResult_t r = state->init;
      last_error = state->last_error;
      delete c;
      return Fail(r, fn, ": ", last_error);
    }
  } else {
    state->init_thread = std::thread([s = state.get()] { Connect(*s); });
  }
  Publish(c, comm);
  return state->blocking ? ncclSuccess : ncclInProgress;
}

// Takes `comm` out of the live set and frees it: ncclCommDestroy (after its queued operations
// finish) and ncclCommAbort (at once: whatever waits is woken and fails).
ncclResult_t Release(const char* fn, ncclComm_t comm, bool abort) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (Live().erase(comm) == 0) {
      return Fail(ncclInvalidArgument, fn, ": comm ", comm,
                  " is not a live communicator (destroyed or aborted twice?)");
    }
  }
  std::shared_ptr<State> s = std::move(comm->state);
  delete comm;
  if (abort) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->aborted = true;
      s->cv.notify_all();
    }
    s->waker.Signal();
    if (s->split_parent != nullptr) {  // its init thread may wait for its turn there
      std::lock_guard<std::mutex> lock(s->split_parent->mu);
      s->split_parent->cv.notify_all();
    }
  }
  if (s->init_thread.joinable()) s->init_thread.join();
  s->split_parent = nullptr;
  std::vector<std::thread> splits;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    splits = std::move(s->split_threads);
  }
  for (std::thread& t : splits) t.join();
  {
    std::unique_lock<std::mutex> lock(s->mu);
    // Destroy: the queued operations finish first. Abort: only the running one, woken.
    s->cv.wait(lock, [&] { return abort ? !s->running : s->done == s->queued; });
  }
  if (s->data != nullptr) s->data->Shutdown();
  if (s->boot != nullptr) s->boot->Shutdown();
  return ncclSuccess;
}

ncclResult_t InitRank(const char* fn, ncclComm_t* comm, int nranks, const ncclUniqueId& id,
                      int rank, bool blocking) {
  if (!rm_emu::DeviceUsable()) {
    return Fail(ncclUnhandledCudaError, fn,
                ": CUDA was initialized in the parent before fork(); a forked child cannot use it");
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, fn, ": rank ", rank, " of nranks ", nranks, " is invalid");
  }
  if (std::memcmp(id.internal, kIdTag, sizeof(kIdTag)) != 0) {
    return Fail(ncclInvalidArgument, fn,
                ": commId was not made by ncclGetUniqueId (not passed on from rank 0?)");
  }
  const auto* random = reinterpret_cast<const unsigned char*>(id.internal + sizeof(kIdTag));
  return Start(fn, std::make_shared<State>(rank, nranks, blocking, HexName(random, kNameBytes)),
               comm);
}

// Every rank's (color, key) for split number `split` of `s`, over its boot mesh after the
// earlier splits' exchanges. A non-blocking split's `child` may be aborted meanwhile: that
// ends the exchange too (and breaks `s`, whose peers are then mid-exchange).
ncclResult_t ExchangeColors(State& s, int split, int color, int key,
                            std::vector<std::pair<int, int>>* all, std::string* error,
                            const State* child = nullptr) {
  const Waker* child_waker = child != nullptr ? &child->waker : nullptr;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] {
      return s.split_turn == split || s.aborted ||
             (child_waker != nullptr && child_waker->signalled());
    });
    if (s.split_turn != split) {
      *error = "the communicator was aborted";
      return ncclInternalError;
    }
  }
  all->assign(s.nranks, {color, key});
  std::vector<int32_t> mine = {color, key};
  std::vector<std::vector<int32_t>> theirs(s.nranks, std::vector<int32_t>(2));
  Header h;
  h.magic = kMessageMagic;
  h.kind = Kind::kCollective;
  h.collective = Collective::kAllGather;
  h.type = ncclInt32;
  h.root = split;  // a rank on another split does not match
  h.count = 2;
  h.bytes = sizeof(int32_t) * 2;
  std::vector<Mesh::Send> sends;
  std::vector<Mesh::Expect> expects;
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    sends.push_back({p, h, mine.data()});
    expects.push_back({p, h, theirs[p].data(), false});
  }
  const ncclResult_t r = s.boot->Exchange(sends, expects, s.waker, error, child_waker);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.split_turn;
    s.cv.notify_all();
  }
  if (r != ncclSuccess) {
    *error = "ncclCommSplit: " + *error;
    if (!s.waker.signalled()) FailAsync(s, r, *error);
    return r;
  }
  for (int p = 0; p < s.nranks; ++p) {
    if (p != s.rank) (*all)[p] = {theirs[p][0], theirs[p][1]};
  }
  return ncclSuccess;
}

// The name of the communicator of `color` made by split number `split` of `parent`.
std::string SplitName(const std::string& parent, int split, int color) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : Cat(parent, "/", split, "/", color)) {
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  unsigned char bytes[8];
  std::memcpy(bytes, &h, 8);
  return HexName(bytes, 8) + Cat(".", split);
}

// Where this rank is in the communicator of `color` that a split makes: the ranks of that
// color ordered by key, then by rank in the parent.
void JoinGroup(const State& parent, int split, int color, int key,
               const std::vector<std::pair<int, int>>& colors, State* child) {
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < parent.nranks; ++r) {
    if (colors[r].first == color) members.emplace_back(colors[r].second, r);
  }
  std::sort(members.begin(), members.end());
  child->rank =
      static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, parent.rank)) -
                       members.begin());
  child->nranks = static_cast<int>(members.size());
  child->name = SplitName(parent.name, split, color);
}

// A non-blocking split's work, on its own thread: the exchange, then (with a `child`, null
// for NCCL_SPLIT_NOCOLOR) its connection.
void SplitInBackground(const std::shared_ptr<State>& parent, int split, int color, int key,
                       State* child) {
  std::vector<std::pair<int, int>> colors;
  std::string error;
  const ncclResult_t r = ExchangeColors(*parent, split, color, key, &colors, &error, child);
  if (child == nullptr) return;
  if (r != ncclSuccess) {
    std::lock_guard<std::mutex> lock(child->mu);
    child->init = r;
    child->last_error = error;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(child->mu);
    JoinGroup(*parent, split, color, key, colors, child);
  }
  Connect(*child);
}

}  // namespace
}  // namespace rm_emu::nccl

using rm_emu::nccl::Collect;
using rm_emu::nccl::Collective;
using rm_emu::nccl::Fail;
using rm_emu::nccl::MakeOp;
using rm_emu::nccl::Op;

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

const char* ncclGetLastError(ncclComm_t comm) {
  // A communicator's asynchronous error, else the calling thread's last one.
  if (comm != nullptr) {
    std::lock_guard<std::mutex> live(rm_emu::nccl::Mutex());
    if (rm_emu::nccl::Live().count(comm) > 0) {
      rm_emu::nccl::State& s = *comm->state;
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.last_error.empty()) {
        thread_local std::string copy;
        copy = s.last_error;
        return copy.c_str();
      }
    }
  }
  return rm_emu::nccl::last_error.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, rm_emu::nccl::kIdTag, sizeof(rm_emu::nccl::kIdTag));
  std::random_device random;
  for (size_t i = 0; i < rm_emu::nccl::kNameBytes; ++i) {
    id->internal[sizeof(rm_emu::nccl::kIdTag) + i] = static_cast<char>(random());
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  const char* fn = "ncclCommInitRankConfig";
  if (comm == nullptr) return Fail(ncclInvalidArgument, fn, ": comm is null");
  *comm = nullptr;
  if (config != nullptr && config->magic != 0xcafebeef) {
    return Fail(ncclInvalidArgument, fn,
                ": config was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  // blocking is NCCL_CONFIG_UNDEF_INT unless set: blocking by default.
  const bool blocking = config == nullptr || config->blocking != 0;
  return rm_emu::nccl::InitRank(fn, comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  if (ncclResult_t r = rm_emu::nccl::CheckComm(fn, comm); r != ncclSuccess) return r;
  if (newcomm == nullptr) return Fail(ncclInvalidArgument, fn, ": newcomm is null");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return Fail(ncclInvalidArgument, fn, ": color ", color,
                " is negative (NCCL_SPLIT_NOCOLOR is the only negative color)");
  }
  if (config != nullptr && config->magic != 0xcafebeef) {
    return Fail(ncclInvalidArgument, fn,
                ": config was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  const std::shared_ptr<rm_emu::nccl::State>& parent = comm->state;
  // No config, or blocking unset: the parent's.
  const bool blocking = config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT
                            ? parent->blocking
                            : config->blocking != 0;
  int split;
  {
    std::lock_guard<std::mutex> lock(parent->mu);
    split = parent->splits++;
  }
  if (!blocking) {
    // Returns at once; the exchange and the connection run on a thread.
    if (color == NCCL_SPLIT_NOCOLOR) {
      std::lock_guard<std::mutex> lock(parent->mu);
      parent->split_threads.emplace_back([parent, split, color, key] {
        rm_emu::nccl::SplitInBackground(parent, split, color, key, nullptr);
      });
      return ncclSuccess;
    }
    auto child = std::make_shared<rm_emu::nccl::State>(-1, 0, /*blocking=*/false, "");
    child->split_parent = parent;
    child->init_thread = std::thread([parent, split, color, key, c = child.get()] {
      rm_emu::nccl::SplitInBackground(parent, split, color, key, c);
    });
    rm_emu::nccl::Publish(new ncclComm{std::move(child)}, newcomm);
    return ncclInProgress;
  }
  std::vector<std::pair<int, int>> colors;
  std::string error;
  if (ncclResult_t r = rm_emu::nccl::ExchangeColors(*parent, split, color, key, &colors, &error);
      r != ncclSuccess) {
    return Fail(r, fn, ": ", error);
  }
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  auto child = std::make_shared<rm_emu::nccl::State>(-1, 0, /*blocking=*/true, "");
  rm_emu::nccl::JoinGroup(*parent, split, color, key, colors, child.get());
  return rm_emu::nccl::Start(fn, std::move(child), newcomm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ncclResult_t r = rm_emu::nccl::CheckInitialized("ncclCommCount", comm); r != ncclSuccess) {
    return r;
  }
  if (count == nullptr) return Fail(ncclInvalidArgument, "ncclCommCount: count is null");
  *count = comm->state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (ncclResult_t r = rm_emu::nccl::CheckInitialized("ncclCommUserRank", comm); r != ncclSuccess) {
    return r;
  }
  if (rank == nullptr) return Fail(ncclInvalidArgument, "ncclCommUserRank: rank is null");
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclCommGetAsyncError", comm, /*usable=*/false);
      r != ncclSuccess) {
    return r;
  }
  if (async_error == nullptr) return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: null");
  rm_emu::nccl::State& s = *comm->state;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init != ncclSuccess) {
    *async_error = s.init;  // ncclInProgress while connecting
  } else if (s.async_error != ncclSuccess) {
    *async_error = s.async_error;
  } else if (s.finalized && s.done < s.queued) {
    *async_error = ncclInProgress;
  } else {
    *async_error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclCommFinalize", comm); r != ncclSuccess) {
    return r;
  }
  rm_emu::nccl::State& s = *comm->state;
  std::unique_lock<std::mutex> lock(s.mu);
  s.finalized = true;
  if (!s.blocking) return s.done < s.queued ? ncclInProgress : ncclSuccess;
  s.cv.wait(lock, [&] { return s.done == s.queued || s.async_error != ncclSuccess; });
  return s.async_error;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return rm_emu::nccl::Release("ncclCommDestroy", comm, /*abort=*/false);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return rm_emu::nccl::Release("ncclCommAbort", comm, /*abort=*/true);
}

ncclResult_t ncclGroupStart() {
  ++rm_emu::nccl::group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  using rm_emu::nccl::grouped;
  if (rm_emu::nccl::group_depth == 0) {
    return Fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
  }
  if (--rm_emu::nccl::group_depth > 0) return ncclSuccess;
  std::vector<rm_emu::nccl::Grouped> calls = std::move(grouped);
  grouped.clear();
  // One queued piece of work per communicator, its calls in order.
  std::vector<ncclComm_t> comms;
  std::map<ncclComm_t, std::vector<Op>> ops;
  std::map<ncclComm_t, cudaStream_t> streams;
  for (const rm_emu::nccl::Grouped& g : calls) {
    if (ops.count(g.comm) == 0) {
      comms.push_back(g.comm);
      streams[g.comm] = g.stream;
    } else if (streams[g.comm] != g.stream) {
      return Fail(ncclInvalidUsage,
                  "ncclGroupEnd: one communicator's calls in a group on different streams "
                  "(not emulated)");
    }
    ops[g.comm].push_back(g.op);
  }
  for (ncclComm_t c : comms) {
    if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclGroupEnd", c); r != ncclSuccess) return r;
    if (ncclResult_t r = rm_emu::nccl::CheckSelfPairs(ops[c], c->state->rank); r != ncclSuccess) {
      return r;
    }
  }
  for (ncclComm_t c : comms) {
    if (ncclResult_t r = rm_emu::nccl::Queue("ncclGroupEnd", c, streams[c], std::move(ops[c]));
        r != ncclSuccess) {
      return r;
    }
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = rm_emu::nccl::CheckOp("ncclAllReduce", op, datatype); r != ncclSuccess) {
    return r;
  }
  return Collect("ncclAllReduce", comm, stream,
                 MakeOp(Collective::kAllReduce, sendbuff, recvbuff, count, datatype, op), 1, 1, 0);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclBroadcast", comm); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->state->nranks) {
    return Fail(ncclInvalidArgument, "ncclBroadcast: root ", root, " is not a rank of a ",
                comm->state->nranks, "-rank communicator");
  }
  return Collect("ncclBroadcast", comm, stream,
                 MakeOp(Collective::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root),
                 1, 1, 0);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  // recvbuff holds nranks * sendcount elements; in place is sendbuff == recvbuff + rank *
  // sendcount.
  if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclAllGather", comm); r != ncclSuccess) return r;
  const auto& s = *comm->state;
  return Collect("ncclAllGather", comm, stream,
                 MakeOp(Collective::kAllGather, sendbuff, recvbuff, sendcount, datatype), 1,
                 s.nranks, s.rank);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  // sendbuff holds nranks * recvcount elements; in place is recvbuff == sendbuff + rank *
  // recvcount.
  if (ncclResult_t r = rm_emu::nccl::CheckOp("ncclReduceScatter", op, datatype); r != ncclSuccess) {
    return r;
  }
  if (ncclResult_t r = rm_emu::nccl::CheckComm("ncclReduceScatter", comm); r != ncclSuccess) {
    return r;
  }
  const auto& s = *comm->state;
  return Collect("ncclReduceScatter", comm, stream,
                 MakeOp(Collective::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op),
                 s.nranks, 1, s.rank);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return rm_emu::nccl::PointToPoint("ncclSend", /*send=*/true, sendbuff, nullptr, count, datatype,
                                    peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return rm_emu::nccl::PointToPoint("ncclRecv", /*send=*/false, nullptr, recvbuff, count, datatype,
                                    peer, comm, stream);
}

}  // extern "C"
