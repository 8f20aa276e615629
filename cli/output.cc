#include "cli/output.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "common/plural.h"
#include "common/progress_rate.h"
#include "google/protobuf/util/json_util.h"
#include "proto/job_spec.pb.h"
#include "spec/job_spec.h"
#include "spec/yaml_proto.h"
#include "yaml-cpp/yaml.h"

namespace ringmaster::cli {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::ordered_json;

// Rewrites one value of `field` in protobuf's JSON (see the header): 64-bit integers to
// numbers, a JobSpec's enums to their YAML names, messages recursively. Returns false when
// the value is to be left out (an unset enum of a spec).
bool FixValue(const FieldDescriptor& field, bool in_spec, Json* value);

void FixMessage(const Descriptor& type, bool in_spec, Json* object) {
  if (!object->is_object()) return;
  in_spec = in_spec || type.full_name() == JobSpec::descriptor()->full_name();
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor& field = *type.field(i);
    auto it = object->find(field.name());
    if (it == object->end()) continue;
    if (field.is_map()) {
      const FieldDescriptor& value_field = *field.message_type()->map_value();
      for (auto& [key, entry] : it->items()) FixValue(value_field, in_spec, &entry);
    } else if (field.is_repeated()) {
      for (Json& element : *it) FixValue(field, in_spec, &element);
    } else if (!FixValue(field, in_spec, &*it)) {
      object->erase(it);
    }
  }
}

bool FixValue(const FieldDescriptor& field, bool in_spec, Json* value) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      if (int64_t n = 0; value->is_string() && absl::SimpleAtoi(value->get<std::string>(), &n)) {
        *value = n;
      }
      return true;
    case FieldDescriptor::CPPTYPE_UINT64:
      if (uint64_t n = 0; value->is_string() && absl::SimpleAtoi(value->get<std::string>(), &n)) {
        *value = n;
      }
      return true;
    case FieldDescriptor::CPPTYPE_ENUM: {
      if (!in_spec || !value->is_string()) return true;
      const EnumValueDescriptor* e =
          field.enum_type()->FindValueByName(value->get<std::string>());
      if (e == nullptr) return true;
      if (e->number() == 0 && !field.is_repeated()) return false;  // unset: YAML cannot say it
      *value = spec::EnumValueYamlName(*e);
      return true;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      // Well-known types (Timestamp, Duration, ...) have JSON forms of their own.
      if (field.message_type()->file()->package() != "google.protobuf") {
        FixMessage(*field.message_type(), in_spec, value);
      }
      return true;
    default:
      return true;
  }
}

// True when YAML (1.1 or 1.2) would read `s`, written plain, as something other than this
// string: a number, a boolean, null, a date, or nothing.
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  const std::string lower = absl::AsciiStrToLower(s);
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~",
                           ".nan", ".inf", "-.inf", "+.inf"}) {
    if (lower == word) return true;
  }
  double number = 0;
  if (absl::SimpleAtod(s, &number)) return true;
  // 2026-01-31 (a timestamp in YAML 1.1), 1_000 (an integer there)
  if (s.size() >= 10 && absl::ascii_isdigit(s[0]) && s[4] == '-' && s[7] == '-') return true;
  return absl::ascii_isdigit(s[0]) && s.find('_') != std::string::npos &&
         s.find_first_not_of("0123456789_.+-eE") == std::string::npos;
}

// A float YAML 1.1 readers also read as one: "1e-05" becomes "1.0e-05".
std::string YamlFloat(double value) {
  std::string text = spec::FormatNumber(value);
  const size_t e = text.find('e');
  if (e != std::string::npos && text.find('.') == std::string::npos) text.insert(e, ".0");
  return text;
}

