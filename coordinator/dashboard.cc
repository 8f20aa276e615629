#include "coordinator/dashboard.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/plural.h"
#include "common/progress_rate.h"
#include "plot/plot.h"

namespace ringmaster::coordinator::dashboard {
namespace {

constexpr absl::string_view kJobsPrefix = "/jobs/";
// A curve draws at most this many of the kept points (a marker each): more are not seen.
constexpr size_t kMaxPlottedPoints = 240;
// The newest rows a table shows of a long list (epochs, recoveries, checkpoints).
constexpr int kMaxRows = 50;

// Text for HTML content and attribute values (and SVG).
std::string Html(absl::string_view s) {
  return absl::StrReplaceAll(
      s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&#39;"}});
}

std::string PhaseName(ringmaster::JobPhase phase) {
  std::string name = JobPhase_Name(phase);
  absl::string_view view = name;
  absl::ConsumePrefix(&view, "JOB_PHASE_");
  return std::string(view);
}

std::string PhaseBadge(ringmaster::JobPhase phase) {
  const std::string name = PhaseName(phase);
  return absl::StrCat("<span class=\"phase ", absl::AsciiStrToLower(name), "\">", name, "</span>");
}

bool Finished(ringmaster::JobPhase phase) {
  return phase == JOB_PHASE_SUCCEEDED || phase == JOB_PHASE_FAILED || phase == JOB_PHASE_CANCELLED;
}

// A number with a thousands suffix: 1234.5 -> "1.23k".
std::string Short(double v) {
  if (!std::isfinite(v)) return "–";
  const double a = std::fabs(v);
  if (a >= 1e9) return absl::StrFormat("%.3gG", v / 1e9);
  if (a >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  if (a >= 1e3) return absl::StrFormat("%.3gk", v / 1e3);
  return absl::StrFormat("%.3g", v);
}

std::string Bytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = bytes / 1024.0;
  int unit = 0;
  while (v >= 1024 && unit < 3) v /= 1024, ++unit;
  return absl::StrFormat("%.1f %s", v, units[unit]);
}

std::string Loss(double loss, int64_t step) {
  return step > 0 && std::isfinite(loss) ? absl::StrFormat("%.4f", loss) : "–";
}

std::string Percent(double fraction) { return absl::StrFormat("%.0f%%", 100 * fraction); }

std::string Seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "–";
  if (s < 10) return absl::StrFormat("%.2f s", s);
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.0f min", s / 60);
  if (s < 172800) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f d", s / 86400);
}

std::string Utc(int64_t unix_ms) {
  if (unix_ms <= 0) return "–";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string Ago(absl::Time now, int64_t unix_ms) {
  if (unix_ms <= 0) return "–";
  return absl::StrCat(Seconds(absl::ToDoubleSeconds(now - absl::FromUnixMillis(unix_ms))), " ago");
}

std::string Slot(const ringmaster::SlotRef& s) { return absl::StrCat(s.node(), "/", s.slot()); }

std::string JobLink(const std::string& id) {
  return absl::StrCat("<a href=\"/jobs/", Html(id), "\">", Html(id), "</a>");
}

// Throughput as rank 0 says it (all ranks together), its steps per second and the ETA: the
// figures of the progress line (common/progress_rate.h, over the last 30 s of steps).
std::string Throughput(const Job& job, const std::vector<RankStats>& ranks) {
  std::vector<std::string> parts;
  for (const RankStats& r : ranks) {
    if (r.rank() != 0) continue;
    if (r.tokens_per_s() > 0) parts.push_back(absl::StrCat(Short(r.tokens_per_s()), " tok/s"));
    if (r.samples_per_s() > 0) {
      parts.push_back(absl::StrCat(Short(r.samples_per_s()), " samples/s"));
    }
  }
  if (job.steps_per_s() > 0) {
    parts.push_back(absl::StrCat(Short(job.steps_per_s()), " steps/s"));
  }
  if (job.phase() == ringmaster::JOB_PHASE_RUNNING) {
    if (const std::optional<double> eta =
            EtaSeconds(job.step(), job.total_steps(), job.steps_per_s())) {
      parts.push_back(absl::StrCat("ETA ", EtaText(*eta)));
    }
  }
  return parts.empty() ? "–" : absl::StrJoin(parts, "<br>");
}

int World(const Job& job) {
  int world = 0;
  for (const ringmaster::Member& m : job.members()) world += m.rank() >= 0;
  return world;
}

std::string StepText(const Job& job) {
  if (job.total_steps() <= 0) return absl::StrCat(job.step());
  return absl::StrFormat("%d / %d<div class=\"bar\"><div style=\"width:%.1f%%\"></div></div>",
                         job.step(), job.total_steps(),
                         std::clamp(100.0 * job.step() / job.total_steps(), 0.0, 100.0));
}

const char kStyle[] = R"css(
body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222;background:#f6f7f9}
header{background:#1f2a36;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:bold;font-size:18px}
header span{color:#b8c4d0;font-size:13px}
main{padding:8px 24px 24px}
h1{font-size:22px;margin:16px 0 8px}
h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #d8dce2;padding-bottom:4px}
table{border-collapse:collapse;background:#fff;font-size:13px;box-shadow:0 1px 2px #0001}
th,td{padding:5px 10px;border-bottom:1px solid #e6e8eb;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}
td{white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.reason,td.wrap{white-space:normal}
td.wrap code{word-break:break-all}
.reason{color:#666;font-size:12px;max-width:460px}
.phase{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:bold;color:#fff;background:#888}
.phase.running{background:#2a9d4b}.phase.forming,.phase.committed{background:#d98b00}
.phase.succeeded{background:#1f6fb4}.phase.failed{background:#c43131}.phase.pending{background:#7a7f87}
.bar{width:90px;height:5px;background:#e2e5e9;border-radius:3px;margin-top:3px}
.bar div{height:5px;background:#2a9d4b;border-radius:3px}
.straggler td{background:#fff1e6}
.summary td:first-child{color:#555;width:170px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
.charts circle.point{r:1.8px}
.charts svg,.timeline svg{background:#fff;box-shadow:0 1px 2px #0001;max-width:100%;height:auto}
.muted{color:#777}
code{font-size:12px}
)css";

HttpResponse HtmlResponse(int status) {
  HttpResponse response;
  response.status = status;
  response.content_type = kHtmlContentType;
  return response;
}

std::string Page(const std::string& title, const std::string& body, const Snapshot& snapshot,
                 const DashboardOptions& options) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
      options.refresh_s > 0
          ? absl::StrCat("<meta http-equiv=\"refresh\" content=\"", options.refresh_s, "\">")
          : "",
      "<title>", Html(title), " · ringmaster</title><style>", kStyle,
      "</style></head>\n<body><header><a href=\"/\">ringmaster</a><span>", Html(title),
      "</span><span>", Utc(absl::ToUnixMillis(snapshot.state.taken)),
      options.refresh_s > 0 ? absl::StrCat(" · reloads every ", options.refresh_s, " s") : "",
      "</span></header>\n<main>\n", body, "</main></body></html>\n");
}

HttpResponse NotFound(const std::string& what, const Snapshot& snapshot,
                      const DashboardOptions& options) {
  HttpResponse response = HtmlResponse(404);
  response.body = Page(
      "not found",
      absl::StrCat("<h1>Not found</h1><p>", Html(what), "</p><p><a href=\"/\">All jobs</a></p>\n"),
      snapshot, DashboardOptions{.refresh_s = 0});
  return response;
}

// The latest figures of the ranks of `job`'s current epoch (none before its first report).
const std::vector<RankStats>& RanksOf(const Snapshot& snapshot, const std::string& job) {
  static const std::vector<RankStats>* const kNone = new std::vector<RankStats>();
  auto it = snapshot.state.ranks.find(job);
  return it == snapshot.state.ranks.end() ? *kNone : it->second;
}

// --- The index ---------------------------------------------------------------------------

std::string JobsTable(const Snapshot& snapshot) {
  if (snapshot.state.jobs.empty()) return "<p class=\"muted\">No jobs.</p>\n";
  std::string out =
      "<table id=\"jobs\"><tr><th>Job</th><th>Phase</th><th>Step</th><th>Loss</th>"
      "<th title=\"over the last 30 s of steps\">Throughput, ETA</th><th>World</th>"
      "<th>Membership epoch</th><th>Restarts</th><th>Checkpoints</th>"
      "</tr>\n";
  for (const Job& job : snapshot.state.jobs) {
    std::string checkpoints = "–";
    if (job.checkpoints_size() > 0) {
      checkpoints = absl::StrCat(job.checkpoints_size(), " (latest step ",
                                 job.checkpoints(job.checkpoints_size() - 1).step(), ")");
    }
    absl::StrAppend(&out, "<tr><td>", JobLink(job.id()), "</td><td>", PhaseBadge(job.phase()),
                    job.reason().empty()
                        ? ""
                        : absl::StrCat("<div class=\"reason\">", Html(job.reason()), "</div>"),
                    "</td><td class=\"num\">", StepText(job), "</td><td class=\"num\">",
                    Loss(job.loss(), job.step()), "</td><td class=\"num\">",
                    Throughput(job, RanksOf(snapshot, job.id())), "</td><td class=\"num\">",
                    World(job), " <span class=\"muted\">(", job.min_ranks(), "–",
                    job.max_ranks() >= 100000 ? "∞" : absl::StrCat(job.max_ranks()), ")</span>",
                    "</td><td class=\"num\">",
                    job.epoch() > 0 ? absl::StrCat(job.epoch(), " <span class=\"muted\">",
                                                   Html(job.epoch_cause()), "</span>")
                                    : "–",
                    "</td><td class=\"num\">", job.restarts(), " / ", job.restart_budget(),
                    "</td><td>", checkpoints, "</td></tr>\n");
  }
  return out + "</table>\n";
}

std::string NodesTable(const ListNodesResponse& nodes) {
  if (nodes.nodes().empty()) return "<p class=\"muted\">No nodes registered.</p>\n";
  std::string out =
      "<table id=\"nodes\"><tr><th>Node</th><th>Slots</th><th>Running</th><th>Heartbeat</th>"
      "<th>Lease left</th><th>State</th></tr>\n";
  for (const NodeInfo& node : nodes.nodes()) {
    std::vector<std::string> running;
    int busy = 0;
    for (const SlotInfo& slot : node.slots()) {
      std::string what;
      if (!slot.job().empty()) {
        ++busy;
        what = absl::StrCat(JobLink(slot.job()),
                            slot.rank() >= 0 ? absl::StrCat(" rank ", slot.rank()) : " (forming)");
      }
      if (!slot.exiting_job().empty()) {
        absl::StrAppend(&what, what.empty() ? "" : "; ", "exiting: ", Html(slot.exiting_job()));
      }
      if (slot.backoff_s() > 0) {
        absl::StrAppend(&what, what.empty() ? "" : "; ", "resting ", Seconds(slot.backoff_s()));
      }
      if (what.empty()) continue;
      running.push_back(absl::StrCat(
          "slot ", slot.slot(), slot.gpu().empty() ? "" : absl::StrCat(" (", Html(slot.gpu()), ")"),
          ": ", what));
    }
    std::string state = "ready";
    if (node.draining()) state = "draining";
    if (node.awaiting_agent()) state = "awaiting its agent";
    if (node.lease_left_s() < 0) state = "lease expired";
    absl::StrAppend(
        &out, "<tr><td>", Html(node.node()), "</td><td class=\"num\">", busy, " / ",
        node.slots_size(), "</td><td>",
        running.empty() ? "<span class=\"muted\">idle</span>" : absl::StrJoin(running, "<br>"),
        "</td><td class=\"num\">",
        node.last_heartbeat_age_s() < 0
            ? "–"
            : absl::StrCat(Seconds(node.last_heartbeat_age_s()), " ago"),
        "</td><td class=\"num\">", Seconds(node.lease_left_s()), "</td><td>", state,
        "</td></tr>\n");
  }
  return out + "</table>\n";
}

HttpResponse Index(const Snapshot& snapshot, const DashboardOptions& options) {
  int running = 0, finished = 0;
  for (const Job& job : snapshot.state.jobs) {
    running += job.phase() == JOB_PHASE_RUNNING;
    finished += Finished(job.phase());
  }
  HttpResponse response = HtmlResponse(200);
  response.body =
      Page("jobs",
           absl::StrCat("<h1>Jobs</h1><p class=\"muted\">",
                        Plural(snapshot.state.jobs.size(), "job"), ": ", running, " running, ",
                        finished, " ended. ", Plural(snapshot.state.nodes.nodes_size(), "node"),
                        ".</p>\n", JobsTable(snapshot),
                        "<h2>Nodes</h2>\n", NodesTable(snapshot.state.nodes)),
           snapshot, options);
  return response;
}

// --- A job's page --------------------------------------------------------------------------

// A command job's first failure (Job.first_failure): who, how, what it said, when.
std::string FirstFailure(const ringmaster::RankFailure& f) {
  const absl::Time at = absl::FromUnixMicros(static_cast<int64_t>(f.failed_at_s() * 1e6));
  std::string out = absl::StrCat(
      "<div id=\"first-failure\"><b>rank ", f.rank(), "</b> on node ", Html(f.slot().node()),
      " slot ", f.slot().slot(), " in membership epoch ", f.epoch(), ": ", Html(f.program()),
      f.program().empty() ? "" : ": ", Html(f.how()), " <span class=\"muted\">at ",
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", at, absl::UTCTimeZone()),
      f.failed_at_from_error_file() ? " (its error file's time)" : " (its exit seen)", "</span>");
  if (!f.error_message().empty()) {
    absl::StrAppend(&out, "<br>error file: <code>", Html(f.error_message()), "</code>");
  }
  if (!f.last_output_line().empty()) {
    absl::StrAppend(&out, "<br>last output line: <code>", Html(f.last_output_line()), "</code>");
  }
  return out + "</div>";
}

std::string Summary(const Job& job, const std::vector<RankStats>& ranks) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"Phase", absl::StrCat(PhaseBadge(job.phase()),
                             job.reason().empty() ? ""
                                                  : absl::StrCat(" <span class=\"reason\">",
                                                                 Html(job.reason()), "</span>"))},
      {"Step", StepText(job)},
      {"Loss", Loss(job.loss(), job.step())},
      {absl::StrCat("Throughput, ETA <span class=\"muted\">(", RateWindowText(), ")</span>"),
       Throughput(job, ranks)},
      {"World",
       absl::StrCat(World(job), " ", PluralNoun(World(job), "rank"), " (min ", job.min_ranks(), ", max ",
                    job.max_ranks() >= 100000 ? "none" : absl::StrCat(job.max_ranks()), ")")},
      {"Membership epoch", absl::StrCat(job.epoch(), " (", Html(job.epoch_cause()), ")")},
      {"Restarts", absl::StrCat(job.restarts(), " of a budget of ", job.restart_budget())},
      {"Submitted", Utc(job.submitted_ms())},
      {"In this phase since", Utc(job.phase_since_ms())},
  };
  if (job.stragglers_size() > 0) {
    std::vector<std::string> names;
    for (const std::string& s : job.stragglers()) names.push_back(Html(s));
    rows.emplace_back("Stragglers", absl::StrJoin(names, "<br>"));
  }
  if (!job.checkpoint_error().empty()) {
    rows.emplace_back("Checkpoint error", absl::StrCat("step ", job.checkpoint_error_step(), ": ",
                                                       Html(job.checkpoint_error())));
  }
  if (job.excluded_nodes_size() > 0) {
    std::vector<std::string> nodes;
    for (const std::string& n : job.excluded_nodes()) nodes.push_back(Html(n));
    rows.emplace_back("Excluded nodes", absl::StrJoin(nodes, ", "));
  }
  if (job.has_first_failure()) rows.emplace_back("First failure", FirstFailure(job.first_failure()));
  std::string out = "<table class=\"summary\" id=\"summary\">\n";
  for (const auto& [name, value] : rows) {
    absl::StrAppend(&out, "<tr><td>", name, "</td><td>", value, "</td></tr>\n");
  }
  return out + "</table>\n";
}

// At most `n` of `points`, evenly spread, the last always among them.
std::vector<JobHistory::Point> Thin(const std::vector<JobHistory::Point>& points, size_t n) {
  if (points.size() <= n) return points;
  std::vector<JobHistory::Point> out;
  for (size_t i = 0; i < n; ++i) out.push_back(points[i * (points.size() - 1) / (n - 1)]);
  return out;
}

// A figure of a report, or nothing where it was not measured.
using Figure = std::function<std::optional<double>(const JobHistory::Point&)>;

// One step's figures are noisy: a curve is drawn as the mean of the `window` reports around
// each one (within its epoch: a recovery changes the world and so the speed), over the
// reports themselves in a paler `raw_color` (not drawn when it is empty or window is 1).
std::vector<plot::Series> Curve(const std::vector<JobHistory::Point>& points, size_t window,
                                const std::string& label, const Figure& figure,
                                const std::string& color, const std::string& raw_color,
                                bool dashed = false) {
  std::vector<std::optional<double>> values;
  for (const JobHistory::Point& p : points) values.push_back(figure(p));
  plot::Series raw{label, {}, raw_color};
  plot::Series mean{
      window > 1 ? absl::StrCat(label, ", mean of ", window) : label, {}, color, dashed};
  const size_t half = window / 2;
  for (size_t i = 0; i < points.size(); ++i) {
    if (!values[i].has_value()) continue;
    const double step = static_cast<double>(points[i].step);
    raw.points.emplace_back(step, *values[i]);
    double sum = 0;
    int n = 0;
    for (size_t j = i > half ? i - half : 0; j < std::min(points.size(), i + window - half); ++j) {
      if (values[j].has_value() && points[j].epoch == points[i].epoch) sum += *values[j], ++n;
    }
    mean.points.emplace_back(step, sum / n);
  }
  if (window <= 1 || raw_color.empty()) return {mean};
  return {raw, mean};
}

std::string Curves(const JobHistory::View& history) {
  const std::vector<JobHistory::Point> points = Thin(history.points, kMaxPlottedPoints);
  if (points.empty()) {
    return "<p class=\"muted\">No steps reported yet: the curves start with rank 0's first "
           "report.</p>\n";
  }
  const size_t window = std::max<size_t>(1, points.size() / 25);
  // The membership epochs after the first, shaded in turn, so that a recovery shows on
  // every curve.
  std::vector<plot::Region> epochs;
  for (size_t i = 1; i < points.size(); ++i) {
    if (points[i].epoch == points[i - 1].epoch) continue;
    if (!epochs.empty()) epochs.back().x_max = static_cast<double>(points[i - 1].step);
    epochs.push_back(plot::Region{
        absl::StrCat("membership epoch ", points[i].epoch), static_cast<double>(points[i].step),
        static_cast<double>(points.back().step), epochs.size() % 2 == 0 ? "#1f77b4" : "#888888"});
  }
  if (epochs.size() > 12) epochs.clear();  // too many to label: the timeline shows them
  auto chart = [&](std::string title, std::string y_label, std::vector<plot::Series> series) {
    plot::PlotSpec spec;
    spec.title = std::move(title);
    spec.x_label = "step";
    spec.y_label = std::move(y_label);
    spec.series = std::move(series);
    spec.regions = epochs;
    spec.x_scale = plot::XScale::kLinear;
    spec.width = 600;
    spec.height = 320;
    return plot::RenderSvg(spec);
  };
  auto positive = [](double JobHistory::Point::*field) {
    return [field](const JobHistory::Point& p) -> std::optional<double> {
      if (p.*field > 0) return p.*field;
      return std::nullopt;
    };
  };
  auto percent = [](double JobHistory::Point::*field) {
    return [field](const JobHistory::Point& p) -> std::optional<double> { return 100 * p.*field; };
  };
  std::string out = absl::StrCat(
      "<div class=\"charts\" id=\"curves\">\n",
      chart("Loss", "loss",
            Curve(
                points, window, "loss",
                [](const JobHistory::Point& p) -> std::optional<double> { return p.loss; },
                "#1f77b4", "#aec7e8")));
  // A language model's tokens/s (its samples/s times the context: ~100x more), else
  // samples/s: one unit on the axis, as the two on one linear axis flattened the smaller.
  std::vector<plot::Series> speed = Curve(
      points, window, "tokens/s", positive(&JobHistory::Point::tokens_per_s), "#9467bd", "#c5b0d5");
  std::erase_if(speed, [](const plot::Series& s) { return s.points.empty(); });
  std::string speed_unit = "tokens/s";
  if (speed.empty()) {
    speed = Curve(points, window, "samples/s", positive(&JobHistory::Point::samples_per_s),
                  "#2ca02c", "#98df8a");
    std::erase_if(speed, [](const plot::Series& s) { return s.points.empty(); });
    speed_unit = "samples/s";
  }
  if (!speed.empty()) {
    absl::StrAppend(&out, chart("Throughput (all ranks)", speed_unit, std::move(speed)));
  } else {
    absl::StrAppend(&out, chart("Throughput (rank 0)", "steps per second",
                                Curve(
                                    points, window, "steps/s",
                                    [](const JobHistory::Point& p) -> std::optional<double> {
                                      if (p.step_time_s > 0) return 1 / p.step_time_s;
                                      return std::nullopt;
                                    },
                                    "#2ca02c", "#98df8a")));
  }
  std::vector<plot::Series> comm = Curve(points, window, "in collectives",
                                         percent(&JobHistory::Point::comm_fraction), "#ff7f0e", "");
  comm.push_back(Curve(points, window, "exposed",
                       percent(&JobHistory::Point::exposed_comm_fraction), "#d62728", "",
                       /*dashed=*/true)[0]);
  absl::StrAppend(
      &out, chart("Communication share of the step", "% of step time", std::move(comm)),
      "</div>\n<p class=\"muted\">Rank 0's reports: ", history.points.size(), " kept",
      points.size() < history.points.size() ? absl::StrCat(", ", points.size(), " drawn") : "",
      window > 1 ? absl::StrCat("; the bold curves are means of ", window, " reports") : "",
      ".</p>\n");
  return out;
}

// The recoveries as a Gantt chart: one row each, its phases as stacked bars in seconds.
std::string Timeline(const Job& job) {
  if (job.recoveries().empty()) {
    return "<p class=\"muted\">No recoveries: the job kept its first members.</p>\n";
  }
  const int first = std::max(0, job.recoveries_size() - kMaxRows);
  struct Phase {
    const char* name;
    const char* color;
    double (Recovery::*seconds)() const;
  };
  const Phase phases[] = {{"detect", "#9467bd", &Recovery::detect_s},
                          {"rendezvous", "#1f77b4", &Recovery::rendezvous_s},
                          {"restore", "#ff7f0e", &Recovery::restore_s},
                          {"first step", "#2ca02c", &Recovery::first_step_s}};
  double longest = 0;
  for (int i = first; i < job.recoveries_size(); ++i) {
    double total = 0;
    for (const Phase& p : phases) total += std::max(0.0, (job.recoveries(i).*p.seconds)());
    longest = std::max(longest, total);
  }
  // The axis: 0 to a round number of seconds, in five ticks.
  double step = std::pow(10, std::floor(std::log10(std::max(longest, 1e-3) / 5)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * step * 5 >= longest) {
      step *= m;
      break;
    }
  }
  const double axis = step * 5;
  const int rows = job.recoveries_size() - first;
  const double left = 330, right = 130, top = 48, row_h = 30, width = 1000;
  const double plot_w = width - left - right, height = top + rows * row_h + 40;
  auto x = [&](double s) { return left + s / axis * plot_w; };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Recoveries: "
      "detection, rendezvous, restore and first step (seconds)</text>\n",
      width, height, width, height);
  double lx = left;
  for (const Phase& p : phases) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"32\" width=\"12\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%.1f\" y=\"41\">%s</text>\n",
                          lx, p.color, lx + 16, p.name);
    lx += 30 + 7 * std::string(p.name).size();
  }
  for (int t = 0; t <= 5; ++t) {
    const double px = x(t * step);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"#e4e4e4\"/><text x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"middle\" fill=\"#333\">%g</text>\n",
                          px, top, px, top + rows * row_h, px, top + rows * row_h + 16, t * step);
  }
  for (int i = first; i < job.recoveries_size(); ++i) {
    const Recovery& r = job.recoveries(i);
    const double y = top + (i - first) * row_h;
    const std::string label = absl::StrCat(
        absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(r.began_ms()), absl::UTCTimeZone()),
        "  membership epoch ", r.epoch(), " ", r.cause(), "  world ", r.old_world(), "→",
        r.new_world() > 0 ? absl::StrCat(r.new_world()) : "?");
    absl::StrAppendFormat(&svg,
                          "<g class=\"recovery\"><title>%s</title>\n<text x=\"12\" y=\"%.1f\" "
                          "fill=\"#222\">%s</text>\n",
                          Html(r.reason()), y + 19, Html(label));
    double at = 0;
    for (const Phase& p : phases) {
      const double s = std::max(0.0, (r.*p.seconds)());
      if (s <= 0) continue;
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"%s\"><title>%s %.3f s</title></rect>\n",
                            x(at), y + 6, std::max(1.0, x(at + s) - x(at)), row_h - 12, p.color,
                            p.name, s);
      at += s;
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">%s</text></g>\n",
                          width - right + 10, y + 19,
                          r.lost_steps() < 0
                              ? "not running yet"
                              : absl::StrCat(Seconds(at), ", lost ", r.lost_steps(),
                                             r.lost_steps() == 1 ? " step" : " steps"));
  }
  svg += "</svg>\n";

  std::string table =
      "<table id=\"recoveries\"><tr><th>Began</th><th>Membership epoch</th><th>Cause</th>"
      "<th>World</th><th>Detect</th><th>Rendezvous</th><th>Restore</th><th>First step</th>"
      "<th>Lost steps</th><th>Resumed from</th><th>Reason</th></tr>\n";
  for (int i = job.recoveries_size() - 1; i >= first; --i) {
    const Recovery& r = job.recoveries(i);
    absl::StrAppend(&table, "<tr><td>", Utc(r.began_ms()), "</td><td class=\"num\">", r.epoch(),
                    "</td><td>", Html(r.cause()), "</td><td class=\"num\">", r.old_world(), " → ",
                    r.new_world() > 0 ? absl::StrCat(r.new_world()) : "?",
                    "</td><td class=\"num\">", r.detect_s() > 0 ? Seconds(r.detect_s()) : "–",
                    "</td><td class=\"num\">", Seconds(r.rendezvous_s()), "</td><td class=\"num\">",
                    Seconds(r.restore_s()), "</td><td class=\"num\">", Seconds(r.first_step_s()),
                    "</td><td class=\"num\">",
                    r.lost_steps() < 0 ? "–" : absl::StrCat(r.lost_steps()),
                    "</td><td class=\"reason\">",
                    r.resumed_from().empty()
                        ? "–"
                        : Html(ResumeText(r.step_before(), r.resumed_from_step(),
                                          r.resumed_from(), r.lost_because())),
                    "</td><td class=\"reason\">", Html(r.reason()), "</td></tr>\n");
  }
  return absl::StrCat("<div class=\"timeline\" id=\"timeline\">\n", svg, "</div>\n", table,
                      "</table>\n");
}

std::string Epochs(const JobHistory::View& history) {
  if (history.epochs.empty()) {
    return "<p class=\"muted\">No membership epoch committed yet.</p>\n";
  }
  std::string out =
      "<table id=\"epochs\"><tr><th>Membership epoch</th><th>Cause</th><th>Committed</th>"
      "<th>World</th>"
      "<th>Ranks (rank: node/slot)</th></tr>\n";
  const int n = static_cast<int>(history.epochs.size());
  for (int i = n - 1; i >= std::max(0, n - kMaxRows); --i) {
    const JobHistory::Epoch& e = history.epochs[i];
    std::vector<std::string> ranks;
    for (size_t r = 0; r < e.ranks.size(); ++r) {
      ranks.push_back(absl::StrCat(r, ": ", Html(ToString(e.ranks[r]))));
    }
    absl::StrAppend(&out, "<tr><td class=\"num\">", e.epoch, "</td><td>", EpochCauseName(e.cause),
                    "</td><td>", Utc(absl::ToUnixMillis(e.committed)), "</td><td class=\"num\">",
                    e.ranks.size(), "</td><td class=\"wrap\">", absl::StrJoin(ranks, " · "),
                    "</td></tr>\n");
  }
  return out + "</table>\n";
}

// The current members, each with its latest figures.
std::string Members(const Job& job, const std::vector<RankStats>& ranks, absl::Time now) {
  if (job.members().empty()) return "<p class=\"muted\">No members now.</p>\n";
  std::map<int, const RankStats*> stats;
  for (const RankStats& r : ranks) stats[r.rank()] = &r;
  std::vector<const ringmaster::Member*> members;
  for (const ringmaster::Member& m : job.members()) members.push_back(&m);
  std::stable_sort(members.begin(), members.end(), [](const auto* a, const auto* b) {
    return (a->rank() < 0 ? 1 << 30 : a->rank()) < (b->rank() < 0 ? 1 << 30 : b->rank());
  });
  std::string out =
      "<table id=\"members\"><tr><th>Rank</th><th>Slot</th><th>State</th><th>Step</th>"
      "<th>Last report</th><th>Step time</th><th>Loss</th><th>Grad norm</th><th>Samples/s</th>"
      "<th>Comm</th><th>Exposed</th><th>Compute vs median</th></tr>\n";
  for (const ringmaster::Member* m : members) {
    const char* state = m->finished() ? "finished"
                        : m->ready()  ? "ready"
                        : m->joined() ? "joined"
                                      : "starting";
    auto it = stats.find(m->rank());
    const RankStats* s = m->rank() >= 0 && it != stats.end() ? it->second : nullptr;
    absl::StrAppend(&out, s != nullptr && s->straggler() ? "<tr class=\"straggler\">" : "<tr>",
                    "<td class=\"num\">", m->rank() >= 0 ? absl::StrCat(m->rank()) : "–",
                    "</td><td>", Html(Slot(m->slot())), "</td><td>", state,
                    "</td><td class=\"num\">", m->step() >= 0 ? absl::StrCat(m->step()) : "–",
                    "</td><td class=\"num\">", Ago(now, m->last_progress_ms()), "</td>");
    if (s == nullptr) {
      absl::StrAppend(&out,
                      "<td colspan=\"7\" class=\"muted\">no report in this membership "
                      "epoch</td></tr>\n");
      continue;
    }
    absl::StrAppend(
        &out, "<td class=\"num\">", Seconds(s->step_time_s()), "</td><td class=\"num\">",
        Loss(s->loss(), s->step()), "</td><td class=\"num\">", Short(s->grad_norm()),
        "</td><td class=\"num\">", s->samples_per_s() > 0 ? Short(s->samples_per_s()) : "–",
        "</td><td class=\"num\">", Percent(s->comm_fraction()), "</td><td class=\"num\">",
        Percent(s->exposed_comm_fraction()), "</td><td class=\"num\">",
        s->slowdown() > 0 ? absl::StrFormat("%.2f×", s->slowdown()) : "–",
        s->straggler() ? " <b>straggler</b>" : "", "</td></tr>\n");
  }
  return out + "</table>\n";
}

std::string Checkpoints(const Job& job) {
  if (job.checkpoints().empty()) return "<p class=\"muted\">No checkpoints yet.</p>\n";
  std::string out =
      "<table id=\"checkpoints\"><tr><th>Step</th><th>World</th><th>Size</th><th>Committed</th>"
      "<th>Save</th><th>Training blocked</th><th>Path</th></tr>\n";
  for (int i = job.checkpoints_size() - 1; i >= std::max(0, job.checkpoints_size() - kMaxRows);
       --i) {
    const CheckpointInfo& c = job.checkpoints(i);
    absl::StrAppend(
        &out, "<tr><td class=\"num\">", c.step(), "</td><td class=\"num\">", c.world_size(),
        "</td><td class=\"num\">", Bytes(c.bytes()), "</td><td>", Utc(c.committed_ms()),
        "</td><td class=\"num\">", c.save_seconds() > 0 ? Seconds(c.save_seconds()) : "–",
        "</td><td class=\"num\">", c.blocked_seconds() > 0 ? Seconds(c.blocked_seconds()) : "–",
        "</td><td class=\"wrap\"><code>", Html(c.path()), "</code></td></tr>\n");
  }
  return out + "</table>\n";
}

HttpResponse JobPage(const Job& job, const JobHistory::View& history, const Snapshot& snapshot,
                     const DashboardOptions& options) {
  const std::vector<RankStats>& ranks = RanksOf(snapshot, job.id());
  HttpResponse response = HtmlResponse(200);
  response.body = Page(
      absl::StrCat("job ", job.id()),
      absl::StrCat(
          "<h1 id=\"job\">", Html(job.id()), " ", PhaseBadge(job.phase()), "</h1>\n",
          Summary(job, ranks), "<h2>Curves</h2>\n", Curves(history), "<h2>Recoveries</h2>\n",
          Timeline(job), "<h2>Members per membership epoch</h2>\n", Epochs(history),
          "<h2>Ranks now</h2>\n",
          Members(job, ranks, snapshot.state.taken), "<h2>Checkpoints</h2>\n", Checkpoints(job)),
      snapshot, options);
  return response;
}

}  // namespace

std::string JobOfPath(const std::string& path) {
  absl::string_view rest = path;
  if (!absl::ConsumePrefix(&rest, kJobsPrefix)) return "";
  absl::ConsumeSuffix(&rest, "/");
  return std::string(rest);
}

HttpResponse Render(const std::string& path, const Snapshot& snapshot,
                    const DashboardOptions& options) {
  if (path == "/" || path.empty()) return Index(snapshot, options);
  const std::string id = JobOfPath(path);
  if (id.empty() || absl::StrContains(id, '/')) {
    return NotFound(absl::StrCat("There is no page ", path, " here."), snapshot, options);
  }
  for (const Job& job : snapshot.state.jobs) {
    if (job.id() != id) continue;
    auto history = snapshot.histories.find(id);
    return JobPage(job, history == snapshot.histories.end() ? JobHistory::View{} : history->second,
                   snapshot, options);
  }
  return NotFound(
      absl::StrCat("The coordinator has no job \"", id, "\" (it may have been deleted)."), snapshot,
      options);
}

HttpResponse Serve(const std::string& path, Coordinator& coordinator,
                   const DashboardOptions& options) {
  Snapshot snapshot;
  snapshot.state = coordinator.Snapshot();
  if (const std::string job = JobOfPath(path); !job.empty()) {
    snapshot.histories[job] = coordinator.History(job);
  }
  return Render(path, snapshot, options);
}

std::vector<HttpRoute> DashboardRoutes(Coordinator* coordinator, const DashboardOptions& options) {
  HttpHandler handler = [coordinator, options](const HttpRequest& request) {
    return Serve(request.path, *coordinator, options);
  };
  return {HttpRoute{"/", /*prefix=*/false, handler}, HttpRoute{"/jobs", /*prefix=*/true, handler}};
}

}  // namespace ringmaster::coordinator::dashboard
