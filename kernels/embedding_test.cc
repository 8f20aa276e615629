#include "kernels/embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace ringmaster::kernels {
namespace {

using testing::FiniteDifference;
using testing::GradientMatches;
using testing::RandomFloats;
using testing::WeightedSum;

constexpr int64_t kBatch = 2, kSeq = 5, kChannels = 12, kVocab = 7, kMaxSeq = 8;
// Token 3 appears four times (twice at the same position t = 1), token 6 never.
constexpr int32_t kTokens[] = {3, 3, 0, 5, 3,  //
                               1, 3, 0, 2, 4};

TEST(Embedding, ForwardAddsTokenAndPositionRows) {
  const std::vector<float> wte = RandomFloats(kVocab * kChannels, 41);
  const std::vector<float> wpe = RandomFloats(kMaxSeq * kChannels, 42);
  std::vector<float> out(kBatch * kSeq * kChannels);
  EmbeddingForward(out.data(), kTokens, wte.data(), wpe.data(), kBatch, kSeq, kChannels, kVocab);
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t < kSeq; ++t) {
      const int32_t id = kTokens[b * kSeq + t];
      for (int64_t c = 0; c < kChannels; ++c) {
        EXPECT_EQ(out[(b * kSeq + t) * kChannels + c],
                  wte[id * kChannels + c] + wpe[t * kChannels + c]);
      }
    }
  }
}

TEST(Embedding, BackwardScatterAddsRepeatedTokens) {
  const std::vector<float> dout = RandomFloats(kBatch * kSeq * kChannels, 43);
  // Existing gradient, to be added to.
  const std::vector<float> dwte0 = RandomFloats(kVocab * kChannels, 44);
  const std::vector<float> dwpe0 = RandomFloats(kMaxSeq * kChannels, 45);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), kTokens, kBatch, kSeq, kChannels,
                    kVocab);
  // Oracle: for every table row, gather the positions that read it.
  for (int32_t v = 0; v < kVocab; ++v) {
    for (int64_t c = 0; c < kChannels; ++c) {
      double want = dwte0[v * kChannels + c];
      for (int64_t bt = 0; bt < kBatch * kSeq; ++bt) {
        if (kTokens[bt] == v) want += dout[bt * kChannels + c];
      }
      EXPECT_NEAR(dwte[v * kChannels + c], want, 1e-6) << "token " << v << " channel " << c;
    }
  }
  for (int64_t t = 0; t < kMaxSeq; ++t) {
    for (int64_t c = 0; c < kChannels; ++c) {
      double want = dwpe0[t * kChannels + c];  // rows t >= kSeq stay as they were
      for (int64_t b = 0; b < kBatch && t < kSeq; ++b) want += dout[(b * kSeq + t) * kChannels + c];
      EXPECT_NEAR(dwpe[t * kChannels + c], want, 1e-6) << "position " << t << " channel " << c;
    }
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  std::vector<float> wte = RandomFloats(kVocab * kChannels, 46);
  std::vector<float> wpe = RandomFloats(kMaxSeq * kChannels, 47);
  const std::vector<float> w = RandomFloats(kBatch * kSeq * kChannels, 48);
  std::vector<float> out(w.size());
  auto loss = [&] {
    EmbeddingForward(out.data(), kTokens, wte.data(), wpe.data(), kBatch, kSeq, kChannels, kVocab);
    return WeightedSum(w, out.data());
  };
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  EmbeddingBackward(dwte.data(), dwpe.data(), w.data(), kTokens, kBatch, kSeq, kChannels, kVocab);
  EXPECT_TRUE(GradientMatches(loss, wte, dwte, FiniteDifference{}, "dwte"));
  EXPECT_TRUE(GradientMatches(loss, wpe, dwpe, FiniteDifference{}, "dwpe"));
}

TEST(EmbeddingDeathTest, TokenOutsideVocabulary) {
  const std::vector<float> wte(kVocab * kChannels), wpe(kMaxSeq * kChannels);
  std::vector<float> out(kChannels);
  const int32_t bad = kVocab;
  EXPECT_DEATH(EmbeddingForward(out.data(), &bad, wte.data(), wpe.data(), 1, 1, kChannels, kVocab),
               "outside vocabulary");
}

}  // namespace
}  // namespace ringmaster::kernels
