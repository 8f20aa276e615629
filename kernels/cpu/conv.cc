#include "kernels/conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/parallel.h"

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

// Threads the strided convolution's parts run on, and the images each takes at most.
int64_t Threads(const StridedConv2dShape& s) { return std::max<int64_t>(1, s.threads); }
int64_t ImagesPerThread(const StridedConv2dShape& s) {
  return std::max<int64_t>(1, (s.batch + Threads(s) - 1) / Threads(s));
}

// Runs part(thread, first image, images) for every chunk of `per` images of the batch, chunk c
// on thread c mod Threads(s), the threads at once (kernels/parallel.h).
template <typename Part>
void ForEachChunkOnThreads(const StridedConv2dShape& s, int64_t per, Part part) {
  const int64_t threads = Threads(s);
  ParallelRun(static_cast<int>(threads), [&](int t) {
    for (int64_t b = t * per; b < s.batch; b += threads * per) {
      part(t, b, std::min(per, s.batch - b));
    }
  });
}

// Output columns per product the strided convolution aims for: a product of the kernel
// matrix with fewer columns than this runs BLAS far below its peak.
constexpr int64_t kTargetColumns = 1024;

// Images unfolded together: enough for kTargetColumns output positions, at most the batch.
// With several threads, at most the batch's share of one thread (each takes whole products).
int64_t ImagesPerProduct(const StridedConv2dShape& s) {
  const int64_t positions = s.out_height() * s.out_width();
  return std::clamp<int64_t>(kTargetColumns / positions, 1, ImagesPerThread(s));
}

// What the strided convolution's three passes share: images per product, output positions,
// unfolded rows, floats per input and output image, and where in the scratch the products
// (or the grouped output gradients) go, after the unfolded images.
struct StridedGeometry {
  explicit StridedGeometry(const StridedConv2dShape& s)
      : per(ImagesPerProduct(s)),
        ohw(s.out_height() * s.out_width()),
        unfolded(s.in_channels * s.kernel_size * s.kernel_size),
        in_image(s.in_channels * s.height * s.width),
        out_image(s.out_channels * ohw),
        columns(unfolded * per * ohw),
        products(per > 1 ? s.out_channels * per * ohw : 0),
        weight_sum(Threads(s) > 1 ? s.out_channels * unfolded : 0) {}
  int64_t per, ohw, unfolded, in_image, out_image;
  // Scratch floats per thread: its unfolded images, its products (or grouped output
  // gradients), and with several threads a weight-gradient sum of its own.
  int64_t columns, products, weight_sum;

