// A server that speaks PyTorch 1.13's TCPStore wire protocol, so that a process other than
// rank 0's program can host a command job's rendezvous store (torchrun's
// TORCHELASTIC_USE_AGENT_STORE=True contract: every rank's init_process_group(init_method=
// "env://") is then a TCPStore *client* of MASTER_ADDR:MASTER_PORT, under a PrefixStore
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>").
//
// Wire protocol (torch/csrc/distributed/c10d/TCPStore.cpp, v1.13; native byte order, which is
// little-endian on every host we run on):
//   a request is one query byte followed by its arguments; a string or value is a uint64
//   length then that many bytes; an integer is an int64.
//     0 SET         key, value                    -> (no reply); wakes WAITs on key
//     1 COMPARE_SET key, expected, desired         -> value: the key's value after the call;
//                   a missing key is set only when expected is empty, else `expected` is
//                   echoed back (as 1.13 does)
//     2 GET         key                            -> value; a missing key is an error (1.13
//                   closes the connection too; its client always WAITs before it GETs)
//     3 ADD         key, int64 delta               -> int64 new value; the first ADD creates
//                   the key; the value is stored as its decimal text (so GET reads "3")
//     4 CHECK       uint64 n, n keys               -> uint8 READY(0) / NOT_READY(1)
//     5 WAIT        uint64 n, n keys               -> uint8 STOP_WAITING(0) once every key
//                   exists (the reply is held back until then; the client times out itself)
//     6 GETNUMKEYS                                 -> int64 number of keys
//     7 WATCH_KEY   key                            -> refused: logged, and the connection is
//                   closed (1.13 answers KEY_CALLBACK_REGISTERED and later pushes updates on
//                   that connection; init_process_group never uses it)
//     8 DELETE_KEY  key                            -> int64 number deleted (0 or 1)
//   Any other query byte, a string longer than Options::max_value_bytes, an ADD to a value that
//   is not a decimal integer, or a GET of a missing key: the error is logged naming the peer and
//   the query byte, and only that connection is closed; the store and other clients go on.
//
// How current PyTorch differs (not implemented): in later 2.x releases (about 2.2-2.3; the exact
// release was not checked) the client's first message is VALIDATE (query byte 0) followed by a uint32 magic number 0x3C85F7CE, and the query numbering
// is VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND,
// MULTI_GET, MULTI_SET, CANCEL_WAIT, PING (WATCH_KEY is gone), so every shared query's byte is
// one higher than 1.13's; WaitResponseType gained WAIT_CANCELED. From 2.0 until then 1.13's
// numbering was kept, with APPEND (9), MULTI_GET (10), MULTI_SET (11), CANCEL_WAIT (12) added
// after DELETE_KEY. This server reads a newer client's VALIDATE as a SET whose key length's low
// 32 bits are the magic, and refuses it with FAILED_PRECONDITION naming the client's version.
//
// What torch 1.13's init_process_group stores here (env://, agent store, seen in
// torch_store_torch_test): "init/" (its TCPStore's own ADD, outside the prefix) and keys
// "//worker/attempt_<N>/default_pg/..." (the PrefixStores' joins).
//
// Threads: one accept thread, and one thread per connection (requests on one connection are
// answered in order; a WAIT blocks only its own connection). All public methods are
// thread-safe. Stop() (also run by the destructor) closes every connection and joins every
// thread; it does not block on clients.
#ifndef RINGMASTER_WORKER_TORCH_STORE_H_
#define RINGMASTER_WORKER_TORCH_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster::worker {

// PyTorch 1.13's c10d::detail::QueryType.
enum class TorchStoreQuery : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};
inline constexpr uint8_t kTorchStoreReady = 0;          // CheckResponseType::READY
inline constexpr uint8_t kTorchStoreNotReady = 1;       // CheckResponseType::NOT_READY
inline constexpr uint8_t kTorchStoreStopWaiting = 0;    // WaitResponseType::STOP_WAITING

class TorchStoreServer {
 public:
  struct Options {
    // Address to listen on (an IPv4 or IPv6 literal, or a name getaddrinfo resolves).
    std::string host = "127.0.0.1";
    // 0: the kernel picks a free port; port() tells which.
    int port = 0;
    // Once a request's first byte has come, the rest of it must come within this (else the
    // connection is closed as stalled); between requests a connection may stay idle forever.
    absl::Duration message_timeout = absl::Seconds(30);
    // Writing a reply must finish within this.
    absl::Duration send_timeout = absl::Seconds(30);
    // A WAIT is answered at most this long after it came; then the connection is closed
    // (torch's own client gives up after its store timeout, 30 min by default).
    absl::Duration wait_timeout = absl::Hours(1);
    // A key or value longer than this is a bad request (it would be allocated first).
    uint64_t max_value_bytes = 64 << 20;
  };

  // Binds and listens, and starts the accept thread. INVALID_ARGUMENT for a bad host or port;
  // UNAVAILABLE when the address cannot be bound (e.g. the port is in use).
  static absl::StatusOr<std::unique_ptr<TorchStoreServer>> Start(const Options& options);

  ~TorchStoreServer();
  TorchStoreServer(const TorchStoreServer&) = delete;
  TorchStoreServer& operator=(const TorchStoreServer&) = delete;

  // The port actually listened on.
  int port() const { return port_; }

  // Closes the listening socket and every connection (a WAIT still pending gets no reply),
  // joins all threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The keys stored now, sorted (for tests and logs).
  std::vector<std::string> Keys() const ABSL_LOCKS_EXCLUDED(mu_);
  // Connections accepted so far.
  int64_t connections_accepted() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Connection;

  TorchStoreServer(const Options& options, int listen_fd, int port, int wake_read,
                   int wake_write);

  void AcceptLoop();
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_);
  void Serve(Connection* connection);
  // Reads and answers one request whose query byte is `query`.
  absl::Status HandleRequest(Connection& connection, uint8_t query);
  absl::Status HandleWait(Connection& connection);
  absl::StatusOr<std::string> ReadString(Connection& connection);
  absl::StatusOr<std::vector<std::string>> ReadKeys(Connection& connection);
  bool AllExist(const std::vector<std::string>& keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Options options_;
  const int listen_fd_;
  const int port_;
  const int wake_read_;   // the accept thread's poll() also watches this; Stop() writes to it
  const int wake_write_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  int64_t connections_accepted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_TORCH_STORE_H_
