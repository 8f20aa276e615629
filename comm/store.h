// Store: the small key-value service through which ranks find each other (bootstrap).
// Ranks publish what their peers need (a TCP address, an NCCL unique id) under keys of a
// per-communicator prefix and wait for each other's keys.
//
// Implementations: FileStore (a directory every rank can reach; tests and one machine)
// here; the coordinator implements the same interface over gRPC.
//
// Thread-safety: implementations are safe to call from any thread.
#ifndef RINGMASTER_COMM_STORE_H_
#define RINGMASTER_COMM_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ringmaster::comm {

class Store {
 public:
  virtual ~Store() = default;

  // Publishes `value` under `key`, replacing any earlier value. Readers see either the old
  // or the new value whole, never a torn one.
  // Errors: INVALID_ARGUMENT for an empty key or one with characters other than
  // [A-Za-z0-9._/-]; UNAVAILABLE when the backing store cannot be reached.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Blocks until `key` exists or `deadline` passes, then returns its value.
  // Errors: DEADLINE_EXCEEDED naming the key; INVALID_ARGUMENT for a bad key.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) = 0;

  // Blocks until every key exists or `deadline` passes.
  // Errors: DEADLINE_EXCEEDED naming the keys still missing.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline) = 0;

  // Atomically adds `delta` to the integer stored under `key` (0 when absent) and returns
  // the new value. Used for counters such as "how many ranks have arrived".
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
};

// Checks a key's syntax; INVALID_ARGUMENT names the key and the allowed characters.
absl::Status ValidateStoreKey(absl::string_view key);

struct FileStoreOptions {
  // Directory shared by every rank. Created (with parents) when missing.
  std::string directory;
  // How often Get/Wait look for a missing key; grows from `poll_min` to `poll_max`.
  absl::Duration poll_min = absl::Microseconds(200);
  absl::Duration poll_max = absl::Milliseconds(20);
};

// A Store whose keys are files under a directory. Set writes a temporary file and renames
// it into place, so a value appears whole. Works across processes on one machine, and
// across machines on a shared filesystem with close-to-open consistency (NFS).
class FileStore final : public Store {
 public:
  // Errors: INVALID_ARGUMENT for an empty directory; the errno of a failed mkdir.
  static absl::StatusOr<std::unique_ptr<FileStore>> Create(const FileStoreOptions& options);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

  const std::string& directory() const { return options_.directory; }

 private:
  explicit FileStore(FileStoreOptions options) : options_(std::move(options)) {}
  std::string PathOf(absl::string_view key) const;
  // Reads the key's file: NOT_FOUND when absent.
  absl::StatusOr<std::string> TryGet(absl::string_view key) const;

  const FileStoreOptions options_;
};

}  // namespace ringmaster::comm

#endif  // RINGMASTER_COMM_STORE_H_
