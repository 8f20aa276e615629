#include "common/proto_json.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace ringmaster {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Clears the set optional doubles that are not finite, in `m` and the messages inside it.
void ClearNonFinite(Message* m) {
  const Reflection* r = m->GetReflection();
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(*m, f); ++j) {
          ClearNonFinite(r->MutableRepeatedMessage(m, f, j));
        }
      } else if (r->HasField(*m, f)) {
        ClearNonFinite(r->MutableMessage(m, f));
      }
      continue;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE || f->is_repeated() ||
        !f->has_presence() || !r->HasField(*m, f)) {
      continue;
    }
    if (!std::isfinite(r->GetDouble(*m, f))) r->ClearField(m, f);
  }
}

}  // namespace

std::string ToJsonLine(const Message& message) {
  std::unique_ptr<Message> copy(message.New());
  copy->CopyFrom(message);
  ClearNonFinite(copy.get());
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  o.add_whitespace = false;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(*copy, &out, o);
  if (!status.ok()) {
    return absl::StrCat("{\"error\":\"", std::string(status.message()), "\"}");
  }
  return out;
}

absl::Status FromJson(absl::string_view json, Message* message, absl::string_view what) {
  message->Clear();
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), message, o);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a ", message->GetDescriptor()->name(), " in JSON (",
                     std::string(status.message()), ")"));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster
