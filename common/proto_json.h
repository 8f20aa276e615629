// Messages as JSON with protobuf's JSON mapping, the way ringmaster's files use it (the
// trainer's summary, metrics.jsonl, ringctl's --summary and --json): field names as in the
// .proto (snake_case), fields at their default written too, one compact line; a field with
// presence (proto3 `optional`) whose double value is not finite is left out, so that every
// number a reader meets is a JSON number.
#ifndef RINGMASTER_COMMON_PROTO_JSON_H_
#define RINGMASTER_COMMON_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace ringmaster {

// One line of JSON, without a newline. Should the mapping fail (it does not for messages
// without Any fields), a JSON object {"error": "..."} saying why.
std::string ToJsonLine(const google::protobuf::Message& message);

// Parses `json` into `message` (cleared first). Keys the message does not have are ignored
// (a newer writer's). INVALID_ARGUMENT with the parser's reason, prefixed by `what` (e.g. the
// file's name and line).
absl::Status FromJson(absl::string_view json, google::protobuf::Message* message,
                      absl::string_view what);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_PROTO_JSON_H_
