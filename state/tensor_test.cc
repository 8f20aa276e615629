#include "state/tensor.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace ringmaster::state {
namespace {

TEST(TensorTableTest, AlignsOffsetsAndCountsParameters) {
  TensorTable table;
  EXPECT_EQ(table.Add("w", {3, 5}), 0);
  EXPECT_EQ(table.Add("b", {5}), 1);
  EXPECT_EQ(table.Add("x", {16}), 2);
  EXPECT_EQ(table.tensor(0).offset, 0);
  EXPECT_EQ(table.tensor(1).offset, 16);
  EXPECT_EQ(table.tensor(2).offset, 32);
  EXPECT_EQ(table.total_elements(), 48);
  EXPECT_EQ(table.parameter_count(), 15 + 5 + 16);
  EXPECT_EQ(*table.Find("b"), 1);
  EXPECT_EQ(table.Find("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ShapeString(table.tensor(0).shape), "[3, 5]");
}

TEST(FlatBufferTest, ZeroedAndAligned) {
  FlatBuffer buffer(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 64, 0u);
  for (float v : buffer.span()) EXPECT_EQ(v, 0.0f);
  TensorSpec t{"t", {4}, 16, 4};
  buffer.tensor(t)[3] = 2.0f;
  EXPECT_EQ(buffer.data()[19], 2.0f);
  buffer.Zero();
  EXPECT_EQ(buffer.data()[19], 0.0f);
  FlatBuffer empty(0);
  EXPECT_EQ(empty.size(), 0);
}

}  // namespace
}  // namespace ringmaster::state
