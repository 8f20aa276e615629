// kernels/cuda/conv.h: argument checks, the scratch layout, and the sequence of kernels
// (conv.cu) and products (MatMulEngine) of each convolution.
//
// Only weight, dweight and the scratch reach cuBLASLt: x, y, dy and dx are read or written
// by this file's kernels alone (im2col, the rearrangements, col2im), so the products never
// see a pointer into the middle of a caller's batch. The scratch's parts start on
// 256-byte boundaries from its start.
#include "kernels/cuda/conv.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/conv_launch.h"

namespace ringmaster::kernels::cuda {
namespace {

constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxFloats = int64_t{1} << 60;
constexpr int64_t kPartAlignFloats = 64;  // 256 bytes
constexpr uintptr_t kCublasAlignBytes = 16;

absl::Status Invalid(const char* fn, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(fn, " (CUDA): ", parts...));
}

int64_t RoundUp(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

// Whether a · b stays at most `limit` (a, b >= 0).
bool ProductAtMost(int64_t a, int64_t b, int64_t limit) { return b == 0 || a <= limit / b; }

// Where the parts of a convolution's scratch start, in floats from its start.
struct ScratchLayout {
  int64_t columns = 0;        // [C·k·k, N·H·W] unfolded images
  int64_t channel_major = 0;  // [O, N·H·W] the product before rearranging, or dy rearranged
  int64_t partial = 0;        // [O, kChannelSumLanes] partial sums of dbias
  int64_t total = 0;
};

ScratchLayout Layout(const Conv2dShape& s) {
  const int64_t positions = s.batch * s.height * s.width;
  ScratchLayout l;
  l.channel_major =
      RoundUp(s.in_channels * s.kernel_size * s.kernel_size * positions, kPartAlignFloats);
  l.partial = l.channel_major + RoundUp(s.out_channels * positions, kPartAlignFloats);
  l.total = l.partial + int64_t{internal::kChannelSumLanes} * s.out_channels;
  return l;
}

absl::Status CheckShape(const char* fn, const Conv2dShape& s) {
  const std::pair<int64_t, const char*> fields[] = {{s.batch, "batch"},
                                                    {s.in_channels, "in_channels"},
                                                    {s.out_channels, "out_channels"},
                                                    {s.height, "height"},
                                                    {s.width, "width"},
                                                    {s.kernel_size, "kernel_size"}};
  for (const auto& [v, name] : fields) {
    if (v < 1) return Invalid(fn, "shape.", name, " must be positive, got ", v);
    if (v > kMaxDimension) return Invalid(fn, "shape.", name, " ", v, " exceeds 2^31 - 1");
  }
  if (s.kernel_size % 2 == 0) {
    return Invalid(fn, "shape.kernel_size must be odd, got ", s.kernel_size);
  }
  // Each field is below 2^31, so these products of two fit in int64.
  if (!ProductAtMost(s.in_channels, s.kernel_size * s.kernel_size, kMaxDimension)) {
    return Invalid(fn, "shape.in_channels * kernel_size^2 = ", s.in_channels, " * ", s.kernel_size,
                   "^2 exceeds 2^31 - 1");
  }
  const int64_t taps = s.in_channels * s.kernel_size * s.kernel_size;
  const int64_t hw = s.height * s.width;
  if (!ProductAtMost(s.batch, hw, kMaxDimension)) {
    return Invalid(fn, "shape.batch * height * width = ", s.batch, " * ", s.height, " * ", s.width,
                   " exceeds 2^31 - 1");
  }
  const int64_t positions = s.batch * hw;
  if (!ProductAtMost(taps, positions, kMaxFloats) ||
      !ProductAtMost(s.out_channels, positions, kMaxFloats) ||
      !ProductAtMost(s.in_channels, positions, kMaxFloats) ||
      !ProductAtMost(s.out_channels, taps, kMaxFloats)) {
    return Invalid(fn, "shape's tensors exceed 2^60 floats");
  }
  return absl::OkStatus();
}

absl::Status CheckType(const char* fn, MatMulType type) {
  if (type != MatMulType::kFloat32 && type != MatMulType::kTensorFloat32) {
    return Invalid(fn, "type must be kFloat32 or kTensorFloat32 (fp32 storage), got ",
                   MatMulTypeName(type));
  }
  return absl::OkStatus();
}

absl::Status CheckNotNull(const char* fn,
                          std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  for (const auto& [p, name] : ptrs) {
    if (p == nullptr) return Invalid(fn, name, " is null");
  }
  return absl::OkStatus();
}

absl::Status CheckCublasAligned(const char* fn,
                                std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  for (const auto& [p, name] : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % kCublasAlignBytes != 0) {
      return Invalid(fn, name, " must be ", kCublasAlignBytes,
                     "-byte aligned (cuBLASLt reads it in vectors)");
    }
  }
  return absl::OkStatus();
}

// An argument's memory: `elements` of `bytes_each` from `p` (null: absent).
struct Extent {
  const void* p;
  int64_t elements;
  int64_t bytes_each;
  const char* name;
};

// `written` shares no byte with any of `others` (absent ones and empty ones are skipped).
absl::Status CheckApart(const char* fn, const Extent& written,
                        std::initializer_list<Extent> others) {
  const auto w = reinterpret_cast<uintptr_t>(written.p);
  const auto w_bytes = static_cast<uintptr_t>(written.elements) * written.bytes_each;
  for (const Extent& o : others) {
    if (written.p == nullptr || o.p == nullptr || w_bytes == 0 || o.elements == 0) continue;
    const auto b = reinterpret_cast<uintptr_t>(o.p);
    const auto b_bytes = static_cast<uintptr_t>(o.elements) * o.bytes_each;
    if (w < b + b_bytes && b < w + w_bytes) {
      return Invalid(fn, written.name, " overlaps ", o.name);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckEngine(const char* fn, const MatMulEngine* engine) {
  if (engine == nullptr) return Invalid(fn, "engine is null");
  return absl::OkStatus();
}

absl::Status Launched(cudaError_t err, const char* what) { return CudaToStatus(err, what); }

}  // namespace

int64_t Conv2dCudaScratchFloats(const Conv2dShape& shape) {
  if (shape.batch < 1 || shape.in_channels < 1 || shape.out_channels < 1 || shape.height < 1 ||
      shape.width < 1 || shape.kernel_size < 1) {
    return 0;
  }
  return Layout(shape).total;
}

absl::Status Conv2dForward(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                           const float* x, const float* weight, const float* bias, float* y,
                           float* scratch, cudaStream_t stream) {
  const char* fn = "Conv2dForward";
  RM_RETURN_IF_ERROR(CheckShape(fn, shape));
  RM_RETURN_IF_ERROR(CheckType(fn, type));
  RM_RETURN_IF_ERROR(
      CheckNotNull(fn, {{x, "x"}, {weight, "weight"}, {y, "y"}, {scratch, "scratch"}}));
  RM_RETURN_IF_ERROR(CheckCublasAligned(fn, {{weight, "weight"}, {scratch, "scratch"}}));
  const Conv2dShape& s = shape;
  const int64_t hw = s.height * s.width, positions = s.batch * hw;
  const int64_t taps = s.in_channels * s.kernel_size * s.kernel_size;
  const ScratchLayout layout = Layout(s);
  const Extent ex{x, s.batch * s.in_channels * hw, 4, "x"};
  const Extent ew{weight, s.out_channels * taps, 4, "weight"};
  const Extent eb{bias, s.out_channels, 4, "bias"};
  const Extent ey{y, s.batch * s.out_channels * hw, 4, "y"};
  const Extent es{scratch, layout.total, 4, "scratch"};
  RM_RETURN_IF_ERROR(CheckApart(fn, ey, {ex, ew, eb, es}));
  RM_RETURN_IF_ERROR(CheckApart(fn, es, {ex, ew, eb}));
  RM_RETURN_IF_ERROR(CheckEngine(fn, engine));

  float* columns = scratch + layout.columns;
  float* z = scratch + layout.channel_major;
  RM_RETURN_IF_ERROR(Launched(internal::LaunchIm2Col(x, columns, s.batch, s.in_channels, s.height,
                                                     s.width, s.kernel_size, stream),
                              "Conv2dForward im2col launch"));
  // z [O, N·H·W] = weight [O, C·k·k] · columns [C·k·k, N·H·W].
  RM_RETURN_IF_ERROR(engine->MatMul(type, Transpose::kNo, Transpose::kNo, s.out_channels, positions,
                                    taps, weight, columns, z, OutputMode::kOverwrite, stream));
  return Launched(
      internal::LaunchChannelMajorToImages(z, bias, y, s.batch, s.out_channels, hw, stream),
      "Conv2dForward output launch");
}

absl::Status Conv2dBackwardWeights(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                                   const float* x, const float* dy, float* dweight, float* dbias,
                                   OutputMode mode, float* scratch, cudaStream_t stream) {
  const char* fn = "Conv2dBackwardWeights";
  RM_RETURN_IF_ERROR(CheckShape(fn, shape));
  RM_RETURN_IF_ERROR(CheckType(fn, type));
  RM_RETURN_IF_ERROR(
      CheckNotNull(fn, {{x, "x"}, {dy, "dy"}, {dweight, "dweight"}, {scratch, "scratch"}}));
  RM_RETURN_IF_ERROR(CheckCublasAligned(fn, {{dweight, "dweight"}, {scratch, "scratch"}}));
  const Conv2dShape& s = shape;
  const int64_t hw = s.height * s.width, positions = s.batch * hw;
  const int64_t taps = s.in_channels * s.kernel_size * s.kernel_size;
  const ScratchLayout layout = Layout(s);
  const Extent ex{x, s.batch * s.in_channels * hw, 4, "x"};
  const Extent edy{dy, s.batch * s.out_channels * hw, 4, "dy"};
  const Extent edw{dweight, s.out_channels * taps, 4, "dweight"};
  const Extent edb{dbias, s.out_channels, 4, "dbias"};
  const Extent es{scratch, layout.total, 4, "scratch"};
  RM_RETURN_IF_ERROR(CheckApart(fn, edw, {ex, edy, edb, es}));
  RM_RETURN_IF_ERROR(CheckApart(fn, edb, {ex, edy, es}));
  RM_RETURN_IF_ERROR(CheckApart(fn, es, {ex, edy}));
  RM_RETURN_IF_ERROR(CheckEngine(fn, engine));

  float* columns = scratch + layout.columns;
  float* dy_rows = scratch + layout.channel_major;
  RM_RETURN_IF_ERROR(Launched(
      internal::LaunchImagesToChannelMajor(dy, dy_rows, s.batch, s.out_channels, hw, stream),
      "Conv2dBackwardWeights dy launch"));
  RM_RETURN_IF_ERROR(Launched(internal::LaunchIm2Col(x, columns, s.batch, s.in_channels, s.height,
                                                     s.width, s.kernel_size, stream),
                              "Conv2dBackwardWeights im2col launch"));
  // dweight [O, C·k·k] (+)= dy_rows [O, N·H·W] · columns [C·k·k, N·H·W]ᵀ.
  RM_RETURN_IF_ERROR(engine->MatMul(type, Transpose::kNo, Transpose::kYes, s.out_channels, taps,
                                    positions, dy_rows, columns, dweight, mode, stream));
  if (dbias == nullptr) return absl::OkStatus();
  return Launched(internal::LaunchChannelSums(dy_rows, s.out_channels, positions, dbias,
                                              mode == OutputMode::kAccumulate,
                                              scratch + layout.partial, stream),
                  "Conv2dBackwardWeights dbias launch");
}

absl::Status Conv2dBackwardInput(MatMulEngine* engine, MatMulType type, const Conv2dShape& shape,
                                 const float* weight, const float* dy, float* dx, float* scratch,
                                 cudaStream_t stream) {
  const char* fn = "Conv2dBackwardInput";
  RM_RETURN_IF_ERROR(CheckShape(fn, shape));
  RM_RETURN_IF_ERROR(CheckType(fn, type));
  RM_RETURN_IF_ERROR(
      CheckNotNull(fn, {{weight, "weight"}, {dy, "dy"}, {dx, "dx"}, {scratch, "scratch"}}));
  RM_RETURN_IF_ERROR(CheckCublasAligned(fn, {{weight, "weight"}, {scratch, "scratch"}}));
  const Conv2dShape& s = shape;
  const int64_t hw = s.height * s.width, positions = s.batch * hw;
  const int64_t taps = s.in_channels * s.kernel_size * s.kernel_size;
  const ScratchLayout layout = Layout(s);
  const Extent ew{weight, s.out_channels * taps, 4, "weight"};
  const Extent edy{dy, s.batch * s.out_channels * hw, 4, "dy"};
  const Extent edx{dx, s.batch * s.in_channels * hw, 4, "dx"};
  const Extent es{scratch, layout.total, 4, "scratch"};
  RM_RETURN_IF_ERROR(CheckApart(fn, edx, {ew, edy, es}));
  RM_RETURN_IF_ERROR(CheckApart(fn, es, {ew, edy}));
  RM_RETURN_IF_ERROR(CheckEngine(fn, engine));

  float* columns = scratch + layout.columns;
  float* dy_rows = scratch + layout.channel_major;
  RM_RETURN_IF_ERROR(Launched(
      internal::LaunchImagesToChannelMajor(dy, dy_rows, s.batch, s.out_channels, hw, stream),
      "Conv2dBackwardInput dy launch"));
  // columns [C·k·k, N·H·W] = weight [O, C·k·k]ᵀ · dy_rows [O, N·H·W].
  RM_RETURN_IF_ERROR(engine->MatMul(type, Transpose::kYes, Transpose::kNo, taps, positions,
                                    s.out_channels, weight, dy_rows, columns,
                                    OutputMode::kOverwrite, stream));
  return Launched(internal::LaunchCol2Im(columns, dx, s.batch, s.in_channels, s.height, s.width,
                                         s.kernel_size, stream),
                  "Conv2dBackwardInput col2im launch");
}

namespace {

// The size checks shared by max-pooling forward and backward.
absl::Status CheckPoolSizes(const char* fn, int64_t planes, int64_t height, int64_t width) {
  const std::pair<int64_t, const char*> sizes[] = {
      {planes, "planes"}, {height, "height"}, {width, "width"}};
  for (const auto& [v, name] : sizes) {
    if (v < 1) return Invalid(fn, name, " must be positive, got ", v);
  }
  if (!ProductAtMost(height, width, kMaxDimension)) {
    return Invalid(fn, "height * width = ", height, " * ", width,
                   " exceeds 2^31 - 1 (argmax is int32)");
  }
  if (!ProductAtMost(planes, height * width, kMaxFloats)) {
    return Invalid(fn, "planes * height * width exceeds 2^60");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MaxPool2x2Forward(const float* x, float* y, int32_t* argmax, int64_t planes,
                               int64_t height, int64_t width, cudaStream_t stream) {
  const char* fn = "MaxPool2x2Forward";
  RM_RETURN_IF_ERROR(CheckPoolSizes(fn, planes, height, width));
  const int64_t pooled = planes * (height / 2) * (width / 2);
  RM_RETURN_IF_ERROR(CheckNotNull(fn, {{x, "x"}}));
  if (pooled > 0) RM_RETURN_IF_ERROR(CheckNotNull(fn, {{y, "y"}, {argmax, "argmax"}}));
  const Extent ex{x, planes * height * width, 4, "x"};
  const Extent ey{y, pooled, 4, "y"};
  const Extent ea{argmax, pooled, 4, "argmax"};
  RM_RETURN_IF_ERROR(CheckApart(fn, ey, {ex, ea}));
  RM_RETURN_IF_ERROR(CheckApart(fn, ea, {ex}));
  return Launched(internal::LaunchMaxPool2x2Forward(x, y, argmax, planes, height, width, stream),
                  "MaxPool2x2Forward launch");
}

absl::Status MaxPool2x2Backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes,
                                int64_t height, int64_t width, cudaStream_t stream) {
  const char* fn = "MaxPool2x2Backward";
  RM_RETURN_IF_ERROR(CheckPoolSizes(fn, planes, height, width));
  const int64_t pooled = planes * (height / 2) * (width / 2);
  if (pooled > 0) RM_RETURN_IF_ERROR(CheckNotNull(fn, {{dy, "dy"}, {argmax, "argmax"}}));
  RM_RETURN_IF_ERROR(CheckNotNull(fn, {{dx, "dx"}}));
  const Extent edx{dx, planes * height * width, 4, "dx"};
  const Extent edy{dy, pooled, 4, "dy"};
  const Extent ea{argmax, pooled, 4, "argmax"};
  RM_RETURN_IF_ERROR(CheckApart(fn, edx, {edy, ea}));
  return Launched(internal::LaunchMaxPool2x2Backward(dy, argmax, dx, planes, height, width, stream),
                  "MaxPool2x2Backward launch");
}

}  // namespace ringmaster::kernels::cuda
