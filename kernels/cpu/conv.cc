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


// Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray 2016) for 3x3 convolutions with
// stride 1 and padding 1, the bulk of ResNet's work: each 2x2 output tile is
// Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A for the 4x4 input tile d around it, so that the products run over
// the 16 transformed positions ξ (16 multiplications per tile instead of 36): per ξ,
// M_ξ [out, tiles] = U_ξ [out, in] · V_ξ [in, tiles]. The backward passes are the exact
// adjoints: with Z = A dy Aᵀ (a tile's 2x2 output gradient spread to 4x4), the weight
// gradient is Gᵀ (Σ_tiles Z_ξ V_ξᵀ) G and the input gradient B (U_ξᵀ Z_ξ) Bᵀ folded back
// onto the overlapping input tiles. Rounding differs from the unfolded product's by a few
// units in the last place of the sums (the transforms add and halve).
namespace winograd {

// "No loop-carried dependences": the transforms' rows never overlap, which GCC cannot prove
// through the many pointers (clang, which builds this only for its thread-safety analysis,
// gets nothing).
#if defined(__clang__)
#define RINGMASTER_IVDEP
#else
#define RINGMASTER_IVDEP _Pragma("GCC ivdep")
#endif

constexpr int kPositions = 16;  // ξ: the 4x4 transformed tile
// Tiles per product the chunks aim for (as kTargetColumns for the unfolded route).
constexpr int64_t kTargetTiles = 256;
// Smallest feature map (side) that runs Winograd (ResNet-18's 4x4 maps gain 1.2x; smaller
// ones were not measured; kernels/conv_bench). Maps of at most kPlaneTiles tiles (8x8) are
// transformed a channel's planes of the chunk at a time, larger ones a row of tiles at a time.
constexpr int64_t kMinSide = 4;
constexpr int64_t kPlaneTiles = 16;

// Floats from one transformed position ξ to the next in U ([16][out][in]), V, M and Z
// ([16][channels][tiles]): the matrix and a cache line more. ResNet's channels·tiles are powers
// of two, and the transforms read or write all 16 positions of a tile at once: 16 streams a
// power of two apart fall into one set of the 12-way L1 cache and evict each other (without
// the extra line, kernels/conv_bench's four stages took 1.2x as long).
constexpr int64_t kStagger = 16;
inline int64_t PositionStride(int64_t rows, int64_t cols) { return rows * cols + kStagger; }

// Used where the products are large enough to run BLAS near its peak.
bool Applies(const StridedConv2dShape& s) {
  return s.winograd && s.kernel_size == 3 && s.stride == 1 && s.padding == 1 &&
         s.in_channels >= 16 && s.out_channels >= 16 && s.height >= kMinSide &&
         s.width >= kMinSide;
}

// Floats of U, the transformed weights.
int64_t TransformedWeightElements(const StridedConv2dShape& s) {
  return kPositions * PositionStride(s.out_channels, s.in_channels);
}

struct Geometry {
  explicit Geometry(const StridedConv2dShape& s)
      : tile_rows((s.height + 1) / 2),
        tile_cols((s.width + 1) / 2),
        per_image(tile_rows * tile_cols),
        images(std::clamp<int64_t>((kTargetTiles + per_image - 1) / per_image, 1,
                                   ImagesPerThread(s))),
        tiles(images * per_image),
        work(std::max<int64_t>({64 * (tile_cols + 2),
                                 // the plane transforms' (PlaneWorkParts): planes, corners, values
                                 images * ((2 * tile_rows + 2) * (2 * tile_cols + 2) +
                                           4 * tile_rows * tile_cols + 18 * per_image)})) {}
  int64_t tile_rows, tile_cols, per_image, images, tiles;
  int64_t work;  // floats of the transforms' own rows
};

// Each thread's part of the scratch: U (or its gradient) [16, out, in] (thread 0's is the
// transformed weights all threads read), one chunk's V (or the input's transformed gradient)
// [16, in, tiles] and M (or Z) [16, out, tiles], each dense for the chunk's tiles, and the
// transforms' work rows.
struct Buffers {
  Buffers(const StridedConv2dShape& s, const Geometry& g, float* scratch, int thread)
      : u(scratch + thread * PerThread(s, g)),
        v(u + kPositions * PositionStride(s.out_channels, s.in_channels)),
        m(v + kPositions * PositionStride(s.in_channels, g.tiles)),
        work(m + kPositions * PositionStride(s.out_channels, g.tiles)) {}
  static int64_t PerThread(const StridedConv2dShape& s, const Geometry& g) {
    return kPositions * (PositionStride(s.out_channels, s.in_channels) +
                         PositionStride(s.in_channels, g.tiles) +
                         PositionStride(s.out_channels, g.tiles)) +
           g.work;
  }
  float* u;
  float* v;
  float* m;
  float* work;
};

int64_t ScratchElements(const StridedConv2dShape& s) {
  return Threads(s) * Buffers::PerThread(s, Geometry(s));
}

// Filters the weight transforms take at once: their taps go tap-major into a block on the
// stack, so that both passes run over unit-stride rows.
constexpr int64_t kFilterBlock = 512;

// U_ξ[o][c] = (G g Gᵀ)_ξ for the filters g = weight[o][c] (3x3) in [begin, end),
// G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1].
__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformWeights(
    const StridedConv2dShape& s, const float* weight, float* u, int64_t begin, int64_t end) {
  const int64_t us = PositionStride(s.out_channels, s.in_channels);
  alignas(64) float taps[9][kFilterBlock];
  for (int64_t b = begin; b < end; b += kFilterBlock) {
    const int64_t n = std::min(kFilterBlock, end - b);
    for (int64_t f = 0; f < n; ++f) {
      for (int k = 0; k < 9; ++k) taps[k][f] = weight[(b + f) * 9 + k];
    }
    for (int i = 0; i < 4; ++i) {
      float* out = u + (i * 4) * us + b;
      RINGMASTER_IVDEP
      for (int64_t f = 0; f < n; ++f) {
        float t[3];  // row i of G g
        for (int j = 0; j < 3; ++j) {
          const float g0 = taps[j][f], g1 = taps[3 + j][f], g2 = taps[6 + j][f];
          t[j] = i == 0 ? g0 : i == 1 ? 0.5f * (g0 + g1 + g2) : i == 2 ? 0.5f * (g0 - g1 + g2) : g2;
        }
        out[f] = t[0];
        out[us + f] = 0.5f * (t[0] + t[1] + t[2]);
        out[2 * us + f] = 0.5f * (t[0] - t[1] + t[2]);
        out[3 * us + f] = t[2];
      }
    }
  }
}

// weight[o][c] (+)= Gᵀ dU_ξ G for the filters in [begin, end), the weights' gradient from U's.
__attribute__((target_clones("avx512f", "avx2", "default"))) void WeightGradientsFromTransformed(
    const StridedConv2dShape& s, const float* du, float* dweight, OutputMode mode, int64_t begin,
    int64_t end) {
  const int64_t us = PositionStride(s.out_channels, s.in_channels);
  alignas(64) float taps[9][kFilterBlock];  // (Gᵀ dU G)[i][j] at [i·3 + j]
  for (int64_t b = begin; b < end; b += kFilterBlock) {
    const int64_t n = std::min(kFilterBlock, end - b);
    const float* in = du + b;
    for (int i = 0; i < 3; ++i) {
      RINGMASTER_IVDEP
      for (int64_t f = 0; f < n; ++f) {
        float t[4];  // row i of Gᵀ dU
        for (int j = 0; j < 4; ++j) {
          const float u0 = in[j * us + f], u1 = in[(4 + j) * us + f];
          const float u2 = in[(8 + j) * us + f], u3 = in[(12 + j) * us + f];
          t[j] = i == 0 ? u0 + 0.5f * (u1 + u2) : i == 1 ? 0.5f * (u1 - u2) : 0.5f * (u1 + u2) + u3;
        }
        taps[i * 3 + 0][f] = t[0] + 0.5f * (t[1] + t[2]);
        taps[i * 3 + 1][f] = 0.5f * (t[1] - t[2]);
        taps[i * 3 + 2][f] = 0.5f * (t[1] + t[2]) + t[3];
      }
    }
    for (int64_t f = 0; f < n; ++f) {
      float* g = dweight + (b + f) * 9;
      for (int k = 0; k < 9; ++k) {
        g[k] = mode == OutputMode::kOverwrite ? taps[k][f] : g[k] + taps[k][f];
      }
    }
  }
}

// Z = A dy Aᵀ for one tile, A = [1 0; 1 1; 1 -1; 0 -1]: its 2x2 output gradient (a00 a01;
// a10 a11) spread to the 16 positions, out[ξ · stride].
[[gnu::always_inline]] inline void SpreadTile(float a00, float a01, float a10, float a11,
                                              float* out, int64_t stride) {
  const float r[4][2] = {{a00, a01}, {a00 + a10, a01 + a11}, {a00 - a10, a01 - a11},
                         {-a10, -a11}};
  for (int k = 0; k < 4; ++k) {
    out[(k * 4 + 0) * stride] = r[k][0];
    out[(k * 4 + 1) * stride] = r[k][0] + r[k][1];
    out[(k * 4 + 2) * stride] = r[k][0] - r[k][1];
    out[(k * 4 + 3) * stride] = -r[k][1];
  }
}

// Y = Aᵀ M A for one tile: its 16 products in[ξ · stride] collapsed to the 2x2 output.
[[gnu::always_inline]] inline void CollapseTile(const float* in, int64_t stride, float& y00,
                                                float& y01, float& y10, float& y11) {
  float r[2][4];  // Aᵀ over the rows: m0 + m1 + m2, m1 - m2 - m3
  for (int j = 0; j < 4; ++j) {
    const float m0 = in[(0 * 4 + j) * stride], m1 = in[(1 * 4 + j) * stride];
    const float m2 = in[(2 * 4 + j) * stride], m3 = in[(3 * 4 + j) * stride];
    r[0][j] = m0 + m1 + m2;
    r[1][j] = m1 - m2 - m3;
  }
  y00 = r[0][0] + r[0][1] + r[0][2];
  y01 = r[0][1] - r[0][2] - r[0][3];
  y10 = r[1][0] + r[1][1] + r[1][2];
  y11 = r[1][1] - r[1][2] - r[1][3];
}

// Row iy of a plane, zero-padded by one column on the left (and zeros past its end, or all
// zeros outside the plane), split into its even and odd padded columns: even[k] = column
// 2k - 1, odd[k] = column 2k, for k in [0, n).
inline void SplitPaddedRow(const float* plane, int64_t height, int64_t width, int64_t iy,
                           int64_t n, float* __restrict__ even, float* __restrict__ odd) {
  if (iy < 0 || iy >= height) {
    std::fill_n(even, n, 0.0f);
    std::fill_n(odd, n, 0.0f);
    return;
  }
  const float* __restrict__ row = plane + iy * width;
  // Pairs (2k - 1, 2k) inside the row: k in [1, width / 2]; n = ceil(width / 2) + 1.
  const int64_t pairs = width / 2;
  even[0] = 0.0f;
  odd[0] = row[0];
  for (int64_t k = 1; k <= pairs - (width % 2 == 0 ? 1 : 0); ++k) {
    even[k] = row[2 * k - 1];
    odd[k] = row[2 * k];
  }
  for (int64_t k = std::max<int64_t>(1, pairs + (width % 2 == 0 ? 0 : 1)); k < n; ++k) {
    const int64_t xe = 2 * k - 1;
    even[k] = xe < width ? row[xe] : 0.0f;
    odd[k] = 0.0f;
  }
}

// V_ξ[c][t] = (Bᵀ d B)_ξ for `count` images' tiles (t = image · per_image + ty · tile_cols +
// tx), Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. Tile (ty, tx) reads padded rows
// 2ty .. 2ty + 3 and padded columns 2tx .. 2tx + 3: even[tx], odd[tx], even[tx + 1],
// odd[tx + 1] of each row, so that every loop runs over unit-stride rows of tiles.
__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformInput(
    const StridedConv2dShape& s, const Geometry& g, const float* images, int64_t count,
    float* v, float* work) {
  const int64_t cols = g.tile_cols, n = cols + 1, tiles = count * g.per_image;
  const int64_t plane_size = s.height * s.width, ct = PositionStride(s.in_channels, tiles);
  float* even = work;        // [4][n]: the tile row's four padded rows
  float* odd = even + 4 * n;  // [4][n]
  float* te = odd + 4 * n;    // [4][n]: Bᵀ over the rows, even and odd columns
  float* to = te + 4 * n;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < s.in_channels; ++c) {
      const float* plane = images + (i * s.in_channels + c) * plane_size;
      for (int64_t ty = 0; ty < g.tile_rows; ++ty) {
        // Padded rows 2ty and 2ty + 1 were the last tile row's third and fourth.
        if (ty > 0) {
          std::copy_n(even + 2 * n, 2 * n, even);
          std::copy_n(odd + 2 * n, 2 * n, odd);
        }
        for (int r = ty > 0 ? 2 : 0; r < 4; ++r) {
          SplitPaddedRow(plane, s.height, s.width, 2 * ty - 1 + r, n, even + r * n, odd + r * n);
        }
        RINGMASTER_IVDEP
        for (int64_t k = 0; k < n; ++k) {
          const float e0 = even[k], e1 = even[n + k], e2 = even[2 * n + k], e3 = even[3 * n + k];
          te[k] = e0 - e2;
          te[n + k] = e1 + e2;
          te[2 * n + k] = e2 - e1;
          te[3 * n + k] = e1 - e3;
          const float o0 = odd[k], o1 = odd[n + k], o2 = odd[2 * n + k], o3 = odd[3 * n + k];
          to[k] = o0 - o2;
          to[n + k] = o1 + o2;
          to[2 * n + k] = o2 - o1;
          to[3 * n + k] = o1 - o3;
        }
        float* out = v + c * tiles + i * g.per_image + ty * cols;
        for (int a = 0; a < 4; ++a) {
          const float* re = te + a * n;
          const float* ro = to + a * n;
          float* v0 = out + (a * 4 + 0) * ct;
          float* v1 = out + (a * 4 + 1) * ct;
          float* v2 = out + (a * 4 + 2) * ct;
          float* v3 = out + (a * 4 + 3) * ct;
          RINGMASTER_IVDEP
          for (int64_t tx = 0; tx < cols; ++tx) {
            const float d0 = re[tx], d1 = ro[tx], d2 = re[tx + 1], d3 = ro[tx + 1];
            v0[tx] = d0 - d2;
            v1[tx] = d1 + d2;
            v2[tx] = d2 - d1;
            v3[tx] = d1 - d3;
          }
        }
      }
    }
  }
}

