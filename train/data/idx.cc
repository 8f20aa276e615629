#include "train/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::train::data {
namespace {

// zlib's internal buffer: large reads of a 26 MB file want more than the 8 KiB default.
constexpr unsigned kGzBufferBytes = 1u << 20;
// The data is read in chunks and the array grows as they arrive, so a header that claims
// more data than the file holds costs at most one chunk of memory beyond the real size.
constexpr size_t kReadChunkBytes = size_t{1} << 26;
// Arrays larger than this are refused as corrupt rather than attempted (1 TiB).
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 40;

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("IDX file ", path, ": ", what));
}

// A gzip (or plain) file open for reading. Not copyable; closes on destruction.
class GzReader {
 public:
  static absl::StatusOr<std::unique_ptr<GzReader>> Open(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening IDX file ", path));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("stat of IDX file ", path));
      close(fd);
      return s;
    }
    if (!S_ISREG(st.st_mode)) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("IDX file ", path, " is not a regular file (a directory?)"));
    }
    gzFile file = gzdopen(fd, "rb");
    if (file == nullptr) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("zlib could not allocate a reader for IDX file ", path));
    }
    gzbuffer(file, kGzBufferBytes);
    return std::unique_ptr<GzReader>(new GzReader(path, file));
  }

  ~GzReader() {
    if (file_ != nullptr) gzclose_r(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `n` bytes into `out`; fewer only at the end of the data. A stream that
  // ends inside a gzip member is reported by `truncated_stream()`, not as an error.
  absl::StatusOr<size_t> Read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      unsigned want = static_cast<unsigned>(std::min(n - done, kReadChunkBytes));
      int got = gzread(file_, static_cast<char*>(out) + done, want);
      if (got < 0) return Error();
      done += static_cast<size_t>(got);
      if (static_cast<unsigned>(got) < want) break;
    }
    return done;
  }

  // True when the last read stopped because the compressed stream ended early.
  bool truncated_stream() {
    int errnum = Z_OK;
    gzerror(file_, &errnum);
    return errnum == Z_BUF_ERROR;
  }

  // Closes the file; reports a CRC or length mismatch in the gzip trailer.
  absl::Status Close() {
    int rc = gzclose_r(file_);
    file_ = nullptr;
    if (rc == Z_OK) return absl::OkStatus();
    if (rc == Z_ERRNO) return ErrnoToStatus(errno, absl::StrCat("closing IDX file ", path_));
    return Corrupt(path_, absl::StrCat("gzip stream is corrupt (zlib error ", rc, ")"));
  }

 private:
  GzReader(std::string path, gzFile file) : path_(std::move(path)), file_(file) {}

  absl::Status Error() {
    const int saved_errno = errno;
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    switch (errnum) {
      case Z_ERRNO:
        return ErrnoToStatus(saved_errno, absl::StrCat("reading IDX file ", path_));
      case Z_MEM_ERROR:
        return absl::ResourceExhaustedError(
            absl::StrCat("out of memory decompressing IDX file ", path_));
      default: {  // Z_DATA_ERROR (bad CRC, bad deflate data), Z_BUF_ERROR, Z_STREAM_ERROR
        // zlib prefixes its message with "<fd:N>: " for a gzdopen'ed file; the path says more.
        absl::string_view text = message;
        if (absl::StartsWith(text, "<fd:"))
          text.remove_prefix(std::min(text.find(": ") + 2, text.size()));
        return Corrupt(path_, absl::StrCat("corrupt gzip data: ", text));
      }
    }
  }

  const std::string path_;
  gzFile file_;
};

// Reads exactly `n` bytes of the header; DATA_LOSS naming `what` when the file ends first.
absl::Status ReadHeader(GzReader& in, const std::string& path, uint8_t* out, size_t n,
                        absl::string_view what) {
  RM_ASSIGN_OR_RETURN(size_t got, in.Read(out, n));
  if (got < n) {
    return Corrupt(path, absl::StrCat("ends inside the ", what, " (", got, " of ", n,
                                      " bytes); the file is truncated or not an IDX file"));
  }
  return absl::OkStatus();
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_rank) {
  CHECK(expected_rank >= 1 && expected_rank <= 255) << "expected_rank " << expected_rank;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GzReader> in, GzReader::Open(path));

  uint8_t magic[4];
  RM_RETURN_IF_ERROR(ReadHeader(*in, path, magic, sizeof(magic), "magic number"));
  const uint32_t magic_value = BigEndian32(magic);
  const uint32_t want_magic = (uint32_t{kIdxTypeUnsignedByte} << 8) | expected_rank;
  if (magic[0] != 0 || magic[1] != 0) {
    return Corrupt(path, absl::StrFormat("not an IDX file: magic number 0x%08x, expected 0x%08x",
                                         magic_value, want_magic));
  }
  if (magic[2] != kIdxTypeUnsignedByte) {
    return Corrupt(path, absl::StrFormat("element type 0x%02x is not supported (only 0x08, "
                                         "unsigned byte); magic 0x%08x, expected 0x%08x",
                                         magic[2], magic_value, want_magic));
  }
  if (magic[3] != expected_rank) {
    return Corrupt(path, absl::StrFormat("has rank %d, expected %d (magic 0x%08x, expected 0x%08x)",
                                         magic[3], expected_rank, magic_value, want_magic));
  }

  std::vector<uint8_t> dim_bytes(4 * static_cast<size_t>(expected_rank));
  RM_RETURN_IF_ERROR(ReadHeader(*in, path, dim_bytes.data(), dim_bytes.size(), "dimensions"));
  IdxArray array;
  uint64_t total = 1;
  for (int i = 0; i < expected_rank; ++i) {
    const uint32_t dim = BigEndian32(&dim_bytes[4 * static_cast<size_t>(i)]);
    array.dims.push_back(dim);
    total = (dim != 0 && total > kMaxDataBytes / dim) ? kMaxDataBytes + 1 : total * dim;
  }
  const std::string shape = absl::StrCat("[", absl::StrJoin(array.dims, ", "), "]");
  if (total > kMaxDataBytes) {
    return Corrupt(path, absl::StrCat("dimensions ", shape, " exceed ", kMaxDataBytes,
                                      " bytes; the header is corrupt"));
  }

  // Grow the array chunk by chunk (see kReadChunkBytes).
  size_t got = 0;
  while (got < total) {
    const size_t want = std::min<size_t>(total - got, kReadChunkBytes);
    array.data.resize(got + want);
    RM_ASSIGN_OR_RETURN(size_t n, in->Read(array.data.data() + got, want));
    got += n;
    if (n < want) break;
  }
  if (got < total) {
    return Corrupt(path,
                   absl::StrCat("truncated: dimensions ", shape, " need ", total,
                                " data bytes but the file holds only ", got,
                                in->truncated_stream() ? " (the gzip stream ends early)" : ""));
  }
  // Reading past the data also makes zlib check the gzip trailer's CRC and length.
  uint8_t extra[4096];
  RM_ASSIGN_OR_RETURN(size_t trailing, in->Read(extra, sizeof(extra)));
  if (trailing > 0) {
    return Corrupt(path, absl::StrCat("has trailing bytes after the ", total, " data bytes that ",
                                      "dimensions ", shape, " need"));
  }
  if (in->truncated_stream()) {
    return Corrupt(path, "the gzip stream ends before its trailer (truncated file)");
  }
  RM_RETURN_IF_ERROR(in->Close());
  return array;
}

}  // namespace ringmaster::train::data
