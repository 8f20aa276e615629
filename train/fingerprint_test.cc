#include "train/fingerprint.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::train {
namespace {

TEST(CompareFingerprints, NamesTheFirstTensorThatDiffers) {
  state::TensorTable table;
  table.Add("fc1.weight", {3});
  table.Add("fc1.bias", {2});
  // 3 ranks x (2 tensors + loss).
  std::vector<uint64_t> all = {1, 2, 9, 1, 2, 9, 1, 2, 9};
  EXPECT_TRUE(CompareFingerprints(table, all, 3, 10).ok());
  all[7] = 5;  // rank 2's fc1.bias
  absl::Status s = CompareFingerprints(table, all, 3, 10);
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_NE(s.message().find("fc1.bias differs between rank 0 and rank 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("step 10"), std::string::npos) << s;
  all[7] = 2;
  all[5] = 8;  // rank 1's loss
  EXPECT_NE(CompareFingerprints(table, all, 3, 4).message().find("the training loss"),
            std::string::npos);
}

TEST(TensorHashes, ChangeWithAnyTensor) {
  state::TensorTable table;
  table.Add("a", {3});
  table.Add("b", {2, 2});
  state::FlatBuffer p(table.total_elements());
  auto before = TensorHashes(table, p.data());
  p.data()[table.tensor(1).offset + 3] = 1e-30f;
  auto after = TensorHashes(table, p.data());
  EXPECT_EQ(before[0], after[0]);
  EXPECT_NE(before[1], after[1]);
}

}  // namespace
}  // namespace ringmaster::train