// Z_ξ[o][t] = (A dy Aᵀ)_ξ, A = [1 0; 1 1; 1 -1; 0 -1]: each tile's 2x2 output gradient (zeros
// past the edges) spread to 4x4.
__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformOutputGradient(
    const StridedConv2dShape& s, const Geometry& g, const float* dy, int64_t count, float* z,
    float* work) {
  const int64_t cols = g.tile_cols, plane_size = s.height * s.width;
  const int64_t tiles = count * g.per_image, ot = PositionStride(s.out_channels, tiles);
  float* e = work;  // [2][cols]: the tile row's two rows, even and odd columns
  float* o = e + 2 * cols;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t oc = 0; oc < s.out_channels; ++oc) {
      const float* plane = dy + (i * s.out_channels + oc) * plane_size;
      for (int64_t ty = 0; ty < g.tile_rows; ++ty) {
        for (int r = 0; r < 2; ++r) {
          // Columns 2tx and 2tx + 1 of row 2ty + r: SplitPaddedRow's odd and (one column on)
          // even halves.
          const int64_t y = 2 * ty + r;
          float* er = e + r * cols;
          float* orow = o + r * cols;
          if (y >= s.height) {
            std::fill_n(er, cols, 0.0f);
            std::fill_n(orow, cols, 0.0f);
            continue;
          }
          const float* row = plane + y * s.width;
          RINGMASTER_IVDEP
          for (int64_t tx = 0; tx < cols; ++tx) {
            er[tx] = row[2 * tx];
            orow[tx] = 2 * tx + 1 < s.width ? row[2 * tx + 1] : 0.0f;
          }
        }
        float* out = z + oc * tiles + i * g.per_image + ty * cols;
        RINGMASTER_IVDEP
        for (int64_t tx = 0; tx < cols; ++tx) {
          SpreadTile(e[tx], o[tx], e[cols + tx], o[cols + tx], out + tx, ot);
        }
      }
    }
  }
}

