#include "cli/plot.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using train::MetricsRecord;

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// A record as the trainer writes it (train/step_reporter.cc), with the optional parts given.
std::string Line(int step, double loss, double lr, double sps, double scale = 1,
                 const std::string& extra = "") {
  return absl::StrFormat(
      "{\"step\":%d,\"epoch\":0,\"loss\":%g,\"lr\":%g,\"grad_norm\":%g,\"local_grad_norm\":1,"
      "\"samples_per_second\":%g,\"comm_seconds\":0.1,\"exposed_comm_seconds\":0.05,"
      "\"window_seconds\":2,\"loss_scale\":%g,\"skipped_steps\":0%s}\n",
      step, loss, lr, 0.5 + step / 100.0, sps, scale, extra);
}

std::vector<int> Steps(const std::vector<MetricsRecord>& records) {
  std::vector<int> steps;
  for (const MetricsRecord& r : records) steps.push_back(r.step());
  return steps;
}

TEST(ParseMetricsHistory, AResumedRunReplacesTheStepsItRepeated) {
  // Run 1 logs 1, 20, 40, 60 and dies; run 2 resumes from the checkpoint of step 30 and logs
  // 40 and 60 again (other losses), then 80; a third run resumed from memory after 80 goes on
  // at 100; step 100 is logged twice (a last line written again).
  const std::string text = Line(1, 2.3, 0.1, 100) + Line(20, 1.5, 0.1, 100) +
                           Line(40, 1.2, 0.1, 100) + Line(60, 1.0, 0.1, 100) +
                           Line(40, 1.25, 0.1, 90) + Line(60, 1.05, 0.1, 90) +
                           Line(80, 0.9, 0.1, 90) + "\n" + Line(100, 0.8, 0.1, 95) +
                           Line(100, 0.7, 0.1, 96);
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "m.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1, 20, 40, 60, 80, 100));
  EXPECT_DOUBLE_EQ(h->records[2].loss(), 1.25);
  EXPECT_DOUBLE_EQ(h->records[3].loss(), 1.05);
  EXPECT_DOUBLE_EQ(h->records[3].samples_per_second(), 90);
  EXPECT_DOUBLE_EQ(h->records[5].loss(), 0.7);
  // What was replaced is said: lines 3, 4 (steps 40, 60) and line 9 (step 100).
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("m.jsonl: 3 records (lines 3-9, steps 40-100) replaced "
                                       "by a resumption of the same run"));
}

TEST(ParseMetricsHistory, MissingFieldsStayUnsetAndUnknownKeysAreIgnored) {
  // A peer's file: step, loss and throughput only; and a newer writer's key.
  const std::string text =
      "{\"step\":10,\"loss\":2.5,\"samples_per_second\":50,\"window_seconds\":1}\n"
      "{\"step\":20,\"loss\":2.0,\"samples_per_second\":55,\"future_key\":[1,2]}\n";
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "peer.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->records.size(), 2u);
  EXPECT_FALSE(h->records[0].has_grad_norm());
  EXPECT_FALSE(h->records[0].has_test_loss());
  EXPECT_FALSE(h->records[1].has_window_seconds());
  EXPECT_EQ(h->records[0].lr(), 0);
  EXPECT_EQ(h->records[0].loss_scale(), 0);
  EXPECT_TRUE(h->dropped.empty());
}

TEST(ParseMetricsHistory, LinesThatAreNotRecordsAreLeftOutCountedAndNamed) {
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(
      Line(1, 2, 0.1, 10) + "{\"step\": 2, \"loss\": \"x\"\n" + Line(3, 1, 0.1, 10) +
          "not json\n" + Line(4, 1, 0.1, 10),
      "runs/a.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1, 3, 4));
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("runs/a.jsonl: left out 2 lines that are not a metrics "
                                       "record (lines 2, 4); the first: runs/a.jsonl:2"));

  h = ParseMetricsHistory(Line(1, 2, 0.1, 10) + "\n{\"loss\": 1.5}\n", "b.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("(line 3); the first: b.jsonl:3: no \"step\""));

  // Not a metrics file at all: an error naming the file and line.
  h = ParseMetricsHistory("a,b,c\n1,2,3\n", "c.csv");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr("c.csv:1"));
  EXPECT_THAT(h.status().message(), HasSubstr("1 more lines"));
}