  int64_t per_thread() const { return columns + products + weight_sum; }
  float* columns_at(float* scratch, int t) const { return scratch + t * per_thread(); }
  float* products_at(float* scratch, int t) const { return columns_at(scratch, t) + columns; }
  float* weight_sum_at(float* scratch, int t) const {
    return products_at(scratch, t) + products;
  }
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
                      // Loops, not memset and memcpy calls: a row is 4-32 floats, and
                      // its padding 0-1 (kernels/BUILD keeps GCC from making calls of them).
                      float* dst = col + col_at;
                      if (in_at < 0) {
                        for (int64_t x = 0; x < ow; ++x) dst[x] = 0.0f;
                        return;
                      }
                      const float* src = images + in_at + shift;
                      for (int64_t x = 0; x < begin; ++x) dst[x] = 0.0f;
                      if (stride == 1) {
                        for (int64_t x = begin; x < end; ++x) dst[x] = src[x];
                      } else {
                        for (int64_t x = begin; x < end; ++x) dst[x] = src[x * stride];
                      }
                      for (int64_t x = end; x < ow; ++x) dst[x] = 0.0f;
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


// Winograd's minimal filtering F(m x m, 3x3) (Lavin and Gray 2016) for 3x3 convolutions with
// stride 1 and padding 1, the bulk of ResNet's work: each m x m output tile is
// Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A for the (m + 2)² input tile d around it, so that the products
// run over the (m + 2)² transformed positions ξ: per ξ, M_ξ [out, tiles] = U_ξ [out, in] ·
// V_ξ [in, tiles]. The backward passes are the exact adjoints: with Z = A dy Aᵀ (a tile's
// output gradient spread to (m + 2)²), the weight gradient is Gᵀ (Σ_tiles Z_ξ V_ξᵀ) G and the
// input gradient B (U_ξᵀ Z_ξ) Bᵀ folded back onto the overlapping input tiles.
//
// Two tile sizes, each a struct of its three matrices as 1-D transforms (and their adjoints):
// F(4x4, 3x3), 36 multiplications for 16 outputs (4x fewer than the direct convolution), on
// maps of 8x8 or more; F(2x2, 3x3), 16 for 4 (2.25x), on smaller ones, where F(4x4)'s tiles
// would be mostly padding and its 36 transformed filters outweigh the few tiles. F(2x2)'s
// coefficients are 0, ±1 and ½, so its results differ from the unfolded product's by a few
// units in the last place; F(4x4)'s (up to 8, and 1/6, 1/24) round more (conv_test bounds
// both by the sum of the terms' magnitudes).
namespace winograd {

// "No loop-carried dependences": the transforms' rows never overlap, which GCC cannot prove
// through the many pointers. And each transform compiled for AVX-512, AVX2 and the baseline,
// the best picked when the program loads. Clang, which builds this only for its
// thread-safety analysis, gets neither (it cannot clone templates).
#if defined(__clang__)
#define RINGMASTER_IVDEP
#define RINGMASTER_CLONES
#else
#define RINGMASTER_IVDEP _Pragma("GCC ivdep")
#define RINGMASTER_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

// F(2x2, 3x3): Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1],
// Aᵀ = [1 1 1 0; 0 1 -1 -1].
struct F2 {
  static constexpr int kOut = 2;  // output tile side m
  static constexpr int kIn = 4;   // input tile side m + 2
  // v = Bᵀ d
  [[gnu::always_inline]] static void Input(const float* d, float* v) {
    v[0] = d[0] - d[2];
    v[1] = d[1] + d[2];
    v[2] = d[2] - d[1];
    v[3] = d[1] - d[3];
  }
  // d = B g
  [[gnu::always_inline]] static void InputAdjoint(const float* g, float* d) {
    d[0] = g[0];
    d[1] = g[1] - g[2] + g[3];
    d[2] = g[1] + g[2] - g[0];
    d[3] = -g[3];
  }
  // u = G g
  [[gnu::always_inline]] static void Filter(const float* g, float* u) {
    u[0] = g[0];
    u[1] = 0.5f * (g[0] + g[1] + g[2]);
    u[2] = 0.5f * (g[0] - g[1] + g[2]);
    u[3] = g[2];
  }
  // g = Gᵀ u
  [[gnu::always_inline]] static void FilterAdjoint(const float* u, float* g) {
    g[0] = u[0] + 0.5f * (u[1] + u[2]);
    g[1] = 0.5f * (u[1] - u[2]);
    g[2] = 0.5f * (u[1] + u[2]) + u[3];
  }
  // y = Aᵀ m
  [[gnu::always_inline]] static void Output(const float* m, float* y) {
    y[0] = m[0] + m[1] + m[2];
    y[1] = m[1] - m[2] - m[3];
  }
  // z = A a
  [[gnu::always_inline]] static void OutputAdjoint(const float* a, float* z) {
    z[0] = a[0];
    z[1] = a[0] + a[1];
    z[2] = a[0] - a[1];
    z[3] = -a[1];
  }
};

// F(4x4, 3x3): Bᵀ = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
// 0 2 -1 -2 1 0; 0 4 0 -5 0 1], G = [¼ 0 0; -⅙ -⅙ -⅙; -⅙ ⅙ -⅙; 1/24 1/12 ⅙; 1/24 -1/12 ⅙;
// 0 0 1], Aᵀ = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
struct F4 {
  static constexpr int kOut = 4;
  static constexpr int kIn = 6;
  [[gnu::always_inline]] static void Input(const float* d, float* v) {
    const float a = d[4] - 4.0f * d[2], b = d[3] - 4.0f * d[1];
    const float c = d[4] - d[2], e = 2.0f * (d[3] - d[1]);
    v[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    v[1] = a + b;
    v[2] = a - b;
    v[3] = c + e;
    v[4] = c - e;
    v[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
  }
  [[gnu::always_inline]] static void InputAdjoint(const float* g, float* d) {
    const float s12 = g[1] + g[2], d12 = g[1] - g[2], s34 = g[3] + g[4], d34 = g[3] - g[4];
    d[0] = 4.0f * g[0];
    d[1] = 4.0f * (g[5] - d12) - 2.0f * d34;
    d[2] = -5.0f * g[0] - 4.0f * s12 - s34;
    d[3] = d12 + 2.0f * d34 - 5.0f * g[5];
    d[4] = g[0] + s12 + s34;
    d[5] = g[5];
  }
  [[gnu::always_inline]] static void Filter(const float* g, float* u) {
    const float outer = g[0] + g[2], quarter = g[0] * (1.0f / 24) + g[2] * (1.0f / 6);
    const float middle = g[1] * (1.0f / 12);
    u[0] = g[0] * 0.25f;
    u[1] = -(outer + g[1]) * (1.0f / 6);
    u[2] = -(outer - g[1]) * (1.0f / 6);
    u[3] = quarter + middle;
    u[4] = quarter - middle;
    u[5] = g[2];
  }
  [[gnu::always_inline]] static void FilterAdjoint(const float* u, float* g) {
    const float s12 = u[1] + u[2], d12 = u[1] - u[2], s34 = u[3] + u[4], d34 = u[3] - u[4];
    g[0] = u[0] * 0.25f - s12 * (1.0f / 6) + s34 * (1.0f / 24);
    g[1] = -d12 * (1.0f / 6) + d34 * (1.0f / 12);
    g[2] = (s34 - s12) * (1.0f / 6) + u[5];
  }
  [[gnu::always_inline]] static void Output(const float* m, float* y) {
    const float s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
    y[0] = m[0] + s12 + s34;
    y[1] = d12 + 2.0f * d34;
    y[2] = s12 + 4.0f * s34;
    y[3] = d12 + 8.0f * d34 + m[5];
  }
  [[gnu::always_inline]] static void OutputAdjoint(const float* a, float* z) {
    const float even = a[0] + a[2], odd = a[1] + a[3];
    const float even4 = a[0] + 4.0f * a[2], odd4 = 2.0f * a[1] + 8.0f * a[3];
    z[0] = a[0];
    z[1] = even + odd;
    z[2] = even - odd;
    z[3] = even4 + odd4;
    z[4] = even4 - odd4;
    z[5] = a[3];
  }
};

// out = T x Tᵀ for a tile x [kRows][kRows] (T: kApply, kRows values to kCols): kApply down
// each column, then along each row. x is read through at(k, q), out written through
// put(i, j, value).
template <int kRows, int kCols, void (*kApply)(const float*, float*), typename At, typename Put>
[[gnu::always_inline]] inline void Transform2d(At at, Put put) {
  float half[kCols][kRows];  // T over the columns: half[i][q]
  for (int q = 0; q < kRows; ++q) {
    float column[kRows], out[kCols];
    for (int k = 0; k < kRows; ++k) column[k] = at(k, q);
    kApply(column, out);
    for (int i = 0; i < kCols; ++i) half[i][q] = out[i];
  }
  for (int i = 0; i < kCols; ++i) {
    float out[kCols];
    kApply(half[i], out);
    for (int j = 0; j < kCols; ++j) put(i, j, out[j]);
  }
}

// Tiles per product the chunks aim for (as kTargetColumns for the unfolded route).
constexpr int64_t kTargetTiles = 128;
// Smallest feature map (side) that runs Winograd (ResNet-18's 4x4 maps gain 1.2x; smaller
// ones were not measured), and the smallest that runs F(4x4, 3x3); kernels/conv_bench
// compares the tiles per ResNet stage.
constexpr int64_t kMinSide = 4;
constexpr int64_t kMinSide4 = 8;

// Floats from one transformed position ξ to the next in U ([ξ][out][in]), V, M and Z
// ([ξ][channels][tiles]): the matrix and a cache line more. ResNet's channels·tiles are powers
// of two, and the transforms read or write all positions of a tile at once: 16 or 36 streams
// a power of two apart fall into one set of the 12-way L1 cache and evict each other (without
// the extra line, kernels/conv_bench's four stages took 1.2x as long).
constexpr int64_t kStagger = 16;
inline int64_t PositionStride(int64_t rows, int64_t cols) { return rows * cols + kStagger; }

// The output tile side Winograd runs with for this shape: 4, 2, or 0 (none: the unfolded
// product).
int64_t TileFor(const StridedConv2dShape& s) {
  if (!s.winograd || s.kernel_size != 3 || s.stride != 1 || s.padding != 1 ||
      s.in_channels < 16 || s.out_channels < 16 || s.height < kMinSide || s.width < kMinSide) {
    return 0;
  }
  if (s.winograd_tile == F2::kOut || s.winograd_tile == F4::kOut) return s.winograd_tile;
  return std::min(s.height, s.width) >= kMinSide4 ? F4::kOut : F2::kOut;
}

// Calls run(W{}) with the tile this shape runs Winograd with; false where it runs none.
template <typename Run>
bool Dispatch(const StridedConv2dShape& s, Run run) {
  switch (TileFor(s)) {
    case F4::kOut:
      run(F4{});
      return true;
    case F2::kOut:
      run(F2{});
      return true;
    default:
      return false;
  }
}

template <class W>
constexpr int kPositions = W::kIn * W::kIn;  // ξ

// Floats of U, the transformed weights.
template <class W>
int64_t TransformedWeightElements(const StridedConv2dShape& s) {
  return kPositions<W> * PositionStride(s.out_channels, s.in_channels);
}

// The tiles of a chunk of images and the planes the transforms go through: an input plane
// zero-padded by one (and to whole tiles) and an output plane to whole tiles.
template <class W>
struct Geometry {
  explicit Geometry(const StridedConv2dShape& s)
      : tile_rows((s.height + W::kOut - 1) / W::kOut),
        tile_cols((s.width + W::kOut - 1) / W::kOut),
        per_image(tile_rows * tile_cols),
        images(std::clamp<int64_t>((kTargetTiles + per_image - 1) / per_image, 1,
                                   ImagesPerThread(s))),
        tiles(images * per_image),
        in_stride(W::kOut * tile_cols + 2),
        in_size((W::kOut * tile_rows + 2) * in_stride),
        out_stride(W::kOut * tile_cols),
        out_size(W::kOut * tile_rows * out_stride),
        // the larger of PlaneWork and Planes
        work(std::max(in_size + out_size + W::kIn * in_stride,
                      images * (in_size + out_size) + tiles * (2 + kPositions<W>))) {}
  int64_t tile_rows, tile_cols, per_image, images, tiles;
  int64_t in_stride, in_size;    // an input plane padded by one (and to whole tiles)
  int64_t out_stride, out_size;  // an output plane to whole tiles
  int64_t work;                  // floats of the transforms' own
};

// Each thread's part of the scratch: U (or its gradient) [ξ][out][in] (thread 0's is the
// transformed weights all threads read, unless they were prepared), one chunk's V (or the
// input's transformed gradient) [ξ][in][tiles] and M (or Z) [ξ][out][tiles], and the
// transforms' work.
template <class W>
struct Buffers {
  Buffers(const StridedConv2dShape& s, const Geometry<W>& g, float* scratch, int thread)
      : u(scratch + thread * PerThread(s, g)),
        v(u + TransformedWeightElements<W>(s)),
        m(v + kPositions<W> * PositionStride(s.in_channels, g.tiles)),
        work(m + kPositions<W> * PositionStride(s.out_channels, g.tiles)) {}
  static int64_t PerThread(const StridedConv2dShape& s, const Geometry<W>& g) {
    return TransformedWeightElements<W>(s) +
           kPositions<W> * (PositionStride(s.in_channels, g.tiles) +
                            PositionStride(s.out_channels, g.tiles)) +
           g.work;
  }
  float* u;
  float* v;
  float* m;
  float* work;
};

template <class W>
int64_t ScratchElements(const StridedConv2dShape& s) {
  return Threads(s) * Buffers<W>::PerThread(s, Geometry<W>(s));
}

// The work's parts for a chunk of `count` images: the padded input planes [count][in_size],
// the whole-tile output planes [count][out_size], each tile's corner in both, and [ξ][tiles]
// values.
template <class W>
struct Planes {
  Planes(const Geometry<W>& g, int64_t count, float* work)
      : tiles(count * g.per_image),
        in(work),
        out(in + count * g.in_size),
        in_at(reinterpret_cast<int32_t*>(out + count * g.out_size)),
        out_at(in_at + tiles),
        values(reinterpret_cast<float*>(out_at + tiles)) {
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t image = t / g.per_image, tile = t % g.per_image;
      const int64_t ty = tile / g.tile_cols, tx = tile % g.tile_cols;
      in_at[t] =
          static_cast<int32_t>(image * g.in_size + W::kOut * (ty * g.in_stride + tx));
      out_at[t] =
          static_cast<int32_t>(image * g.out_size + W::kOut * (ty * g.out_stride + tx));
    }
  }
  int64_t tiles;
  float* in;
  float* out;
  int32_t* in_at;
  int32_t* out_at;
  float* values;
};

// to[y · to_row + x] = from[y · from_row + x] for a block of rows x cols: a loop, not a memcpy
// call per row (ResNet's rows are 4-32 floats, and the calls cost more than the copies).
[[gnu::always_inline]] inline void CopyRows(const float* from, int64_t from_row, float* to,
                                            int64_t to_row, int64_t rows, int64_t cols) {
  for (int64_t y = 0; y < rows; ++y) {
    const float* f = from + y * from_row;
    float* t = to + y * to_row;
    RINGMASTER_IVDEP
    for (int64_t x = 0; x < cols; ++x) t[x] = f[x];
  }
}

// Filters the weight transforms take at once: their taps go tap-major into a block on the
// stack, so that the transforms run over unit-stride rows of filters.
constexpr int64_t kFilterBlock = 512;

// U_ξ[o][c] = (G g Gᵀ)_ξ for the filters g = weight[o][c] (3x3) in [begin, end).
template <class W>
RINGMASTER_CLONES void TransformWeights(
    const StridedConv2dShape& s, const float* weight, float* u, int64_t begin, int64_t end) {
  const int64_t us = PositionStride(s.out_channels, s.in_channels);
  alignas(64) float taps[9][kFilterBlock];
  for (int64_t b = begin; b < end; b += kFilterBlock) {
    const int64_t n = std::min(kFilterBlock, end - b);
    for (int64_t f = 0; f < n; ++f) {
      for (int k = 0; k < 9; ++k) taps[k][f] = weight[(b + f) * 9 + k];
    }
    float* out = u + b;
    RINGMASTER_IVDEP
    for (int64_t f = 0; f < n; ++f) {
      Transform2d<3, W::kIn, W::Filter>(
          [&](int k, int q) { return taps[k * 3 + q][f]; },
          [&](int i, int j, float v) { out[(i * W::kIn + j) * us + f] = v; });
    }
  }
}

// weight[o][c] (+)= Gᵀ dU_ξ G for the filters in [begin, end), the weights' gradient from U's.
template <class W>
RINGMASTER_CLONES void WeightGradientsFromTransformed(
    const StridedConv2dShape& s, const float* du, float* dweight, OutputMode mode, int64_t begin,
    int64_t end) {
  const int64_t us = PositionStride(s.out_channels, s.in_channels);
  alignas(64) float taps[9][kFilterBlock];
  for (int64_t b = begin; b < end; b += kFilterBlock) {
    const int64_t n = std::min(kFilterBlock, end - b);
    const float* in = du + b;
    RINGMASTER_IVDEP
    for (int64_t f = 0; f < n; ++f) {
      Transform2d<W::kIn, 3, W::FilterAdjoint>(
          [&](int k, int q) { return in[(k * W::kIn + q) * us + f]; },
          [&](int i, int j, float v) { taps[i * 3 + j][f] = v; });
    }
    for (int64_t f = 0; f < n; ++f) {
      float* g = dweight + (b + f) * 9;
      for (int k = 0; k < 9; ++k) {
        g[k] = mode == OutputMode::kOverwrite ? taps[k][f] : g[k] + taps[k][f];
      }
    }
  }
}

// The four transforms of the images' tiles below are separable: the 1-D transform runs down
// the columns of a whole row of tiles at once (unit-stride rows, which vectorise; the tiles
// of a row share their overlapping columns), then along each tile's rows. A plane at a time,
// through `work`: a padded input plane, a whole-tile output plane and [kIn] rows of the
// column pass (Geometry::work).
template <class W>
struct PlaneWork {
  PlaneWork(const Geometry<W>& g, float* work)
      : pad(work), whole(pad + g.in_size), half(whole + g.out_size) {}
  float* pad;    // [in_size]: an input plane padded by one, zeros past the image
  float* whole;  // [out_size]: an output plane to whole tiles, zeros past the image
  float* half;   // [kIn][in_stride]: the column pass of a row of tiles
};

// out[(a · kIn + j) · stride + ty · tile_cols + tx] = (T p Tᵀ)[a][j] for every tile of one
// plane, T = kApply (kRows values to kIn): tile (ty, tx) is the kRows x kRows block of `plane`
// (rows `row` floats apart) at (kOut · ty, kOut · tx). T runs down the columns of a whole row
// of tiles into `half` ([kIn][row]), then along each tile's rows.
template <class W, int kRows, void (*kApply)(const float*, float*)>
[[gnu::always_inline]] inline void SpreadTiles(const Geometry<W>& g, const float* plane,
                                               int64_t row, float* half, float* out,
                                               int64_t stride) {
  const int64_t cols = g.tile_cols;
  for (int64_t ty = 0; ty < g.tile_rows; ++ty, out += cols) {
    const float* top = plane + W::kOut * ty * row;
    RINGMASTER_IVDEP
    for (int64_t x = 0; x < row; ++x) {
      float column[kRows], spread[W::kIn];
      for (int k = 0; k < kRows; ++k) column[k] = top[k * row + x];
      kApply(column, spread);
      for (int a = 0; a < W::kIn; ++a) half[a * row + x] = spread[a];
    }
    for (int a = 0; a < W::kIn; ++a) {
      const float* h = half + a * row;
      float* to = out + a * W::kIn * stride;
      RINGMASTER_IVDEP
      for (int64_t tx = 0; tx < cols; ++tx) {
        float values[kRows], spread[W::kIn];
        for (int q = 0; q < kRows; ++q) values[q] = h[W::kOut * tx + q];
        kApply(values, spread);
        for (int j = 0; j < W::kIn; ++j) to[j * stride + tx] = spread[j];
      }
    }
  }
}

// V_ξ[c][t] = (Bᵀ d B)_ξ for the chunk's tiles (t = image · per_image + ty · tile_cols + tx).
template <class W>
RINGMASTER_CLONES void TransformInput(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* images, int64_t count,
    float* v, float* work) {
  const PlaneWork<W> w(g, work);
  const int64_t n = count * g.per_image, ct = PositionStride(s.in_channels, n);
  const int64_t plane = s.height * s.width, row = g.in_stride;
  std::fill_n(w.pad, g.in_size, 0.0f);  // borders stay zero; insides are each plane's
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(images + (i * s.in_channels + c) * plane, s.width, w.pad + row + 1, row,
               s.height, s.width);
      SpreadTiles<W, W::kIn, W::Input>(g, w.pad, row, w.half, v + c * n + i * g.per_image, ct);
    }
  }
}

// Z_ξ[o][t] = (A dy Aᵀ)_ξ: each tile's output gradient (zeros past the edges) spread to the
// positions.
template <class W>
RINGMASTER_CLONES void TransformOutputGradient(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* dy, int64_t count, float* z,
    float* work) {
  const PlaneWork<W> w(g, work);
  const int64_t n = count * g.per_image, ot = PositionStride(s.out_channels, n);
  const int64_t plane = s.height * s.width, row = g.out_stride;
  std::fill_n(w.whole, g.out_size, 0.0f);  // zeros past the image
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(dy + (i * s.out_channels + o) * plane, s.width, w.whole, row, s.height, s.width);
      SpreadTiles<W, W::kOut, W::OutputAdjoint>(g, w.whole, row, w.half,
                                                z + o * n + i * g.per_image, ot);
    }
  }
}

