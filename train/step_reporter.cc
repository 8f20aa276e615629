#include "train/step_reporter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "train/result.pb.h"

namespace ringmaster::train {

std::string ShortDuration(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d + absl::Milliseconds(500)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

namespace {

// The metrics file is the job's history: a resumed or recovered run appends to it (its
// records carry their step, so a step trained again shows twice, in order). A last line cut
// short (a process killed while writing it) is dropped first, so that every line is JSON.
absl::Status OpenMetrics(const std::string& path, std::ofstream* out) {
  std::error_code ignored;  // a failure to create it shows when opening the file
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  if (std::ifstream in(path, std::ios::binary); in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      std::error_code error;
      std::filesystem::resize_file(path, keep, error);
      if (error) {
        return absl::FailedPreconditionError(absl::StrCat(
            "metrics.jsonl: cannot drop the cut-short last line of ", path, ": ", error.message()));
      }
      LOG(WARNING) << path << ": dropped a last line cut short (" << text.size() - keep
                   << " bytes)";
    }
  }
  out->open(path, std::ios::out | std::ios::app);
  if (!*out) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics.jsonl: cannot write ", path, " (does its directory exist?)"));
  }
  return absl::OkStatus();
}

// The record's numbers, as TensorBoard scalars named as its fields (but step, the event's
// own): those with presence only when set, and not-finite ones left out as in the JSON.
std::vector<std::pair<std::string, double>> Scalars(const MetricsRecord& record) {
  std::vector<std::pair<std::string, double>> out;
  const google::protobuf::Descriptor* d = record.GetDescriptor();
  const google::protobuf::Reflection* r = record.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->name() == "step" || (f->has_presence() && !r->HasField(record, f))) continue;
    double value = 0;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
        value = r->GetDouble(record, f);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
        value = r->GetInt32(record, f);
        break;
      default:
        continue;
    }
    if (std::isfinite(value)) out.emplace_back(f->name(), value);
  }
  return out;
}

}  // namespace

StepReporter::StepReporter(const StepReporterOptions& options)
    : options_(options),
      log_every_(std::max<int64_t>(1, options.config->log_every)),
      start_(absl::Now()),
      window_start_(start_) {}

absl::StatusOr<std::unique_ptr<StepReporter>> StepReporter::Create(
    const StepReporterOptions& options) {
  std::unique_ptr<StepReporter> r(new StepReporter(options));
  if (options.rank == 0 && !options.config->metrics_jsonl.empty()) {
    RM_RETURN_IF_ERROR(OpenMetrics(options.config->metrics_jsonl, &r->metrics_));
  }
  if (options.rank == 0 && !options.config->metrics_tensorboard.empty()) {
    TensorBoardWriterOptions tb;
    tb.dir = options.config->metrics_tensorboard;
    tb.start = absl::Now();
    RM_ASSIGN_OR_RETURN(r->tensorboard_, TensorBoardWriter::Create(tb));
  }
  return r;
}

void StepReporter::Say(const std::string& line) const {
  LOG(INFO) << line;
  if (options_.rank == 0 && options_.progress) options_.progress(line);
}

void StepReporter::StartAt(int64_t first_step) {
  first_step_ = first_step;
  start_ = window_start_ = absl::Now();
  excluded_ = training_time_ = absl::ZeroDuration();
  counted_step_ = first_step;
  rate_.Clear();
  rate_.Add(start_, first_step);
  sample_rate_.Clear();
  sample_rate_.Add(start_, total_samples_);
  // Once, so that each figure of the lines below is read as meant.
  if (options_.rank == 0) {
    Say(absl::StrCat("progress lines: samples/s (or tokens/s) and eta ", RateWindowText(),
                     "; data_epoch counts passes over the training data (not the job's "
                     "membership epoch)"));
  }
}

bool StepReporter::Logged(int64_t step) const {
  return (step + 1) % log_every_ == 0 || step + 1 == options_.total_steps || step == 0;
}

void StepReporter::Count(int64_t samples, const GradientSyncStats& stats) {
  const absl::Time now = absl::Now();
  rate_.Add(now, ++counted_step_);
  training_time_ = now - start_ - excluded_;
  batch_ = samples;
  window_samples_ += samples;
  total_samples_ += samples;
  sample_rate_.Add(now, total_samples_);
  window_comm_ += stats.comm_time;
  window_exposed_ += stats.exposed_wait;
}

