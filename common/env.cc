#include "common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster {
namespace {

absl::Status PathError(absl::string_view op, const std::string& path) {
  return ErrnoToStatus(errno, absl::StrCat(op, " ", path));
}

constexpr uint64_t kDirectAlign = 4096;

bool Aligned(uint64_t v) { return v % kDirectAlign == 0; }

class PosixWritableFile final : public WritableFile {
 public:
  // `direct_fd` is -1, or the same file opened with O_DIRECT.
  PosixWritableFile(std::string path, int fd, int direct_fd)
      : path_(std::move(path)), fd_(fd), direct_fd_(direct_fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
    if (direct_fd_ >= 0) close(direct_fd_);
  }

  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    const bool direct = direct_fd_ >= 0 && Aligned(offset) && Aligned(data.size()) &&
                        Aligned(reinterpret_cast<uintptr_t>(data.data()));
    const int fd = direct ? direct_fd_ : fd_;
    while (!data.empty()) {
      ssize_t n = pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return PathError(absl::StrCat("pwrite at offset ", offset, " of"), path_);
      }
      if (direct && !Aligned(static_cast<uint64_t>(n))) {
        // A short direct write leaves an unaligned rest: finish it through the page cache.
        return PWrite(offset + static_cast<uint64_t>(n), data.substr(static_cast<size_t>(n)));
      }
      data.remove_prefix(static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status StartWriteback(uint64_t offset, uint64_t length) override {
    if (sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(length),
                        SYNC_FILE_RANGE_WRITE) != 0) {
      // Not every filesystem supports it; it is only a hint.
      if (errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) return absl::OkStatus();
      return PathError("sync_file_range", path_);
    }
    return absl::OkStatus();
  }

  // fdatasync works on the file, whichever descriptor: it covers the direct writes too
  // (their data may still sit in the device's volatile cache, and the file's size in the
  // journal).
  absl::Status Sync() override {
    if (fdatasync(fd_) != 0) return PathError("fdatasync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int direct = std::exchange(direct_fd_, -1);
    if (direct >= 0 && close(direct) != 0) {
      const int saved = errno;
      close(std::exchange(fd_, -1));
      errno = saved;
      return PathError("close", path_);
    }
    int fd = std::exchange(fd_, -1);
    if (fd >= 0 && close(fd) != 0) return PathError("close", path_);
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  int fd_;
  int direct_fd_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomAccessFile() override { close(fd_); }

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* scratch) const override {
    size_t done = 0;
    while (done < n) {
      ssize_t r = pread(fd_, scratch + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PathError(absl::StrCat("pread at offset ", offset + done, " of"), path_);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

  absl::StatusOr<uint64_t> Size() const override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return PathError("fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PathError("open for writing", path);
    int direct_fd = -1;
    if (options.direct_io) {
      direct_fd = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
      // EINVAL: this filesystem has no direct I/O (tmpfs); the page cache it is.
      if (direct_fd < 0 && errno != EINVAL) {
        const int saved = errno;
        close(fd);
        errno = saved;
        return PathError("open for direct writing", path);
      }
    }
    return std::make_unique<PosixWritableFile>(path, fd, direct_fd);
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PathError("open for reading", path);
    return std::make_unique<PosixRandomAccessFile>(path, fd);
  }

  absl::Status CreateDir(const std::string& path) override {
    if (mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
    if (errno == EEXIST && IsDirectory(path).ok()) return absl::OkStatus();
    return PathError("mkdir", path);
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return PathError("unlink", path);
    return absl::OkStatus();
  }

  absl::Status DeleteDir(const std::string& path) override {
    if (rmdir(path.c_str()) != 0) return PathError("rmdir", path);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PathError("open directory", path);
    absl::Status s;
    if (fsync(fd) != 0) s = PathError("fsync directory", path);
    close(fd);
    return s;
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return PathError("opendir", dir);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
    }
    absl::Status s = errno != 0 ? PathError("readdir", dir) : absl::OkStatus();
    closedir(d);
    if (!s.ok()) return s;
    return names;
  }

  absl::Status FileExists(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return PathError("stat", path);
    return absl::OkStatus();
  }

  absl::Status IsDirectory(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return PathError("stat", path);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();
  return env;
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  RM_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string contents(size, '\0');
  RM_ASSIGN_OR_RETURN(size_t n, file->PRead(0, size, contents.data()));
  contents.resize(n);
  return contents;
}

absl::Status WriteFileDurably(Env* env, const std::string& path, absl::string_view contents) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path, FileOptions()));
  RM_RETURN_IF_ERROR(file->PWrite(0, contents));
  RM_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::Status ReplaceFileDurably(Env* env, const std::string& path, const std::string& temp_path,
                                absl::string_view contents) {
  absl::Status s = WriteFileDurably(env, temp_path, contents);
  if (s.ok()) s = env->RenameFile(temp_path, path);
  if (!s.ok()) {
    env->DeleteFile(temp_path).IgnoreError();
    return s;
  }
  size_t slash = path.find_last_of('/');
  return env->SyncDir(slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash));
}

absl::Status DeleteRecursively(Env* env, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> children = env->GetChildren(dir);
  if (absl::IsNotFound(children.status())) return absl::OkStatus();
  RM_RETURN_IF_ERROR(children.status());
  for (const std::string& name : *children) {
    std::string path = JoinPath(dir, name);
    absl::Status s = env->IsDirectory(path);
    if (s.ok()) {
      RM_RETURN_IF_ERROR(DeleteRecursively(env, path));
    } else if (absl::IsFailedPrecondition(s)) {
      s = env->DeleteFile(path);
      if (!s.ok() && !absl::IsNotFound(s)) return s;
    } else if (!absl::IsNotFound(s)) {
      return s;
    }
  }
  absl::Status s = env->DeleteDir(dir);
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace ringmaster
