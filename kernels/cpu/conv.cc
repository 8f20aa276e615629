#include "kernels/conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ringmaster::kernels {
namespace {

// For kernel column kx (padding p), output column xo reads input column xo + kx - p; these
// are the output columns [begin, end) for which that lies inside the row.
struct ColumnRange {
  int64_t begin;
  int64_t end;
};

ColumnRange ValidColumns(int64_t kx, int64_t pad, int64_t width) {
  // Output columns x with 0 <= x + kx - pad < width, within [0, width): empty (begin == end)
  // when the kernel reaches past the whole row (pad > width).
  const int64_t begin = std::clamp<int64_t>(pad - kx, 0, width);
  return {begin, std::clamp<int64_t>(width + pad - kx, begin, width)};
}

// Visits every (unfolded row, output row) pair of one image: `visit(col_at, in_at, range,
// shift)` where col_at is the offset in the unfolded image of that output row's segment,
// in_at the offset in the image of the input row it reads (-1 when that row is padding), and
// input column = output column + shift for the output columns in `range`.
template <typename Visit>
void ForEachUnfoldedRow(const Conv2dShape& s, Visit visit) {
  const int64_t k = s.kernel_size, pad = k / 2, hw = s.height * s.width;
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t ky = 0; ky < k; ++ky) {
      for (int64_t kx = 0; kx < k; ++kx) {
        const int64_t unfolded = (c * k + ky) * k + kx;
        const ColumnRange range = ValidColumns(kx, pad, s.width);
        for (int64_t y = 0; y < s.height; ++y) {
          const int64_t iy = y + ky - pad;
          const bool inside = iy >= 0 && iy < s.height;
          visit(unfolded * hw + y * s.width, inside ? (c * s.height + iy) * s.width : -1, range,
                kx - pad);
        }
      }
    }
  }
}

// col [C·k·k, H·W] = the image's receptive fields, zeros for padding.
void Im2Col(const Conv2dShape& s, const float* image, float* col) {
  ForEachUnfoldedRow(s, [&](int64_t col_at, int64_t in_at, ColumnRange r, int64_t shift) {
    float* dst = col + col_at;
    if (in_at < 0) {
      std::memset(dst, 0, s.width * sizeof(float));
      return;
    }
    std::memset(dst, 0, r.begin * sizeof(float));
    std::memcpy(dst + r.begin, image + in_at + r.begin + shift, (r.end - r.begin) * sizeof(float));
    std::memset(dst + r.end, 0, (s.width - r.end) * sizeof(float));
  });
}

// image += the receptive fields in col folded back (the adjoint of Im2Col).
void Col2ImAdd(const Conv2dShape& s, const float* col, float* image) {
  ForEachUnfoldedRow(s, [&](int64_t col_at, int64_t in_at, ColumnRange r, int64_t shift) {
    if (in_at < 0) return;
    const float* src = col + col_at;
    float* dst = image + in_at;
    for (int64_t x = r.begin; x < r.end; ++x) dst[x + shift] += src[x];
  });
}

// Σ v[i] in 8 interleaved partial sums, so that the loop vectorises without reassociation.
float Sum(const float* v, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += v[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += v[i];
  for (float lane : lanes) sum += lane;
  return sum;
}

// An integer that orders floats as max-pooling does: by value, -0 below +0, and every NaN
// above everything. Integer comparisons keep the pooling loop vectorisable (combined float
// comparisons do not, with GCC 12).
inline int32_t PoolKey(float v) {
  int32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const int32_t ordered = u >= 0 ? u : u ^ 0x7fffffff;
  return (u & 0x7fffffff) > 0x7f800000 ? INT32_MAX : ordered;
}

struct PoolBest {
  float value;
  int32_t key;
  int32_t at;
};

// A later window element wins only if it is strictly greater: ties keep the first.
inline void TakeIfGreater(float v, int32_t at, PoolBest& best) {
  const int32_t key = PoolKey(v);
  const bool take = key > best.key;
  best.value = take ? v : best.value;
  best.key = take ? key : best.key;
  best.at = take ? at : best.at;
}

}  // namespace

