#include "spec/yaml_proto.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace ringmaster::spec {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::EnumDescriptor;
using ::google::protobuf::EnumValueDescriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::OneofDescriptor;
using ::google::protobuf::Reflection;

// ---------------------------------------------------------------------------------------
// Names and near misses.

// Optimal string alignment distance: Levenshtein plus adjacent transpositions.
int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const int substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate nearest to `written` when it is a near miss: at most 2 edits and at most a
// third of the written length (at least 1), so that "xy" does not suggest "lr". Empty when
// none is near.
std::string NearMiss(absl::string_view written, const std::vector<std::string>& candidates) {
  const std::string lower = absl::AsciiStrToLower(written);
  const int limit = std::min<int>(2, std::max<int>(1, static_cast<int>(written.size()) / 3));
  std::string best;
  int best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const int distance = EditDistance(lower, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::vector<std::string> FieldNames(const Descriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.field_count(); ++i) names.push_back(descriptor.field(i)->name());
  return names;
}

// The names a YAML document may use for `type`'s values (all but value 0, "unset").
std::vector<std::string> EnumNames(const EnumDescriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i) {
    if (type.value(i)->number() != 0) names.push_back(EnumValueYamlName(*type.value(i)));
  }
  return names;
}

std::string Quote(absl::string_view text) {
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

// `what` ("key", "value") is not among `known`: suggest a near miss or list them all.
std::string UnknownName(absl::string_view what, absl::string_view written,
                        const std::vector<std::string>& known) {
  const std::string suggestion = NearMiss(written, known);
  if (!suggestion.empty()) {
    return absl::StrCat("unknown ", what, " ", Quote(written), "; did you mean ", Quote(suggestion),
                        "?");
  }
  return absl::StrCat("unknown ", what, " ", Quote(written), "; expected one of ",
                      absl::StrJoin(known, ", "));
}

std::string JoinPath(absl::string_view path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

std::string LineColumn(const YAML::Mark& mark) {
  return absl::StrCat(mark.line + 1, ":", mark.column + 1);
}

// ---------------------------------------------------------------------------------------
// Scalars.

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

// What one value of `field` looks like, for "expected ..." messages.
std::string Expected(const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "a non-negative integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrCat("one of ", absl::StrJoin(EnumNames(*field.enum_type()), ", "));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return absl::StrCat("a mapping with keys ",
                          absl::StrJoin(FieldNames(*field.message_type()), ", "));
  }
  return "a value";
}

// A parsed scalar, in the widest type of its kind.
using Scalar =
    std::variant<int64_t, uint64_t, double, bool, std::string, const EnumValueDescriptor*>;

bool IsDecimalInteger(absl::string_view text) {
  absl::ConsumePrefix(&text, "-") || absl::ConsumePrefix(&text, "+");
  return !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

absl::StatusOr<Scalar> ParseSigned(const std::string& text, int64_t min, int64_t max) {
  if (!IsDecimalInteger(text)) {
    return absl::InvalidArgumentError(absl::StrCat("expected an integer, got ", Quote(text)));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("out of range: ", text, " is not in [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<Scalar> ParseUnsigned(const std::string& text, uint64_t max) {
  if (!IsDecimalInteger(text) || absl::StartsWith(text, "-")) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a non-negative integer, got ", Quote(text)));
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("out of range: ", text, " is not in [0, ", max, "]"));
  }
  return value;
}

absl::StatusOr<Scalar> ParseReal(const std::string& text, double max) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("expected a number, got ", Quote(text)));
  }
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("expected a finite number, got ", Quote(text)));
  }
  if (std::abs(value) > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("out of range: ", text, " does not fit in a 32-bit float"));
  }
  return value;
}

absl::StatusOr<Scalar> ParseBool(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return absl::InvalidArgumentError(absl::StrCat("expected true or false, got ", Quote(text)));
}