// y's tiles = Aᵀ M_ξ A (the part inside the image): Aᵀ along each tile's rows of M, then
// down the columns of the row of tiles.
template <class W>
RINGMASTER_CLONES void TransformOutput(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* m, int64_t count, float* y,
    float* work) {
  const PlaneWork<W> w(g, work);
  const int64_t n = count * g.per_image, ot = PositionStride(s.out_channels, n);
  const int64_t plane = s.height * s.width, row = g.out_stride, cols = g.tile_cols;
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t i = 0; i < count; ++i) {
      const float* in = m + o * n + i * g.per_image;
      for (int64_t ty = 0; ty < g.tile_rows; ++ty, in += cols) {
        for (int r = 0; r < W::kIn; ++r) {
          const float* from = in + r * W::kIn * ot;
          float* h = w.half + r * row;
          RINGMASTER_IVDEP
          for (int64_t tx = 0; tx < cols; ++tx) {
            float mr[W::kIn], yr[W::kOut];
            for (int q = 0; q < W::kIn; ++q) mr[q] = from[q * ot + tx];
            W::Output(mr, yr);
            for (int b = 0; b < W::kOut; ++b) h[W::kOut * tx + b] = yr[b];
          }
        }
        float* top = w.whole + W::kOut * ty * row;
        RINGMASTER_IVDEP
        for (int64_t x = 0; x < row; ++x) {
          float mc[W::kIn], yc[W::kOut];
          for (int r = 0; r < W::kIn; ++r) mc[r] = w.half[r * row + x];
          W::Output(mc, yc);
          for (int k = 0; k < W::kOut; ++k) top[k * row + x] = yc[k];
        }
      }
      CopyRows(w.whole, row, y + (i * s.out_channels + o) * plane, s.width, s.height, s.width);
    }
  }
}

