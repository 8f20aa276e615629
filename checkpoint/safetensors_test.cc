#include "checkpoint/safetensors.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/testing.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A file of the format written by hand: the length, `header` as it is, then `data`.
std::string RawFile(const std::string& dir, const std::string& name, const std::string& header,
                    const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  bytes += data;
  const std::string path = absl::StrCat(dir, "/", name);
  EXPECT_TRUE(WriteFileAtomically(path, bytes).ok());
  return path;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> ReadAll(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.Find(name);
  EXPECT_NE(e, nullptr) << name;
  if (e == nullptr) return {};
  std::vector<float> out(e->numel());
  const absl::Status s = r.ReadFloats(*e, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

SafetensorsTensor Tensor(const std::string& name, std::vector<int64_t> shape,
                         std::vector<float> values) {
  return {name, std::move(shape), [values](absl::Span<float> out) {
            std::copy(values.begin(), values.end(), out.begin());
            return absl::OkStatus();
          }};
}

TEST(Safetensors, WritesTheReferenceLayoutAndReadsItBack) {
  const std::string dir = testing::FreshDir("safetensors_write");
  const std::string path = dir + "/a.safetensors";
  SafetensorsWriteOptions o;
  o.metadata = {{"format", "pt"}};
  ASSERT_TRUE(
      WriteSafetensors(path,
                       {Tensor("zeta", {2, 3}, {1, 2, 3, 4, 5, 6}),
                        Tensor("alpha", {3}, {-1.5f, 0.25f, 1e30f}), Tensor("scalar", {}, {7})},
                       o)
          .ok());
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  const std::string header = bytes->substr(8, n);
  // The data starts at a multiple of 8; the header is JSON padded with spaces.
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  EXPECT_EQ(bytes->size(), 8 + n + 4 * (6 + 3 + 1));
  // Keys sorted, offsets back to back in name order.
  EXPECT_LT(header.find("__metadata__"), header.find("alpha"));
  EXPECT_LT(header.find("alpha"), header.find("scalar"));
  EXPECT_LT(header.find("scalar"), header.find("zeta"));
  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["alpha"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(j["scalar"]["data_offsets"], nlohmann::json({12, 16}));
  EXPECT_EQ(j["zeta"]["data_offsets"], nlohmann::json({16, 40}));
  EXPECT_EQ(j["zeta"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["zeta"]["dtype"], "F32");

  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  ASSERT_EQ((*r)->tensors().size(), 3u);
  EXPECT_EQ((*r)->tensors()[0].name, "alpha");
  EXPECT_EQ(ReadAll(**r, "zeta"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ReadAll(**r, "alpha"), (std::vector<float>{-1.5f, 0.25f, 1e30f}));
  EXPECT_EQ(ReadAll(**r, "scalar"), (std::vector<float>{7}));
  EXPECT_EQ((*r)->Find("scalar")->shape, std::vector<int64_t>{});

  // Deterministic: the same tensors give the same bytes.
  ASSERT_TRUE(
      WriteSafetensors(dir + "/b.safetensors",
                       {Tensor("scalar", {}, {7}), Tensor("alpha", {3}, {-1.5f, 0.25f, 1e30f}),
                        Tensor("zeta", {2, 3}, {1, 2, 3, 4, 5, 6})},
                       o)
          .ok());
  EXPECT_EQ(*ReadFile(dir + "/b.safetensors"), *bytes);
}

TEST(Safetensors, ReadsHalfPrecisionExactly) {
  const std::string dir = testing::FreshDir("safetensors_half");
  // F16: 1, -2, 65504 (the largest), 2^-24 (the smallest subnormal), 2^-14 (the smallest
  // normal), inf. BF16: 1, 3.140625, -0.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x7C00};
  const std::vector<uint16_t> bf16 = {0x3F80, 0x4049, 0x8000};
  const std::vector<float> f32 = {0.5f, -3.0f};
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[12,18]},)"
                             R"("f":{"dtype":"F32","shape":[2],"data_offsets":[18,26]}}   )";
  const std::string path =
      RawFile(dir, "half.safetensors", header, Bytes(f16) + Bytes(bf16) + Bytes(f32));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadAll(**r, "h"),
            (std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -14),
                                std::numeric_limits<float>::infinity()}));
  const std::vector<float> b = ReadAll(**r, "b");
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 3.140625f);
  EXPECT_TRUE(std::signbit(b[2]) && b[2] == 0.0f);
  EXPECT_EQ(ReadAll(**r, "f"), f32);
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7E00)));
}