// y's tiles = Aᵀ M_ξ A (the 2x2 inside the image).
__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformOutput(
    const StridedConv2dShape& s, const Geometry& g, const float* m, int64_t count, float* y,
    float* work) {
  const int64_t cols = g.tile_cols, plane_size = s.height * s.width;
  const int64_t tiles = count * g.per_image, ot = PositionStride(s.out_channels, tiles);
  float* y00 = work;  // [cols] each: the tiles' four outputs
  float* y01 = y00 + cols;
  float* y10 = y01 + cols;
  float* y11 = y10 + cols;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t oc = 0; oc < s.out_channels; ++oc) {
      float* plane = y + (i * s.out_channels + oc) * plane_size;
      for (int64_t ty = 0; ty < g.tile_rows; ++ty) {
        const float* in = m + oc * tiles + i * g.per_image + ty * cols;
        RINGMASTER_IVDEP
        for (int64_t tx = 0; tx < cols; ++tx) {
          CollapseTile(in + tx, ot, y00[tx], y01[tx], y10[tx], y11[tx]);
        }
        float* row0 = plane + 2 * ty * s.width;
        RINGMASTER_IVDEP
        for (int64_t x = 0; x < s.width; ++x) row0[x] = (x & 1) ? y01[x >> 1] : y00[x >> 1];
        if (2 * ty + 1 < s.height) {
          float* row1 = row0 + s.width;
          RINGMASTER_IVDEP
          for (int64_t x = 0; x < s.width; ++x) row1[x] = (x & 1) ? y11[x >> 1] : y10[x >> 1];
        }
      }
    }
  }
}