// dx = B dV_ξ Bᵀ folded back onto the overlapping input tiles, the adjoint of TransformInput:
// B along each tile's rows, added into the row of tiles' columns (neighbours overlap), then B
// down the columns, added into the padded plane (rows of tiles overlap), whose inside is dx.
template <class W>
RINGMASTER_CLONES void FoldInputGradient(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* dv, int64_t count, float* dx,
    float* work) {
  const PlaneWork<W> w(g, work);
  const int64_t n = count * g.per_image, ct = PositionStride(s.in_channels, n);
  const int64_t plane = s.height * s.width, row = g.in_stride, cols = g.tile_cols;
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t i = 0; i < count; ++i) {
      std::fill_n(w.pad, g.in_size, 0.0f);
      const float* in = dv + c * n + i * g.per_image;
      for (int64_t ty = 0; ty < g.tile_rows; ++ty, in += cols) {
        std::fill_n(w.half, W::kIn * row, 0.0f);
        for (int a = 0; a < W::kIn; ++a) {
          const float* from = in + a * W::kIn * ct;
          float* h = w.half + a * row;
          for (int64_t tx = 0; tx < cols; ++tx) {  // neighbours overlap: no IVDEP
            float gr[W::kIn], d[W::kIn];
            for (int j = 0; j < W::kIn; ++j) gr[j] = from[j * ct + tx];
            W::InputAdjoint(gr, d);
            for (int q = 0; q < W::kIn; ++q) h[W::kOut * tx + q] += d[q];
          }
        }
        float* top = w.pad + W::kOut * ty * row;
        RINGMASTER_IVDEP
        for (int64_t x = 0; x < row; ++x) {
          float gc[W::kIn], d[W::kIn];
          for (int a = 0; a < W::kIn; ++a) gc[a] = w.half[a * row + x];
          W::InputAdjoint(gc, d);
          for (int k = 0; k < W::kIn; ++k) top[k * row + x] += d[k];
        }
      }
      CopyRows(w.pad + row + 1, row, dx + (i * s.in_channels + c) * plane, s.width, s.height,
               s.width);
    }
  }
}

