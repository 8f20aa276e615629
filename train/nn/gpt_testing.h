// Test helpers for the GPT models.
#ifndef RINGMASTER_TRAIN_NN_GPT_TESTING_H_
#define RINGMASTER_TRAIN_NN_GPT_TESTING_H_

#include <cstdint>

#include "train/batch.h"
#include "train/nn/gpt.h"
#include "train/nn/random.h"

namespace ringmaster::train::nn {

// n samples of context + 1 token ids drawn uniformly from the vocabulary.
inline Batch RandomTokens(int64_t n, const GptOptions& options, uint64_t seed) {
  Batch b;
  b.size = n;
  b.context = options.context;
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < n * (options.context + 1); ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.Next() % options.vocab));
  }
  return b;
}

}  // namespace ringmaster::train::nn

#endif  // RINGMASTER_TRAIN_NN_GPT_TESTING_H_
