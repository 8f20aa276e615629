#include "cli/plot.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace ringmaster::cli {
namespace {

using train::MetricsRecord;
using Points = std::vector<std::pair<double, double>>;
using Value = std::function<std::optional<double>(const MetricsRecord&)>;

constexpr int kColumns = 2;
constexpr int kPanelWidth = 640, kPanelHeight = 360;

// The x of each record: its step, or the training seconds up to its end.
std::vector<double> XValues(const std::vector<MetricsRecord>& records, const std::string& x) {
  std::vector<double> out;
  double seconds = 0;
  for (const MetricsRecord& r : records) {
    seconds += r.has_window_seconds() ? r.window_seconds() : 0;
    out.push_back(x == "seconds" ? seconds : r.step());
  }
  return out;
}

Points PointsOf(const PlotRun& run, const std::vector<double>& xs, const Value& value) {
  Points out;
  for (size_t i = 0; i < run.records.size(); ++i) {
    if (std::optional<double> y = value(run.records[i])) out.emplace_back(xs[i], *y);
  }
  return out;
}

plot::PlotSpec NewPanel(const std::string& title, const std::string& y_label,
                        const std::string& x) {
  plot::PlotSpec spec;
  spec.title = title;
  spec.x_label = x == "seconds" ? "training time (s)" : "step";
  spec.y_label = y_label;
  spec.x_scale = plot::XScale::kLinear;
  spec.width = kPanelWidth;
  spec.height = kPanelHeight;
  return spec;
}

// Draws panel `name` into `spec`, or returns why it has no data.
std::optional<std::string> DrawPanel(const std::string& name, const std::vector<PlotRun>& runs,
                                     const std::vector<std::vector<double>>& xs,
                                     const std::string& x, plot::PlotSpec* spec) {
  // One series per run with points for `value`, in the run's colour.
  auto add = [&](const Value& value, absl::string_view suffix, bool dashed) {
    for (size_t i = 0; i < runs.size(); ++i) {
      Points points = PointsOf(runs[i], xs[i], value);
      if (points.empty()) continue;
      spec->series.push_back(plot::Series{absl::StrCat(runs[i].label, suffix), std::move(points),
                                          plot::PaletteColor(i), dashed});
    }
  };
  auto if_set = [](bool (MetricsRecord::*has)() const, double (MetricsRecord::*get)() const) {
    return Value([has, get](const MetricsRecord& r) -> std::optional<double> {
      if (!(r.*has)()) return std::nullopt;
      return (r.*get)();
    });
  };
  auto any_point = [&](const std::function<bool(double)>& pred) {
    for (const plot::Series& s : spec->series) {
      for (const auto& [px, py] : s.points) {
        if (pred(py)) return true;
      }
    }
    return false;
  };

  if (name == "loss") {
    *spec = NewPanel("loss", "loss", x);
    add(if_set(&MetricsRecord::has_loss, &MetricsRecord::loss), "", false);
    add(if_set(&MetricsRecord::has_test_loss, &MetricsRecord::test_loss), " test", true);
    if (spec->series.empty()) return "no record has a loss or test_loss";
  } else if (name == "lr") {
    *spec = NewPanel("learning rate", "learning rate", x);
    add([](const MetricsRecord& r) { return std::optional<double>(r.lr()); }, "", false);
    // lr has no presence: a file without it (a peer's) reads 0 throughout.
    if (!any_point([](double y) { return y != 0; })) return "no record has a learning rate";
  } else if (name == "throughput") {
    // tokens/s only when every record with a throughput has it, so the runs compare.
    bool tokens = false, all_tokens = true;
    for (const PlotRun& run : runs) {
      for (const MetricsRecord& r : run.records) {
        if (!r.has_samples_per_second()) continue;
        tokens = true;
        all_tokens = all_tokens && r.has_tokens_per_second();
      }
    }
    tokens = tokens && all_tokens;
    *spec = NewPanel("throughput (all ranks)", tokens ? "tokens/s" : "samples/s", x);
    add(tokens ? if_set(&MetricsRecord::has_tokens_per_second, &MetricsRecord::tokens_per_second)
               : if_set(&MetricsRecord::has_samples_per_second,
                        &MetricsRecord::samples_per_second),
        "", false);
    if (spec->series.empty()) return "no record has samples_per_second";
  } else if (name == "grad_norm") {
    *spec = NewPanel("gradient norm (global)", "gradient norm", x);
    add(if_set(&MetricsRecord::has_grad_norm, &MetricsRecord::grad_norm), "", false);
    if (spec->series.empty()) return "no record has grad_norm";
  } else if (name == "loss_scale") {
    *spec = NewPanel("loss scale (fp16)", "loss scale", x);
    spec->log_y = true;
    // 1 without fp16's scaler; 0 (absent) in a peer's file.
    add([](const MetricsRecord& r) {
          return r.loss_scale() > 0 ? std::optional<double>(r.loss_scale()) : std::nullopt;
        },
        "", false);
    if (!any_point([](double y) { return y != 1; })) {
      return "no run has a loss scale other than 1 (fp16 only)";
    }
  } else {
    return "not a panel";
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<MetricsRecord>> ParseMetricsHistory(absl::string_view jsonl,
                                                               absl::string_view file) {
  std::vector<MetricsRecord> history;
  const std::vector<absl::string_view> lines = absl::StrSplit(jsonl, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StripAsciiWhitespace(lines[i]).empty()) continue;
    const std::string where = absl::StrCat(file, ":", i + 1);
    MetricsRecord record;
    if (absl::Status parsed = FromJson(lines[i], &record, where); !parsed.ok()) {
      // The last piece has no newline after it: a line still being written.
      if (i + 1 == lines.size()) break;
      return parsed;
    }
    if (!record.has_step()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no \"step\" (is this a ringmaster metrics.jsonl?)"));
    }
    // A resumed run repeats steps: its records replace the earlier run's from there on.
    while (!history.empty() && history.back().step() >= record.step()) history.pop_back();
    history.push_back(std::move(record));
  }
  return history;
}

