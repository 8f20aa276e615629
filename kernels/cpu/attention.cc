#include "kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glog/logging.h"

namespace ringmaster::kernels {
namespace {

// Query rows per block: a block's scores against all its keys ([64, T] floats, 256 KiB at
// T = 1024) stay in L2 while they go through softmax and the p.v product.
constexpr int64_t kBlockRows = 64;

struct Dims {
  int64_t batch;
  int64_t seq_len;
  int64_t channels;
  int64_t heads;
  int64_t head_size;
  float scale;  // 1 / sqrt(head_size)

  int64_t qkv_ld() const { return 3 * channels; }
};

Dims MakeDims(int64_t batch, int64_t seq_len, int64_t channels, int64_t heads) {
  CHECK_GT(batch, 0);
  CHECK_GT(seq_len, 0);
  CHECK_GT(heads, 0);
  CHECK_GT(channels, 0);
  CHECK_EQ(channels % heads, 0) << "heads " << heads << " must divide channels " << channels;
  const int64_t hs = channels / heads;
  return Dims{batch, seq_len, channels, heads, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

// One (b, h): q, k, v, dq, dk, dv are [T, hs] slices with leading dimension 3C; out and
// dout are [T, hs] slices with leading dimension C.
struct HeadSlices {
  const float* q;
  const float* k;
  const float* v;
  int64_t row;         // index of (b, h) among the B * NH heads: probs and lse are laid out by it
  int64_t out_offset;  // of the slice in out / dout
  int64_t qkv_offset;  // of the q slice in qkv / dqkv
};

HeadSlices Slices(const Dims& d, const float* qkv, int64_t b, int64_t h) {
  const int64_t qkv_offset = b * d.seq_len * d.qkv_ld() + h * d.head_size;
  const float* q = qkv + qkv_offset;
  return HeadSlices{q,
                    q + d.channels,
                    q + 2 * d.channels,
                    b * d.heads + h,
                    b * d.seq_len * d.channels + h * d.head_size,
                    qkv_offset};
}

template <typename Fn>
void ForEachHead(const Dims& d, const float* qkv, Fn fn) {
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) fn(Slices(d, qkv, b, h));
  }
}

// Query rows [i0, i1) of a head; its keys are [0, i1).
struct Block {
  int64_t i0;
  int64_t i1;
  int64_t rows() const { return i1 - i0; }
};

template <typename Fn>
void ForEachBlock(const Dims& d, Fn fn) {
  for (int64_t i0 = 0; i0 < d.seq_len; i0 += kBlockRows) {
    fn(Block{i0, std::min(i0 + kBlockRows, d.seq_len)});
  }
}

// s[r, j] = scale * q_{i0 + r} . k_j for the block's rows r and keys j < i1, into s (leading
// dimension lds). Entries with j > i0 + r are computed too and must be ignored by the caller.
void Scores(const Dims& d, const HeadSlices& head, const Block& blk, float* s, int64_t lds) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blk.rows(), blk.i1, d.head_size, d.scale,
              head.q + blk.i0 * d.qkv_ld(), d.qkv_ld(), head.k, d.qkv_ld(), 0.0f, s, lds);
}

// Row i of p holds scores s[i, 0..i]: replaces them with their softmax, zeroes p[i+1, width),
// and returns log sum_j exp(s[i, j]). The maximum starts from s[i, 0], so a NaN or inf score
// makes the row NaN rather than disappear.
float SoftmaxRow(float* p, int64_t i, int64_t width) {
  float m = p[0];
  for (int64_t j = 1; j <= i; ++j) m = p[j] > m ? p[j] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    const float e = std::exp(p[j] - m);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
  std::fill(p + i + 1, p + width, 0.0f);
  return m + std::log(sum);
}

// Softmax of a block's scores and the p.v product: p (leading dimension ldp) receives the
// probabilities, zero from the diagonal up to column `width`; lse (when not null) receives
// each row's log-sum-exp; out receives the block's output rows.
void ForwardBlock(const Dims& d, const HeadSlices& head, const Block& blk, float* p, int64_t ldp,
                  int64_t width, float* lse, float* out) {
  Scores(d, head, blk, p, ldp);
  for (int64_t r = 0; r < blk.rows(); ++r) {
    const float row_lse = SoftmaxRow(p + r * ldp, blk.i0 + r, width);
    if (lse != nullptr) lse[blk.i0 + r] = row_lse;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blk.rows(), d.head_size, blk.i1, 1.0f, p,
              ldp, head.v, d.qkv_ld(), 0.0f, out + blk.i0 * d.channels, d.channels);
}

// Gradient slices of one head in dqkv.
struct HeadGrads {
  float* dq;
  float* dk;
  float* dv;
};

HeadGrads ZeroedGrads(const Dims& d, const HeadSlices& head, float* dqkv) {
  HeadGrads g{dqkv + head.qkv_offset, dqkv + head.qkv_offset + d.channels,
              dqkv + head.qkv_offset + 2 * d.channels};
  // dk and dv gather contributions from every block; dq rows are written once by their block.
  for (int64_t t = 0; t < d.seq_len; ++t) {
    std::memset(g.dk + t * d.qkv_ld(), 0, d.head_size * sizeof(float));
    std::memset(g.dv + t * d.qkv_ld(), 0, d.head_size * sizeof(float));
  }
  return g;
}

