#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "state/tensor.h"

namespace ringmaster::checkpoint {
namespace {

constexpr absl::string_view kMetadataKey = "__metadata__";

// Bytes per element of every dtype the format defines; 0: not one of them.
int64_t DtypeBytes(absl::string_view dtype) {
  static const auto* const kBytes = new absl::flat_hash_map<std::string, int64_t>{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kBytes->find(dtype);
  return it == kBytes->end() ? 0 : it->second;
}

// Reads exactly data.size() bytes at `offset`; DATA_LOSS naming the file when it ends first.
absl::Status ReadExactly(const RandomAccessFile& file, uint64_t offset, absl::Span<char> data,
                         absl::string_view what) {
  size_t done = 0;
  while (done < data.size()) {
    RM_ASSIGN_OR_RETURN(size_t n,
                        file.PRead(offset + done, data.size() - done, data.data() + done));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(file.path(), ": ", what, ": the file ends at byte ",
                                              offset + done, ", ", data.size() - done,
                                              " bytes short (a truncated file)"));
    }
    done += n;
  }
  return absl::OkStatus();
}

// A non-negative integer of the header, or DATA_LOSS naming what it is.
absl::StatusOr<int64_t> NonNegative(const nlohmann::json& v, const std::string& where) {
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                           : v.is_number_integer() && v.get<int64_t>() >= 0;
  if (!fits) {
    return absl::DataLossError(
        absl::StrCat(where, " must be a non-negative 64-bit integer, not ", v.dump()));
  }
  return v.get<int64_t>();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& where, const std::string& name,
                                            const nlohmann::json& v) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(where, ": tensor \"", name, "\": ", what));
  };
  if (!v.is_object()) return bad(absl::StrCat("expected an object, got ", v.dump()));
  for (const auto& [key, unused] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad(absl::StrCat("unknown field \"", key, "\""));
    }
  }
  SafetensorsEntry e;
  e.name = name;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) return bad("no \"dtype\" string");
  e.dtype = dtype->get<std::string>();
  if (DtypeBytes(e.dtype) == 0) {
    return bad(absl::StrCat("unknown dtype \"", e.dtype,
                            "\" (the format's: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, "
                            "BF16, I32, U32, F32, F64, I64, U64)"));
  }
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return bad("no \"shape\" array");
  for (const nlohmann::json& d : *shape) {
    auto dim = NonNegative(d, "a dimension of \"shape\"");
    if (!dim.ok()) return bad(std::string(dim.status().message()));
    e.shape.push_back(*dim);
  }
  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
    return bad("no \"data_offsets\" [begin, end]");
  }
  auto begin = NonNegative((*offsets)[0], "data_offsets[0]");
  if (!begin.ok()) return bad(std::string(begin.status().message()));
  auto end = NonNegative((*offsets)[1], "data_offsets[1]");
  if (!end.ok()) return bad(std::string(end.status().message()));
  e.begin = *begin;
  e.end = *end;
  if (e.end < e.begin) {
    return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
  }
  // numel * bytes, without overflow: a dimension of 0 makes it 0 whatever the others.
  const int64_t bytes = DtypeBytes(e.dtype);
  __int128 want = bytes;
  const __int128 kHuge = static_cast<__int128>(1) << 100;
  for (int64_t d : e.shape) want = (d != 0 && want > kHuge / d) ? kHuge : want * d;
  if (want != e.end - e.begin) {
    return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                            " bytes; dtype ", e.dtype, " and shape ", state::ShapeString(e.shape),
                            " need ", static_cast<int64_t>(std::min<__int128>(want, INT64_MAX))));
  }
  return e;
}

// Round to nearest even; NaN stays a (quiet) NaN.
uint16_t RoundToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float Bfloat16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBfloat16(float f) { return RoundToBfloat16(f); }

float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t x;
  if (exponent == 0x1f) {  // inf or NaN
    x = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    x = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    x = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    x = sign | ((112 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path,
                                                                           Env* env) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  RM_ASSIGN_OR_RETURN(r->file_, env->NewRandomAccessFile(path));
  RM_ASSIGN_OR_RETURN(const uint64_t size, r->file_->Size());
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file: ", what));
  };
  if (size < 8)
    return bad(absl::StrCat("it has ", size, " bytes, fewer than the 8 of the header length"));
  unsigned char length_bytes[8];
  RM_RETURN_IF_ERROR(ReadExactly(
      *r->file_, 0, absl::MakeSpan(reinterpret_cast<char*>(length_bytes), 8), "the header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length_bytes[i];
  if (n < 2 || n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return bad(absl::StrCat("a header length of ", n, " bytes (at least 2, at most ",
                            kMaxSafetensorsHeaderBytes, ")"));
  }
  if (n > size - 8) {
    return bad(absl::StrCat("the header length is ", n, " bytes but only ", size - 8,
                            " follow (a truncated file)"));
  }
  std::string header(n, '\0');
  RM_RETURN_IF_ERROR(ReadExactly(*r->file_, 8, absl::MakeSpan(header), "the header"));
  if (header[0] != '{') return bad("the header does not begin with '{'");
  // Trailing padding is spaces only (the format); the JSON parser would take other
  // whitespace too.
  const size_t last = header.find_last_not_of(' ');
  if (header[last] != '}')
    return bad("the header does not end with '}' (before its space padding)");
  nlohmann::json json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return bad("the header is not a JSON object");
  r->data_start_ = static_cast<int64_t>(8 + n);
  const int64_t data_bytes = static_cast<int64_t>(size) - r->data_start_;
  for (const auto& [key, value] : json.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return bad("\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return bad(absl::StrCat("\"__metadata__\" entry \"", mk, "\" is not a string"));
        }
        r->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    RM_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(path, key, value));
    if (e.end > data_bytes) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor \"", key, "\": data_offsets [", e.begin, ", ", e.end,
                       "] go past the end of the data section (", data_bytes,
                       " bytes): a truncated file, or offsets out of range"));
    }
    r->tensors_.push_back(std::move(e));
  }
  std::sort(r->tensors_.begin(), r->tensors_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : r->tensors_) {
    if (e.begin == e.end) continue;  // empty tensors take no bytes
    if (previous != nullptr && e.begin < previous->end) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensors \"", previous->name, "\" [", previous->begin, ", ", previous->end,
          ") and \"", e.name, "\" [", e.begin, ", ", e.end, ") overlap in the data section"));
    }
    previous = &e;
  }
  return r;
}