std::vector<std::string> DefaultLabels(const std::vector<std::string>& files) {
  std::vector<std::string> labels;
  for (const std::string& file : files) {
    absl::string_view name = file;
    if (size_t slash = name.rfind('/'); slash != absl::string_view::npos) {
      name.remove_prefix(slash + 1);
    }
    absl::ConsumeSuffix(&name, ".jsonl");
    absl::ConsumeSuffix(&name, ".metrics");
    labels.emplace_back(name.empty() ? absl::string_view(file) : name);
  }
  std::map<std::string, int> count;
  for (const std::string& l : labels) ++count[l];
  for (size_t i = 0; i < labels.size(); ++i) {
    if (count[labels[i]] > 1) labels[i] = files[i];
  }
  return labels;
}

Curves DrawCurves(const std::vector<PlotRun>& runs, const PlotFlags& flags) {
  std::vector<std::vector<double>> xs;
  for (const PlotRun& run : runs) xs.push_back(XValues(run.records, flags.x));
  Curves curves;
  for (const char* name : kPlotPanels) {
    if (!flags.panels.empty() &&
        std::find(flags.panels.begin(), flags.panels.end(), name) == flags.panels.end()) {
      continue;
    }
    plot::PlotSpec spec;
    if (std::optional<std::string> why = DrawPanel(name, runs, xs, flags.x, &spec)) {
      curves.notes.push_back(absl::StrCat("panel ", name, " left out: ", *why));
    } else {
      curves.panels.push_back(std::move(spec));
    }
  }
  return curves;
}

absl::StatusOr<PlotResult> PlotCurves(const PlotFlags& flags) {
  const std::vector<std::string> labels =
      flags.labels.empty() ? DefaultLabels(flags.files) : flags.labels;
  std::vector<PlotRun> runs;
  for (size_t i = 0; i < flags.files.size(); ++i) {
    const std::string& file = flags.files[i];
    RM_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
    PlotRun run;
    run.label = i < labels.size() ? labels[i] : file;
    RM_ASSIGN_OR_RETURN(run.records, ParseMetricsHistory(text, file));
    if (run.records.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, ": no metrics record (give the metrics.jsonl of a job that logged a step)"));
    }
    runs.push_back(std::move(run));
  }
  Curves curves = DrawCurves(runs, flags);
  if (curves.panels.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nothing to draw: ", absl::StrJoin(curves.notes, "; ")));
  }
  RM_RETURN_IF_ERROR(plot::WritePanels(curves.panels, kColumns, flags.out));
  PlotResult result;
  std::vector<std::string> drawn;
  for (const plot::PlotSpec& p : curves.panels) drawn.push_back(p.title);
  std::vector<std::string> run_labels;
  for (const PlotRun& r : runs) {
    run_labels.push_back(absl::StrCat(r.label, " (", r.records.size(), " records, steps ",
                                      r.records.front().step(), "-", r.records.back().step(),
                                      ")"));
  }
  result.summary = absl::StrCat("wrote ", flags.out, ": ", runs.size(), " run",
                                runs.size() == 1 ? "" : "s", " (", absl::StrJoin(run_labels, ", "),
                                "); panels: ", absl::StrJoin(drawn, ", "), "\n");
  result.notes = std::move(curves.notes);
  return result;
}

}  // namespace ringmaster::cli
