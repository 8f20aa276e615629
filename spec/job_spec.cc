#include "spec/job_spec.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "spec/defaults.h"
#include "spec/validate.h"
#include "xxhash.h"

namespace ringmaster::spec {
namespace {

// A job name from a file name: "examples/fashion_mnist_mlp.yaml" → "fashion_mnist_mlp".
std::string NameFromPath(absl::string_view path) {
  if (const size_t slash = path.rfind('/'); slash != absl::string_view::npos) {
    path.remove_prefix(slash + 1);
  }
  if (const size_t dot = path.rfind('.'); dot != absl::string_view::npos && dot > 0) {
    path = path.substr(0, dot);
  }
  std::string name(path);
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') c = '_';
  }
  return name;
}

// Parse, override, default, validate; errors located by `source_name`.
absl::StatusOr<JobSpec> Load(absl::string_view yaml, const std::string& source_name,
                             const std::string& default_name,
                             absl::Span<const std::string> overrides) {
  JobSpec spec;
  FieldLocations locations;
  RM_RETURN_IF_ERROR(MergeYamlIntoMessage(yaml, YamlSourceOptions{source_name}, &spec, &locations));
  for (const std::string& assignment : overrides) {
    RM_RETURN_IF_ERROR(ApplyOverride(&spec, assignment, &locations));
  }
  if (spec.name().empty()) spec.set_name(default_name);
  ApplyJobSpecDefaults(&spec);
  std::vector<FieldError> errors = FindJobSpecErrors(spec);
  for (FieldError& error : errors) error.location = locations.Find(error.path);
  RM_RETURN_IF_ERROR(FieldErrorsToStatus(errors));
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                        absl::Span<const std::string> overrides) {
  RM_ASSIGN_OR_RETURN(const std::string yaml, ReadFile(path));
  return Load(yaml, path, NameFromPath(path), overrides);
}

absl::StatusOr<JobSpec> LoadJobSpecText(absl::string_view yaml,
                                        absl::Span<const std::string> overrides) {
  return Load(yaml, "", std::string(kDefaultJobName), overrides);
}

absl::Status ApplyOverride(JobSpec* spec, absl::string_view assignment, FieldLocations* locations) {
  const YamlSourceOptions options{absl::StrCat("--set ", assignment)};
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos) {
    return FieldErrorsToStatus({FieldError{options.source_name, "", "expected path=value"}});
  }
  return SetFieldFromYaml(spec, absl::StripAsciiWhitespace(assignment.substr(0, equals)),
                          assignment.substr(equals + 1), options, locations);
}

std::string JobSpecToYaml(const JobSpec& spec) { return MessageToYaml(spec); }

absl::StatusOr<std::string> JobSpecToJson(const JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!status.ok())
    return absl::InternalError(absl::StrCat("JobSpec to JSON: ", status.ToString()));
  return json;
}

uint64_t JobSpecHash(const JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    CHECK(spec.SerializeToCodedStream(&out)) << "JobSpec failed to serialize";
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

namespace {

// The spec without kOperationalFields.
JobSpec TrainingPart(const JobSpec& spec) {
  JobSpec training = spec;
  for (absl::string_view path : kOperationalFields) {
    const absl::Status status = ClearFieldAtPath(&training, path);
    CHECK(status.ok()) << "kOperationalFields names no field: " << status;
  }
  return training;
}

}  // namespace

uint64_t TrainingSpecHash(const JobSpec& spec) { return JobSpecHash(TrainingPart(spec)); }

bool RanksHoldWholeState(const JobSpec& spec) {
  const MeshSpec& mesh = spec.parallelism().mesh();
  return spec.parallelism().zero_stage() == 0 && std::max(1, mesh.tp()) == 1 &&
         std::max(1, mesh.pp()) == 1;
}

std::string TrainingSpecText(const JobSpec& spec) {
  return MessageToFieldLines(TrainingPart(spec));
}

absl::StatusOr<ResumePoint> ParseResume(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "auto") return ResumePoint{ResumePoint::Kind::kAuto, 0};
  if (lower == "never") return ResumePoint{ResumePoint::Kind::kNever, 0};
  if (lower == "extend") return ResumePoint{ResumePoint::Kind::kExtend, 0};
  int64_t step = 0;
  if (!text.empty() && absl::ascii_isdigit(text[0]) && absl::SimpleAtoi(text, &step)) {
    return ResumePoint{ResumePoint::Kind::kStep, step};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected auto, never, extend or a step number, got \"", text, "\""));
}

}  // namespace ringmaster::spec
