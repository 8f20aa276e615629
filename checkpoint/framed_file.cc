#include "checkpoint/framed_file.h"

#include <xxhash.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::checkpoint {
namespace {

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

uint64_t Xxh3(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string Frame(absl::string_view magic, absl::string_view payload) {
  CHECK_EQ(magic.size(), 8u) << magic;
  std::string out;
  out.reserve(kFrameHeaderBytes + payload.size());
  out.append(magic.data(), magic.size());
  AppendU64(&out, payload.size());
  AppendU64(&out, Xxh3(payload));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<absl::string_view> Unframe(absl::string_view magic, absl::string_view contents,
                                          absl::string_view name) {
  if (contents.size() < kFrameHeaderBytes) {
    return absl::DataLossError(absl::StrCat(name, ": truncated: ", contents.size(),
                                            " bytes, shorter than the ", kFrameHeaderBytes,
                                            "-byte header"));
  }
  if (contents.substr(0, 8) != magic) {
    return absl::DataLossError(absl::StrCat(name, ": bad magic at offset 0: expected \"", magic,
                                            "\", got \"", absl::CHexEscape(contents.substr(0, 8)),
                                            "\""));
  }
  const uint64_t length = LoadU64(contents.data() + 8);
  const uint64_t checksum = LoadU64(contents.data() + 16);
  absl::string_view payload = contents.substr(kFrameHeaderBytes);
  if (length != payload.size()) {
    return absl::DataLossError(absl::StrCat(name, ": the length at offset 8 says ", length,
                                            " payload bytes, the file has ", payload.size(),
                                            " after the header (truncated or extended)"));
  }
  const uint64_t actual = Xxh3(payload);
  if (actual != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch over bytes [%d, %d): the header (offset 16) says %#018x, the "
        "bytes hash to %#018x",
        name, kFrameHeaderBytes, contents.size(), checksum, actual));
  }
  return payload;
}

absl::Status WriteFramedProto(Env* env, const std::string& path, absl::string_view magic,
                              const google::protobuf::MessageLite& message) {
  std::string payload;
  if (!message.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat("cannot serialize ", message.GetTypeName()));
  }
  return WriteFileDurably(env, path, Frame(magic, payload));
}

absl::Status ReadFramedProto(Env* env, const std::string& path, absl::string_view magic,
                             google::protobuf::MessageLite* message) {
  RM_ASSIGN_OR_RETURN(std::string contents, ReadFileToString(env, path));
  RM_ASSIGN_OR_RETURN(absl::string_view payload, Unframe(magic, contents, path));
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat(path, ": the payload at offset ", kFrameHeaderBytes,
                                            " is not a valid ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster::checkpoint
