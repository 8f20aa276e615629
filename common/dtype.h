// Element types shared by kernels, the data plane and training.
#ifndef RINGMASTER_COMMON_DTYPE_H_
#define RINGMASTER_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,   // IEEE 754 binary16
  kBFloat16 = 3,  // bfloat16: the top half of a float32
  kInt32 = 4,
  kInt64 = 5,
  kUint8 = 6,
};

inline constexpr DataType kAllDataTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt32,   DataType::kInt64,   DataType::kUint8};

// Bytes per element.
size_t DataTypeSize(DataType type);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8".
absl::string_view DataTypeName(DataType type);
// Parses the names above (and the long forms "float32", "bfloat16", ...). INVALID_ARGUMENT
// names the text and the accepted values.
absl::StatusOr<DataType> ParseDataType(absl::string_view name);
bool IsFloatingPoint(DataType type);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_DTYPE_H_