absl::StatusOr<Scalar> ParseEnum(const std::string& text, const EnumDescriptor& type) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (int i = 0; i < type.value_count(); ++i) {
    const EnumValueDescriptor* value = type.value(i);
    if (value->number() != 0 && EnumValueYamlName(*value) == lower) return value;
  }
  const std::vector<std::string> names = EnumNames(type);
  std::string message =
      absl::StrCat("expected one of ", absl::StrJoin(names, ", "), ", got ", Quote(text));
  if (const std::string suggestion = NearMiss(text, names); !suggestion.empty()) {
    absl::StrAppend(&message, "; did you mean ", Quote(suggestion), "?");
  }
  return absl::InvalidArgumentError(message);
}

// Converts a scalar's text for `field`; the error's message says what was expected.
absl::StatusOr<Scalar> ParseScalar(const std::string& text, const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return ParseSigned(text, std::numeric_limits<int32_t>::min(),
                         std::numeric_limits<int32_t>::max());
    case FieldDescriptor::CPPTYPE_INT64:
      return ParseSigned(text, std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max());
    case FieldDescriptor::CPPTYPE_UINT32:
      return ParseUnsigned(text, std::numeric_limits<uint32_t>::max());
    case FieldDescriptor::CPPTYPE_UINT64:
      return ParseUnsigned(text, std::numeric_limits<uint64_t>::max());
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return ParseReal(text, std::numeric_limits<double>::max());
    case FieldDescriptor::CPPTYPE_FLOAT:
      return ParseReal(text, std::numeric_limits<float>::max());
    case FieldDescriptor::CPPTYPE_BOOL:
      return ParseBool(text);
    case FieldDescriptor::CPPTYPE_STRING:
      return text;
    case FieldDescriptor::CPPTYPE_ENUM:
      return ParseEnum(text, *field.enum_type());
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return absl::InternalError(absl::StrCat(field.full_name(), " is not a scalar field"));
}

// Where a value goes: a singular field, the end of a repeated field, or one element.
constexpr int kSingular = -1;
constexpr int kAppend = -2;
struct Slot {
  Message* message;
  const FieldDescriptor* field;
  int index;  // kSingular, kAppend or an element index
};

template <typename T>
void StoreAs(const Slot& slot, T value,
             void (Reflection::*set)(Message*, const FieldDescriptor*, T) const,
             void (Reflection::*add)(Message*, const FieldDescriptor*, T) const,
             void (Reflection::*set_element)(Message*, const FieldDescriptor*, int, T) const) {
  const Reflection* reflection = slot.message->GetReflection();
  if (slot.index == kSingular) {
    (reflection->*set)(slot.message, slot.field, std::move(value));
  } else if (slot.index == kAppend) {
    (reflection->*add)(slot.message, slot.field, std::move(value));
  } else {
    (reflection->*set_element)(slot.message, slot.field, slot.index, std::move(value));
  }
}

