#include "cli/plot.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/plural.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace ringmaster::cli {
namespace {

using train::MetricsRecord;
using Points = std::vector<std::pair<double, double>>;
using Value = std::function<std::optional<double>(const MetricsRecord&)>;

constexpr int kColumns = 2;
constexpr int kPanelWidth = 640, kPanelHeight = 360;

// A parsed line of a metrics file.
struct Line {
  int number = 0;
  MetricsRecord record;
};

struct BadLines {
  std::vector<int> numbers;
  std::string first_error;
};

// Records of run `of` replaced by later records of run `by` (the same run when equal).
struct Replaced {
  std::string of, by;
  std::vector<Line> lines;
};

std::string Quoted(const std::string& s) { return s.empty() ? "none" : s; }

std::string RunName(const MetricsRecord& r) {
  return r.run().empty() ? "a run without a name (written before records named their runs)"
                         : absl::StrCat("run ", r.run());
}

// "line 4" or "lines 2, 7, 9" (the first 5, then "and N more").
std::string LineList(const std::vector<int>& numbers) {
  std::vector<int> shown(numbers.begin(), numbers.begin() + std::min<size_t>(5, numbers.size()));
  std::string out = absl::StrCat(numbers.size() == 1 ? "line " : "lines ", absl::StrJoin(shown, ", "));
  if (numbers.size() > shown.size()) absl::StrAppend(&out, " and ", numbers.size() - shown.size(), " more");
  return out;
}

// "lines 1-130, steps 1-1300" of records in file order.
std::string LineRange(const std::vector<const Line*>& lines) {
  int64_t low = lines.front()->record.step(), high = low;
  int first = lines.front()->number, last = first;
  for (const Line* l : lines) {
    low = std::min<int64_t>(low, l->record.step());
    high = std::max<int64_t>(high, l->record.step());
    first = std::min(first, l->number);
    last = std::max(last, l->number);
  }
  const auto span = [](int64_t a, int64_t b) {
    return a == b ? absl::StrCat(a) : absl::StrCat(a, "-", b);
  };
  return absl::StrCat(first == last ? "line " : "lines ", span(first, last),
                      low == high ? ", step " : ", steps ", span(low, high));
}

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
  } else if (name == "accuracy") {
    *spec = NewPanel("test accuracy", "accuracy", x);
    add(if_set(&MetricsRecord::has_test_accuracy, &MetricsRecord::test_accuracy), "", false);
    if (spec->series.empty()) return "no record has a test_accuracy (no evaluation of a classifier)";
  } else if (name == "perplexity") {
    *spec = NewPanel("test perplexity", "perplexity", x);
    spec->log_y = true;
    add(if_set(&MetricsRecord::has_test_perplexity, &MetricsRecord::test_perplexity), "", false);
    if (spec->series.empty()) {
      return "no record has a test_perplexity (no evaluation of a language model)";
    }
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

// A series whose points equal an earlier one's is drawn exactly over it and would look
// missing: its legend says so, and so does a note.
void NoteIdenticalSeries(const std::string& name, plot::PlotSpec* spec,
                         std::vector<std::string>* notes) {
  std::vector<plot::Series>& series = spec->series;
  for (size_t j = 1; j < series.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      if (series[i].points != series[j].points) continue;
      notes->push_back(absl::StrCat("panel ", name, ": ", series[j].label, " is identical to ",
                                    series[i].label, " (", series[j].points.size(),
                                    " points; drawn over it)"));
      absl::StrAppend(&series[j].label, " (identical to ", series[i].label, ")");
      break;
    }
  }
}

// The lines of `jsonl` that are metrics records with a step, in file order; the others are
// said in `dropped`. INVALID_ARGUMENT (the first bad line's error) when no line is one.
absl::StatusOr<std::vector<Line>> ParseLines(absl::string_view jsonl, absl::string_view file,
                                             std::vector<std::string>* dropped) {
  std::vector<Line> lines;
  BadLines bad;
  const std::vector<absl::string_view> pieces = absl::StrSplit(jsonl, '\n');
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (absl::StripAsciiWhitespace(pieces[i]).empty()) continue;
    const int number = static_cast<int>(i) + 1;
    const std::string where = absl::StrCat(file, ":", number);
    MetricsRecord record;
    absl::Status parsed = FromJson(pieces[i], &record, where);
    // The last piece has no newline after it: a line still being written.
    if (!parsed.ok() && i + 1 == pieces.size()) {
      dropped->push_back(
          absl::StrCat(where, ": left out the last line, cut short (a run still writing it)"));
      break;
    }
    if (parsed.ok() && !record.has_step()) {
      parsed = absl::InvalidArgumentError(
          absl::StrCat(where, ": no \"step\" (is this a ringmaster metrics.jsonl?)"));
    }
    if (!parsed.ok()) {
      if (bad.numbers.empty()) bad.first_error = std::string(parsed.message());
      bad.numbers.push_back(number);
      continue;
    }
    lines.push_back({number, std::move(record)});
  }
  if (bad.numbers.empty()) return lines;
  if (lines.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        bad.first_error, bad.numbers.size() > 1
                             ? absl::StrCat(" (and ", bad.numbers.size() - 1,
                                            " more lines that are not metrics records)")
                             : ""));
  }
  dropped->push_back(absl::StrCat(file, ": left out ", Plural(bad.numbers.size(), "line"),
                                  " that ", bad.numbers.size() == 1 ? "is" : "are",
                                  " not a metrics record (", LineList(bad.numbers),
                                  "); the first: ", bad.first_error));
  return lines;
}

