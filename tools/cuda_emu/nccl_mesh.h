// Internal to tools/cuda_emu: the transport of the emulated NCCL (nccl.cc). The ranks of one
// communicator, one per process, are connected pairwise by Unix stream sockets in the
// abstract namespace ("<name>.<rank>", nothing on the filesystem): a full mesh. Messages are
// a fixed Header and a payload. The collectives (nccl.cc) are written against Exchange()
// only: what to send to each peer and what to expect from each.
//
// Every blocking call also watches a Waker, which ncclCommAbort signals for good, and fails
// with ncclRemoteError when a peer's connection closes under it (its process exited or it
// aborted): a dead peer is noticed, never waited for.
#ifndef RINGMASTER_TOOLS_CUDA_EMU_NCCL_MESH_H_
#define RINGMASTER_TOOLS_CUDA_EMU_NCCL_MESH_H_

#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace rm_emu::nccl {

// Wakes every blocking call of one communicator, once and for good (an eventfd).
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  void Signal();
  bool signalled() const { return signalled_.load(); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::atomic<bool> signalled_{false};
};

// The collectives; point to point is Collective::kNone.
enum class Collective : uint8_t { kNone = 0, kAllReduce, kAllGather, kReduceScatter, kBroadcast };

enum class Kind : uint8_t {
  kCollective = 1,  // a rank's part of a collective
  kData = 2,        // ncclSend's payload
  kAck = 3,         // the receiver took a kData (ncclSend completes only then, as on a GPU)
  kEarly = 4,       // the receiver keeps a kData that came before its ncclRecv (no payload)
};

// What a message is. A received header must equal the expected one (kind, collective,
// type, op, root, count, bytes): anything else means the ranks called different operations.
struct Header {
  uint32_t magic = 0;
  Kind kind = Kind::kCollective;
  Collective collective = Collective::kNone;
  uint8_t type = 0;  // ncclDataType_t
  uint8_t op = 0;    // ncclRedOp_t
  int32_t root = 0;  // broadcast
  uint32_t reserved = 0;
  uint64_t count = 0;  // elements
  uint64_t bytes = 0;  // payload
};
static_assert(sizeof(Header) == 32);

// What a rank tells its peers when it connects.
struct Hello {
  uint32_t magic = 0;
  int32_t nranks = 0;
  int32_t rank = 0;
  char gpu_uuid[16] = {};
};

class Mesh {
 public:
  // Connects `rank` of `nranks` to every other rank of the communicator `name`: listens on
  // "<name>.<rank>" (for the Mesh's life), connects to each lower rank (retrying until it
  // listens) and accepts each higher one, exchanging Hellos. Blocks until done, the waker fires
  // (ncclInternalError) or a peer fails (ncclRemoteError). ncclInvalidUsage when the name is in use
  // already or a peer disagrees about nranks. peers->at(r) is rank r's Hello (ours at our rank).
  static ncclResult_t Connect(const std::string& name, int rank, int nranks, const Hello& mine,
                              const Waker& waker, std::unique_ptr<Mesh>* mesh,
                              std::vector<Hello>* peers, std::string* error);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Shuts every connection down (peers see them close); any thread, any time.
  void Shutdown();

  struct Send {
    int peer;
    Header header;     // header.bytes of payload
    const void* data;  // must stay valid until Exchange returns
  };
  struct Expect {
    int peer;
    Header header;  // what must arrive (magic and kind included)
    void* dest;     // header.bytes are written here
    bool ack;       // answer with a kAck once the payload is in
  };
  // Sends every Send (in order per peer) and receives every Expect, progressing all peers
  // at once so that no pair waits on the other. Messages of one peer match the Expects of
  // that peer and kind in order. A kData that comes while this rank expects none of that
  // peer (its ncclRecv is in a later call, as when the peer's group sends and receives while
  // this rank's sends, computes, then receives: fine on a GPU) is kept, without its kAck,
  // for the first kData Expect of a later Exchange, and the peer is told (kEarly): two ranks
  // that each keep the other's kData while each waits for its own kAck both sent first,
  // which would hang on a GPU. Returns ncclSuccess; ncclInvalidUsage when a peer sends
  // what was not expected (the ranks called different operations: a GPU would hang);
  // ncclRemoteError when a needed connection closes; ncclInternalError when the waker (or
  // `also`) fires.
  ncclResult_t Exchange(std::vector<Send> sends, std::vector<Expect> expects, const Waker& waker,
                        std::string* error, const Waker* also = nullptr);

 private:
  explicit Mesh(int rank, int nranks) : rank_(rank), fds_(nranks, -1), early_(nranks) {}

  struct Early {
    Header header;
    std::vector<char> payload;
  };

  const int rank_;
  int listener_ = -1;
  std::vector<int> fds_;                  // by peer rank; -1 at our own
  std::vector<std::deque<Early>> early_;  // by peer: kData kept for a later Expect, in order
};

// "AllReduce of 7 float32 (sum)", for messages.
std::string Describe(const Header& header);

}  // namespace rm_emu::nccl

#endif  // RINGMASTER_TOOLS_CUDA_EMU_NCCL_MESH_H_