// Stores a value that ParseScalar made for `slot.field`.
void Store(const Slot& slot, const Scalar& value) {
  switch (slot.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      StoreAs<int32_t>(slot, static_cast<int32_t>(std::get<int64_t>(value)), &Reflection::SetInt32,
                       &Reflection::AddInt32, &Reflection::SetRepeatedInt32);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      StoreAs<int64_t>(slot, std::get<int64_t>(value), &Reflection::SetInt64, &Reflection::AddInt64,
                       &Reflection::SetRepeatedInt64);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      StoreAs<uint32_t>(slot, static_cast<uint32_t>(std::get<uint64_t>(value)),
                        &Reflection::SetUInt32, &Reflection::AddUInt32,
                        &Reflection::SetRepeatedUInt32);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      StoreAs<uint64_t>(slot, std::get<uint64_t>(value), &Reflection::SetUInt64,
                        &Reflection::AddUInt64, &Reflection::SetRepeatedUInt64);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      StoreAs<double>(slot, std::get<double>(value), &Reflection::SetDouble, &Reflection::AddDouble,
                      &Reflection::SetRepeatedDouble);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      StoreAs<float>(slot, static_cast<float>(std::get<double>(value)), &Reflection::SetFloat,
                     &Reflection::AddFloat, &Reflection::SetRepeatedFloat);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      StoreAs<bool>(slot, std::get<bool>(value), &Reflection::SetBool, &Reflection::AddBool,
                    &Reflection::SetRepeatedBool);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      StoreAs<std::string>(slot, std::get<std::string>(value), &Reflection::SetString,
                           &Reflection::AddString, &Reflection::SetRepeatedString);
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      StoreAs<const EnumValueDescriptor*>(slot, std::get<const EnumValueDescriptor*>(value),
                                          &Reflection::SetEnum, &Reflection::AddEnum,
                                          &Reflection::SetRepeatedEnum);
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

// ---------------------------------------------------------------------------------------
// Reading YAML into messages.

// Whether errors carry the YAML line:column after the source name. Off for an override's
// value, a one-line text whose columns say nothing the path does not.
enum class Marks { kReport, kOmit };

// Walks YAML nodes against a message's descriptor, collecting errors.
class YamlReader {
 public:
  YamlReader(const YamlSourceOptions& options, Marks marks, FieldLocations* locations)
      : options_(options), marks_(marks), locations_(locations) {}

  // Merges the mapping `node` into `message`; a null node changes nothing.
  void ReadMessage(const YAML::Node& node, const std::string& path, Message* message) {
    if (node.IsNull()) return;
    const Descriptor& descriptor = *message->GetDescriptor();
    if (!node.IsMap()) {
      Error(node.Mark(), path,
            absl::StrCat("expected a mapping with keys ",
                         absl::StrJoin(FieldNames(descriptor), ", "), ", got ", Describe(node)));
      return;
    }
    absl::flat_hash_map<std::string, YAML::Mark> seen;
    absl::flat_hash_map<const OneofDescriptor*, std::pair<std::string, YAML::Mark>> chosen;
    for (const auto& entry : node) {
      const YAML::Node& key = entry.first;
      const YAML::Node& value = entry.second;
      if (!key.IsScalar()) {
        Error(key.Mark(), path, absl::StrCat("keys must be field names, got ", Describe(key)));
        continue;
      }
      const std::string& name = key.Scalar();
      const std::string field_path = JoinPath(path, name);
      const FieldDescriptor* field = descriptor.FindFieldByName(name);
      if (field == nullptr) {
        Error(key.Mark(), field_path, UnknownName("key", name, FieldNames(descriptor)));
        continue;
      }
      if (auto [first, inserted] = seen.emplace(name, key.Mark()); !inserted) {
        Error(key.Mark(), field_path,
              absl::StrCat("duplicate key (first at ", LineColumn(first->second), ")"));
        continue;
      }
      // A oneof member is chosen when written with a value, or as an empty message.
      const OneofDescriptor* oneof = field->real_containing_oneof();
      const bool chooses = !value.IsNull() || field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
      if (oneof != nullptr && chooses) {
        if (auto [other, inserted] = chosen.emplace(oneof, std::make_pair(name, key.Mark()));
            !inserted) {
          Error(key.Mark(), field_path,
                absl::StrCat("conflicts with ", JoinPath(path, other->second.first), " (at ",
                             LineColumn(other->second.second), "): only one of ",
                             absl::StrJoin(OneofNames(*oneof), ", "), " may be set"));
          continue;
        }
      }
      // A scalar is located by its value, a section or list by its key.
      ReadField(value, value.IsScalar() ? value.Mark() : key.Mark(), field_path, message, *field);
    }
  }

  // Reads `value` into `field` of `message`, replacing what it held (a message is merged
  // into). `at` is where the value was written.
  void ReadField(const YAML::Node& value, const YAML::Mark& at, const std::string& path,
                 Message* message, const FieldDescriptor& field) {
    Record(path, at);
    const Reflection* reflection = message->GetReflection();
    if (field.is_map()) {
      ReadMap(value, path, message, field);
    } else if (field.is_repeated()) {
      ReadList(value, path, message, field);
    } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ReadMessage(value, path, reflection->MutableMessage(message, &field));
    } else if (value.IsNull()) {
      reflection->ClearField(message, &field);
    } else {
      ReadScalar(value, path, Slot{message, &field, kSingular});
    }
  }

  // Reads `node` over element `index` of a repeated field (a message element is replaced).
  void ReadElement(const YAML::Node& node, const std::string& path, Message* message,
                   const FieldDescriptor& field, int index) {
    Record(path, node.Mark());
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Message* element = message->GetReflection()->MutableRepeatedMessage(message, &field, index);
      element->Clear();
      ReadMessage(node, path, element);
    } else {
      ReadScalar(node, path, Slot{message, &field, index});
    }
  }

  // The first kMaxFieldErrors are kept; the rest only counted (a spec with a million unknown
  // keys gets a bounded answer, in bounded memory).
  void Error(const YAML::Mark& mark, std::string path, std::string message) {
    if (errors_.size() >= kMaxFieldErrors) {
      ++more_errors_;
      return;
    }
    errors_.push_back(FieldError{Location(mark), std::move(path), std::move(message)});
  }

  const std::vector<FieldError>& errors() const { return errors_; }
  int64_t more_errors() const { return more_errors_; }

 private:
  static std::vector<std::string> OneofNames(const OneofDescriptor& oneof) {
    std::vector<std::string> names;
    for (int i = 0; i < oneof.field_count(); ++i) names.push_back(oneof.field(i)->name());
    return names;
  }

  std::string Location(const YAML::Mark& mark) const {
    if (marks_ == Marks::kOmit || mark.is_null()) return options_.source_name;
    if (options_.source_name.empty()) return LineColumn(mark);
    return absl::StrCat(options_.source_name, ":", LineColumn(mark));
  }

  void Record(const std::string& path, const YAML::Mark& mark) {
    if (locations_ != nullptr) locations_->Record(path, Location(mark));
  }

  void ReadList(const YAML::Node& value, const std::string& path, Message* message,
                const FieldDescriptor& field) {
    const Reflection* reflection = message->GetReflection();
    reflection->ClearField(message, &field);
    if (value.IsNull()) return;
    if (!value.IsSequence()) {
      Error(value.Mark(), path, absl::StrCat("expected a list, got ", Describe(value)));
      return;
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const YAML::Node element = value[i];
      const std::string element_path = absl::StrCat(path, "[", i, "]");
      Record(element_path, element.Mark());
      if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        ReadMessage(element, element_path, reflection->AddMessage(message, &field));
      } else {
        ReadScalar(element, element_path, Slot{message, &field, kAppend});
      }
    }
  }

  // A map field (map<K, V> with scalar V) from a YAML mapping {key: value, ...}; replaces
  // what it held.
  void ReadMap(const YAML::Node& value, const std::string& path, Message* message,
               const FieldDescriptor& field) {
    message->GetReflection()->ClearField(message, &field);
    if (value.IsNull()) return;
    if (!value.IsMap()) {
      Error(value.Mark(), path, absl::StrCat("expected a mapping, got ", Describe(value)));
      return;
    }
    const FieldDescriptor& key_field = *field.message_type()->map_key();
    const FieldDescriptor& value_field = *field.message_type()->map_value();
    for (const auto& item : value) {
      const std::string item_path =
          JoinPath(path, item.first.IsScalar() ? item.first.Scalar() : "?");
      Record(item_path, item.first.Mark());
      Message* entry = message->GetReflection()->AddMessage(message, &field);
      ReadScalar(item.first, item_path, Slot{entry, &key_field, kSingular});
      ReadScalar(item.second, item_path, Slot{entry, &value_field, kSingular});
    }
  }

  void ReadScalar(const YAML::Node& node, const std::string& path, const Slot& slot) {
    if (!node.IsScalar()) {
      Error(node.Mark(), path,
            absl::StrCat("expected ", Expected(*slot.field), ", got ", Describe(node)));
      return;
    }
    absl::StatusOr<Scalar> value = ParseScalar(node.Scalar(), *slot.field);
    if (!value.ok()) {
      Error(node.Mark(), path, std::string(value.status().message()));
      return;
    }
    Store(slot, *value);
  }

  const YamlSourceOptions& options_;
  const Marks marks_;
  FieldLocations* const locations_;
  std::vector<FieldError> errors_;
  int64_t more_errors_ = 0;
};

