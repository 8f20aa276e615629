#include "train/tensorboard_test_reader.h"

#include "common/file_util.h"
#include "gtest/gtest.h"

namespace ringmaster::train {

using tensorboard::Event;

uint32_t ReferenceCrc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t ReferenceMasked(absl::string_view data) {
  const uint32_t crc = ReferenceCrc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t ReadLittleEndian(absl::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

std::vector<Event> ReadEvents(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<Event> events;
  absl::string_view left;
  if (text.ok()) left = *text;
  while (!left.empty()) {
    if (left.size() < 12) {
      ADD_FAILURE() << path << ": " << left.size() << " bytes left, less than a header";
      break;
    }
    const uint64_t length = ReadLittleEndian(left.substr(0, 8));
    EXPECT_EQ(ReadLittleEndian(left.substr(8, 4)), ReferenceMasked(left.substr(0, 8)));
    if (left.size() < 12 + length + 4) {
      ADD_FAILURE() << path << ": a record of " << length << " bytes is cut short";
      break;
    }
    const absl::string_view data = left.substr(12, length);
    EXPECT_EQ(ReadLittleEndian(left.substr(12 + length, 4)), ReferenceMasked(data));
    Event event;
    EXPECT_TRUE(event.ParseFromArray(data.data(), static_cast<int>(data.size())));
    events.push_back(event);
    left.remove_prefix(12 + length + 4);
  }
  return events;
}

}  // namespace ringmaster::train
