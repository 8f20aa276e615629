#include "worker/program_progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringmaster::worker {
namespace {

using nlohmann::json;

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

double Unix(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

json Report(int64_t step, absl::Time at) {
  return {{"type", "report"}, {"step", step}, {"time", Unix(at)}};
}

std::unique_ptr<ProgramProgress> Make(ProgramProgressOptions o = {}) {
  auto p = ProgramProgress::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

std::vector<json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(ProgramProgressTest, AReportBecomesTheRankStatsOfABuiltInTrainer) {
  ProgramProgressOptions o;
  o.rank = 1;
  auto p = Make(o);
  EXPECT_FALSE(p->TakeStats());
  // Steps every 0.1 s of 64 samples (256 tokens).
  for (int step = 1; step <= 21; ++step) {
    json m = Report(step, kStart + absl::Milliseconds(100) * step);
    m["loss"] = 1.0 / step;
    m["samples"] = 64;
    m["tokens"] = 256;
    m["scalars"] = {{"lr", 0.01}, {"grad_norm", 2.5}, {"comm_fraction", 0.25}, {"acc", 0.9}};
    p->Take(m, kStart + absl::Seconds(50));  // received later: the report's time counts
  }
  std::optional<RankStats> s = p->TakeStats();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->step(), 21);
  EXPECT_DOUBLE_EQ(s->loss(), 1.0 / 21);
  EXPECT_NEAR(s->step_time_s(), 0.1, 1e-6);
  EXPECT_NEAR(s->steps_per_s(), 10, 1e-6);
  EXPECT_NEAR(s->samples_per_s(), 640, 1e-3);
  EXPECT_NEAR(s->tokens_per_s(), 2560, 1e-3);
  EXPECT_DOUBLE_EQ(s->lr(), 0.01);
  EXPECT_DOUBLE_EQ(s->grad_norm(), 2.5);
  EXPECT_DOUBLE_EQ(s->comm_fraction(), 0.25);
  EXPECT_FALSE(p->TakeStats());  // taken: nothing new
  EXPECT_EQ(p->step(), 21);
}

TEST(ProgramProgressTest, SamplesPerSecondCountTheWindowsSamples) {
  auto p = Make();
  // 10 steps of 100 samples, then one of 10 (a data epoch's last, short batch).
  for (int step = 1; step <= 10; ++step) {
    p->Take(json{{"type", "report"}, {"step", step}, {"samples", 100},
                 {"time", Unix(kStart + absl::Seconds(step))}}, kStart);
  }
  p->Take(json{{"type", "report"}, {"step", 11}, {"samples", 10},
               {"time", Unix(kStart + absl::Seconds(11))}}, kStart);
  std::optional<RankStats> s = p->TakeStats();
  ASSERT_TRUE(s);
  EXPECT_NEAR(s->samples_per_s(), (9 * 100 + 10) / 10.0, 1e-6);  // steps 2..11 over 10 s
}

TEST(ProgramProgressTest, BadReportsAreDropped) {
  auto p = Make();
  for (const json& bad : {json{{"type", "report"}},
                          json{{"type", "report"}, {"step", -1}},
                          json{{"type", "report"}, {"step", 1.5}},
                          json{{"type", "report"}, {"step", "3"}},
                          json{{"type", "report"}, {"step", 3}, {"loss", "high"}},
                          json{{"type", "report"}, {"step", 3}, {"samples", -4}}}) {
    p->Take(bad, kStart);
    EXPECT_FALSE(p->TakeStats()) << bad.dump();
  }
  p->Take({{"type", "report"}, {"step", 3}, {"loss", "NaN"}}, kStart);
  std::optional<RankStats> s = p->TakeStats();
  ASSERT_TRUE(s);
  EXPECT_TRUE(std::isnan(s->loss()));
}

TEST(ProgramProgressTest, AProgramThatNeverSaidHelloIsAlwaysAlive) {
  ProgramProgressOptions o;
  o.heartbeat_timeout = absl::Seconds(1);
  auto p = Make(o);
  EXPECT_TRUE(p->Alive(kStart + absl::Hours(1)));
  p->Take({{"type", "hello"}, {"pid", 7}, {"inprocess", false}}, kStart);
  EXPECT_TRUE(p->said_hello());
  EXPECT_TRUE(p->Alive(kStart + absl::Seconds(1)));
  EXPECT_FALSE(p->Alive(kStart + absl::Milliseconds(1001)));  // frozen: no heartbeat
  p->Take({{"type", "heartbeat"}}, kStart + absl::Seconds(2));
  EXPECT_TRUE(p->Alive(kStart + absl::Milliseconds(2500)));
  EXPECT_FALSE(p->TakeStats());  // heartbeats are no reports
}

TEST(ProgramProgressTest, RankZeroWritesMetricsRecordsEveryLogEverySteps) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/records");
  ProgramProgressOptions o;
  o.metrics_jsonl = dir + "/m.jsonl";  // the directory is created
  o.job = "demo";
  o.run = "demo-1";
  o.log_every = 10;
  auto p = Make(o);
  for (int step = 1; step <= 25; ++step) {
    json m = Report(step, kStart + absl::Seconds(step));
    m["loss"] = step == 21 ? json("NaN") : json(0.5);
    m["samples"] = 8;
    m["scalars"] = {{"lr", 0.1}, {"accuracy", 0.75}, {"bad", "Infinity"}};
    p->Take(m, kStart);
  }
  std::vector<json> lines = ReadLines(o.metrics_jsonl);
  ASSERT_EQ(lines.size(), 3u);  // steps 1, 11, 21
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["step"], 11);
  EXPECT_EQ(lines[2]["step"], 21);
  EXPECT_EQ(lines[1]["loss"], 0.5);
  EXPECT_FALSE(lines[2].contains("loss"));  // not finite: left out
  EXPECT_EQ(lines[1]["job"], "demo");
  EXPECT_EQ(lines[1]["run"], "demo-1");
  EXPECT_EQ(lines[1]["lr"], 0.1);
  EXPECT_NEAR(lines[1]["samples_per_second"].get<double>(), 8, 1e-9);
  EXPECT_NEAR(lines[1]["window_seconds"].get<double>(), 10, 1e-9);
  EXPECT_EQ(lines[1]["scalars"], json({{"lr", 0.1}, {"accuracy", 0.75}}));

  ProgramProgressOptions other = o;
  other.rank = 1;
  other.metrics_jsonl = dir + "/other.jsonl";
  auto q = Make(other);
  q->Take(Report(1, kStart), kStart);
  EXPECT_NE(access(other.metrics_jsonl.c_str(), F_OK), 0);  // only rank 0 writes
}

TEST(ProgramProgressTest, AnUnwritableMetricsFileIsNamed) {
  ProgramProgressOptions o;
  o.metrics_jsonl = "/proc/no/such/m.jsonl";
  auto p = ProgramProgress::Create(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
  EXPECT_NE(p.status().message().find("/proc/no/such/m.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace ringmaster::worker
