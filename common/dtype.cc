#include "common/dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kUint8:
      return 1;
  }
  return 0;
}

absl::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "f32";
    case DataType::kFloat64:
      return "f64";
    case DataType::kFloat16:
      return "f16";
    case DataType::kBFloat16:
      return "bf16";
    case DataType::kInt32:
      return "i32";
    case DataType::kInt64:
      return "i64";
    case DataType::kUint8:
      return "u8";
  }
  return "unknown";
}

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "f32" || n == "float32" || n == "float") return DataType::kFloat32;
  if (n == "f64" || n == "float64" || n == "double") return DataType::kFloat64;
  if (n == "f16" || n == "float16" || n == "half") return DataType::kFloat16;
  if (n == "bf16" || n == "bfloat16") return DataType::kBFloat16;
  if (n == "i32" || n == "int32") return DataType::kInt32;
  if (n == "i64" || n == "int64") return DataType::kInt64;
  if (n == "u8" || n == "uint8") return DataType::kUint8;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data type \"", name, "\"; expected one of f32, f64, f16, bf16, i32, i64, u8"));
}

bool IsFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 || type == DataType::kFloat16 ||
         type == DataType::kBFloat16;
}

}  // namespace ringmaster