// ---------------------------------------------------------------------------------------
// Paths: "a.b[2].c".

struct PathSegment {
  std::string name;
  std::optional<int> index;
};

absl::StatusOr<std::vector<PathSegment>> ParsePath(absl::string_view path) {
  std::vector<PathSegment> segments;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    PathSegment segment;
    absl::string_view name = part;
    if (const size_t open = part.find('['); open != absl::string_view::npos) {
      name = part.substr(0, open);
      absl::string_view index = part.substr(open + 1);
      int value = 0;
      if (!absl::ConsumeSuffix(&index, "]") || !absl::SimpleAtoi(index, &value) || value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad element index in ", Quote(part), "; write name[0], name[1], ..."));
      }
      segment.index = value;
    }
    if (name.empty() || !std::all_of(name.begin(), name.end(),
                                     [](char c) { return absl::ascii_isalnum(c) || c == '_'; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad field path ", Quote(path), ": expected names separated by '.'"));
    }
    segment.name = std::string(name);
    segments.push_back(std::move(segment));
  }
  return segments;
}

// The field `name` of `descriptor`; `path` (ending in `name`) names it in the error.
absl::StatusOr<const FieldDescriptor*> FindField(const Descriptor& descriptor,
                                                 absl::string_view name, absl::string_view path) {
  const FieldDescriptor* field = descriptor.FindFieldByName(std::string(name));
  if (field == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", UnknownName("field", name, FieldNames(descriptor))));
  }
  return field;
}

absl::Status NotAMessage(const FieldDescriptor& field, absl::string_view path) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": holds ", Expected(field),
                                                 ", not fields; it cannot be followed by '.'"));
}