int64_t Conv2dScratchElements(const Conv2dShape& s) {
  return s.in_channels * s.kernel_size * s.kernel_size * s.height * s.width;
}

void Conv2dForward(const Conv2dShape& s, const float* x, const float* weight, const float* bias,
                   float* y, float* scratch) {
  const int64_t hw = s.height * s.width, unfolded = Conv2dScratchElements(s) / hw;
  for (int64_t n = 0; n < s.batch; ++n) {
    float* out = y + n * s.out_channels * hw;
    Im2Col(s, x + n * s.in_channels * hw, scratch);
    OutputMode mode = OutputMode::kOverwrite;
    if (bias != nullptr) {
      for (int64_t o = 0; o < s.out_channels; ++o) std::fill_n(out + o * hw, hw, bias[o]);
      mode = OutputMode::kAccumulate;
    }
    MatMul(Transpose::kNo, Transpose::kNo, s.out_channels, hw, unfolded, weight, scratch, out,
           mode);
  }
}

void Conv2dBackwardWeights(const Conv2dShape& s, const float* x, const float* dy, float* dweight,
                           float* dbias, OutputMode mode, float* scratch) {
  const int64_t hw = s.height * s.width, unfolded = Conv2dScratchElements(s) / hw;
  if (mode == OutputMode::kOverwrite) {
    std::memset(dweight, 0, s.out_channels * unfolded * sizeof(float));
    if (dbias != nullptr) std::memset(dbias, 0, s.out_channels * sizeof(float));
  }
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* grad = dy + n * s.out_channels * hw;
    Im2Col(s, x + n * s.in_channels * hw, scratch);
    MatMul(Transpose::kNo, Transpose::kYes, s.out_channels, unfolded, hw, grad, scratch, dweight,
           OutputMode::kAccumulate);
    if (dbias == nullptr) continue;
    for (int64_t o = 0; o < s.out_channels; ++o) dbias[o] += Sum(grad + o * hw, hw);
  }
}

void Conv2dBackwardInput(const Conv2dShape& s, const float* weight, const float* dy, float* dx,
                         float* scratch) {
  const int64_t hw = s.height * s.width, unfolded = Conv2dScratchElements(s) / hw;
  std::memset(dx, 0, s.batch * s.in_channels * hw * sizeof(float));
  for (int64_t n = 0; n < s.batch; ++n) {
    MatMul(Transpose::kYes, Transpose::kNo, unfolded, hw, s.out_channels, weight,
           dy + n * s.out_channels * hw, scratch, OutputMode::kOverwrite);
    Col2ImAdd(s, scratch, dx + n * s.in_channels * hw);
  }
}

void MaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t height,
                       int64_t width) {
  const int64_t out_h = height / 2, out_w = width / 2;
  const int32_t w = static_cast<int32_t>(width);
  for (int64_t p = 0; p < planes; ++p) {
    const float* in = x + p * height * width;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const int32_t top = static_cast<int32_t>(2 * oy * width);
      const float* row0 = in + top;
      const float* row1 = row0 + width;
      float* out = y + (p * out_h + oy) * out_w;
      int32_t* index = argmax + (p * out_h + oy) * out_w;
      // Selects, not branches (the comparisons are data-dependent coin flips): the loop
      // vectorises.
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const int32_t at = top + 2 * static_cast<int32_t>(ox);
        PoolBest best{row0[2 * ox], PoolKey(row0[2 * ox]), at};
        TakeIfGreater(row0[2 * ox + 1], at + 1, best);
        TakeIfGreater(row1[2 * ox], at + w, best);
        TakeIfGreater(row1[2 * ox + 1], at + w + 1, best);
        out[ox] = best.value;
        index[ox] = best.at;
      }
    }
  }
}

void MaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes,
                        int64_t height, int64_t width) {
  const int64_t outputs = (height / 2) * (width / 2);
  std::memset(dx, 0, planes * height * width * sizeof(float));
  for (int64_t p = 0; p < planes; ++p) {
    float* plane = dx + p * height * width;
    for (int64_t k = 0; k < outputs; ++k) plane[argmax[p * outputs + k]] = dy[p * outputs + k];
  }
}

}  // namespace ringmaster::kernels
