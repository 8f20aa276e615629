#include "kernels/embedding.h"

#include "glog/logging.h"

namespace ringmaster::kernels {
namespace {

// Offset of token's row in a [vocab, channels] table.
int64_t TokenRow(int32_t token, int64_t channels, int64_t vocab) {
  CHECK(token >= 0 && token < vocab) << "token id " << token << " outside vocabulary of " << vocab;
  return token * channels;
}

}  // namespace

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t bt = b * seq_len + t;
      const float* token_row = wte + TokenRow(tokens[bt], channels, vocab);
      const float* pos_row = wpe + t * channels;
      float* o = out + bt * channels;
      for (int64_t c = 0; c < channels; ++c) o[c] = token_row[c] + pos_row[c];
    }
  }
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int64_t batch, int64_t seq_len, int64_t channels, int64_t vocab) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t bt = b * seq_len + t;
      float* token_row = dwte + TokenRow(tokens[bt], channels, vocab);
      float* pos_row = dwpe + t * channels;
      const float* d = dout + bt * channels;
      for (int64_t c = 0; c < channels; ++c) {
        token_row[c] += d[c];
        pos_row[c] += d[c];
      }
    }
  }
}

}  // namespace ringmaster::kernels
