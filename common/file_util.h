// Small file helpers with the project's durability rule: a file appears whole or not at
// all (write a temporary file, optionally fsync it, rename it into place, then fsync the
// directory).
#ifndef RINGMASTER_COMMON_FILE_UTIL_H_
#define RINGMASTER_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

struct WriteFileOptions {
  // fsync the file before the rename and the directory after it, so the new contents
  // survive a machine crash. Off for ephemeral files (rendezvous keys).
  bool durable = true;
  int mode = 0644;
};

// Replaces `path` with `contents` atomically: readers see the old or the new file whole.
// Errors carry the errno's code and name the path and the failing step; the temporary
// file is removed on failure.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const WriteFileOptions& options = {});

// Reads a whole file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Reads a file that holds a secret (a token, a private key), refusing one that every user
// of the machine may read or write: FAILED_PRECONDITION naming the file, its mode and the
// chmod that fixes it. (Group access is allowed: a Kubernetes secret is mounted 0440.)
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_FILE_UTIL_H_