// A record of `run` (job, run name, config fingerprint) at `step`.
std::string RunLine(int step, double loss, const std::string& job, const std::string& run,
                    const std::string& config) {
  return Line(step, loss, 0.1, 10, 1,
              absl::StrFormat(",\"job\":\"%s\",\"run\":\"%s\",\"config\":\"%s\"", job, run,
                              config));
}

TEST(ParseMetricsHistory, RecordsOfAnotherConfigurationAreLeftOutAndSaidSo) {
  // The case: a run of 130 records, then a run with other --sets (another
  // configuration) appended 5 to the same file. Before, the second silently replaced the
  // first; now the last one is drawn and the other is said, with where and why.
  std::string text;
  for (int k = 1; k <= 130; ++k) text += RunLine(k * 10, 3 - k / 100.0, "tiny_gpt", "a", "c1");
  for (int k = 1; k <= 5; ++k) text += RunLine(k * 10, 2, "tiny_gpt", "b", "c2");
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "gpt.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(10, 20, 30, 40, 50));
  EXPECT_EQ(h->records[0].run(), "b");
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0],
              HasSubstr("gpt.jsonl: left out 130 records of run a (lines 1-130, steps 10-1300), "
                        "another configuration (config c1, drawn: c2)"));
  EXPECT_THAT(h->dropped[0], HasSubstr("out/{run}.metrics.jsonl"));

  // Another job: named as such; records of the last job before and after it are one history.
  text = RunLine(1, 2, "mlp", "m1", "c") + RunLine(2, 1.9, "mlp", "m1", "c") +
         RunLine(1, 5, "gpt", "g1", "c") + RunLine(3, 1.8, "mlp", "m1", "c");
  h = ParseMetricsHistory(text, "x.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1, 2, 3));
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("1 record of run g1 (line 3, step 1), another job (gpt, "
                                       "drawn: mlp)"));
}

TEST(ParseMetricsHistory, RecordsWrittenBeforeRunsWereNamedAreSaidAsSuch) {
  // A file an older trainer appended to before this one's run: its records name nothing.
  const std::string text =
      Line(1, 2.3, 0.1, 100) + Line(20, 1.5, 0.1, 100) + RunLine(1, 2.2, "mlp", "mlp-1", "c");
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "old.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1));
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0],
              HasSubstr("old.jsonl: left out 2 records of a run without a name (written before "
                        "records named their runs) (lines 1-2, steps 1-20), which name no job or "
                        "configuration"));
}

TEST(ParseMetricsHistory, AnotherRunOfTheSameConfigurationReplacesWhatItRepeatsAndSaysSo) {
  // The same spec run again from the start (another run name): its steps replace the first
  // run's, and the note names both runs.
  const std::string text = RunLine(10, 2, "j", "r1", "c") + RunLine(20, 1.5, "j", "r1", "c") +
                           RunLine(30, 1.2, "j", "r1", "c") + RunLine(10, 2.1, "j", "r2", "c");
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "j.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(10));
  EXPECT_DOUBLE_EQ(h->records[0].loss(), 2.1);
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("j.jsonl: 3 records (lines 1-3, steps 10-30) replaced by "
                                       "run r2's, which trained those steps again (run r1 has "
                                       "the same job and configuration"));
}