void EmitYaml(const Json& value, YAML::Emitter* out) {
  switch (value.type()) {
    case Json::value_t::object:
      if (value.empty()) {
        *out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      *out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        *out << YAML::Key;
        if (NeedsQuotes(key)) *out << YAML::DoubleQuoted;
        *out << key << YAML::Value;
        EmitYaml(item, out);
      }
      *out << YAML::EndMap;
      return;
    case Json::value_t::array:
      if (value.empty()) {
        *out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      *out << YAML::BeginSeq;
      for (const Json& item : value) EmitYaml(item, out);
      *out << YAML::EndSeq;
      return;
    case Json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      if (NeedsQuotes(s)) *out << YAML::DoubleQuoted;
      *out << s;
      return;
    }
    case Json::value_t::boolean:
      *out << (value.get<bool>() ? "true" : "false");
      return;
    case Json::value_t::number_integer:
      *out << value.get<int64_t>();
      return;
    case Json::value_t::number_unsigned:
      *out << value.get<uint64_t>();
      return;
    case Json::value_t::number_float:
      *out << YamlFloat(value.get<double>());
      return;
    default:
      *out << YAML::Null;
      return;
  }
}

std::string Age(int64_t ms, absl::Time now) {
  if (ms <= 0) return "-";
  return HumanDuration(now - absl::FromUnixMillis(ms));
}

std::string StepText(const Job& job) {
  const int64_t step = std::max<int64_t>(0, job.step());
  if (job.total_steps() > 0) return absl::StrCat(step, "/", job.total_steps());
  return step > 0 ? absl::StrCat(step) : "-";
}

std::string LossText(const Job& job) {
  return job.step() > 0 ? absl::StrFormat("%.4g", job.loss()) : "-";
}


std::string SlotText(const SlotRef& slot) { return absl::StrCat(slot.node(), "/", slot.slot()); }

std::string MemberState(const Member& m) {
  if (m.finished()) return "finished";
  if (m.ready()) return "ready";
  return m.joined() ? "joined" : "joining";
}

bool Running(const Job& job) {
  return job.phase() == JOB_PHASE_RUNNING || job.phase() == JOB_PHASE_COMMITTED;
}

// Every non-empty line of `text` after `prefix`.
std::string Indent(absl::string_view text, absl::string_view prefix) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, prefix, line, "\n");
  }
  return out;
}

std::string Seconds(double s) { return absl::StrFormat("%.2fs", s); }

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text.empty() || text == "table") return OutputFormat::kTable;
  if (text == "wide") return OutputFormat::kWide;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("-o ", text, ": use one of table, wide, json, yaml"));
}

absl::StatusOr<Json> MessageToJsonValue(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string text;
  if (const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
      !status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName(),
                                            " as JSON: ", status.ToString()));
  }
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InternalError(absl::StrCat("protobuf printed invalid JSON for ",
                                            message.GetTypeName()));
  }
  FixMessage(*message.GetDescriptor(), /*in_spec=*/false, &value);
  return value;
}

std::string JsonValueToYaml(const Json& value) {
  YAML::Emitter out;
  EmitYaml(value, &out);
  return absl::StrCat(out.c_str(), "\n");
}

absl::StatusOr<std::string> FormatMessage(const google::protobuf::Message& message,
                                          OutputFormat format) {
  if (format != OutputFormat::kJson && format != OutputFormat::kYaml) {
    return absl::InvalidArgumentError("FormatMessage prints JSON or YAML only");
  }
  auto value = MessageToJsonValue(message);
  if (!value.ok()) return value.status();
  return FormatJsonValue(*value, format);
}

std::string FormatJsonValue(const Json& value, OutputFormat format) {
  if (format != OutputFormat::kJson) return JsonValueToYaml(value);
  return absl::StrCat(value.dump(2, ' ', false, Json::error_handler_t::replace), "\n");
}

absl::StatusOr<std::string> MessageToJsonLine(const google::protobuf::Message& message) {
  auto value = MessageToJsonValue(message);
  if (!value.ok()) return value.status();
  return absl::StrCat(value->dump(-1, ' ', false, Json::error_handler_t::replace), "\n");
}

