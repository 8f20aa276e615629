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

// Floor and ceiling of a / b for b > 0 and any a.
int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Output columns per product the strided convolution aims for: a product of the kernel
// matrix with fewer columns than this runs BLAS far below its peak.
constexpr int64_t kTargetColumns = 1024;

// Images unfolded together: enough for kTargetColumns output positions, at most the batch.
int64_t ImagesPerProduct(const StridedConv2dShape& s) {
  const int64_t positions = s.out_height() * s.out_width();
  return std::clamp<int64_t>(kTargetColumns / positions, 1, std::max<int64_t>(1, s.batch));
}

// What the strided convolution's three passes share: images per product, output positions,
// unfolded rows, floats per input and output image, and where in the scratch the products
// (or the grouped output gradients) go, after the unfolded images.
struct StridedGeometry {
  StridedGeometry(const StridedConv2dShape& s, float* scratch)
      : per(ImagesPerProduct(s)),
        ohw(s.out_height() * s.out_width()),
        unfolded(s.in_channels * s.kernel_size * s.kernel_size),
        in_image(s.in_channels * s.height * s.width),
        out_image(s.out_channels * ohw),
        products(scratch + unfolded * per * ohw) {}
  int64_t per, ohw, unfolded, in_image, out_image;
  float* products;
};

// Visits every (unfolded row, image, output row) of `images` images, as ForEachUnfoldedRow
// does for one: `visit(col_at, in_at, begin, end, kx_shift)`, where col_at is the offset in
// the unfolded images ([C·k·k, images·OH·OW]) of the output row's segment, in_at the offset
// of the input row it reads (-1 for padding), and output column ox in [begin, end) reads
// input column ox · stride + kx_shift (outside that range, padding).
template <typename Visit>
void ForEachStridedRow(const StridedConv2dShape& s, int64_t images, Visit visit) {
  const int64_t k = s.kernel_size, oh = s.out_height(), ow = s.out_width();
  const int64_t ohw = oh * ow, columns = images * ohw;
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t ky = 0; ky < k; ++ky) {
      for (int64_t kx = 0; kx < k; ++kx) {
        const int64_t row = (c * k + ky) * k + kx, shift = kx - s.padding;
        const int64_t begin = std::clamp<int64_t>(CeilDiv(-shift, s.stride), 0, ow);
        const int64_t end =
            std::clamp<int64_t>(FloorDiv(s.width - 1 - shift, s.stride) + 1, begin, ow);
        for (int64_t i = 0; i < images; ++i) {
          for (int64_t y = 0; y < oh; ++y) {
            const int64_t iy = y * s.stride + ky - s.padding;
            const bool inside = iy >= 0 && iy < s.height;
            visit(row * columns + i * ohw + y * ow,
                  inside ? ((i * s.in_channels + c) * s.height + iy) * s.width : -1, begin, end,
                  shift);
          }
        }
      }
    }
  }
}

void StridedIm2Col(const StridedConv2dShape& s, const float* images, int64_t count, float* col) {
  const int64_t ow = s.out_width(), stride = s.stride;
  ForEachStridedRow(s, count,
                    [&](int64_t col_at, int64_t in_at, int64_t begin, int64_t end, int64_t shift) {
                      float* dst = col + col_at;
                      if (in_at < 0) {
                        std::memset(dst, 0, ow * sizeof(float));
                        return;
                      }
                      const float* src = images + in_at + shift;
                      std::memset(dst, 0, begin * sizeof(float));
                      if (stride == 1) {
                        std::memcpy(dst + begin, src + begin, (end - begin) * sizeof(float));
                      } else {
                        for (int64_t x = begin; x < end; ++x) dst[x] = src[x * stride];
                      }
                      std::memset(dst + end, 0, (ow - end) * sizeof(float));
                    });
}

void StridedCol2ImAdd(const StridedConv2dShape& s, const float* col, int64_t count, float* images) {
  const int64_t stride = s.stride;
  ForEachStridedRow(s, count,
                    [&](int64_t col_at, int64_t in_at, int64_t begin, int64_t end, int64_t shift) {
                      if (in_at < 0) return;
                      const float* src = col + col_at;
                      float* dst = images + in_at + shift;
                      for (int64_t x = begin; x < end; ++x) dst[x * stride] += src[x];
                    });
}

