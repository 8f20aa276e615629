// The filesystem as a seam (leveldb's Env): code that must survive a full disk or a crash
// talks to files only through an Env, so tests can wrap the real one and inject failures
// (common/fault_injection_env.h) or kill the process between any two operations.
//
// Only what checkpoints need: positional writes and reads, fsync of files and directories,
// rename, mkdir, unlink, rmdir and listing. Paths are plain strings; nothing is relative to
// a working directory other than the process's.
//
// Errors carry the errno's code (common/status_macros.h: ENOENT NOT_FOUND, ENOSPC
// RESOURCE_EXHAUSTED, EACCES PERMISSION_DENIED, ...) and name the path and the operation.
//
// Thread-safety: Env::Default() and its methods may be called from any thread. A file
// object is used by one thread at a time; different files are independent.
#ifndef RINGMASTER_COMMON_ENV_H_
#define RINGMASTER_COMMON_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

// How a file is opened for writing.
struct FileOptions {
  // Bypass the page cache (O_DIRECT) for writes whose offset, length and buffer address
  // are multiples of 4096: the device reads the caller's memory itself, so a large write
  // costs no copy and no page-cache pressure. Other writes go through the page cache as
  // usual. Where the filesystem refuses O_DIRECT (tmpfs), every write goes through the page
  // cache. Durability is the same either way: it needs Sync.
  bool direct_io = false;
};

// A file open for writing at explicit offsets. The destructor closes it and ignores errors:
// call Close() to see them.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` at `offset` (retrying short writes). RESOURCE_EXHAUSTED when the
  // disk is full; the bytes before the failure may or may not have been written.
  virtual absl::Status PWrite(uint64_t offset, absl::string_view data) = 0;
  // A hint: start writing [offset, offset + length) back to the disk now, without waiting
  // (Linux sync_file_range), so a later Sync has less to do. Durability still needs Sync.
  virtual absl::Status StartWriteback(uint64_t offset, uint64_t length) = 0;
  // Makes the written data durable (fdatasync). Blocks until the device confirms.
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
  virtual const std::string& path() const = 0;
};

// A file open for reading at explicit offsets.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to `n` bytes at `offset` into `scratch`; returns how many were read, fewer
  // than `n` only at the end of the file.
  virtual absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* scratch) const = 0;
  virtual absl::StatusOr<uint64_t> Size() const = 0;
  virtual const std::string& path() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The POSIX filesystem. Never null, never destroyed.
  static Env* Default();

  // Creates `path` or truncates it to zero bytes, for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) = 0;
  // NOT_FOUND when `path` does not exist.
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;

  // Creates a directory; OK when it exists already (as a directory). The parent must exist.
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // Removes a file (NOT_FOUND when absent).
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Removes an empty directory (NOT_FOUND when absent).
  virtual absl::Status DeleteDir(const std::string& path) = 0;
  // rename(2): atomically replaces `to` (a file, or an empty directory) with `from`.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // fsync of a directory: makes the creations, renames and deletions in it durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // The names in a directory, without "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  // OK when `path` exists (file or directory), NOT_FOUND when it does not.
  virtual absl::Status FileExists(const std::string& path) = 0;
  // OK when `path` is a directory; NOT_FOUND when absent; FAILED_PRECONDITION otherwise.
  virtual absl::Status IsDirectory(const std::string& path) = 0;
};

// Forwards every call to another Env; fault-injecting Envs override a few methods.
class EnvWrapper : public Env {
 public:
  // `target` is not owned and must outlive the wrapper.
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override {
    return target_->NewWritableFile(path, options);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  absl::Status CreateDir(const std::string& path) override { return target_->CreateDir(path); }
  absl::Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  absl::Status DeleteDir(const std::string& path) override { return target_->DeleteDir(path); }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return target_->GetChildren(dir);
  }
  absl::Status FileExists(const std::string& path) override { return target_->FileExists(path); }
  absl::Status IsDirectory(const std::string& path) override { return target_->IsDirectory(path); }

 private:
  Env* const target_;
};

// "a/b" + "c" = "a/b/c".
std::string JoinPath(absl::string_view dir, absl::string_view name);

// The whole file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path);

// Writes `contents` to `path` and syncs it (no rename: for files inside a directory that
// is not visible yet).
absl::Status WriteFileDurably(Env* env, const std::string& path, absl::string_view contents);

// leveldb's SetCurrentFile: writes `contents` to `temp_path` (same directory), syncs it,
// renames it over `path` and syncs the directory. Readers see the old or the new file
// whole; after a crash, at worst `temp_path` is left behind. The temporary is removed on
// failure.
absl::Status ReplaceFileDurably(Env* env, const std::string& path, const std::string& temp_path,
                                absl::string_view contents);

// Removes a directory and everything below it (files and directories). OK when it does not
// exist. Not atomic: rename the directory out of view first if a partial removal must not
// be seen.
absl::Status DeleteRecursively(Env* env, const std::string& dir);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_ENV_H_