// The same four transforms for maps of few tiles a row, a tile at a time over a channel's
// tiles of the whole chunk, through tables of their corners in the chunk's planes (Planes):
// there a row of tiles is too short for the column pass to gain.
//
// V_ξ[c][t] = (Bᵀ d B)_ξ.
template <class W>
RINGMASTER_CLONES void TransformInputTiles(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* images, int64_t count,
    float* v, float* work) {
  const Planes<W> p(g, count, work);
  const int64_t n = p.tiles, ct = PositionStride(s.in_channels, n), plane = s.height * s.width;
  const int64_t row = g.in_stride;
  std::fill_n(p.in, count * g.in_size, 0.0f);  // borders stay zero; insides are each channel's
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(images + (i * s.in_channels + c) * plane, s.width, p.in + i * g.in_size + row + 1,
               row, s.height, s.width);
    }
    float* out = v + c * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      const float* d = p.in + p.in_at[t];
      Transform2d<W::kIn, W::kIn, W::Input>(
          [&](int k, int q) { return d[k * row + q]; },
          [&](int i, int j, float x) { out[(i * W::kIn + j) * ct + t] = x; });
    }
  }
}

// Z_ξ[o][t] = (A dy Aᵀ)_ξ.
template <class W>
RINGMASTER_CLONES void TransformOutputGradientTiles(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* dy, int64_t count, float* z,
    float* work) {
  const Planes<W> p(g, count, work);
  const int64_t n = p.tiles, ot = PositionStride(s.out_channels, n), plane = s.height * s.width;
  const int64_t row = g.out_stride;
  std::fill_n(p.out, count * g.out_size, 0.0f);  // zeros past the planes' edges
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(dy + (i * s.out_channels + o) * plane, s.width, p.out + i * g.out_size, row,
               s.height, s.width);
    }
    float* out = z + o * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      const float* a = p.out + p.out_at[t];
      Transform2d<W::kOut, W::kIn, W::OutputAdjoint>(
          [&](int k, int q) { return a[k * row + q]; },
          [&](int i, int j, float x) { out[(i * W::kIn + j) * ot + t] = x; });
    }
  }
}