const SafetensorsEntry* SafetensorsReader::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : tensors_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::Status SafetensorsReader::ReadFloats(const SafetensorsEntry& e, absl::Span<float> out) const {
  if (static_cast<int64_t>(out.size()) != e.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", e.name, "\" has ",
                                                   e.numel(), " elements, not ", out.size()));
  }
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16") {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", e.name, "\" is ", e.dtype,
                     "; weights are read from F32, F16 or BF16 tensors only"));
  }
  const std::string what = absl::StrCat("tensor \"", e.name, "\"");
  if (e.dtype == "F32") {
    return ReadExactly(*file_, data_start_ + e.begin,
                       absl::MakeSpan(reinterpret_cast<char*>(out.data()), out.size() * 4), what);
  }
  // 16-bit: read in pieces into a bounce buffer and widen.
  constexpr size_t kChunk = 1 << 20;
  std::vector<uint16_t> half(std::min(out.size(), kChunk));
  const bool bf16 = e.dtype == "BF16";
  for (size_t i = 0; i < out.size(); i += kChunk) {
    const size_t k = std::min(kChunk, out.size() - i);
    RM_RETURN_IF_ERROR(ReadExactly(*file_, data_start_ + e.begin + 2 * i,
                                   absl::MakeSpan(reinterpret_cast<char*>(half.data()), 2 * k),
                                   what));
    for (size_t j = 0; j < k; ++j) {
      out[i + j] = bf16 ? Bfloat16ToFloat(half[j]) : Float16ToFloat(half[j]);
    }
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const SafetensorsWriteOptions& options) {
  const bool bf16 = options.dtype == SafetensorsWriteOptions::Dtype::kBF16;
  const int64_t element_bytes = bf16 ? 2 : 4;
  std::vector<const SafetensorsTensor*> order;
  std::set<std::string> names;
  for (const SafetensorsTensor& t : tensors) {
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing ", path, ": tensor \"", t.name, "\": ", what));
    };
    if (t.name.empty() || t.name == kMetadataKey) return bad("not a tensor name");
    if (!names.insert(t.name).second) return bad("named twice");
    if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; })) {
      return bad(absl::StrCat("a negative dimension in ", state::ShapeString(t.shape)));
    }
    if (!t.fill) return bad("nothing fills it");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return a->name < b->name;
  });
  // nlohmann's object keeps its keys sorted (std::map), as the reference writes them.
  nlohmann::json header = nlohmann::json::object();
  if (!options.metadata.empty()) header[std::string(kMetadataKey)] = options.metadata;
  std::vector<int64_t> numel(order.size());
  int64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    numel[i] = 1;
    for (int64_t d : order[i]->shape) numel[i] *= d;
    const int64_t end = offset + numel[i] * element_bytes;
    header[order[i]->name] = {{"dtype", bf16 ? "BF16" : "F32"},
                              {"shape", order[i]->shape},
                              {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  head += text;

  Env* env = options.env;
  const std::string tmp = path + ".tmp";
  auto write = [&]() -> absl::Status {
    RM_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp, {}));
    uint64_t at = 0;
    RM_RETURN_IF_ERROR(file->PWrite(at, head));
    at += head.size();
    std::vector<float> values;
    std::vector<uint16_t> half;
    for (size_t i = 0; i < order.size(); ++i) {
      values.assign(numel[i], 0.0f);
      RM_RETURN_IF_ERROR(order[i]->fill(absl::MakeSpan(values)));
      absl::string_view bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
      if (bf16) {
        half.resize(values.size());
        for (size_t j = 0; j < values.size(); ++j) half[j] = RoundToBfloat16(values[j]);
        bytes = absl::string_view(reinterpret_cast<const char*>(half.data()), half.size() * 2);
      }
      RM_RETURN_IF_ERROR(file->PWrite(at, bytes));
      at += bytes.size();
    }
    RM_RETURN_IF_ERROR(file->Sync());
    RM_RETURN_IF_ERROR(file->Close());
    RM_RETURN_IF_ERROR(env->RenameFile(tmp, path));
    const size_t slash = path.find_last_of('/');
    return env->SyncDir(slash == std::string::npos ? "."
                                                   : path.substr(0, std::max<size_t>(slash, 1)));
  };
  absl::Status s = write();
  if (!s.ok()) env->DeleteFile(tmp).IgnoreError();
  return s;
}

}  // namespace ringmaster::checkpoint
