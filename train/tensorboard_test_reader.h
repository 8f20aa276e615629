// A reader of TensorBoard event files for tests, written from the format's definition and
// independent of train/tensorboard_writer (its own bitwise CRC-32C): it checks every frame.
#ifndef RINGMASTER_TRAIN_TENSORBOARD_TEST_READER_H_
#define RINGMASTER_TRAIN_TENSORBOARD_TEST_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "train/tensorboard_event.pb.h"

namespace ringmaster::train {

// CRC-32C bit by bit (reflected polynomial 0x82F63B78, initial and final inversion), as
// RFC 3720 defines it.
uint32_t ReferenceCrc32c(absl::string_view data);

// TFRecord's mask of ReferenceCrc32c.
uint32_t ReferenceMasked(absl::string_view data);

// `bytes` (at most 8) as a little-endian number.
uint64_t ReadLittleEndian(absl::string_view bytes);

// A TFRecord file's Events, every frame and both CRCs checked: a failure is a gtest failure
// (the events read until then are returned).
std::vector<tensorboard::Event> ReadEvents(const std::string& path);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TENSORBOARD_TEST_READER_H_
