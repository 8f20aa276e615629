#include "kernels/embedding_index.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringmaster::kernels {

int64_t EmbeddingIndexInts(int64_t batch, int64_t seq_len) {
  return 3 * batch * seq_len + 1;  // at most B T groups: tokens, starts + 1, positions
}

absl::StatusOr<EmbeddingIndex> IndexTokens(const int32_t* tokens, int64_t batch, int64_t seq_len,
                                           int64_t vocab) {
  auto invalid = [](const auto&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("IndexTokens: ", parts...));
  };
  if (batch < 1) return invalid("batch must be >= 1, got ", batch);
  if (seq_len < 1) return invalid("seq_len must be >= 1, got ", seq_len);
  if (vocab < 1) return invalid("vocab must be >= 1, got ", vocab);
  if (batch > std::numeric_limits<int32_t>::max() / seq_len) {
    return invalid("batch x seq_len must be below 2^31, got ", batch, " x ", seq_len);
  }
  if (tokens == nullptr) return invalid("tokens is null");
  const int64_t n = batch * seq_len;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return invalid("token id ", tokens[i], " at batch row ", i / seq_len, ", position ",
                     i % seq_len, " is outside [0, ", vocab, ")");
    }
  }
  // Positions sorted by token, stably: each token's positions stay ascending.
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
  std::stable_sort(positions.begin(), positions.end(),
                   [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  std::vector<int32_t> group_tokens, starts;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || tokens[positions[i]] != tokens[positions[i - 1]]) {
      group_tokens.push_back(tokens[positions[i]]);
      starts.push_back(static_cast<int32_t>(i));
    }
  }
  starts.push_back(static_cast<int32_t>(n));
  EmbeddingIndex index;
  index.groups = static_cast<int64_t>(group_tokens.size());
  index.ints.reserve(2 * index.groups + 1 + n);
  index.ints.insert(index.ints.end(), group_tokens.begin(), group_tokens.end());
  index.ints.insert(index.ints.end(), starts.begin(), starts.end());
  index.ints.insert(index.ints.end(), positions.begin(), positions.end());
  return index;
}

}  // namespace ringmaster::kernels
