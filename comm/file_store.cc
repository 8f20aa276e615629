#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/store.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace ringmaster::comm {
namespace {

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) RM_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStoreKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("store key \"", key, "\" has a character outside [A-Za-z0-9._/-]"));
    }
  }
  if (key.front() == '/' || key.back() == '/' || key.find("//") != absl::string_view::npos ||
      key.find("..") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key \"", key, "\" must not start or end with '/', nor contain '//' or '..'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Create(const FileStoreOptions& options) {
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("FileStoreOptions.directory is empty");
  }
  if (options.poll_min <= absl::ZeroDuration() || options.poll_max < options.poll_min) {
    return absl::InvalidArgumentError(
        "FileStoreOptions: poll_min must be > 0 and poll_max >= poll_min");
  }
  RM_RETURN_IF_ERROR(MakeDirs(options.directory));
  return std::unique_ptr<FileStore>(new FileStore(options));
}

std::string FileStore::PathOf(absl::string_view key) const {
  return absl::StrCat(options_.directory, "/", key, ".value");
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  RM_RETURN_IF_ERROR(ValidateStoreKey(key));
  std::string path = PathOf(key);
  RM_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.find_last_of('/'))));
  return WriteFileAtomically(path, value, {.durable = false});
}

absl::StatusOr<std::string> FileStore::TryGet(absl::string_view key) const {
  return ReadFile(PathOf(key));
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Time deadline) {
  RM_RETURN_IF_ERROR(ValidateStoreKey(key));
  absl::Duration backoff = options_.poll_min;
  while (true) {
    auto value = TryGet(key);
    if (value.ok() || !absl::IsNotFound(value.status())) return value;
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store key \"", key, "\" did not appear in ",
                                                      options_.directory, " before the deadline"));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, options_.poll_max);
  }
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Time deadline) {
  for (const std::string& key : keys) RM_RETURN_IF_ERROR(ValidateStoreKey(key));
  absl::Duration backoff = options_.poll_min;
  while (true) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (access(PathOf(key).c_str(), F_OK) != 0) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store keys still missing in ", options_.directory,
                       " at the deadline: ", absl::StrJoin(missing, ", ")));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, options_.poll_max);
  }
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  RM_RETURN_IF_ERROR(ValidateStoreKey(key));
  std::string path = PathOf(key);
  RM_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.find_last_of('/'))));
  // One lock file per key serialises read-modify-write across processes.
  std::string lock_path = path + ".lock";
  int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", lock_path));
  if (flock(lock_fd, LOCK_EX) != 0) {
    absl::Status s = ErrnoToStatus(errno, absl::StrCat("flock ", lock_path));
    close(lock_fd);
    return s;
  }
  int64_t value = 0;
  auto current = TryGet(key);
  absl::Status s;
  if (current.ok()) {
    if (!absl::SimpleAtoi(*current, &value)) {
      s = absl::FailedPreconditionError(absl::StrCat("store key \"", key, "\" holds \"", *current,
                                                     "\", not an integer; Add needs one"));
    }
  } else if (!absl::IsNotFound(current.status())) {
    s = current.status();
  }
  if (s.ok()) {
    value += delta;
    s = Set(key, absl::StrCat(value));
  }
  flock(lock_fd, LOCK_UN);
  close(lock_fd);
  if (!s.ok()) return s;
  return value;
}

}  // namespace ringmaster::comm
