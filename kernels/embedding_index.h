// The positions of each distinct token of a batch, in ascending order: what the CUDA
// embedding backward (kernels/cuda/embedding.h) needs to add each token's gradients in the
// CPU's order without atomics. Built on the host, where the data loader's tokens are, and
// copied to the device with them; plain C++ (no CUDA), so it is tested in every build.
#ifndef RINGMASTER_KERNELS_EMBEDDING_INDEX_H_
#define RINGMASTER_KERNELS_EMBEDDING_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster::kernels {

// For G = groups (distinct tokens, ascending), ints holds [0, G) the tokens, [G, 2G + 1) the
// start of each token's positions in the last part (the last start is B T), and
// [2G + 1, 2G + 1 + B T) the positions b T + t, ascending within each token.
struct EmbeddingIndex {
  int64_t groups = 0;
  std::vector<int32_t> ints;
};

// The most ints an index of a [batch, seq_len] batch holds (3 B T + 1).
int64_t EmbeddingIndexInts(int64_t batch, int64_t seq_len);

// tokens [batch, seq_len] on the host. INVALID_ARGUMENT for a size below 1, B T of 2^31 or
// more, or a token id outside [0, vocab) (the first, with its batch row and position).
absl::StatusOr<EmbeddingIndex> IndexTokens(const int32_t* tokens, int64_t batch, int64_t seq_len,
                                           int64_t vocab);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_EMBEDDING_INDEX_H_