std::string HumanDuration(absl::Duration d) {
  const int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < 0) return "0s";
  if (seconds < 120) return absl::StrCat(seconds, "s");
  const int64_t minutes = seconds / 60;
  if (minutes < 10) {
    return seconds % 60 == 0 ? absl::StrCat(minutes, "m")
                             : absl::StrCat(minutes, "m", seconds % 60, "s");
  }
  if (minutes < 3 * 60) return absl::StrCat(minutes, "m");
  const int64_t hours = minutes / 60;
  if (hours < 8) {
    return minutes % 60 == 0 ? absl::StrCat(hours, "h")
                             : absl::StrCat(hours, "h", minutes % 60, "m");
  }
  if (hours < 48) return absl::StrCat(hours, "h");
  const int64_t days = hours / 24;
  if (days < 8) {
    return hours % 24 == 0 ? absl::StrCat(days, "d") : absl::StrCat(days, "d", hours % 24, "h");
  }
  if (days < 2 * 365) return absl::StrCat(days, "d");
  const int64_t years = days / 365;
  if (years < 8 && days % 365 != 0) return absl::StrCat(years, "y", days % 365, "d");
  return absl::StrCat(years, "y");
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (row.size() > widths.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 3, ' ');
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

std::string PhaseName(JobPhase phase) {
  return absl::AsciiStrToLower(absl::StripPrefix(JobPhase_Name(phase), "JOB_PHASE_"));
}

std::string Eta(const Job& job) {
  if (!Running(job)) return "";
  const std::optional<double> eta = EtaSeconds(job.step(), job.total_steps(), job.steps_per_s());
  return eta ? EtaText(*eta) : "";
}

std::string JobsTable(const std::vector<Job>& jobs, absl::Time now, bool wide, bool all) {
  if (jobs.empty()) {
    return absl::StrCat("no jobs", all ? "" : " running (--all shows finished ones)", "\n");
  }
  std::vector<std::vector<std::string>> rows;
  if (wide) {
    rows.push_back({"NAME", "PHASE", "STEP", "LOSS", "RANKS", "MIN-MAX", "MEMBERSHIP-EPOCH",
                    "RESTARTS", "STEPS/S", "ETA", "AGE", "MEMBERS", "REASON"});
  } else {
    rows.push_back({"NAME", "PHASE", "STEP", "LOSS", "RANKS", "AGE"});
  }
  for (const Job& j : jobs) {
    if (!wide) {
      rows.push_back({j.id(), PhaseName(j.phase()), StepText(j), LossText(j),
                      absl::StrCat(j.members_size()), Age(j.submitted_ms(), now)});
      continue;
    }
    std::vector<std::string> members;
    for (const Member& m : j.members()) members.push_back(SlotText(m.slot()));
    const std::string eta = Eta(j);
    rows.push_back({j.id(), PhaseName(j.phase()), StepText(j), LossText(j),
                    absl::StrCat(j.members_size()),
                    absl::StrCat(j.min_ranks(), "-", j.max_ranks()), absl::StrCat(j.epoch()), absl::StrCat(j.restarts(), "/", j.restart_budget()),
                    j.steps_per_s() > 0 ? absl::StrFormat("%.2f", j.steps_per_s()) : "-",
                    eta.empty() ? "-" : eta, Age(j.submitted_ms(), now),
                    members.empty() ? "-" : absl::StrJoin(members, ","),
                    j.reason().empty() ? "-" : j.reason()});
  }
  return FormatTable(rows);
}

