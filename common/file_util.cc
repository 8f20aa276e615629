#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace ringmaster {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const WriteFileOptions& options) {
  if (path.empty()) return absl::InvalidArgumentError("WriteFileAtomically: path is empty");
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter++);
  auto fail = [&](absl::string_view what) {
    return ErrnoToStatus(errno, absl::StrCat("writing ", path, ": ", what));
  };
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, options.mode);
  if (fd < 0) return fail(absl::StrCat("open ", tmp));
  absl::Status s;
  for (size_t done = 0; s.ok() && done < contents.size();) {
    ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      s = fail(absl::StrCat("write ", tmp));
    }
  }
  if (s.ok() && options.durable && fsync(fd) != 0) s = fail(absl::StrCat("fsync ", tmp));
  if (close(fd) != 0 && s.ok()) s = fail(absl::StrCat("close ", tmp));
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = fail(absl::StrCat("rename ", tmp));
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  if (options.durable) {
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return fail(absl::StrCat("open directory ", dir));
    if (fsync(dfd) != 0) s = fail(absl::StrCat("fsync directory ", dir));
    close(dfd);
  }
  return s;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("read ", path));
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if ((st.st_mode & 0007) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " holds a secret but other users of this machine can access it (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), "); run: chmod 600 ", path));
  }
  return ReadFile(path);
}

}  // namespace ringmaster