// y's tiles = Aᵀ M_ξ A.
template <class W>
RINGMASTER_CLONES void TransformOutputTiles(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* m, int64_t count, float* y,
    float* work) {
  const Planes<W> p(g, count, work);
  const int64_t n = p.tiles, ot = PositionStride(s.out_channels, n), plane = s.height * s.width;
  const int64_t row = g.out_stride;
  for (int64_t o = 0; o < s.out_channels; ++o) {
    const float* in = m + o * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      float* e = p.out + p.out_at[t];
      Transform2d<W::kIn, W::kOut, W::Output>(
          [&](int k, int q) { return in[(k * W::kIn + q) * ot + t]; },
          [&](int i, int j, float x) { e[i * row + j] = x; });
    }
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(p.out + i * g.out_size, row, y + (i * s.out_channels + o) * plane, s.width,
               s.height, s.width);
    }
  }
}

// dx = B dV_ξ Bᵀ folded back: each tile's values, then added into the padded planes a
// position at a time (the tiles of one position never overlap).
template <class W>
RINGMASTER_CLONES void FoldInputGradientTiles(
    const StridedConv2dShape& s, const Geometry<W>& g, const float* dv, int64_t count, float* dx,
    float* work) {
  const Planes<W> p(g, count, work);
  const int64_t n = p.tiles, ct = PositionStride(s.in_channels, n), plane = s.height * s.width;
  const int64_t row = g.in_stride;
  float* values = p.values;  // [ξ][n]
  for (int64_t c = 0; c < s.in_channels; ++c) {
    const float* in = dv + c * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      Transform2d<W::kIn, W::kIn, W::InputAdjoint>(
          [&](int k, int q) { return in[(k * W::kIn + q) * ct + t]; },
          [&](int i, int j, float x) { values[(i * W::kIn + j) * n + t] = x; });
    }
    std::fill_n(p.in, count * g.in_size, 0.0f);
    for (int rq = 0; rq < kPositions<W>; ++rq) {
      const int64_t off = (rq / W::kIn) * row + rq % W::kIn;
      const float* from = values + rq * n;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) p.in[p.in_at[t] + off] += from[t];
    }
    for (int64_t i = 0; i < count; ++i) {
      CopyRows(p.in + i * g.in_size + row + 1, row, dx + (i * s.in_channels + c) * plane, s.width,
               s.height, s.width);
    }
  }
}