// dx += B dV_ξ Bᵀ folded back onto the overlapping input tiles (inside the image), the
// adjoint of TransformInput: B's rows are Bᵀ's columns, [1 0 0 0; 0 1 -1 1; -1 1 1 0;
// 0 0 0 -1] applied to (x0, x1, x2, x3). Sums go into padded rows split into even and odd
// columns (as TransformInput reads them); a tile row shares two rows with the next.
__attribute__((target_clones("avx512f", "avx2", "default"))) void FoldInputGradient(
    const StridedConv2dShape& s, const Geometry& g, const float* dv, int64_t count, float* dx,
    float* work) {
  const int64_t cols = g.tile_cols, n = cols + 1, plane_size = s.height * s.width;
  const int64_t tiles = count * g.per_image, ct = PositionStride(s.in_channels, tiles);
  float* even = work;          // [4][n]: padded rows 2ty .. 2ty + 3, even columns
  float* odd = even + 4 * n;   // [4][n]
  float* te = odd + 4 * n;     // [4][n]: per row a of the tile, B over its columns
  float* to = te + 4 * n;
  // Adds padded row `r` (padded row index pr) of the accumulators into dx's row pr - 1.
  auto flush = [&](float* plane, int64_t pr, const float* e, const float* o) {
    const int64_t iy = pr - 1;
    if (iy < 0 || iy >= s.height) return;
    float* row = plane + iy * s.width;
    RINGMASTER_IVDEP
    for (int64_t x = 0; x < s.width; ++x) {
      // Column x is padded column x + 1: odd[(x + 1) / 2] for even x, even[(x + 1) / 2] for odd.
      row[x] += (x & 1) ? e[(x + 1) >> 1] : o[x >> 1];
    }
  };
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < s.in_channels; ++c) {
      float* plane = dx + (i * s.in_channels + c) * plane_size;
      std::fill_n(even, 8 * n, 0.0f);  // even and odd
      for (int64_t ty = 0; ty < g.tile_rows; ++ty) {
        const float* in = dv + c * tiles + i * g.per_image + ty * cols;
        std::fill_n(te, 8 * n, 0.0f);  // te and to
        for (int a = 0; a < 4; ++a) {  // B over the columns of the tile's row a
          const float* v0 = in + (a * 4 + 0) * ct;
          const float* v1 = in + (a * 4 + 1) * ct;
          const float* v2 = in + (a * 4 + 2) * ct;
          const float* v3 = in + (a * 4 + 3) * ct;
          float* re = te + a * n;
          float* ro = to + a * n;
          RINGMASTER_IVDEP
          for (int64_t tx = 0; tx < cols; ++tx) {  // columns 0 and 1 of the tile
            re[tx] += v0[tx];
            ro[tx] += v1[tx] - v2[tx] + v3[tx];
          }
          RINGMASTER_IVDEP
          for (int64_t tx = 0; tx < cols; ++tx) {  // columns 2 and 3: one tile on
            re[tx + 1] += v1[tx] + v2[tx] - v0[tx];
            ro[tx + 1] -= v3[tx];
          }
        }
        RINGMASTER_IVDEP
        for (int64_t k = 0; k < n; ++k) {  // then B over the rows
          const float e0 = te[k], e1 = te[n + k], e2 = te[2 * n + k], e3 = te[3 * n + k];
          even[k] += e0;
          even[n + k] += e1 - e2 + e3;
          even[2 * n + k] += e1 + e2 - e0;
          even[3 * n + k] -= e3;
          const float o0 = to[k], o1 = to[n + k], o2 = to[2 * n + k], o3 = to[3 * n + k];
          odd[k] += o0;
          odd[n + k] += o1 - o2 + o3;
          odd[2 * n + k] += o1 + o2 - o0;
          odd[3 * n + k] -= o3;
        }
        // Padded rows 2ty and 2ty + 1 are complete; the next tile row starts at 2ty + 2.
        flush(plane, 2 * ty, even, odd);
        flush(plane, 2 * ty + 1, even + n, odd + n);
        std::copy_n(even + 2 * n, 2 * n, even);
        std::copy_n(odd + 2 * n, 2 * n, odd);
        std::fill_n(even + 2 * n, 2 * n, 0.0f);
        std::fill_n(odd + 2 * n, 2 * n, 0.0f);
      }
      flush(plane, 2 * g.tile_rows, even, odd);
      flush(plane, 2 * g.tile_rows + 1, even + n, odd + n);
    }
  }
}