TEST(ParseMetricsHistory, DropsALastLineStillBeingWritten) {
  std::string text = Line(1, 2, 0.1, 10) + Line(2, 1.9, 0.1, 10) + "{\"step\":3,\"lo";
  absl::StatusOr<MetricsHistory> h = ParseMetricsHistory(text, "live.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1, 2));
  ASSERT_EQ(h->dropped.size(), 1u);
  EXPECT_THAT(h->dropped[0], HasSubstr("live.jsonl:3: left out the last line, cut short"));
  // A whole last record without its newline counts.
  text = Line(1, 2, 0.1, 10) + "{\"step\":3,\"loss\":1}";
  h = ParseMetricsHistory(text, "live.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Steps(h->records), ElementsAre(1, 3));
  EXPECT_TRUE(h->dropped.empty());
}

// Runs with records at `steps`; fp16 ones with a loss scale of 2^(16 - k) at their k-th
// record; with_test adds a test loss at every other record.
PlotRun MakeRun(const std::string& label, const std::vector<int>& steps, bool fp16, bool with_test) {
  std::string text;
  for (size_t k = 0; k < steps.size(); ++k) {
    text += Line(steps[k], 2.0 / (k + 1), 0.01 * (k + 1), 100 + k, fp16 ? 65536 >> k : 1,
                 with_test && k % 2 == 1 ? ",\"test_loss\":1.5,\"test_accuracy\":0.7" : "");
  }
  PlotRun run;
  run.label = label;
  run.records = ParseMetricsHistory(text, label)->records;
  return run;
}

const plot::PlotSpec* Panel(const Curves& curves, const std::string& title) {
  for (const plot::PlotSpec& p : curves.panels) {
    if (p.title == title) return &p;
  }
  return nullptr;
}

TEST(DrawCurves, OnePanelPerQuantityOneSeriesPerRun) {
  const std::vector<PlotRun> runs = {MakeRun("bf16", {1, 10, 20, 30}, false, true),
                                     MakeRun("fp16", {1, 10, 20}, true, false)};
  PlotFlags flags;
  const Curves curves = DrawCurves(runs, flags);
  ASSERT_EQ(curves.notes.size(), 1u);
  EXPECT_THAT(curves.notes[0], HasSubstr("panel perplexity left out: no record has a "
                                         "test_perplexity"));
  ASSERT_EQ(curves.panels.size(), 6u);
  // Test accuracy: the run that evaluated.
  const plot::PlotSpec* accuracy = Panel(curves, "test accuracy");
  ASSERT_NE(accuracy, nullptr);
  ASSERT_EQ(accuracy->series.size(), 1u);
  EXPECT_EQ(accuracy->series[0].points,
            (std::vector<std::pair<double, double>>{{10, 0.7}, {30, 0.7}}));
  // Loss: each run's training loss, and the evaluated run's test loss dashed.
  const plot::PlotSpec* loss = Panel(curves, "loss");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->series.size(), 3u);
  EXPECT_EQ(loss->series[0].label, "bf16");
  EXPECT_EQ(loss->series[0].points.size(), 4u);
  EXPECT_EQ(loss->series[1].label, "fp16");
  EXPECT_EQ(loss->series[1].points.size(), 3u);
  EXPECT_EQ(loss->series[2].label, "bf16 test");
  EXPECT_TRUE(loss->series[2].dashed);
  EXPECT_EQ(loss->series[2].points,
            (std::vector<std::pair<double, double>>{{10, 1.5}, {30, 1.5}}));
  EXPECT_EQ(loss->series[2].color, loss->series[0].color);
  EXPECT_NE(loss->series[1].color, loss->series[0].color);
  EXPECT_EQ(loss->x_scale, plot::XScale::kLinear);
  EXPECT_EQ(loss->series[0].points[1], (std::pair<double, double>{10, 1.0}));
  for (const char* title : {"learning rate", "throughput (all ranks)", "gradient norm (global)",
                            "loss scale (fp16)"}) {
    const plot::PlotSpec* p = Panel(curves, title);
    ASSERT_NE(p, nullptr) << title;
    ASSERT_EQ(p->series.size(), 2u) << title;
    EXPECT_EQ(p->series[0].points.size(), 4u) << title;
    EXPECT_EQ(p->series[1].points.size(), 3u) << title;
    EXPECT_EQ(p->series[1].color, loss->series[1].color) << title;
  }
  EXPECT_EQ(Panel(curves, "throughput (all ranks)")->y_label, "samples/s");
  EXPECT_TRUE(Panel(curves, "loss scale (fp16)")->log_y);
  EXPECT_EQ(Panel(curves, "loss scale (fp16)")->series[1].points[2].second, 16384);
  EXPECT_EQ(Panel(curves, "gradient norm (global)")->series[0].points[3].second, 0.8);
}

TEST(DrawCurves, PanelsWithoutDataAreLeftOutAndSaidSo) {
  // No fp16 run, and a peer's file without a gradient norm or learning rate.
  PlotRun peer;
  peer.label = "pytorch";
  peer.records = ParseMetricsHistory(
      "{\"step\":10,\"loss\":2.5,\"samples_per_second\":50}\n", "peer")->records;
  const Curves curves = DrawCurves({MakeRun("ringmaster", {10, 20}, false, false), peer}, PlotFlags{});
  std::vector<std::string> titles;
  for (const plot::PlotSpec& p : curves.panels) titles.push_back(p.title);
  EXPECT_THAT(titles, ElementsAre("loss", "learning rate", "throughput (all ranks)",
                                  "gradient norm (global)"));
  ASSERT_EQ(curves.notes.size(), 3u);
  EXPECT_THAT(curves.notes[0], HasSubstr("accuracy left out"));
  EXPECT_THAT(curves.notes[1], HasSubstr("perplexity left out"));
  EXPECT_THAT(curves.notes[2], HasSubstr("loss_scale left out"));
  EXPECT_EQ(Panel(curves, "gradient norm (global)")->series.size(), 1u);  // the peer has none
  EXPECT_EQ(Panel(curves, "loss")->series.size(), 2u);

  const Curves only_peer = DrawCurves({peer}, PlotFlags{});
  EXPECT_EQ(only_peer.panels.size(), 2u);  // loss, throughput
  EXPECT_EQ(only_peer.notes.size(), 5u);   // accuracy, perplexity, lr, grad_norm, loss_scale
}

TEST(DrawCurves, PanelsFlagPicksAndTokensWhenEveryRecordHasThem) {
  PlotRun lm;
  lm.label = "gpt";
  lm.records = ParseMetricsHistory(
      Line(1, 5, 1e-3, 8, 1, ",\"tokens_per_second\":512") +
          Line(2, 4, 1e-3, 10, 1, ",\"tokens_per_second\":640"),
      "gpt")->records;
  PlotFlags flags;
  flags.panels = {"throughput", "loss_scale"};
  Curves curves = DrawCurves({lm}, flags);
  ASSERT_EQ(curves.panels.size(), 1u);
  EXPECT_EQ(curves.panels[0].y_label, "tokens/s");
  EXPECT_EQ(curves.panels[0].series[0].points,
            (std::vector<std::pair<double, double>>{{1, 512}, {2, 640}}));
  EXPECT_EQ(curves.notes.size(), 1u);  // loss_scale
  // With a run that does not know its tokens, samples/s for both.
  curves = DrawCurves({lm, MakeRun("mlp", {1, 2}, false, false)}, flags);
  EXPECT_EQ(curves.panels[0].y_label, "samples/s");
  EXPECT_EQ(curves.panels[0].series[0].points[1].second, 10);
}

TEST(DrawCurves, SecondsAxisSumsTheWindows) {
  PlotFlags flags;
  flags.x = "seconds";
  flags.panels = {"loss"};
  // Line() gives every record a 2 s window.
  const Curves curves = DrawCurves({MakeRun("a", {1, 10, 20}, false, false)}, flags);
  ASSERT_EQ(curves.panels.size(), 1u);
  EXPECT_EQ(curves.panels[0].x_label, "training time (s)");
  std::vector<double> xs;
  for (const auto& [x, y] : curves.panels[0].series[0].points) xs.push_back(x);
  EXPECT_THAT(xs, ElementsAre(2, 4, 6));
}

TEST(DefaultLabels, FileNamesOrPathsWhenTheyClash) {
  EXPECT_THAT(DefaultLabels({"out/fashion.metrics.jsonl", "2ranks.jsonl"}),
              ElementsAre("fashion", "2ranks"));
  EXPECT_THAT(DefaultLabels({"run1/metrics.jsonl", "run2/metrics.jsonl", "x.txt"}),
              ElementsAre("run1/metrics.jsonl", "run2/metrics.jsonl", "x.txt"));
}

TEST(PlotCurves, WritesOneSvgWithAPanelPerQuantity) {
  const std::string a = TempPath("one.jsonl"), b = TempPath("two.jsonl"), out = TempPath("c.svg");
  ASSERT_TRUE(WriteFileAtomically(a, Line(1, 2.3, 0.1, 100) + Line(20, 1.1, 0.1, 110) +
                                         Line(40, 0.9, 0.05, 120)).ok());
  ASSERT_TRUE(WriteFileAtomically(b, Line(1, 2.3, 0.1, 190) + Line(20, 1.2, 0.1, 210)).ok());
  PlotFlags flags;
  flags.files = {a, b};
  flags.out = out;
  flags.labels = {"1 rank", "2 ranks"};
  absl::StatusOr<PlotResult> result = PlotCurves(flags);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->summary, HasSubstr("2 runs"));
  EXPECT_THAT(result->summary, HasSubstr("1 rank (3 records, steps 1-40)"));
  ASSERT_EQ(result->notes.size(), 3u);  // accuracy, perplexity, loss_scale
  EXPECT_THAT(result->notes[2], HasSubstr("loss_scale"));
  absl::StatusOr<std::string> svg = ReadFile(out);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(Count(*svg, "<svg "), 1 + 4);  // the document and its 4 panels
  EXPECT_EQ(Count(*svg, "</svg>"), 1 + 4);
  // Every panel draws both runs: 3 + 2 points each.
  EXPECT_EQ(Count(*svg, "<circle class=\"point\""), 4 * (3 + 2));
  EXPECT_EQ(Count(*svg, ">1 rank</text>"), 4);
  EXPECT_EQ(Count(*svg, ">2 ranks</text>"), 4);
  for (const char* title : {">loss</text>", ">learning rate</text>", ">gradient norm (global)<",
                            ">throughput (all ranks)<"}) {
    EXPECT_THAT(*svg, HasSubstr(title));
  }
  EXPECT_THAT(*svg, ::testing::Not(HasSubstr("loss scale")));
}

