// YAML ↔ protobuf messages, field by field through the message's descriptor (reflection),
// with errors a person can act on: each names the field path as the user wrote it
// (`optimizer.adamw.beta1`, `model.mlp.hidden[1]`), where it was written (`job.yaml:7:12`)
// and what was expected. Nothing here knows about JobSpec; spec/job_spec.h builds on it.
//
// The mapping (proto3):
//   message              a YAML mapping whose keys are field names (snake_case as in the
//                        .proto); an empty value (`sgd:`) means "present, all defaults"
//   oneof                at most one member may be written in one mapping
//   repeated             a YAML list (block or flow: `[512, 512]`)
//   int32/int64/uint*    a decimal integer that fits the type
//   double/float         a finite number (integers accepted)
//   bool                 true/false (also yes/no, on/off, any case)
//   string/bytes         any scalar, verbatim
//   enum                 the value's name without the enum's prefix, lower-case:
//                        Decay.DECAY_COSINE is `cosine` (any case accepted); value 0 is
//                        "unset" and cannot be written
//   an empty value       (`key:` or `key: ~`) on a scalar or list: leaves the field unset
//
// Thread-safety: the functions are pure (no shared state); a FieldLocations is not
// synchronised.
#ifndef RINGMASTER_SPEC_YAML_PROTO_H_
#define RINGMASTER_SPEC_YAML_PROTO_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ringmaster::spec {

// Where each field's value was written, by field path: "model.mlp.hidden[1]" →
// "job.yaml:7:12", "optimizer.lr" → "--set optimizer.lr=0.1". Later records replace
// earlier ones (an override replaces the file's value).
class FieldLocations {
 public:
  void Record(std::string path, std::string location);
  // The location of `path`, else of its nearest enclosing field ("a.b[2].c", "a.b[2]",
  // "a.b", "a"); empty when none was recorded.
  std::string Find(absl::string_view path) const;

 private:
  absl::flat_hash_map<std::string, std::string> locations_;
};

// One problem with one field.
struct FieldError {
  std::string location;  // "job.yaml:7:12", "--set lr=x", or empty when unknown
  std::string path;      // "optimizer.adamw.beta1"; empty for the document itself
  std::string message;   // what is wrong and what was expected
};

// "<location>: <path>: <message>", leaving out the empty parts.
std::string FormatFieldError(const FieldError& error);
// At most this many errors are reported for one document; the rest are counted.
inline constexpr size_t kMaxFieldErrors = 20;

// INVALID_ARGUMENT with one formatted error per line (at most kMaxFieldErrors, then "... and
// N more errors", N counting `more` too); OK when `errors` is empty.
absl::Status FieldErrorsToStatus(const std::vector<FieldError>& errors, int64_t more = 0);

struct YamlSourceOptions {
  // Names the text in error locations: "job.yaml" gives "job.yaml:7:12". May be empty
  // ("7:12").
  std::string source_name;
};

// Parses `yaml` (one document; its root a mapping, or empty) and merges it into `message`:
// written fields replace what `message` holds, lists replace lists. Every error in the
// document is collected (not only the first): yaml-cpp syntax errors (with line:column),
// unknown keys (with the nearest known key as a suggestion when it is a near miss, else
// the list of keys), duplicate keys, wrong types, out-of-range integers, unknown enum
// names (listing the allowed ones), two members of a oneof, a list where a scalar belongs
// and the reverse. On error `message` may hold part of the document.
// `locations` (may be null) receives the location of every field written.
// Errors: INVALID_ARGUMENT, one line per problem (FormatFieldError).
absl::Status MergeYamlIntoMessage(absl::string_view yaml, const YamlSourceOptions& options,
                                  google::protobuf::Message* message, FieldLocations* locations);

// Sets the field at `path` to `value`, a YAML scalar or flow collection:
//   SetFieldFromYaml(&spec, "optimizer.lr", "0.01", ...)
//   SetFieldFromYaml(&spec, "model.mlp.hidden", "[256, 256]", ...)
//   SetFieldFromYaml(&spec, "model.mlp.hidden[0]", "1024", ...)    one existing element
//   SetFieldFromYaml(&spec, "optimizer.adamw", "{beta1: 0.95}", ...)  replaces the message
// Path segments are field names separated by '.', a repeated field's element as
// `name[i]`. Entering a oneof member selects it (clearing the other members), so
// "optimizer.sgd.momentum" switches the optimizer to sgd. An empty `value` clears a scalar
// or list (its default applies again) and makes a message present with nothing set.
// Errors are reported as by MergeYamlIntoMessage, with `options.source_name` as the
// location (no line:column). On error `message` is unchanged.
// Errors: INVALID_ARGUMENT naming the path and what is wrong.
absl::Status SetFieldFromYaml(google::protobuf::Message* message, absl::string_view path,
                              absl::string_view value, const YamlSourceOptions& options,
                              FieldLocations* locations);

// Clears the field at `path` (syntax as SetFieldFromYaml, without element indices). A
// path through a message or oneof member that is not set changes nothing.
// Errors: INVALID_ARGUMENT for a path that names no field.
absl::Status ClearFieldAtPath(google::protobuf::Message* message, absl::string_view path);

// The message as block-style YAML in field declaration order, readable and parseable back
// by MergeYamlIntoMessage into an equal message. Written: fields with presence (messages,
// oneof members, `optional` scalars) when set; other scalars always, except enum value 0;
// lists when non-empty (scalar lists in flow style). Numbers are written in the shortest
// form that reads back exactly.
std::string MessageToYaml(const google::protobuf::Message& message);

// The fields MessageToYaml writes but empty strings, one line each, "path: value" in
// declaration order:
// "optimizer.lr: 0.1", "model.mlp.hidden: [512, 512]", "optimizer.adamw: {}" (a message set
// but empty); a repeated message's elements as "path[i].field". Values are C-escaped, so a
// line never holds a newline. For comparing two messages field by field.
std::string MessageToFieldLines(const google::protobuf::Message& message);

// The YAML name of an enum value: "cosine" for ScheduleSpec.Decay.DECAY_COSINE (the
// enum's name in UPPER_SNAKE_CASE, then '_', is removed when it prefixes the value).
std::string EnumValueYamlName(const google::protobuf::EnumValueDescriptor& value);

// The shortest decimal text that reads back as exactly `value` ("0.05", "1e-08", "25").
std::string FormatNumber(double value);

}  // namespace ringmaster::spec

#endif  // RINGMASTER_SPEC_YAML_PROTO_H_