// The transforms for small maps (kPlaneTiles tiles or fewer per image), a channel's
// planes of the whole chunk at a time: each tile's 16 values are gathered from zero-padded
// copies of the planes through a table of the tiles' corners, so that every loop runs over
// the chunk's tiles of one channel (contiguous in V, M and Z; a row of tiles alone would be
// 2-4 long). `work` holds the padded planes, the corner tables and [16, tiles] values.
struct PlaneLayout {
  PlaneLayout(const Geometry& g, int64_t count)
      : in_stride(2 * g.tile_cols + 2),
        in_size((2 * g.tile_rows + 2) * in_stride),
        out_stride(2 * g.tile_cols),
        out_size(2 * g.tile_rows * out_stride),
        tiles(count * g.per_image) {}
  int64_t in_stride, in_size;    // an input plane padded by one (and to whole tiles)
  int64_t out_stride, out_size;  // an output plane to whole tiles
  int64_t tiles;                 // the chunk's, per channel
};


// The work's parts: the padded input planes [count][in_size], the whole-tile output planes
// [count][out_size], each tile's corner in both (image included), and [16][tiles] values.
struct PlaneWorkParts {
  PlaneWorkParts(const Geometry& g, const PlaneLayout& p, int64_t count, float* work)
      : in(work),
        out(in + count * p.in_size),
        in_at(reinterpret_cast<int32_t*>(out + count * p.out_size)),
        out_at(in_at + p.tiles),
        values(reinterpret_cast<float*>(out_at + p.tiles)) {
    for (int64_t t = 0; t < p.tiles; ++t) {
      const int64_t image = t / g.per_image, tile = t % g.per_image;
      const int64_t ty = tile / g.tile_cols, tx = tile % g.tile_cols;
      in_at[t] = static_cast<int32_t>(image * p.in_size + 2 * ty * p.in_stride + 2 * tx);
      out_at[t] = static_cast<int32_t>(image * p.out_size + 2 * ty * p.out_stride + 2 * tx);
    }
  }
  float* in;
  float* out;
  int32_t* in_at;
  int32_t* out_at;
  float* values;
};

