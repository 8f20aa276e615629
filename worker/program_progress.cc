#include "worker/program_progress.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "glog/logging.h"
#include "train/result.pb.h"

namespace ringmaster::worker {

namespace {

// A number of the channel: a JSON number, or the strings the module sends for NaN and the
// infinities (JSON has none). nullopt for anything else.
std::optional<double> Number(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  return std::nullopt;
}

// A count of the channel (step, samples, tokens): a non-negative integer, else nullopt.
std::optional<int64_t> Count(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return static_cast<int64_t>(value.get<uint64_t>());
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<int64_t>();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgramProgress>> ProgramProgress::Create(
    const ProgramProgressOptions& options) {
  std::unique_ptr<ProgramProgress> p(new ProgramProgress(options));
  if (options.rank == 0 && !options.metrics_jsonl.empty()) {
    std::error_code ignored;  // a failure to create it shows when opening the file
    std::filesystem::create_directories(
        std::filesystem::path(options.metrics_jsonl).parent_path(), ignored);
    p->metrics_.open(options.metrics_jsonl, std::ios::out | std::ios::app);
    if (!p->metrics_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "metrics.jsonl: cannot write ", options.metrics_jsonl, " (does its directory exist?)"));
    }
  }
  return p;
}

void ProgramProgress::Take(const nlohmann::json& message, absl::Time now) {
  last_message_ = std::max(last_message_, now);
  const auto type_it = message.find("type");
  if (type_it == message.end() || !type_it->is_string()) return;
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == "hello") said_hello_ = true;
  if (type == "report") TakeReport(message, now);
}

bool ProgramProgress::Alive(absl::Time now) const {
  return !said_hello_ || now - last_message_ <= options_.heartbeat_timeout;
}

std::optional<RankStats> ProgramProgress::TakeStats() {
  if (!fresh_) return std::nullopt;
  fresh_ = false;
  return stats_;
}

void ProgramProgress::TakeReport(const nlohmann::json& m, absl::Time now) {
  const std::optional<int64_t> step = m.contains("step") ? Count(m["step"]) : std::nullopt;
  if (!step) {
    LOG(WARNING) << "program report without a step that is an integer >= 0, dropped: "
                 << m.dump().substr(0, 200);
    return;
  }
  std::optional<double> loss;
  std::optional<int64_t> samples, tokens;
  for (const auto& [field, out] : {std::pair{"samples", &samples}, std::pair{"tokens", &tokens}}) {
    if (!m.contains(field)) continue;
    *out = Count(m[field]);
    if (!*out) {
      LOG(WARNING) << "program report whose " << field << " is not an integer >= 0, dropped: "
                   << m.dump().substr(0, 200);
      return;
    }
  }
  if (m.contains("loss") && !(loss = Number(m["loss"]))) {
    LOG(WARNING) << "program report whose loss is not a number, dropped: "
                 << m.dump().substr(0, 200);
    return;
  }
  absl::Time at = now;
  if (auto t = m.find("time"); t != m.end() && t->is_number()) {
    at = absl::FromUnixMicros(static_cast<int64_t>(t->get<double>() * 1e6));
  }
  if (*step < step_ || (step_ >= 0 && at < step_at_)) {  // an older checkpoint restored
    sample_rate_.Clear();
    token_rate_.Clear();
  }
  RankStats& s = stats_;
  if (step_ >= 0 && *step > step_ && at > step_at_) {
    s.set_step_time_s(absl::ToDoubleSeconds(at - step_at_) / static_cast<double>(*step - step_));
  }
  step_ = *step;
  step_at_ = at;
  rate_.Add(at, *step);
  samples_ += samples.value_or(0);
  tokens_ += tokens.value_or(0);
  sample_rate_.Add(at, samples_);
  token_rate_.Add(at, tokens_);
  s.set_rank(options_.rank);
  s.set_step(*step);
  if (loss) s.set_loss(*loss);
  s.set_steps_per_s(rate_.steps_per_s());
  s.set_samples_per_s(sample_rate_.steps_per_s());
  s.set_tokens_per_s(token_rate_.steps_per_s());
  if (auto scalars = m.find("scalars"); scalars != m.end() && scalars->is_object()) {
    auto scalar = [&](const char* name, void (RankStats::*set)(double)) {
      if (auto v = scalars->find(name); v != scalars->end()) {
        if (std::optional<double> x = Number(*v)) (s.*set)(*x);
      }
    };
    scalar("lr", &RankStats::set_lr);
    scalar("grad_norm", &RankStats::set_grad_norm);
    scalar("comm_fraction", &RankStats::set_comm_fraction);
    scalar("exposed_comm_fraction", &RankStats::set_exposed_comm_fraction);
  }
  fresh_ = true;
  if (metrics_.is_open() &&
      (recorded_step_ < 0 || *step < recorded_step_ || *step >= recorded_step_ + options_.log_every)) {
    WriteRecord(m, s, recorded_step_ < 0 ? 0 : absl::ToDoubleSeconds(at - recorded_at_));
    recorded_step_ = *step;
    recorded_at_ = at;
  }
}

void ProgramProgress::WriteRecord(const nlohmann::json& m, const RankStats& s, double window_s) {
  train::MetricsRecord record;
  record.set_step(static_cast<int32_t>(s.step()));
  if (m.contains("loss")) record.set_loss(s.loss());
  record.set_lr(s.lr());
  if (s.grad_norm() != 0) record.set_grad_norm(s.grad_norm());
  if (s.samples_per_s() > 0) record.set_samples_per_second(s.samples_per_s());
  if (s.tokens_per_s() > 0) record.set_tokens_per_second(s.tokens_per_s());
  if (window_s > 0) record.set_window_seconds(window_s);
  record.set_loss_scale(1);
  record.set_job(options_.job);
  record.set_run(options_.run);
  nlohmann::json line = nlohmann::json::parse(ToJsonLine(record), nullptr, false);
  if (line.is_discarded()) return;
  // A loss that is not finite is left out, as a built-in trainer's record leaves it out.
  if (auto loss = line.find("loss"); loss != line.end() && !std::isfinite(s.loss())) {
    line.erase(loss);
  }
  // The program's own scalars, as the program named them (ringctl plot ignores keys it does
  // not know); the not-finite ones left out.
  if (auto scalars = m.find("scalars"); scalars != m.end() && scalars->is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, value] : scalars->items()) {
      if (std::optional<double> x = Number(value); x && std::isfinite(*x)) out[name] = *x;
    }
    if (!out.empty()) line["scalars"] = std::move(out);
  }
  metrics_ << line.dump() << "\n";
  metrics_.flush();
}

}  // namespace ringmaster::worker
