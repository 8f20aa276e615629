// An Env for tests that sees every filesystem operation before it happens and may fail it,
// delay it, or end the process there (leveldb's db/fault_injection_test.cc, as a seam).
//
//   FaultInjectionEnv env(Env::Default(), [](const FileOp& op) {
//     if (op.kind == FileOp::Kind::kPWrite && op.index >= 40) return ENOSPC status;
//     return absl::OkStatus();
//   });
//
// Test-only (testonly target). Thread-safe: the hook may be called from several threads at
// once and must be thread-safe itself; `index` numbers the operations in the order the
// hook is called.
#ifndef RINGMASTER_COMMON_FAULT_INJECTION_ENV_H_
#define RINGMASTER_COMMON_FAULT_INJECTION_ENV_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"

namespace ringmaster {

struct FileOp {
  enum class Kind {
    kOpenWrite,
    kOpenRead,
    kPWrite,
    kStartWriteback,
    kSync,
    kClose,
    kPRead,
    kCreateDir,
    kDeleteFile,
    kDeleteDir,
    kRename,
    kSyncDir,
    kGetChildren,
    kExists,
  };
  Kind kind = Kind::kOpenWrite;
  std::string path;     // the file or directory (for a rename: the source)
  std::string to;       // kRename: the destination
  uint64_t offset = 0;  // kPWrite, kPRead, kStartWriteback
  uint64_t size = 0;    // bytes to write or read
  int64_t index = 0;    // operations hooked before this one
};

const char* FileOpKindName(FileOp::Kind kind);

// Called before each operation. A non-OK status fails the operation, which then does
// nothing. It may block (a slow disk) or kill the process (a crash at this point).
using FileOpHook = std::function<absl::Status(const FileOp& op)>;

class FaultInjectionEnv final : public EnvWrapper {
 public:
  // `target` is not owned. A null hook lets everything through (and counts).
  FaultInjectionEnv(Env* target, FileOpHook hook);

  // Operations hooked so far.
  int64_t operations() const { return next_index_.load(); }
  // Bytes passed to PWrite calls that the hook let through.
  uint64_t bytes_written() const { return bytes_written_.load(); }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status DeleteDir(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  absl::Status FileExists(const std::string& path) override;
  absl::Status IsDirectory(const std::string& path) override;

  // Runs the hook for `op` (filling in its index). For the file wrappers.
  absl::Status Check(FileOp op);
  void CountWritten(uint64_t bytes) { bytes_written_ += bytes; }

 private:
  // Runs the hook, then `call` when the hook lets the operation through.
  template <typename Call>
  auto Guarded(FileOp op, Call call) -> decltype(call()) {
    absl::Status s = Check(std::move(op));
    if (!s.ok()) return s;
    return call();
  }

  FileOpHook hook_;
  std::atomic<int64_t> next_index_{0};
  std::atomic<uint64_t> bytes_written_{0};
};

// A hook for a full disk: PWrite fails with ENOSPC's status (RESOURCE_EXHAUSTED) once
// `budget` bytes have been written through it, as the real filesystem would report it.
FileOpHook DiskFullAfter(uint64_t budget);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_FAULT_INJECTION_ENV_H_