// Applies `value` at the end of `segments` inside `message`. Errors become FieldErrors at
// the override's location.
absl::Status SetAtPath(Message* message, const std::vector<PathSegment>& segments,
                       const YAML::Node& value, YamlReader* reader) {
  std::string walked;
  Message* current = message;
  for (size_t i = 0; i < segments.size(); ++i) {
    const PathSegment& segment = segments[i];
    walked = JoinPath(walked, segment.name);
    RM_ASSIGN_OR_RETURN(const FieldDescriptor* field,
                        FindField(*current->GetDescriptor(), segment.name, walked));
    const Reflection* reflection = current->GetReflection();
    const bool last = i + 1 == segments.size();
    if (segment.index.has_value()) {
      if (!field->is_repeated()) {
        return absl::InvalidArgumentError(
            absl::StrCat(walked, ": is not a list; remove [", *segment.index, "]"));
      }
      const int size = reflection->FieldSize(*current, field);
      if (*segment.index >= size) {
        return absl::InvalidArgumentError(
            absl::StrCat(walked, "[", *segment.index, "]: no such element; the list has ", size));
      }
      walked = absl::StrCat(walked, "[", *segment.index, "]");
      if (last) {
        reader->ReadElement(value, walked, current, *field, *segment.index);
        return absl::OkStatus();
      }
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return NotAMessage(*field, walked);
      current = reflection->MutableRepeatedMessage(current, field, *segment.index);
      continue;
    }
    if (last) {
      reflection->ClearField(current, field);
      reader->ReadField(value, value.Mark(), walked, current, *field);
      return absl::OkStatus();
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(walked, ": is a list; name an element, e.g. ", walked, "[0]"));
    }
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return NotAMessage(*field, walked);
    current = reflection->MutableMessage(current, field);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Writing YAML.

template <typename T>
T GetAs(const Message& message, const FieldDescriptor& field, int index,
        T (Reflection::*get)(const Message&, const FieldDescriptor*) const,
        T (Reflection::*get_element)(const Message&, const FieldDescriptor*, int) const) {
  const Reflection* reflection = message.GetReflection();
  return index == kSingular ? (reflection->*get)(message, &field)
                            : (reflection->*get_element)(message, &field, index);
}

template <typename T>
std::string FormatShortest(T value) {
  if (value == 0) return std::signbit(value) ? "-0" : "0";
  // Whole numbers as integers ("600", not "6e+02"), while they are exact.
  if (std::abs(value) < 1e15 && value == std::trunc(value)) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  for (int precision = 1; precision < std::numeric_limits<T>::max_digits10; ++precision) {
    const std::string text = absl::StrFormat("%.*g", precision, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && static_cast<T>(back) == value) return text;
  }
  return absl::StrFormat("%.*g", std::numeric_limits<T>::max_digits10, value);
}

// The text of a scalar field's value (`index`: kSingular or an element).
std::string ScalarText(const Message& message, const FieldDescriptor& field, int index) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(GetAs<int32_t>(message, field, index, &Reflection::GetInt32,
                                         &Reflection::GetRepeatedInt32));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(GetAs<int64_t>(message, field, index, &Reflection::GetInt64,
                                         &Reflection::GetRepeatedInt64));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(GetAs<uint32_t>(message, field, index, &Reflection::GetUInt32,
                                          &Reflection::GetRepeatedUInt32));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(GetAs<uint64_t>(message, field, index, &Reflection::GetUInt64,
                                          &Reflection::GetRepeatedUInt64));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return FormatShortest(GetAs<double>(message, field, index, &Reflection::GetDouble,
                                          &Reflection::GetRepeatedDouble));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return FormatShortest(GetAs<float>(message, field, index, &Reflection::GetFloat,
                                         &Reflection::GetRepeatedFloat));
    case FieldDescriptor::CPPTYPE_BOOL:
      return GetAs<bool>(message, field, index, &Reflection::GetBool, &Reflection::GetRepeatedBool)
                 ? "true"
                 : "false";
    case FieldDescriptor::CPPTYPE_STRING:
      return GetAs<std::string>(message, field, index, &Reflection::GetString,
                                &Reflection::GetRepeatedString);
    case FieldDescriptor::CPPTYPE_ENUM:
      return EnumValueYamlName(*GetAs<const EnumValueDescriptor*>(
          message, field, index, &Reflection::GetEnum, &Reflection::GetRepeatedEnum));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "";
}