// Each transform by rows of tiles, or a tile at a time where the rows are short.
constexpr int64_t kRowTiles = 4;
template <class W>
void Input(const StridedConv2dShape& s, const Geometry<W>& g, const float* x, int64_t count,
           float* v, float* work) {
  if (g.tile_cols < kRowTiles) return TransformInputTiles(s, g, x, count, v, work);
  TransformInput(s, g, x, count, v, work);
}
template <class W>
void OutputGradient(const StridedConv2dShape& s, const Geometry<W>& g, const float* dy,
                    int64_t count, float* z, float* work) {
  if (g.tile_cols < kRowTiles) return TransformOutputGradientTiles(s, g, dy, count, z, work);
  TransformOutputGradient(s, g, dy, count, z, work);
}
template <class W>
void Output(const StridedConv2dShape& s, const Geometry<W>& g, const float* m, int64_t count,
            float* y, float* work) {
  if (g.tile_cols < kRowTiles) return TransformOutputTiles(s, g, m, count, y, work);
  TransformOutput(s, g, m, count, y, work);
}
template <class W>
void Fold(const StridedConv2dShape& s, const Geometry<W>& g, const float* dv, int64_t count,
          float* dx, float* work) {
  if (g.tile_cols < kRowTiles) return FoldInputGradientTiles(s, g, dv, count, dx, work);
  FoldInputGradient(s, g, dv, count, dx, work);
}

// U from the weights, the filters split over the threads.
template <class W>
void TransformWeightsOnThreads(const StridedConv2dShape& s, const float* weight, float* u) {
  ParallelFor(Threads(s), s.out_channels * s.in_channels,
              [&](int64_t begin, int64_t end) { TransformWeights<W>(s, weight, u, begin, end); });
}

// `u`: the transformed weights, or null to transform them here.
template <class W>
void Forward(const StridedConv2dShape& s, const float* x, const float* weight, const float* u,
             float* y, float* scratch) {
  const Geometry<W> g(s);
  const int64_t us = PositionStride(s.out_channels, s.in_channels), plane = s.height * s.width;
  if (u == nullptr) {
    const Buffers<W> first(s, g, scratch, 0);
    TransformWeightsOnThreads<W>(s, weight, first.u);
    u = first.u;
  }
  ForEachChunkOnThreads(s, g.images, [&](int t, int64_t b, int64_t count) {
    const Buffers<W> buf(s, g, scratch, t);
    const int64_t tiles = count * g.per_image;
    const int64_t vs = PositionStride(s.in_channels, tiles);
    const int64_t ms = PositionStride(s.out_channels, tiles);
    Input(s, g, x + b * s.in_channels * plane, count, buf.v, buf.work);
    for (int xi = 0; xi < kPositions<W>; ++xi) {  // M_ξ = U_ξ V_ξ
      MatMul(Transpose::kNo, Transpose::kNo, s.out_channels, tiles, s.in_channels, u + xi * us,
             buf.v + xi * vs, buf.m + xi * ms, OutputMode::kOverwrite);
    }
    Output(s, g, buf.m, count, y + b * s.out_channels * plane, buf.work);
  });
}

// The weight gradient (dweight, unless null; from x and dy) and the input gradient (dx,
// unless null; from U = `u`, or from `weight` transformed here), in one pass over the chunks:
// each chunk's output gradient is transformed once for both. Both at once need `u`: each
// thread's U in the scratch holds its dU then.
template <class W>
void Backward(const StridedConv2dShape& s, const float* x, const float* weight, const float* u,
              const float* dy, float* dweight, OutputMode mode, float* dx, float* scratch) {
  const Geometry<W> g(s);
  const int64_t us = PositionStride(s.out_channels, s.in_channels), plane = s.height * s.width;
  const int64_t u_elements = TransformedWeightElements<W>(s);
  if (dx != nullptr && u == nullptr) {  // dweight is null
    const Buffers<W> first(s, g, scratch, 0);
    TransformWeightsOnThreads<W>(s, weight, first.u);
    u = first.u;
  }
  if (dweight != nullptr) {
    // Each thread sums its chunks' dU in its own U, zero where it takes none.
    ParallelRun(static_cast<int>(Threads(s)), [&](int t) {
      std::memset(Buffers<W>(s, g, scratch, t).u, 0, u_elements * sizeof(float));
    });
  }
  ForEachChunkOnThreads(s, g.images, [&](int t, int64_t b, int64_t count) {
    const Buffers<W> buf(s, g, scratch, t);
    const int64_t tiles = count * g.per_image;
    const int64_t vs = PositionStride(s.in_channels, tiles);
    const int64_t zs = PositionStride(s.out_channels, tiles);
    OutputGradient(s, g, dy + b * s.out_channels * plane, count, buf.m, buf.work);
    if (dweight != nullptr) {
      Input(s, g, x + b * s.in_channels * plane, count, buf.v, buf.work);
      for (int xi = 0; xi < kPositions<W>; ++xi) {  // dU_ξ += Z_ξ V_ξᵀ
        MatMul(Transpose::kNo, Transpose::kYes, s.out_channels, s.in_channels, tiles,
               buf.m + xi * zs, buf.v + xi * vs, buf.u + xi * us, OutputMode::kAccumulate);
      }
    }
    if (dx != nullptr) {
      for (int xi = 0; xi < kPositions<W>; ++xi) {  // dV_ξ = U_ξᵀ Z_ξ, over V
        MatMul(Transpose::kYes, Transpose::kNo, s.in_channels, tiles, s.out_channels,
               u + xi * us, buf.m + xi * zs, buf.v + xi * vs, OutputMode::kOverwrite);
      }
      Fold(s, g, buf.v, count, dx + b * s.in_channels * plane, buf.work);
    }
  });
  if (dweight == nullptr) return;
  const Buffers<W> first(s, g, scratch, 0);
  ParallelFor(Threads(s), u_elements, [&](int64_t begin, int64_t end) {
    for (int t = 1; t < Threads(s); ++t) {
      const float* du = Buffers<W>(s, g, scratch, t).u;
      for (int64_t i = begin; i < end; ++i) first.u[i] += du[i];
    }
  });
  ParallelFor(Threads(s), s.out_channels * s.in_channels, [&](int64_t begin, int64_t end) {
    WeightGradientsFromTransformed<W>(s, first.u, dweight, mode, begin, end);
  });
}