// Moves `count` images' [channels, positions] maps between NCHW (image-major) and the
// products' channel-major layout [channels, count · positions] ("grouped").
enum class Regroup { kToGrouped, kToNchw };
void RegroupImages(Regroup direction, const float* from, int64_t count, int64_t channels,
                   int64_t positions, float* to) {
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t nchw = (i * channels + c) * positions, grouped = (c * count + i) * positions;
      const bool grouping = direction == Regroup::kToGrouped;
      std::memcpy(to + (grouping ? grouped : nchw), from + (grouping ? nchw : grouped),
                  positions * sizeof(float));
    }
  }
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

int64_t StridedConv2dScratchElements(const StridedConv2dShape& s) {
  const int64_t images = ImagesPerProduct(s), columns = images * s.out_height() * s.out_width();
  const int64_t unfolded = s.in_channels * s.kernel_size * s.kernel_size;
  return unfolded * columns + (images > 1 ? s.out_channels * columns : 0);
}

void StridedConv2dForward(const StridedConv2dShape& s, const float* x, const float* weight,
                          float* y, float* scratch) {
  const StridedGeometry g(s, scratch);
  const int64_t per = g.per, ohw = g.ohw, unfolded = g.unfolded;
  const int64_t in_image = g.in_image, out_image = g.out_image;
  float* products = g.products;
  for (int64_t b = 0; b < s.batch; b += per) {
    const int64_t count = std::min(per, s.batch - b);
    StridedIm2Col(s, x + b * in_image, count, scratch);
    float* out = per == 1 ? y + b * out_image : products;
    MatMul(Transpose::kNo, Transpose::kNo, s.out_channels, count * ohw, unfolded, weight, scratch,
           out, OutputMode::kOverwrite);
    if (per > 1)
      RegroupImages(Regroup::kToNchw, products, count, s.out_channels, ohw, y + b * out_image);
  }
}

void StridedConv2dBackwardWeights(const StridedConv2dShape& s, const float* x, const float* dy,
                                  float* dweight, OutputMode mode, float* scratch) {
  const StridedGeometry g(s, scratch);
  const int64_t per = g.per, ohw = g.ohw, unfolded = g.unfolded;
  const int64_t in_image = g.in_image, out_image = g.out_image;
  float* grouped = g.products;
  if (mode == OutputMode::kOverwrite) {
    std::memset(dweight, 0, s.out_channels * unfolded * sizeof(float));
  }
  for (int64_t b = 0; b < s.batch; b += per) {
    const int64_t count = std::min(per, s.batch - b);
    StridedIm2Col(s, x + b * in_image, count, scratch);
    const float* grad = dy + b * out_image;
    if (per > 1) {
      RegroupImages(Regroup::kToGrouped, grad, count, s.out_channels, ohw, grouped);
      grad = grouped;
    }
    MatMul(Transpose::kNo, Transpose::kYes, s.out_channels, unfolded, count * ohw, grad, scratch,
           dweight, OutputMode::kAccumulate);
  }
}

void StridedConv2dBackwardInput(const StridedConv2dShape& s, const float* weight, const float* dy,
                                float* dx, float* scratch) {
  const StridedGeometry g(s, scratch);
  const int64_t per = g.per, ohw = g.ohw, unfolded = g.unfolded;
  const int64_t in_image = g.in_image, out_image = g.out_image;
  float* grouped = g.products;
  std::memset(dx, 0, s.batch * in_image * sizeof(float));
  for (int64_t b = 0; b < s.batch; b += per) {
    const int64_t count = std::min(per, s.batch - b);
    const float* grad = dy + b * out_image;
    if (per > 1) {
      RegroupImages(Regroup::kToGrouped, grad, count, s.out_channels, ohw, grouped);
      grad = grouped;
    }
    MatMul(Transpose::kYes, Transpose::kNo, unfolded, count * ohw, s.out_channels, weight, grad,
           scratch, OutputMode::kOverwrite);
    StridedCol2ImAdd(s, scratch, count, dx + b * in_image);
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

void GlobalAvgPoolForward(const float* x, float* y, int64_t planes, int64_t positions) {
  const float scale = 1.0f / static_cast<float>(positions);
  for (int64_t p = 0; p < planes; ++p) y[p] = Sum(x + p * positions, positions) * scale;
}

void GlobalAvgPoolBackward(const float* dy, float* dx, int64_t planes, int64_t positions) {
  const float scale = 1.0f / static_cast<float>(positions);
  for (int64_t p = 0; p < planes; ++p) std::fill_n(dx + p * positions, positions, dy[p] * scale);
}

}  // namespace ringmaster::kernels