__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformInputPlanes(
    const StridedConv2dShape& s, const Geometry& g, const float* images, int64_t count,
    float* v, float* work) {
  const PlaneLayout p(g, count);
  const PlaneWorkParts w(g, p, count, work);
  const int64_t n = p.tiles, ct = PositionStride(s.in_channels, n), plane_size = s.height * s.width;
  float* d = w.values;  // [16][n]: (row r, column q) of each tile
  std::fill_n(w.in, count * p.in_size, 0.0f);  // borders stay zero; insides are each channel's
  for (int64_t c = 0; c < s.in_channels; ++c) {
    for (int64_t i = 0; i < count; ++i) {
      const float* plane = images + (i * s.in_channels + c) * plane_size;
      float* pad = w.in + i * p.in_size;
      for (int64_t y = 0; y < s.height; ++y) {
        std::memcpy(pad + (y + 1) * p.in_stride + 1, plane + y * s.width, s.width * sizeof(float));
      }
    }
    for (int64_t rq = 0; rq < 16; ++rq) {
      const int64_t off = (rq / 4) * p.in_stride + rq % 4;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) d[rq * n + t] = w.in[w.in_at[t] + off];
    }
    for (int q = 0; q < 4; ++q) {  // Bᵀ over the rows, column q: rows of d in place
      float* d0 = d + (0 * 4 + q) * n;
      float* d1 = d + (1 * 4 + q) * n;
      float* d2 = d + (2 * 4 + q) * n;
      float* d3 = d + (3 * 4 + q) * n;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) {
        const float a0 = d0[t], a1 = d1[t], a2 = d2[t], a3 = d3[t];
        d0[t] = a0 - a2;
        d1[t] = a1 + a2;
        d2[t] = a2 - a1;
        d3[t] = a1 - a3;
      }
    }
    float* out = v + c * n;
    for (int a = 0; a < 4; ++a) {  // then B over the columns, into V
      const float* t0 = d + (a * 4 + 0) * n;
      const float* t1 = d + (a * 4 + 1) * n;
      const float* t2 = d + (a * 4 + 2) * n;
      const float* t3 = d + (a * 4 + 3) * n;
      float* v0 = out + (a * 4 + 0) * ct;
      float* v1 = out + (a * 4 + 1) * ct;
      float* v2 = out + (a * 4 + 2) * ct;
      float* v3 = out + (a * 4 + 3) * ct;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) {
        v0[t] = t0[t] - t2[t];
        v1[t] = t1[t] + t2[t];
        v2[t] = t2[t] - t1[t];
        v3[t] = t1[t] - t3[t];
      }
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformOutputGradientPlanes(
    const StridedConv2dShape& s, const Geometry& g, const float* dy, int64_t count, float* z,
    float* work) {
  const PlaneLayout p(g, count);
  const PlaneWorkParts w(g, p, count, work);
  const int64_t n = p.tiles, ot = PositionStride(s.out_channels, n), plane_size = s.height * s.width;
  const int64_t row = p.out_stride;
  std::fill_n(w.out, count * p.out_size, 0.0f);  // zeros past the planes' edges
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t i = 0; i < count; ++i) {
      const float* plane = dy + (i * s.out_channels + o) * plane_size;
      float* whole = w.out + i * p.out_size;
      for (int64_t y = 0; y < s.height; ++y) {
        std::memcpy(whole + y * row, plane + y * s.width, s.width * sizeof(float));
      }
    }
    float* out = z + o * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      const float* e = w.out + w.out_at[t];
      SpreadTile(e[0], e[1], e[row], e[row + 1], out + t, ot);
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void TransformOutputPlanes(
    const StridedConv2dShape& s, const Geometry& g, const float* m, int64_t count, float* y,
    float* work) {
  const PlaneLayout p(g, count);
  const PlaneWorkParts w(g, p, count, work);
  const int64_t n = p.tiles, ot = PositionStride(s.out_channels, n), plane_size = s.height * s.width;
  const int64_t row = p.out_stride;
  for (int64_t o = 0; o < s.out_channels; ++o) {
    const float* in = m + o * n;
    RINGMASTER_IVDEP
    for (int64_t t = 0; t < n; ++t) {
      float* e = w.out + w.out_at[t];
      CollapseTile(in + t, ot, e[0], e[1], e[row], e[row + 1]);
    }
    for (int64_t i = 0; i < count; ++i) {
      float* plane = y + (i * s.out_channels + o) * plane_size;
      const float* whole = w.out + i * p.out_size;
      for (int64_t yy = 0; yy < s.height; ++yy) {
        std::memcpy(plane + yy * s.width, whole + yy * row, s.width * sizeof(float));
      }
    }
  }
}