bool ShouldEmit(const Message& message, const FieldDescriptor& field) {
  const Reflection* reflection = message.GetReflection();
  if (field.is_repeated()) return reflection->FieldSize(message, &field) > 0;
  if (field.has_presence()) return reflection->HasField(message, &field);
  if (field.cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    return reflection->GetEnumValue(message, &field) != 0;
  }
  return true;
}

// A map field's entries by key (a map's wire order is unspecified; the text must not be).
std::vector<const Message*> SortedMapEntries(const Message& message,
                                             const FieldDescriptor& field) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const Message*> entries;
  for (int j = 0; j < reflection->FieldSize(message, &field); ++j) {
    entries.push_back(&reflection->GetRepeatedMessage(message, &field, j));
  }
  const FieldDescriptor& key = *field.message_type()->map_key();
  std::stable_sort(entries.begin(), entries.end(), [&key](const Message* a, const Message* b) {
    return ScalarText(*a, key, kSingular) < ScalarText(*b, key, kSingular);
  });
  return entries;
}

void EmitMessage(const Message& message, YAML::Emitter* out) {
  const Descriptor& descriptor = *message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  *out << YAML::BeginMap;
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (!ShouldEmit(message, field)) continue;
    *out << YAML::Key << field.name() << YAML::Value;
    const bool is_message = field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field.is_map()) {
      const FieldDescriptor& key = *field.message_type()->map_key();
      const FieldDescriptor& value = *field.message_type()->map_value();
      *out << YAML::BeginMap;
      for (const Message* entry : SortedMapEntries(message, field)) {
        *out << YAML::Key << ScalarText(*entry, key, kSingular) << YAML::Value
             << YAML::DoubleQuoted << ScalarText(*entry, value, kSingular);
      }
      *out << YAML::EndMap;
    } else if (field.is_repeated()) {
      if (!is_message) *out << YAML::Flow;
      *out << YAML::BeginSeq;
      for (int j = 0; j < reflection->FieldSize(message, &field); ++j) {
        if (is_message) {
          EmitMessage(reflection->GetRepeatedMessage(message, &field, j), out);
        } else {
          *out << ScalarText(message, field, j);
        }
      }
      *out << YAML::EndSeq;
    } else if (is_message) {
      EmitMessage(reflection->GetMessage(message, &field), out);
    } else {
      *out << ScalarText(message, field, kSingular);
    }
  }
  *out << YAML::EndMap;
}