#undef RINGMASTER_IVDEP
#undef RINGMASTER_CLONES

}  // namespace winograd

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
  int64_t elements = 0;
  if (winograd::Dispatch(s, [&](auto w) {
        elements = winograd::ScratchElements<decltype(w)>(s);
      })) {
    return elements;
  }
  return Threads(s) * StridedGeometry(s).per_thread();
}

int64_t StridedConv2dPreparedWeightElements(const StridedConv2dShape& s) {
  int64_t elements = 0;
  winograd::Dispatch(
      s, [&](auto w) { elements = winograd::TransformedWeightElements<decltype(w)>(s); });
  return elements;
}

void StridedConv2dPrepareWeights(const StridedConv2dShape& s, const float* weight,
                                 float* prepared) {
  winograd::Dispatch(s, [&](auto w) {
    winograd::TransformWeightsOnThreads<decltype(w)>(s, weight, prepared);
  });
}

void StridedConv2dForward(const StridedConv2dShape& s, const float* x, const float* weight,
                          float* y, float* scratch, const float* prepared) {
  if (winograd::Dispatch(s, [&](auto w) {
        winograd::Forward<decltype(w)>(s, x, weight, prepared, y, scratch);
      })) {
    return;
  }
  const StridedGeometry g(s);
  ForEachChunkOnThreads(s, g.per, [&](int t, int64_t b, int64_t count) {
    float* columns = g.columns_at(scratch, t);
    float* products = g.products_at(scratch, t);
    StridedIm2Col(s, x + b * g.in_image, count, columns);
    float* out = g.per == 1 ? y + b * g.out_image : products;
    MatMul(Transpose::kNo, Transpose::kNo, s.out_channels, count * g.ohw, g.unfolded, weight,
           columns, out, OutputMode::kOverwrite);
    if (g.per > 1) {
      RegroupImages(Regroup::kToNchw, products, count, s.out_channels, g.ohw,
                    y + b * g.out_image);
    }
  });
}

void StridedConv2dBackwardWeights(const StridedConv2dShape& s, const float* x, const float* dy,
                                  float* dweight, OutputMode mode, float* scratch) {
  if (winograd::Dispatch(s, [&](auto w) {
        winograd::Backward<decltype(w)>(s, x, nullptr, nullptr, dy, dweight, mode, nullptr,
                                        scratch);
      })) {
    return;
  }
  const StridedGeometry g(s);
  const int64_t weights = s.out_channels * g.unfolded;
  if (mode == OutputMode::kOverwrite) std::memset(dweight, 0, weights * sizeof(float));
  // Thread 0 adds into dweight; the others into sums of their own, added to it after.
  for (int t = 1; t < Threads(s); ++t) {
    std::memset(g.weight_sum_at(scratch, t), 0, weights * sizeof(float));
  }
  ForEachChunkOnThreads(s, g.per, [&](int t, int64_t b, int64_t count) {
    float* columns = g.columns_at(scratch, t);
    StridedIm2Col(s, x + b * g.in_image, count, columns);
    const float* grad = dy + b * g.out_image;
    if (g.per > 1) {
      float* grouped = g.products_at(scratch, t);
      RegroupImages(Regroup::kToGrouped, grad, count, s.out_channels, g.ohw, grouped);
      grad = grouped;
    }
    MatMul(Transpose::kNo, Transpose::kYes, s.out_channels, g.unfolded, count * g.ohw, grad,
           columns, t == 0 ? dweight : g.weight_sum_at(scratch, t), OutputMode::kAccumulate);
  });
  for (int t = 1; t < Threads(s); ++t) {
    const float* sum = g.weight_sum_at(scratch, t);
    for (int64_t i = 0; i < weights; ++i) dweight[i] += sum[i];
  }
}

void StridedConv2dBackwardInput(const StridedConv2dShape& s, const float* weight, const float* dy,
                                float* dx, float* scratch, const float* prepared) {
  if (winograd::Dispatch(s, [&](auto w) {
        winograd::Backward<decltype(w)>(s, nullptr, weight, prepared, dy, nullptr,
                                        OutputMode::kOverwrite, dx, scratch);
      })) {
    return;
  }
  const StridedGeometry g(s);
  ForEachChunkOnThreads(s, g.per, [&](int t, int64_t b, int64_t count) {
    float* columns = g.columns_at(scratch, t);
    const float* grad = dy + b * g.out_image;
    if (g.per > 1) {
      float* grouped = g.products_at(scratch, t);
      RegroupImages(Regroup::kToGrouped, grad, count, s.out_channels, g.ohw, grouped);
      grad = grouped;
    }
    MatMul(Transpose::kYes, Transpose::kNo, g.unfolded, count * g.ohw, s.out_channels, weight,
           grad, columns, OutputMode::kOverwrite);
    std::memset(dx + b * g.in_image, 0, count * g.in_image * sizeof(float));
    StridedCol2ImAdd(s, columns, count, dx + b * g.in_image);
  });
}

void StridedConv2dBackward(const StridedConv2dShape& s, const float* x, const float* weight,
                           const float* dy, float* dweight, OutputMode mode, float* dx,
                           float* scratch, const float* prepared) {
  if (prepared != nullptr && winograd::Dispatch(s, [&](auto w) {
        winograd::Backward<decltype(w)>(s, x, weight, prepared, dy, dweight, mode, dx, scratch);
      })) {
    return;
  }
  StridedConv2dBackwardWeights(s, x, dy, dweight, mode, scratch);
  StridedConv2dBackwardInput(s, weight, dy, dx, scratch, prepared);
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