// dx += B dV_ξ Bᵀ folded back onto the overlapping input tiles, the adjoint of
// TransformInputPlanes: B over the columns, then over the rows ((g0, g1, g2, g3) ->
// (g0, g1 - g2 + g3, g1 + g2 - g0, -g3)), then each tile's 16 values added into the padded
// planes (tiles of one position never overlap), whose insides go to dx.
__attribute__((target_clones("avx512f", "avx2", "default"))) void FoldInputGradientPlanes(
    const StridedConv2dShape& s, const Geometry& g, const float* dv, int64_t count, float* dx,
    float* work) {
  const PlaneLayout p(g, count);
  const PlaneWorkParts w(g, p, count, work);
  const int64_t n = p.tiles, ct = PositionStride(s.in_channels, n), plane_size = s.height * s.width;
  float* d = w.values;  // [16][n]
  for (int64_t c = 0; c < s.in_channels; ++c) {
    const float* in = dv + c * n;
    for (int a = 0; a < 4; ++a) {  // B over the columns of the tiles' row a
      const float* v0 = in + (a * 4 + 0) * ct;
      const float* v1 = in + (a * 4 + 1) * ct;
      const float* v2 = in + (a * 4 + 2) * ct;
      const float* v3 = in + (a * 4 + 3) * ct;
      float* t0 = d + (a * 4 + 0) * n;
      float* t1 = d + (a * 4 + 1) * n;
      float* t2 = d + (a * 4 + 2) * n;
      float* t3 = d + (a * 4 + 3) * n;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) {
        const float g0 = v0[t], g1 = v1[t], g2 = v2[t], g3 = v3[t];
        t0[t] = g0;
        t1[t] = g1 - g2 + g3;
        t2[t] = g1 + g2 - g0;
        t3[t] = -g3;
      }
    }
    for (int q = 0; q < 4; ++q) {  // then over the rows, column q in place
      float* d0 = d + (0 * 4 + q) * n;
      float* d1 = d + (1 * 4 + q) * n;
      float* d2 = d + (2 * 4 + q) * n;
      float* d3 = d + (3 * 4 + q) * n;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) {
        const float g0 = d0[t], g1 = d1[t], g2 = d2[t], g3 = d3[t];
        d0[t] = g0;
        d1[t] = g1 - g2 + g3;
        d2[t] = g1 + g2 - g0;
        d3[t] = -g3;
      }
    }
    std::fill_n(w.in, count * p.in_size, 0.0f);
    for (int64_t rq = 0; rq < 16; ++rq) {
      const int64_t off = (rq / 4) * p.in_stride + rq % 4;
      RINGMASTER_IVDEP
      for (int64_t t = 0; t < n; ++t) w.in[w.in_at[t] + off] += d[rq * n + t];
    }
    for (int64_t i = 0; i < count; ++i) {
      float* plane = dx + (i * s.in_channels + c) * plane_size;
      const float* pad = w.in + i * p.in_size;
      for (int64_t y = 0; y < s.height; ++y) {
        const float* from = pad + (y + 1) * p.in_stride + 1;
        float* to = plane + y * s.width;
        for (int64_t x = 0; x < s.width; ++x) to[x] += from[x];
      }
    }
  }
}

// Each transform by rows of tiles, or by whole planes for small maps.
void Input(const StridedConv2dShape& s, const Geometry& g, const float* x, int64_t count,
           float* v, float* work) {
  if (g.per_image <= kPlaneTiles) return TransformInputPlanes(s, g, x, count, v, work);
  TransformInput(s, g, x, count, v, work);
}
void OutputGradient(const StridedConv2dShape& s, const Geometry& g, const float* dy,
                    int64_t count, float* z, float* work) {
  if (g.per_image <= kPlaneTiles) return TransformOutputGradientPlanes(s, g, dy, count, z, work);
  TransformOutputGradient(s, g, dy, count, z, work);
}
void Output(const StridedConv2dShape& s, const Geometry& g, const float* m, int64_t count,
            float* y, float* work) {
  if (g.per_image <= kPlaneTiles) return TransformOutputPlanes(s, g, m, count, y, work);
  TransformOutput(s, g, m, count, y, work);
}
void FoldInput(const StridedConv2dShape& s, const Geometry& g, const float* dv, int64_t count,
               float* dx, float* work) {
  if (g.per_image <= kPlaneTiles) return FoldInputGradientPlanes(s, g, dv, count, dx, work);
  FoldInputGradient(s, g, dv, count, dx, work);
}

// U from the weights, the filters split over the threads.
void TransformWeightsOnThreads(const StridedConv2dShape& s, const float* weight, float* u) {
  ParallelFor(Threads(s), s.out_channels * s.in_channels,
              [&](int64_t begin, int64_t end) { TransformWeights(s, weight, u, begin, end); });
}

// `u`: the transformed weights, or null to transform them here.
void Forward(const StridedConv2dShape& s, const float* x, const float* weight, const float* u,
             float* y, float* scratch) {
  const Geometry g(s);
  const int64_t oc = PositionStride(s.out_channels, s.in_channels), plane = s.height * s.width;
  if (u == nullptr) {
    const Buffers first(s, g, scratch, 0);
    TransformWeightsOnThreads(s, weight, first.u);
    u = first.u;
  }
  ForEachChunkOnThreads(s, g.images, [&](int t, int64_t b, int64_t count) {
    const Buffers buf(s, g, scratch, t);
    const int64_t tiles = count * g.per_image;
    Input(s, g, x + b * s.in_channels * plane, count, buf.v, buf.work);
    for (int xi = 0; xi < kPositions; ++xi) {  // M_ξ = U_ξ V_ξ
      MatMul(Transpose::kNo, Transpose::kNo, s.out_channels, tiles, s.in_channels, u + xi * oc,
             buf.v + xi * PositionStride(s.in_channels, tiles), buf.m + xi * PositionStride(s.out_channels, tiles),
             OutputMode::kOverwrite);
    }
    Output(s, g, buf.m, count, y + b * s.out_channels * plane, buf.work);
  });
}

