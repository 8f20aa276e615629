#include "train/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "isa-l/crc.h"
#include "train/tensorboard_event.pb.h"

namespace ringmaster::train {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";

// `value`'s low `bytes` bytes, least significant first.
std::string LittleEndian(uint64_t value, int bytes) {
  std::string out(bytes, '\0');
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  // ISA-L's crc32_iscsi is CRC-32C without the final inversion; it takes int lengths.
  uint32_t crc = 0xFFFFFFFFu;
  while (!data.empty()) {
    const size_t n = std::min<size_t>(data.size(), INT_MAX);
    crc = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data.data())),
                      static_cast<int>(n), crc);
    data.remove_prefix(n);
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(absl::string_view data) {
  const std::string length = LittleEndian(data.size(), 8);
  return absl::StrCat(length, LittleEndian(MaskedCrc32c(length), 4), data,
                      LittleEndian(MaskedCrc32c(data), 4));
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const TensorBoardWriterOptions& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("metrics.tensorboard: the directory is empty");
  }
  std::error_code error;
  std::filesystem::create_directories(options.dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "metrics.tensorboard: cannot create the directory ", options.dir, ": ", error.message()));
  }
  const std::string base =
      absl::StrCat(options.dir, "/events.out.tfevents.", absl::ToUnixSeconds(options.start), ".",
                   HostName(), ".", getpid());
  std::string path = base;
  int fd = -1;
  for (int n = 1; fd < 0; ++n) {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || n > 1000)) {
      return absl::FailedPreconditionError(absl::StrCat("metrics.tensorboard: cannot create ",
                                                        path, ": ", std::strerror(errno)));
    }
    if (fd < 0) path = absl::StrCat(base, ".", n);
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(fd, path));
  tensorboard::Event version;
  version.set_wall_time(absl::ToDoubleSeconds(options.start - absl::UnixEpoch()));
  version.set_file_version(kFileVersion);
  if (absl::Status s = writer->Append(version.SerializeAsString()); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { close(fd_); }

absl::Status TensorBoardWriter::WriteScalars(
    int64_t step, absl::Time wall_time,
    const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(absl::ToDoubleSeconds(wall_time - absl::UnixEpoch()));
  event.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return Append(event.SerializeAsString());
}

absl::Status TensorBoardWriter::Append(const std::string& record_data) {
  const std::string record = TfRecord(record_data);
  absl::string_view left = record;
  while (!left.empty()) {
    const ssize_t n = write(fd_, left.data(), left.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("metrics.tensorboard: write ", path_));
    left.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::train