TEST(Safetensors, WritesBf16RoundingToNearestEven) {
  const std::string dir = testing::FreshDir("safetensors_bf16");
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16's spacing at 1
  // Halfway cases go to the even neighbour; just above halfway goes up.
  const std::vector<float> values = {one + ulp / 2, one + 3 * ulp / 2,
                                     one + ulp / 2 + std::ldexp(1.0f, -20), -2.5f};
  SafetensorsWriteOptions o;
  o.dtype = SafetensorsWriteOptions::Dtype::kBF16;
  ASSERT_TRUE(WriteSafetensors(dir + "/b.safetensors", {Tensor("x", {4}, values)}, o).ok());
  auto r = SafetensorsReader::Open(dir + "/b.safetensors");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Find("x")->dtype, "BF16");
  EXPECT_EQ(ReadAll(**r, "x"), (std::vector<float>{one, one + 2 * ulp, one + ulp, -2.5f}));
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
}

// Each damage is refused with the file's name and what is wrong, naming the tensor.
TEST(Safetensors, DamagedFilesAreRefusedNamingFileAndTensor) {
  const std::string dir = testing::FreshDir("safetensors_bad");
  const std::string data = Bytes(std::vector<float>{1, 2, 3, 4});
  struct Case {
    std::string name, header, data, want;
  };
  const std::vector<Case> cases = {
      {"truncated", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       data.substr(0, 10),
       "tensor \"w\": data_offsets [0, 16] go past the end of the data section (10 bytes): a "
       "truncated file"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       data, "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap"},
      {"unknown_dtype", R"({"w":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})", data,
       "tensor \"w\": unknown dtype \"F7\""},
      {"wrong_length", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data,
       "tensor \"w\": data_offsets [0, 16] hold 16 bytes; dtype F32 and shape [3] need 12"},
      {"negative_dim", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data,
       "tensor \"w\": a dimension of \"shape\" must be a non-negative"},
      {"no_offsets", R"({"w":{"dtype":"F32","shape":[4]}})", data,
       "tensor \"w\": no \"data_offsets\""},
      {"not_json", R"({"w":{"dtype":"F32",)", data, "not a safetensors file"},
      {"bad_metadata", R"({"__metadata__":{"a":1}})", "", "\"__metadata__\" entry \"a\""},
      {"nul_padding",
       std::string(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") +
           std::string(3, '\0'),
       data, "does not end with '}'"},
  };
  for (const Case& c : cases) {
    const std::string path = RawFile(dir, c.name, c.header, c.data);
    auto r = SafetensorsReader::Open(path);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << c.name << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), AllOf(HasSubstr(path), HasSubstr(c.want)))
        << c.name;
  }
  // A header length past the end of the file.
  {
    std::string bytes(8, '\0');
    bytes[0] = 100;
    bytes += "{}";
    ASSERT_TRUE(WriteFileAtomically(dir + "/short", bytes).ok());
    auto r = SafetensorsReader::Open(dir + "/short");
    EXPECT_TRUE(absl::IsDataLoss(r.status()));
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("the header length is 100 bytes but only 2 follow"));
  }
  EXPECT_TRUE(absl::IsNotFound(SafetensorsReader::Open(dir + "/absent").status()));
}

TEST(Safetensors, OtherDtypesAreListedButNotReadAsFloat) {
  const std::string dir = testing::FreshDir("safetensors_i64");
  const std::string path =
      RawFile(dir, "i.safetensors", R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})",
              Bytes(std::vector<int64_t>{1, 2}));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<float> out(2);
  const absl::Status s = (*r)->ReadFloats((*r)->tensors()[0], absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(path), HasSubstr("tensor \"ids\" is I64"),
                                              HasSubstr("F32, F16 or BF16")));
}

TEST(Safetensors, TheWriterRefusesBadTensors) {
  const std::string dir = testing::FreshDir("safetensors_writer_bad");
  const std::string path = dir + "/x.safetensors";
  auto s = WriteSafetensors(path, {Tensor("a", {1}, {1}), Tensor("a", {1}, {2})}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor \"a\": named twice"));
  s = WriteSafetensors(path, {Tensor("__metadata__", {1}, {1})}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  // A fill's error comes back and leaves no file.
  s = WriteSafetensors(
      path, {{"a", {1}, [](absl::Span<float>) { return absl::DataLossError("boom"); }}}, {});
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_FALSE(ReadFile(path).ok());
  EXPECT_FALSE(ReadFile(path + ".tmp").ok());
}

}  // namespace
}  // namespace ringmaster::checkpoint