std::string NodesTable(const ListNodesResponse& response, bool wide) {
  if (response.nodes().empty()) {
    return "no nodes: no agent has registered (start ringworker on each node)\n";
  }
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NODE", "STATUS", "HEARTBEAT", "SLOT", "JOB", "RANK", "NOTE"});
  if (wide) {
    for (const char* column : {"GPU", "ADDRESS", "LOGS"}) rows[0].push_back(column);
  }
  for (const NodeInfo& n : response.nodes()) {
    const std::string status = n.awaiting_agent()    ? "awaiting agent"
                               : n.lease_left_s() <= 0 ? "lease expired"
                               : n.draining()          ? "draining"
                                                       : "ready";
    const std::string heartbeat = n.last_heartbeat_age_s() < 0
                                      ? "-"
                                      : HumanDuration(absl::Seconds(n.last_heartbeat_age_s()));
    bool first = true;
    for (const SlotInfo& slot : n.slots()) {
      std::vector<std::string> notes;
      if (!slot.exiting_job().empty()) {
        notes.push_back(absl::StrCat("trainer of ", slot.exiting_job(), " exiting"));
      }
      if (slot.backoff_s() > 0) {
        notes.push_back(
            absl::StrCat("backing off ", HumanDuration(absl::Seconds(slot.backoff_s()))));
      }
      std::vector<std::string> row = {
          first ? n.node() : "", first ? status : "", first ? heartbeat : "",
          absl::StrCat(slot.slot()), slot.job().empty() ? "-" : slot.job(),
          slot.job().empty() || slot.rank() < 0 ? "-" : absl::StrCat(slot.rank()),
          notes.empty() ? "-" : absl::StrJoin(notes, "; ")};
      if (wide) {
        row.push_back(slot.gpu().empty() ? "-" : slot.gpu());
        row.push_back(first && !n.address().empty() ? n.address() : first ? "-" : "");
        row.push_back(first && !n.log_address().empty() ? n.log_address() : first ? "-" : "");
      }
      rows.push_back(std::move(row));
      first = false;
    }
  }
  return FormatTable(rows);
}

std::string ProgressLine(const Job& job, absl::Time now) {
  std::string line = absl::StrFormat(
      "%-20s %-10s membership epoch %-3d ranks %-3d step %-12s loss %-8s restarts %d  elapsed %s",
      job.id(), PhaseName(job.phase()), job.epoch(), job.members_size(), StepText(job),
      LossText(job), job.restarts(), Age(job.submitted_ms(), now));
  if (const std::string eta = Eta(job); !eta.empty()) absl::StrAppend(&line, ", ETA ", eta);
  if (!job.reason().empty()) absl::StrAppend(&line, "  (", job.reason(), ")");
  return line;
}

// A command job's first failure (Job.first_failure): who, how and when on one line; what its
// error file and its last output line said below.
std::string FirstFailureText(const RankFailure& f, absl::Time now) {
  const absl::Time at = absl::FromUnixMicros(static_cast<int64_t>(f.failed_at_s() * 1e6));
  std::string out = absl::StrCat(
      "  first failure: rank ", f.rank(), " (node ", f.slot().node(), ", slot ", f.slot().slot(),
      ") in membership epoch ", f.epoch(), ": ", f.program(), f.program().empty() ? "" : ": ",
      f.how(), "\n    at ", absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", at, absl::UTCTimeZone()),
      " (", Age(absl::ToUnixMillis(at), now), " ago; ",
      f.failed_at_from_error_file() ? "its error file's time" : "when its exit was seen", ")\n");
  if (!f.error_message().empty()) {
    absl::StrAppend(&out, "    error file: ",
                    absl::StrReplaceAll(f.error_message(), {{"\n", "\n      "}}), "\n");
  }
  if (!f.last_output_line().empty()) {
    absl::StrAppend(&out, "    last output line: ", f.last_output_line(), "\n");
  }
  return out;
}

