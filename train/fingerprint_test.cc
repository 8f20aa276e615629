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

TEST(CompareGroupFingerprints, ComparesTheGroupsTensorsAndNamesTheJobsRanks) {
  state::TensorTable table;
  table.Add("h0.attn.qkv.weight", {3});
  table.Add("h0.ln1.weight", {2});
  // 2 ranks x (tensor 1 only + loss): the group's ranks are 1 and 3 of the job.
  const FingerprintGroup group{{1}, {1, 3}, "the tensor-parallel group of stage 0"};
  std::vector<uint64_t> all = {7, 9, 7, 9};
  EXPECT_TRUE(CompareGroupFingerprints(table, all, 2, 3, group).ok());
  all[2] = 8;
  const absl::Status s = CompareGroupFingerprints(table, all, 2, 3, group);
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_NE(s.message().find("h0.ln1.weight differs between rank 1 and rank 3 (the "
                             "tensor-parallel group of stage 0)"),
            std::string::npos)
      << s;
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