TEST(PlotCurves, ErrorsNameTheFile) {
  PlotFlags flags;
  flags.out = TempPath("never.svg");
  flags.files = {TempPath("missing.jsonl")};
  absl::StatusOr<PlotResult> result = PlotCurves(flags);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("missing.jsonl"));

  const std::string empty = TempPath("empty.jsonl");
  ASSERT_TRUE(WriteFileAtomically(empty, "\n").ok());
  flags.files = {empty};
  result = PlotCurves(flags);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("empty.jsonl: no metrics record"));

  const std::string bad = TempPath("bad.jsonl");
  ASSERT_TRUE(WriteFileAtomically(bad, "\nnot json\n").ok());
  flags.files = {bad};
  result = PlotCurves(flags);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("bad.jsonl:2"));
  EXPECT_FALSE(ReadFile(flags.out).ok());

  const std::string good = TempPath("good.jsonl");
  ASSERT_TRUE(WriteFileAtomically(good, Line(1, 2, 0.1, 10)).ok());
  flags.files = {good};
  flags.out = "/proc/nonexistent/curves.svg";
  result = PlotCurves(flags);
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("/proc/nonexistent/curves.svg"));
}

TEST(DrawCurves, PerplexityOfLanguageModelsOnALogScale) {
  PlotRun lm;
  lm.label = "gpt";
  lm.records = ParseMetricsHistory(
      Line(10, 5, 1e-3, 8, 1, ",\"test_loss\":5.5,\"test_perplexity\":244.7") +
          Line(20, 4, 1e-3, 8) +
          Line(30, 3, 1e-3, 8, 1, ",\"test_loss\":2.3,\"test_perplexity\":9.97"),
      "gpt")->records;
  PlotFlags flags;
  flags.panels = {"accuracy", "perplexity"};
  const Curves curves = DrawCurves({lm}, flags);
  ASSERT_EQ(curves.panels.size(), 1u);
  EXPECT_EQ(curves.panels[0].title, "test perplexity");
  EXPECT_TRUE(curves.panels[0].log_y);
  EXPECT_EQ(curves.panels[0].series[0].points,
            (std::vector<std::pair<double, double>>{{10, 244.7}, {30, 9.97}}));
  ASSERT_EQ(curves.notes.size(), 1u);
  EXPECT_THAT(curves.notes[0], HasSubstr("panel accuracy left out: no record has a "
                                         "test_accuracy"));
}

