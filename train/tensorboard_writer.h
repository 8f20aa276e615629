// TensorBoard event files (metrics.tensorboard: DIR): scalar curves a TensorBoard pointed at
// DIR shows, written the way TensorFlow's summary writer writes them.
//
// A file is DIR/events.out.tfevents.<unix seconds>.<host>.<pid> (with ".<n>" added should
// that name exist: a second writer in the same process and second), a sequence of TFRecords
// (little-endian uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of
// the data), each record an Event (train/tensorboard_event.proto): first one with
// file_version "brain.Event:2", then one per WriteScalars with a Summary of simple values.
// A new writer (a resumed run) starts a new file: TensorBoard reads every file of DIR.
// Each record is written with one write(2) as it comes, so a running job can be watched
// (the kernel's page cache; no fsync).
//
// Thread-safety: a writer is used from one thread at a time; the free functions are pure.
#ifndef RINGMASTER_TRAIN_TENSORBOARD_WRITER_H_
#define RINGMASTER_TRAIN_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ringmaster::train {

struct TensorBoardWriterOptions {
  std::string dir;  // created (with its parents) when missing
  // The file's time: in its name (whole seconds) and its first record's wall_time.
  absl::Time start = absl::UnixEpoch();
};

class TensorBoardWriter {
 public:
  // Creates the directory and a new events file holding the file_version record.
  // FAILED_PRECONDITION naming the directory or file (and the errno's reason) when either
  // cannot be made or written; INVALID_ARGUMENT for an empty dir.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(
      const TensorBoardWriterOptions& options);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` and `wall_time` with a simple value (a float) per (tag, value), in
  // order. Errors: the errno's status naming the file (RESOURCE_EXHAUSTED for a full disk);
  // a record cut short by a failed write is not repaired (TensorBoard stops reading there).
  absl::Status WriteScalars(int64_t step, absl::Time wall_time,
                            const std::vector<std::pair<std::string, double>>& scalars);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status Append(const std::string& record_data);

  const int fd_;
  const std::string path_;
};

// CRC-32C (Castagnoli, as iSCSI and TFRecord use it) of `data`; "123456789" -> 0xE3069283.
uint32_t Crc32c(absl::string_view data);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
uint32_t MaskedCrc32c(absl::string_view data);

// `data` framed as one TFRecord.
std::string TfRecord(absl::string_view data);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TENSORBOARD_WRITER_H_