// Backward of one block given its probabilities p (leading dimension ldp, zero past the
// diagonal). dp is [rows, i1] scratch. With do = dout rows of the block:
//   dv[0, i1) += p^T do,  dp = do v^T,  ds = p * (dp - rowsum(p * dp)),
//   dq[i0, i1) = scale ds k,  dk[0, i1) += scale ds^T q.
void BackwardBlock(const Dims& d, const HeadSlices& head, const HeadGrads& g, const Block& blk,
                   const float* dout, const float* p, int64_t ldp, float* dp) {
  const int64_t ld = d.qkv_ld();
  const int64_t rows = blk.rows();
  const int64_t keys = blk.i1;
  const float* dout_blk = dout + blk.i0 * d.channels;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d.head_size, rows, 1.0f, p, ldp,
              dout_blk, d.channels, 1.0f, g.dv, ld);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d.head_size, 1.0f, dout_blk,
              d.channels, head.v, ld, 0.0f, dp, keys);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = blk.i0 + r;
    const float* pr = p + r * ldp;
    float* dpr = dp + r * keys;
    float dot = 0.0f;
    for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dpr[j];
    for (int64_t j = 0; j <= i; ++j) dpr[j] = pr[j] * (dpr[j] - dot);
    std::fill(dpr + i + 1, dpr + keys, 0.0f);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d.head_size, keys, d.scale, dp, keys,
              head.k, ld, 0.0f, g.dq + blk.i0 * ld, ld);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d.head_size, rows, d.scale, dp, keys,
              head.q + blk.i0 * ld, ld, 1.0f, g.dk, ld);
}

}  // namespace

int64_t AttentionProbsFloats(int64_t batch, int64_t seq_len, int64_t heads) {
  return batch * heads * seq_len * seq_len;
}

int64_t AttentionLseFloats(int64_t batch, int64_t seq_len, int64_t heads) {
  return batch * heads * seq_len;
}

int64_t AttentionScratchFloats(int64_t seq_len) {
  return 2 * std::min(seq_len, kBlockRows) * seq_len;
}

void AttentionForward(float* out, float* probs, const float* qkv, int64_t batch, int64_t seq_len,
                      int64_t channels, int64_t heads) {
  const Dims d = MakeDims(batch, seq_len, channels, heads);
  const int64_t t = d.seq_len;
  ForEachHead(d, qkv, [&](const HeadSlices& head) {
    float* head_probs = probs + head.row * t * t;
    ForEachBlock(d, [&](const Block& blk) {
      ForwardBlock(d, head, blk, head_probs + blk.i0 * t, t, t, nullptr, out + head.out_offset);
    });
  });
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                       float* scratch, int64_t batch, int64_t seq_len, int64_t channels,
                       int64_t heads) {
  const Dims d = MakeDims(batch, seq_len, channels, heads);
  const int64_t t = d.seq_len;
  ForEachHead(d, qkv, [&](const HeadSlices& head) {
    const HeadGrads g = ZeroedGrads(d, head, dqkv);
    const float* head_probs = probs + head.row * t * t;
    ForEachBlock(d, [&](const Block& blk) {
      BackwardBlock(d, head, g, blk, dout + head.out_offset, head_probs + blk.i0 * t, t, scratch);
    });
  });
}

void AttentionForwardLse(float* out, float* lse, const float* qkv, float* scratch, int64_t batch,
                         int64_t seq_len, int64_t channels, int64_t heads) {
  const Dims d = MakeDims(batch, seq_len, channels, heads);
  ForEachHead(d, qkv, [&](const HeadSlices& head) {
    float* head_lse = lse + head.row * d.seq_len;
    ForEachBlock(d, [&](const Block& blk) {
      ForwardBlock(d, head, blk, scratch, blk.i1, blk.i1, head_lse, out + head.out_offset);
    });
  });
}

void AttentionBackwardLse(float* dqkv, const float* dout, const float* qkv, const float* lse,
                          float* scratch, int64_t batch, int64_t seq_len, int64_t channels,
                          int64_t heads) {
  const Dims d = MakeDims(batch, seq_len, channels, heads);
  float* p = scratch;
  float* dp = scratch + std::min(d.seq_len, kBlockRows) * d.seq_len;
  ForEachHead(d, qkv, [&](const HeadSlices& head) {
    const HeadGrads g = ZeroedGrads(d, head, dqkv);
    const float* head_lse = lse + head.row * d.seq_len;
    ForEachBlock(d, [&](const Block& blk) {
      // Recompute the block's probabilities: p = exp(s - lse), zero past the diagonal.
      const int64_t keys = blk.i1;
      Scores(d, head, blk, p, keys);
      for (int64_t r = 0; r < blk.rows(); ++r) {
        const int64_t i = blk.i0 + r;
        float* pr = p + r * keys;
        for (int64_t j = 0; j <= i; ++j) pr[j] = std::exp(pr[j] - head_lse[i]);
        std::fill(pr + i + 1, pr + keys, 0.0f);
      }
      BackwardBlock(d, head, g, blk, dout + head.out_offset, p, keys, dp);
    });
  });
}

}  // namespace ringmaster::kernels