TEST(DrawCurves, IdenticalCurvesAreNamedInTheLegendAndANote) {
  // Two runs whose losses are the same points (e.g. a --set that changed nothing), and a
  // third that differs.
  const PlotRun a = MakeRun("a", {1, 10, 20}, false, false);
  PlotRun b = a;
  b.label = "b";
  PlotRun c = MakeRun("c", {1, 10, 20}, false, false);
  c.records[1].set_loss(0.75);
  PlotFlags flags;
  flags.panels = {"loss"};
  const Curves curves = DrawCurves({a, b, c}, flags);
  ASSERT_EQ(curves.panels.size(), 1u);
  const std::vector<plot::Series>& series = curves.panels[0].series;
  ASSERT_EQ(series.size(), 3u);
  EXPECT_EQ(series[0].label, "a");
  EXPECT_EQ(series[1].label, "b (identical to a)");
  EXPECT_EQ(series[2].label, "c");
  ASSERT_EQ(curves.notes.size(), 1u);
  EXPECT_EQ(curves.notes[0], "panel loss: b is identical to a (3 points; drawn over it)");
}

TEST(PlotCurves, SaysWhatTheFilesHeldThatIsNotDrawn) {
  const std::string mixed = TempPath("mixed.jsonl"), out = TempPath("mixed.svg");
  ASSERT_TRUE(WriteFileAtomically(mixed, RunLine(10, 2, "g", "r1", "c1") +
                                             RunLine(20, 1.5, "g", "r1", "c1") + "garbage\n" +
                                             RunLine(10, 2.2, "g", "r2", "c2"))
                  .ok());
  PlotFlags flags;
  flags.files = {mixed};
  flags.out = out;
  flags.panels = {"loss"};
  absl::StatusOr<PlotResult> result = PlotCurves(flags);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->summary, HasSubstr("mixed (1 record, step 10, run r2)"));
  ASSERT_EQ(result->notes.size(), 2u);
  EXPECT_THAT(result->notes[0], HasSubstr("mixed.jsonl: left out 1 line that is not a metrics "
                                          "record (line 3)"));
  EXPECT_THAT(result->notes[1], HasSubstr("mixed.jsonl: left out 2 records of run r1"));
}