std::string JobDescription(const Job& job, absl::Time now, bool wide) {
  std::string out = absl::StrFormat("job %s: %s for %s (submitted %s ago)\n", job.id(),
                                    PhaseName(job.phase()), Age(job.phase_since_ms(), now),
                                    Age(job.submitted_ms(), now));
  if (!job.reason().empty()) absl::StrAppend(&out, "  reason: ", job.reason(), "\n");
  if (job.has_first_failure()) absl::StrAppend(&out, FirstFailureText(job.first_failure(), now));
  if (!job.cannot_grow().empty() && job.members_size() < job.max_ranks() &&
      job.phase() != JOB_PHASE_SUCCEEDED && job.phase() != JOB_PHASE_FAILED &&
      job.phase() != JOB_PHASE_CANCELLED) {
    absl::StrAppend(&out, "  ", job.cannot_grow(), "\n");
  }
  absl::StrAppendFormat(&out,
                        "  membership epoch %d (%s), %s, min %d max %d, restarts %d of "
                        "%d\n",
                        job.epoch(), job.epoch_cause().empty() ? "-" : job.epoch_cause(),
                        Plural(job.members_size(), "member"), job.min_ranks(), job.max_ranks(), job.restarts(),
                        job.restart_budget());
  absl::StrAppendFormat(&out, "  step %s, loss %s, %.2f steps/s %s", StepText(job),
                        LossText(job), job.steps_per_s(), RateWindowText());
  if (const std::string eta = Eta(job); !eta.empty()) absl::StrAppend(&out, ", ETA ", eta);
  out += "\n";
  if (!job.checkpoint_error().empty()) {
    absl::StrAppendFormat(&out, "  checkpoint of step %d failed: %s\n",
                          job.checkpoint_error_step(), job.checkpoint_error());
  }
  for (const std::string& s : job.stragglers()) absl::StrAppend(&out, "  straggler: ", s, "\n");
  if (job.excluded_nodes_size() > 0) {
    absl::StrAppend(&out, "  not placed on (its data is missing there): ",
                    absl::StrJoin(job.excluded_nodes(), ", "), "\n");
  }
  if (job.members_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    if (wide) {
      rows.push_back({"RANK", "SLOT", "STEP", "STATE", "PROGRESS", "JOINED", "READY"});
    } else {
      rows.push_back({"RANK", "SLOT", "STEP", "STATE", "PROGRESS"});
    }
    for (const Member& m : job.members()) {
      std::vector<std::string> row = {
          m.rank() < 0 ? "-" : absl::StrCat(m.rank()), SlotText(m.slot()),
          m.step() < 0 ? "-" : absl::StrCat(m.step()), MemberState(m),
          Age(m.last_progress_ms(), now)};
      if (wide) {
        row.push_back(m.joined() ? "yes" : "no");
        row.push_back(m.ready() ? "yes" : "no");
      }
      rows.push_back(std::move(row));
    }
    absl::StrAppend(&out, Indent(FormatTable(rows), "  "));
  }
  for (const Recovery& r : job.recoveries()) {
    // Where the new epoch resumed from and what that cost, as its trainers said it.
    const std::string lost =
        !r.resumed_from().empty()
            ? ResumeText(r.step_before(), r.resumed_from_step(), r.resumed_from(),
                         r.lost_because())
        : r.lost_steps() < 0
            ? "steps lost: not known yet"
            : absl::StrCat(r.lost_steps(), " steps lost",
                           wide ? absl::StrCat(" (from step ", r.step_before(), ")") : "");
    absl::StrAppendFormat(
        &out,
        "  recovery to membership epoch %d (%s): %d -> %d ranks; %srendezvous %.2fs, restore "
        "%.2fs, first step %.2fs, %s — %s\n",
        r.epoch(), r.cause(), r.old_world(), r.new_world(),
        wide ? absl::StrCat("began ", Age(r.began_ms(), now), " ago, detected in ",
                            Seconds(r.detect_s()), ", ")
             : "",
        r.rendezvous_s(), r.restore_s(), r.first_step_s(), lost, r.reason());
  }
  if (!wide) return out;
  if (job.checkpoints_size() > 0) {
    std::vector<std::vector<std::string>> rows = {{"STEP", "WORLD", "BYTES", "AGE", "PATH"}};
    for (const CheckpointInfo& c : job.checkpoints()) {
      rows.push_back({absl::StrCat(c.step()), absl::StrCat(c.world_size()),
                      absl::StrCat(c.bytes()), Age(c.committed_ms(), now), c.path()});
    }
    absl::StrAppend(&out, "  checkpoints:\n");
    absl::StrAppend(&out, Indent(FormatTable(rows), "  "));
  }
  absl::StrAppend(&out, "  spec:\n");
  absl::StrAppend(&out, Indent(spec::JobSpecToYaml(job.spec()), "    "));
  return out;
}

