#include "kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glog/logging.h"
#include "kernels/cpu/vector_math.h"

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

// max_j x[j], n >= 1, in eight lanes like LaneSum. A NaN may be skipped; callers feed
// x - max through exp, which brings it back.
[[gnu::always_inline]] inline float Max(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float acc[kLanes];
  std::fill(acc, acc + kLanes, x[0]);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  }
  for (; j < n; ++j) acc[0] = x[j] > acc[0] ? x[j] : acc[0];
  float m = acc[0];
  for (int k = 1; k < kLanes; ++k) m = acc[k] > m ? acc[k] : m;
  return m;
}

// The row functions below take a block's [rows, width] slab of p (or dp) with leading
// dimension ld; row r is query i = blk.i0 + r and its live entries are columns j <= i. They
// leave columns (i, width) exactly zero, which the products over the whole slab rely on.

// Scores in, softmax over j <= i out; lse[i] (when lse is not null) = log sum_j exp(s[i, j]).
// A NaN or inf score makes its row NaN.
RM_TARGET_CLONES void SoftmaxRows(float* p, int64_t ld, const Block& blk, int64_t width,
                                  float* lse) {
  for (int64_t r = 0; r < blk.rows(); ++r) {
    float* pr = p + r * ld;
    const int64_t n = blk.i0 + r + 1;
    const float m = Max(pr, n);
    const float sum = LaneSum(n, [pr, m](int64_t j) { return pr[j] = FastExp(pr[j] - m); });
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) pr[j] *= inv;
    std::fill(pr + n, pr + width, 0.0f);
    if (lse != nullptr) lse[blk.i0 + r] = m + std::log(sum);
  }
}

// Scores in, p = exp(s - lse[i]) out: the probabilities again, from the saved statistics.
RM_TARGET_CLONES void ProbsFromLse(float* p, int64_t ld, const Block& blk, int64_t width,
                                   const float* lse) {
  for (int64_t r = 0; r < blk.rows(); ++r) {
    float* pr = p + r * ld;
    const int64_t n = blk.i0 + r + 1;
    const float shift = lse[blk.i0 + r];
    for (int64_t j = 0; j < n; ++j) pr[j] = FastExp(pr[j] - shift);
    std::fill(pr + n, pr + width, 0.0f);
  }
}

// Softmax backward: dp (dL/dp, leading dimension lddp) in, ds = p * (dp - sum_j p dp) out.
RM_TARGET_CLONES void SoftmaxBackwardRows(float* dp, int64_t lddp, const float* p, int64_t ldp,
                                          const Block& blk, int64_t width) {
  for (int64_t r = 0; r < blk.rows(); ++r) {
    const float* pr = p + r * ldp;
    float* dpr = dp + r * lddp;
    const int64_t n = blk.i0 + r + 1;
    const float dot = LaneSum(n, [pr, dpr](int64_t j) { return pr[j] * dpr[j]; });
    for (int64_t j = 0; j < n; ++j) dpr[j] = pr[j] * (dpr[j] - dot);
    std::fill(dpr + n, dpr + width, 0.0f);
  }
}

// Softmax of a block's scores and the p.v product: p (leading dimension ldp) receives the
// probabilities, zero from the diagonal up to column `width`; lse (when not null) receives
// each row's log-sum-exp; out receives the block's output rows.
void ForwardBlock(const Dims& d, const HeadSlices& head, const Block& blk, float* p, int64_t ldp,
                  int64_t width, float* lse, float* out) {
  Scores(d, head, blk, p, ldp);
  SoftmaxRows(p, ldp, blk, width, lse);
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
  SoftmaxBackwardRows(dp, keys, p, ldp, blk, keys);
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
      const int64_t keys = blk.i1;
      Scores(d, head, blk, p, keys);
      ProbsFromLse(p, keys, blk, keys, head_lse);
      BackwardBlock(d, head, g, blk, dout + head.out_offset, p, keys, dp);
    });
  });
}

}  // namespace ringmaster::kernels