StepReporter::Rates StepReporter::rates() const {
  Rates r;
  r.steps_per_s = rate_.steps_per_s();
  r.samples_per_s = sample_rate_.steps_per_s();  // "steps" of this rate are samples
  r.tokens_per_s = r.samples_per_s * static_cast<double>(options_.context);
  return r;
}

void StepReporter::Log(const StepLine& l, const GradientSyncStats& last) {
  const absl::Duration window = absl::Now() - window_start_;
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(window));
  const double sps = static_cast<double>(window_samples_) / secs;
  const double comm_s = absl::ToDoubleSeconds(window_comm_);
  // The line's rate and ETA are everyone's (common/progress_rate.h); the metrics record
  // keeps the window since the previous record, which it states (window_seconds).
  const Rates now = rates();
  const std::string rate = options_.context > 0
                               ? absl::StrFormat("%.0f tokens/s", now.tokens_per_s)
                               : absl::StrFormat("%.0f samples/s", now.samples_per_s);
  std::string line = absl::StrFormat(
      "step %d/%d data_epoch %d loss %.4f lr %.4g grad_norm %.3g %s comm %.1f%% (exposed %.1f%%)",
      l.step, options_.total_steps, l.epoch, l.loss, l.lr, l.grad_norm, rate,
      100 * comm_s / secs, 100 * absl::ToDoubleSeconds(window_exposed_) / secs);
  last_window_ = {sps, options_.context > 0 ? sps * options_.context : 0, comm_s / secs,
                  absl::ToDoubleSeconds(window_exposed_) / secs};
  const std::optional<double> eta = EtaSeconds(l.step, options_.total_steps, now.steps_per_s);
  absl::StrAppend(&line, " elapsed ", ShortDuration(absl::Now() - start_), " eta ",
                  eta ? EtaText(*eta) : "-");
  if (l.loss_scale) absl::StrAppend(&line, absl::StrFormat(" loss_scale %g", *l.loss_scale));
  if (l.test_accuracy) absl::StrAppend(&line, absl::StrFormat(" test_accuracy %.4f", *l.test_accuracy));
  if (l.test_perplexity) {
    absl::StrAppend(&line, absl::StrFormat(" val_loss %.4f val_perplexity %.3f", *l.test_loss,
                                           *l.test_perplexity));
  }
  Say(line);
  if (metrics_.is_open() || tensorboard_) {
    // One line of JSON (train/result.proto): a value that is not finite is left out.
    MetricsRecord record;
    record.set_step(static_cast<int32_t>(l.step));
    record.set_epoch(static_cast<int32_t>(l.epoch));
    record.set_loss(l.loss);
    record.set_lr(l.lr);
    record.set_grad_norm(l.grad_norm);
    record.set_local_grad_norm(l.local_grad_norm);
    record.set_samples_per_second(sps);
    if (options_.context > 0) record.set_tokens_per_second(sps * options_.context);
    record.set_comm_seconds(comm_s);
    record.set_exposed_comm_seconds(absl::ToDoubleSeconds(window_exposed_));
    record.set_window_seconds(secs);
    record.set_loss_scale(l.loss_scale.value_or(1.0));
    record.set_skipped_steps(static_cast<int32_t>(l.skipped_steps));
    if (l.test_accuracy) record.set_test_accuracy(*l.test_accuracy);
    if (l.test_loss) record.set_test_loss(*l.test_loss);
    if (l.test_perplexity) record.set_test_perplexity(*l.test_perplexity);
    record.set_job(options_.config->name);
    record.set_run(options_.config->metrics_run);
    record.set_config(options_.config->config_fingerprint);
    if (metrics_.is_open()) {
      metrics_ << ToJsonLine(record) << "\n";
      metrics_.flush();
    }
    if (tensorboard_) {
      if (absl::Status s = tensorboard_->WriteScalars(l.step, absl::Now(), Scalars(record));
          !s.ok()) {
        LOG(WARNING) << s << "; no more TensorBoard events in this run";
        tensorboard_.reset();
      }
    }
  }
  LOG(INFO) << "rank " << options_.rank << " step " << l.step << ": local gradient norm "
            << last.local_grad_norm << ", comm " << absl::FormatDuration(last.comm_time)
            << " (exposed " << absl::FormatDuration(last.exposed_wait) << ")";
  window_start_ = absl::Now();
  window_samples_ = 0;
  window_comm_ = window_exposed_ = absl::ZeroDuration();
}

}  // namespace ringmaster::train