// One "path: value" line per field that MessageToYaml would write, in declaration order.
void EmitFieldLines(const Message& message, const std::string& prefix,
                    std::vector<std::string>* lines) {
  const Descriptor& descriptor = *message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (!ShouldEmit(message, field)) continue;
    const std::string path = absl::StrCat(prefix, field.name());
    const bool is_message = field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field.is_map()) {
      const FieldDescriptor& key = *field.message_type()->map_key();
      const FieldDescriptor& value = *field.message_type()->map_value();
      for (const Message* entry : SortedMapEntries(message, field)) {
        lines->push_back(absl::StrCat(path, ".", ScalarText(*entry, key, kSingular), ": ",
                                      ScalarText(*entry, value, kSingular)));
      }
    } else if (field.is_repeated() && is_message) {
      for (int j = 0; j < reflection->FieldSize(message, &field); ++j) {
        EmitFieldLines(reflection->GetRepeatedMessage(message, &field, j),
                       absl::StrCat(path, "[", j, "]."), lines);
      }
    } else if (field.is_repeated()) {
      std::vector<std::string> values;
      for (int j = 0; j < reflection->FieldSize(message, &field); ++j) {
        values.push_back(ScalarText(message, field, j));
      }
      lines->push_back(absl::StrCat(path, ": [", absl::StrJoin(values, ", "), "]"));
    } else if (is_message) {
      const size_t before = lines->size();
      EmitFieldLines(reflection->GetMessage(message, &field), absl::StrCat(path, "."), lines);
      // A message that is set but empty (a oneof's choice without settings) still counts.
      if (lines->size() == before) lines->push_back(absl::StrCat(path, ": {}"));
    } else {
      const std::string value = ScalarText(message, field, kSingular);
      // A string without presence that is empty is unset (a cleared field).
      if (value.empty() && field.cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
          !field.has_presence()) {
        continue;
      }
      lines->push_back(absl::StrCat(path, ": ", absl::CEscape(value)));
    }
  }
}

