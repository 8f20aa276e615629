#include "kernels/conv.h"

#include <algorithm>
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
  return {std::max<int64_t>(0, pad - kx), std::min<int64_t>(width, width + pad - kx)};
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
    for (int64_t o = 0; o < s.out_channels; ++o) {
      float sum = 0.0f;
      for (int64_t i = 0; i < hw; ++i) sum += grad[o * hw + i];
      dbias[o] += sum;
    }
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
  for (int64_t p = 0; p < planes; ++p) {
    const float* in = x + p * height * width;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const int64_t top_left = 2 * oy * width + 2 * ox;
        int64_t best = top_left;
        for (int64_t at : {top_left + 1, top_left + width, top_left + width + 1}) {
          const bool best_is_nan = in[best] != in[best];
          if (!best_is_nan && (in[at] > in[best] || in[at] != in[at])) best = at;
        }
        const int64_t k = (p * out_h + oy) * out_w + ox;
        y[k] = in[best];
        argmax[k] = static_cast<int32_t>(best);
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