// The lines of the last record's job and configuration: the records of another are another
// experiment, left out and said in `dropped`, one note per run.
std::vector<Line> KeepTheLastJobAndConfig(const std::vector<Line>& lines, absl::string_view file,
                                          std::vector<std::string>* dropped) {
  if (lines.empty()) return {};
  const MetricsRecord& last = lines.back().record;
  std::vector<Line> kept;
  std::vector<std::pair<std::string, std::vector<const Line*>>> others;  // by run, in order
  for (const Line& line : lines) {
    if (line.record.job() == last.job() && line.record.config() == last.config()) {
      kept.push_back(line);
      continue;
    }
    const std::string key = RunName(line.record);
    auto it = std::find_if(others.begin(), others.end(), [&](const auto& o) { return o.first == key; });
    if (it == others.end()) it = others.insert(others.end(), {key, {}});
    it->second.push_back(&line);
  }
  for (const auto& [run, group] : others) {
    const MetricsRecord& first = group.front()->record;
    dropped->push_back(absl::StrCat(
        file, ": left out ", Plural(group.size(), "record"), " of ", run, " (",
        LineRange(group), "), ",
        first.job().empty() && first.config().empty()
            ? std::string("which name no job or configuration")
        : first.job() != last.job()
            ? absl::StrCat("another job (", Quoted(first.job()), ", drawn: ", Quoted(last.job()), ")")
            : absl::StrCat("another configuration (config ", Quoted(first.config()),
                           ", drawn: ", Quoted(last.config()), ")"),
        ": the file mixes runs, and the last one's is drawn; give each run a file of its own "
        "(metrics.jsonl: out/{run}.metrics.jsonl)"));
  }
  return kept;
}

// One record per step: a resumed run repeats steps, and its records replace the earlier ones
// from there on; what was replaced is said in `dropped`, one note per pair of runs.
std::vector<Line> ReplaceRepeatedSteps(std::vector<Line> kept, absl::string_view file,
                                       std::vector<std::string>* dropped) {
  std::vector<Line> out;
  std::vector<Replaced> replaced;
  for (Line& line : kept) {
    while (!out.empty() && out.back().record.step() >= line.record.step()) {
      const std::string by = RunName(line.record), of = RunName(out.back().record);
      auto it = std::find_if(replaced.begin(), replaced.end(),
                             [&](const Replaced& r) { return r.of == of && r.by == by; });
      if (it == replaced.end()) it = replaced.insert(replaced.end(), Replaced{of, by, {}});
      it->lines.push_back(out.back());
      out.pop_back();
    }
    out.push_back(std::move(line));
  }
  for (const Replaced& r : replaced) {
    std::vector<const Line*> group;
    for (const Line& line : r.lines) group.push_back(&line);
    dropped->push_back(absl::StrCat(
        file, ": ", Plural(r.lines.size(), "record"), " (", LineRange(group), ") replaced by ",
        r.of == r.by ? "a resumption of the same run, which trained those steps again"
                     : absl::StrCat(r.by, "'s, which trained those steps again (", r.of,
                                    " has the same job and configuration: a resumption, or "
                                    "the same spec run again)")));
  }
  return out;
}

}  // namespace

absl::StatusOr<MetricsHistory> ParseMetricsHistory(absl::string_view jsonl,
                                                   absl::string_view file) {
  MetricsHistory history;
  RM_ASSIGN_OR_RETURN(std::vector<Line> lines, ParseLines(jsonl, file, &history.dropped));
  std::vector<Line> kept = KeepTheLastJobAndConfig(lines, file, &history.dropped);
  for (Line& line : ReplaceRepeatedSteps(std::move(kept), file, &history.dropped)) {
    history.records.push_back(std::move(line.record));
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
      NoteIdenticalSeries(name, &spec, &curves.notes);
      curves.panels.push_back(std::move(spec));
    }
  }
  return curves;
}

absl::StatusOr<PlotResult> PlotCurves(const PlotFlags& flags) {
  const std::vector<std::string> labels =
      flags.labels.empty() ? DefaultLabels(flags.files) : flags.labels;
  std::vector<PlotRun> runs;
  std::vector<std::string> dropped;  // what the files held that is not drawn
  for (size_t i = 0; i < flags.files.size(); ++i) {
    const std::string& file = flags.files[i];
    RM_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
    PlotRun run;
    run.label = i < labels.size() ? labels[i] : file;
    RM_ASSIGN_OR_RETURN(MetricsHistory history, ParseMetricsHistory(text, file));
    if (history.records.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, ": no metrics record (give the metrics.jsonl of a job that logged a step)"));
    }
    run.records = std::move(history.records);
    dropped.insert(dropped.end(), history.dropped.begin(), history.dropped.end());
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
    const int64_t first = r.records.front().step(), last = r.records.back().step();
    run_labels.push_back(absl::StrCat(
        r.label, " (", Plural(r.records.size(), "record"),
        first == last ? absl::StrCat(", step ", first) : absl::StrCat(", steps ", first, "-", last),
        r.records.back().run().empty() || r.records.back().run() == r.label
            ? ""
            : absl::StrCat(", run ", r.records.back().run()),
        ")"));
  }
  result.summary = absl::StrCat("wrote ", flags.out, ": ", Plural(runs.size(), "run"), " (",
                                absl::StrJoin(run_labels, ", "),
                                "); panels: ", absl::StrJoin(drawn, ", "), "\n");
  result.notes = std::move(dropped);
  result.notes.insert(result.notes.end(), curves.notes.begin(), curves.notes.end());
  return result;
}

}  // namespace ringmaster::cli
