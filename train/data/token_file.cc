#include "train/data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace ringmaster::train::data {
namespace {

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "token file ", path, ": ", what,
      "; it is not a token file in llm.c's format (make one with `ringctl data prepare`)"));
}

int32_t Int32At(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                              uint32_t{p[3]} << 24);
}

void PutInt32(int32_t v, char* out) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(u >> (8 * i));
}

// Reads up to `n` bytes; fewer only at the end of the file.
absl::StatusOr<size_t> ReadFully(int fd, const std::string& path, void* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = read(fd, static_cast<char*>(out) + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoToStatus(errno, absl::StrCat("reading token file ", path));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

// The file's contents after an open that must be closed.
absl::StatusOr<std::vector<uint16_t>> ReadOpen(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat of token file ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, " is not a regular file (a directory?)"));
  }
  unsigned char header[kTokenFileHeaderBytes];
  RM_ASSIGN_OR_RETURN(size_t got, ReadFully(fd, path, header, sizeof(header)));
  if (got < sizeof(header)) {
    return Corrupt(path, absl::StrCat("truncated: ", got, " bytes, shorter than the header of ",
                                      kTokenFileHeaderBytes, " bytes"));
  }
  const int32_t magic = Int32At(header);
  if (magic != kTokenFileMagic) {
    return Corrupt(path, absl::StrCat("bad magic ", magic, " (expected ", kTokenFileMagic, ")"));
  }
  const int32_t version = Int32At(header + 4);
  if (version != kTokenFileVersion) {
    return Corrupt(path, absl::StrCat("version ", version, ", but only version ", kTokenFileVersion,
                                      " (GPT-2's uint16 tokens) is read"));
  }
  const int32_t count = Int32At(header + 8);
  if (count < 0) return Corrupt(path, absl::StrCat("negative token count ", count));
  const int64_t data_bytes = static_cast<int64_t>(st.st_size) - kTokenFileHeaderBytes;
  const int64_t want = int64_t{count} * 2;
  if (data_bytes < want) {
    return Corrupt(path, absl::StrCat("truncated: the header says ", count, " tokens (", want,
                                      " bytes) but ", data_bytes, " bytes follow it"));
  }
  if (data_bytes > want) {
    return Corrupt(path, absl::StrCat(data_bytes - want, " bytes after the ", count,
                                      " tokens the header counts"));
  }
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  RM_ASSIGN_OR_RETURN(got, ReadFully(fd, path, tokens.data(), static_cast<size_t>(want)));
  if (static_cast<int64_t>(got) < want) {
    return Corrupt(path, absl::StrCat("truncated while reading: ", got, " of ", want,
                                      " token bytes (did the file change?)"));
  }
  // The ids are little-endian on disk.
  if constexpr (std::endian::native == std::endian::big) {
    for (uint16_t& t : tokens) t = static_cast<uint16_t>(t >> 8 | t << 8);
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening token file ", path));
  absl::StatusOr<std::vector<uint16_t>> tokens = ReadOpen(fd, path);
  close(fd);
  return tokens;
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) > kTokenFileMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": ", tokens.size(), " tokens, more than the ",
                     kTokenFileMaxTokens, " one file holds; split the input into several files"));
  }
  std::string bytes(kTokenFileHeaderBytes + 2 * tokens.size(), '\0');
  PutInt32(kTokenFileMagic, bytes.data());
  PutInt32(kTokenFileVersion, bytes.data() + 4);
  PutInt32(static_cast<int32_t>(tokens.size()), bytes.data() + 8);
  char* out = bytes.data() + kTokenFileHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t > 0xFFFF) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, ": token ", t, " at position ", i,
                       " does not fit in 16 bits (llm.c's GPT-2 format holds ids 0..65535)"));
    }
    *out++ = static_cast<char>(t & 0xFF);
    *out++ = static_cast<char>(t >> 8);
  }
  return WriteFileAtomically(path, bytes);
}

absl::Status CheckTokenVocabulary(const std::string& path, absl::Span<const uint16_t> tokens,
                                  int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, ": token ", tokens[i], " at position ", i,
          " is not below the model's vocabulary of ", vocab_size,
          "; prepare the file with the model's tokenizer (`ringctl data prepare --tokenizer`), "
          "or raise model.gpt.vocab"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::train::data