void BackwardWeights(const StridedConv2dShape& s, const float* x, const float* dy,
                     float* dweight, OutputMode mode, float* scratch) {
  const Geometry g(s);
  const int64_t oc = PositionStride(s.out_channels, s.in_channels), plane = s.height * s.width;
  // Each thread sums its chunks' dU in its own U, zero where it takes none.
  ParallelRun(static_cast<int>(Threads(s)), [&](int t) {
    std::memset(Buffers(s, g, scratch, t).u, 0, kPositions * oc * sizeof(float));
  });
  ForEachChunkOnThreads(s, g.images, [&](int t, int64_t b, int64_t count) {
    const Buffers buf(s, g, scratch, t);
    const int64_t tiles = count * g.per_image;
    Input(s, g, x + b * s.in_channels * plane, count, buf.v, buf.work);
    OutputGradient(s, g, dy + b * s.out_channels * plane, count, buf.m, buf.work);
    for (int xi = 0; xi < kPositions; ++xi) {  // dU_ξ += Z_ξ V_ξᵀ
      MatMul(Transpose::kNo, Transpose::kYes, s.out_channels, s.in_channels, tiles,
             buf.m + xi * PositionStride(s.out_channels, tiles), buf.v + xi * PositionStride(s.in_channels, tiles),
             buf.u + xi * oc, OutputMode::kAccumulate);
    }
  });
  const Buffers first(s, g, scratch, 0);
  ParallelFor(Threads(s), kPositions * oc, [&](int64_t begin, int64_t end) {
    for (int t = 1; t < Threads(s); ++t) {
      const float* du = Buffers(s, g, scratch, t).u;
      for (int64_t i = begin; i < end; ++i) first.u[i] += du[i];
    }
  });
  ParallelFor(Threads(s), s.out_channels * s.in_channels, [&](int64_t begin, int64_t end) {
    WeightGradientsFromTransformed(s, first.u, dweight, mode, begin, end);
  });
}

void BackwardInput(const StridedConv2dShape& s, const float* weight, const float* u,
                   const float* dy, float* dx, float* scratch) {
  const Geometry g(s);
  const int64_t oc = PositionStride(s.out_channels, s.in_channels), plane = s.height * s.width;
  if (u == nullptr) {
    const Buffers first(s, g, scratch, 0);
    TransformWeightsOnThreads(s, weight, first.u);
    u = first.u;
  }
  ForEachChunkOnThreads(s, g.images, [&](int t, int64_t b, int64_t count) {
    const Buffers buf(s, g, scratch, t);
    const int64_t tiles = count * g.per_image;
    OutputGradient(s, g, dy + b * s.out_channels * plane, count, buf.m, buf.work);
    for (int xi = 0; xi < kPositions; ++xi) {  // dV_ξ = U_ξᵀ Z_ξ
      MatMul(Transpose::kYes, Transpose::kNo, s.in_channels, tiles, s.out_channels,
             u + xi * oc, buf.m + xi * PositionStride(s.out_channels, tiles),
             buf.v + xi * PositionStride(s.in_channels, tiles), OutputMode::kOverwrite);
    }
    float* images = dx + b * s.in_channels * plane;
    std::memset(images, 0, count * s.in_channels * plane * sizeof(float));
    FoldInput(s, g, buf.v, count, images, buf.work);
  });
}

#undef RINGMASTER_IVDEP

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
  if (winograd::Applies(s)) return winograd::ScratchElements(s);
  return Threads(s) * StridedGeometry(s).per_thread();
}

int64_t StridedConv2dPreparedWeightElements(const StridedConv2dShape& s) {
  return winograd::Applies(s) ? winograd::TransformedWeightElements(s) : 0;
}

void StridedConv2dPrepareWeights(const StridedConv2dShape& s, const float* weight,
                                 float* prepared) {
  if (winograd::Applies(s)) winograd::TransformWeightsOnThreads(s, weight, prepared);
}

void StridedConv2dForward(const StridedConv2dShape& s, const float* x, const float* weight,
                          float* y, float* scratch, const float* prepared) {
  if (winograd::Applies(s)) return winograd::Forward(s, x, weight, prepared, y, scratch);
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
  if (winograd::Applies(s)) {
    return winograd::BackwardWeights(s, x, dy, dweight, mode, scratch);
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
  if (winograd::Applies(s)) return winograd::BackwardInput(s, weight, prepared, dy, dx, scratch);
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