TEST(PlotCommandLine, FlagsAndUsageErrors) {
  ParsedCommandLine p = ParseCommandLine(
      {"plot", "a.jsonl", "b.jsonl", "-o", "c.svg", "--labels", "1 rank,2 ranks", "--panels",
       "loss,lr", "--x", "seconds"});
  ASSERT_TRUE(p.line.has_value()) << p.err;
  EXPECT_EQ(p.line->command, Command::kPlot);
  EXPECT_THAT(p.line->plot.files, ElementsAre("a.jsonl", "b.jsonl"));
  EXPECT_EQ(p.line->plot.out, "c.svg");
  EXPECT_THAT(p.line->plot.labels, ElementsAre("1 rank", "2 ranks"));
  EXPECT_THAT(p.line->plot.panels, ElementsAre("loss", "lr"));
  EXPECT_EQ(p.line->plot.x, "seconds");

  p = ParseCommandLine({"plot", "a.jsonl", "-o", "c.svg"});
  ASSERT_TRUE(p.line.has_value()) << p.err;
  EXPECT_EQ(p.line->plot.x, "step");
  EXPECT_TRUE(p.line->plot.panels.empty());

  const struct {
    std::vector<std::string> args;
    const char* names;
  } bad[] = {
      {{"plot", "a.jsonl", "b.jsonl", "-o", "c.svg", "--labels", "one"}, "--labels"},
      {{"plot", "a.jsonl", "-o", "c.svg", "--panels", "loss,bogus"}, "--panels"},
      {{"plot", "a.jsonl", "-o", "c.svg", "--x", "epoch"}, "--x"},
      {{"plot", "a.jsonl"}, "--output"},
      {{"plot", "-o", "c.svg"}, "METRICS"},
  };
  for (const auto& b : bad) {
    p = ParseCommandLine(b.args);
    EXPECT_FALSE(p.line.has_value()) << b.names;
    EXPECT_EQ(p.exit_status, 2) << b.names;
    EXPECT_THAT(p.err, HasSubstr(b.names));
    EXPECT_THAT(p.err, HasSubstr("ringctl plot"));
  }
}

}  // namespace
}  // namespace ringmaster::cli