// UPPER_SNAKE_CASE of a CamelCase name: "OnBusy" → "ON_BUSY".
std::string UpperSnake(absl::string_view camel) {
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    if (i > 0 && absl::ascii_isupper(camel[i]) && !absl::ascii_isupper(camel[i - 1])) {
      out.push_back('_');
    }
    out.push_back(absl::ascii_toupper(camel[i]));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Public functions.

void FieldLocations::Record(std::string path, std::string location) {
  locations_[std::move(path)] = std::move(location);
}

std::string FieldLocations::Find(absl::string_view path) const {
  while (!path.empty()) {
    if (auto it = locations_.find(path); it != locations_.end()) return it->second;
    const size_t cut = path.find_last_of(".[");
    path = path.substr(0, cut == absl::string_view::npos ? 0 : cut);
  }
  return "";
}

std::string FormatFieldError(const FieldError& error) {
  std::vector<absl::string_view> parts;
  if (!error.location.empty()) parts.push_back(error.location);
  if (!error.path.empty()) parts.push_back(error.path);
  parts.push_back(error.message);
  return absl::StrJoin(parts, ": ");
}

absl::Status FieldErrorsToStatus(const std::vector<FieldError>& errors, int64_t more) {
  if (errors.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (size_t i = 0; i < errors.size() && i < kMaxFieldErrors; ++i) {
    lines.push_back(FormatFieldError(errors[i]));
  }
  more += static_cast<int64_t>(errors.size()) - static_cast<int64_t>(lines.size());
  if (more > 0) lines.push_back(absl::StrCat("... and ", more, " more errors"));
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

absl::Status MergeYamlIntoMessage(absl::string_view yaml, const YamlSourceOptions& options,
                                  Message* message, FieldLocations* locations) {
  YamlReader reader(options, Marks::kReport, locations);
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(std::string(yaml));
    if (documents.size() > 1) {
      reader.Error(documents[1].Mark(), "",
                   absl::StrCat("expected one YAML document, found ", documents.size()));
    } else if (!documents.empty()) {
      reader.ReadMessage(documents[0], "", message);
    }
  } catch (const YAML::Exception& e) {
    reader.Error(e.mark, "", absl::StrCat("YAML syntax error: ", e.msg));
  }
  return FieldErrorsToStatus(reader.errors(), reader.more_errors());
}

absl::Status SetFieldFromYaml(Message* message, absl::string_view path, absl::string_view value,
                              const YamlSourceOptions& options, FieldLocations* locations) {
  // Work on a copy so that a failed override leaves `message` as it was.
  std::unique_ptr<Message> copy(message->New());
  copy->CopyFrom(*message);
  YamlReader reader(options, Marks::kOmit, locations);
  const absl::Status path_status = [&]() -> absl::Status {
    RM_ASSIGN_OR_RETURN(const std::vector<PathSegment> segments, ParsePath(path));
    YAML::Node node;
    try {
      node = YAML::Load(std::string(value));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": YAML syntax error in ", Quote(value),
                                                     " at column ", e.mark.column + 1, ": ",
                                                     e.msg));
    }
    return SetAtPath(copy.get(), segments, node, &reader);
  }();
  if (!path_status.ok()) {
    return FieldErrorsToStatus(
        {FieldError{options.source_name, "", std::string(path_status.message())}});
  }
  RM_RETURN_IF_ERROR(FieldErrorsToStatus(reader.errors(), reader.more_errors()));
  message->CopyFrom(*copy);
  return absl::OkStatus();
}

absl::Status ClearFieldAtPath(Message* message, absl::string_view path) {
  RM_ASSIGN_OR_RETURN(const std::vector<PathSegment> segments, ParsePath(path));
  std::string walked;
  Message* current = message;
  for (size_t i = 0; i < segments.size(); ++i) {
    walked = JoinPath(walked, segments[i].name);
    if (segments[i].index.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(walked, ": element indices cannot be cleared; clear the list"));
    }
    RM_ASSIGN_OR_RETURN(const FieldDescriptor* field,
                        FindField(*current->GetDescriptor(), segments[i].name, walked));
    const Reflection* reflection = current->GetReflection();
    if (i + 1 == segments.size()) {
      reflection->ClearField(current, field);
      break;
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(walked, ": is a list; it cannot be followed by '.'"));
    }
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return NotAMessage(*field, walked);
    // Never create what is not there: that would select a oneof member.
    if (!reflection->HasField(*current, field)) break;
    current = reflection->MutableMessage(current, field);
  }
  return absl::OkStatus();
}

std::string MessageToYaml(const Message& message) {
  YAML::Emitter out;
  EmitMessage(message, &out);
  return absl::StrCat(out.c_str(), "\n");
}

std::string MessageToFieldLines(const Message& message) {
  std::vector<std::string> lines;
  EmitFieldLines(message, "", &lines);
  std::string text;
  for (const std::string& line : lines) absl::StrAppend(&text, line, "\n");
  return text;
}

std::string EnumValueYamlName(const EnumValueDescriptor& value) {
  absl::string_view name = value.name();
  absl::ConsumePrefix(&name, absl::StrCat(UpperSnake(value.type()->name()), "_"));
  return absl::AsciiStrToLower(name);
}

std::string FormatNumber(double value) { return FormatShortest(value); }

}  // namespace ringmaster::spec