namespace {

// A per-step figure, scaled, with `decimals` and `unit`: "-" before the first step.
std::string PerStep(double total, int64_t steps, int decimals, double scale = 1,
                    absl::string_view unit = "") {
  return steps > 0 ? absl::StrFormat("%.*f%s", decimals, scale * total / steps, unit) : "-";
}

// Measured over formula, "-" where no formula applies.
std::string Ratio(int64_t measured, int64_t formula) {
  return formula > 0 ? absl::StrFormat("%.3f", static_cast<double>(measured) / formula) : "-";
}

}  // namespace

std::string CommTable(const JobEvent& event, std::optional<int> rank) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "GROUP", "OP", "CALLS/STEP", "MB/STEP", "FORMULA_MB", "RATIO", "TIME/STEP"}};
  const RankStats* selected = nullptr;
  for (const RankStats& r : event.ranks()) {
    if (rank && r.rank() != *rank) continue;
    selected = &r;
    const int64_t steps = r.process_steps();
    for (const CommOpStats& op : r.comm_ops()) {
      rows.push_back({absl::StrCat(r.rank()), absl::StrCat(op.group(), "(", op.group_size(), ")"),
                      op.op(), PerStep(op.calls(), steps, 1),
                      PerStep(op.bytes_sent(), steps, 3, 1e-6),
                      PerStep(op.formula_bytes_sent(), steps, 3, 1e-6),
                      Ratio(op.bytes_sent(), op.formula_bytes_sent()),
                      PerStep(op.seconds(), steps, 2, 1e3, "ms")});
    }
  }
  if (rows.size() == 1) return "";
  std::string out = absl::StrCat(
      "communication per step (", rank ? absl::StrCat("rank ", *rank) : "every rank",
      "; FORMULA_MB: the algorithm's, e.g. ring 2(N-1)/N x B)\n", Indent(FormatTable(rows), "  "));
  if (!rank || selected->buckets().empty()) return out;
  std::vector<std::vector<std::string>> buckets = {
      {"BUCKET", "MB", "CALLS/STEP", "MB/STEP", "FORMULA_MB", "RATIO", "TIME/STEP"}};
  const int64_t steps = selected->process_steps();
  for (const BucketStats& b : selected->buckets()) {
    buckets.push_back({absl::StrCat(b.bucket()), absl::StrFormat("%.3f", 1e-6 * b.bytes()),
                       PerStep(b.calls(), steps, 1), PerStep(b.bytes_sent(), steps, 3, 1e-6),
                       PerStep(b.formula_bytes_sent(), steps, 3, 1e-6),
                       Ratio(b.bytes_sent(), b.formula_bytes_sent()),
                       PerStep(b.seconds(), steps, 2, 1e3, "ms")});
  }
  absl::StrAppend(&out, "gradient buckets of rank ", *rank, "\n",
                  Indent(FormatTable(buckets), "  "));
  return out;
}

std::string TopFrame(const JobEvent& event, absl::Time now, std::optional<int> comm_rank) {
  std::string out = absl::StrCat(ProgressLine(event.job(), now), "\n");
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "SLOT", "STEP", "STEP_TIME", "COMM", "LOSS", "GRAD_NORM", "SLOWDOWN"}};
  for (const RankStats& r : event.ranks()) {
    rows.push_back({absl::StrCat(r.rank()), SlotText(r.slot()), absl::StrCat(r.step()),
                    absl::StrFormat("%.1fms", 1e3 * r.step_time_s()),
                    absl::StrFormat("%.0f%%", 100 * r.comm_fraction()),
                    absl::StrFormat("%.4g", r.loss()), absl::StrFormat("%.3g", r.grad_norm()),
                    r.slowdown() <= 0 ? "-"
                                      : absl::StrFormat("%.1fx%s", r.slowdown(),
                                                        r.straggler() ? " straggler" : "")});
  }
  absl::StrAppend(&out, Indent(FormatTable(rows), "  "), CommTable(event, comm_rank));
  return out;
}

}  // namespace ringmaster::cli
