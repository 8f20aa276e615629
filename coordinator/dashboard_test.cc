// The dashboard's pages rendered from snapshots made here: the index's jobs and nodes, a job
// page with its recoveries, curves, members per epoch, ranks and checkpoints, escaping of
// what users and nodes wrote, and 404s.
#include "coordinator/dashboard.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace ringmaster::coordinator::dashboard {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);
const int64_t kNowMs = absl::ToUnixMillis(kNow);

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

ringmaster::SlotRef ProtoSlot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

// Job "mlp": started on 4 ranks, lost b/0 at step 120 (back to the checkpoint of step 100,
// 3 ranks), runs at step 180 of 300.
JobEvent RunningJob() {
  JobEvent event;
  Job* job = event.mutable_job();
  job->set_id("mlp");
  job->set_phase(JOB_PHASE_RUNNING);
  job->set_epoch(2);
  job->set_epoch_cause("failure");
  job->set_restarts(1);
  job->set_restart_budget(3);
  job->set_min_ranks(2);
  job->set_max_ranks(4);
  job->set_step(180);
  job->set_total_steps(300);
  job->set_loss(0.4321);
  job->set_steps_per_s(4);
  job->set_submitted_ms(kNowMs - 120'000);
  for (auto [node, slot, rank] : {std::tuple{"a", 0, 0}, {"a", 1, 1}, {"b", 1, 2}}) {
    ringmaster::Member* m = job->add_members();
    *m->mutable_slot() = ProtoSlot(node, slot);
    m->set_rank(rank);
    m->set_joined(true);
    m->set_ready(true);
    m->set_step(180);
    m->set_last_progress_ms(kNowMs - 500);
    RankStats* s = event.add_ranks();
    s->set_rank(rank);
    *s->mutable_slot() = ProtoSlot(node, slot);
    s->set_step(180);
    s->set_step_time_s(rank == 2 ? 0.4 : 0.25);
    s->set_loss(0.4321);
    s->set_samples_per_s(1536);
    s->set_comm_fraction(0.3);
    s->set_exposed_comm_fraction(0.1);
    s->set_slowdown(rank == 2 ? 1.9 : 1.0);
    s->set_straggler(rank == 2);
  }
  job->add_stragglers("b/1 (rank 2, compute 1.9x the median)");
  Recovery* r = job->add_recoveries();
  r->set_epoch(2);
  r->set_cause("failure");
  r->set_reason("trainer b/0 exited with signal 9");
  r->set_old_world(4);
  r->set_new_world(3);
  r->set_began_ms(kNowMs - 60'000);
  r->set_rendezvous_s(0.8);
  r->set_restore_s(1.5);
  r->set_first_step_s(0.3);
  r->set_lost_steps(20);
  r->set_step_before(120);
  r->set_resumed_from_step(100);
  r->set_resumed_from("step 100's checkpoint");
  r->set_lost_because("its state is sharded over the ranks (ZeRO-2)");
  CheckpointInfo* c = job->add_checkpoints();
  c->set_step(100);
  c->set_path("/ckpt/mlp/step-100");
  c->set_world_size(4);
  c->set_bytes(3 << 20);
  c->set_committed_ms(kNowMs - 70'000);
  c->set_save_seconds(0.5);
  return event;
}

JobHistory::View RunningHistory() {
  JobHistory::View view;
  for (int step = 1; step <= 180; ++step) {
    JobHistory::Point p;
    p.time = kNow - absl::Seconds(180 - step);
    p.epoch = step <= 100 ? 1 : 2;
    p.step = step;
    p.loss = 2.3 / (1 + step / 50.0);
    p.samples_per_s = 1500 + step;
    p.comm_fraction = 0.3;
    p.exposed_comm_fraction = 0.1;
    view.points.push_back(p);
  }
  view.epochs.push_back(
      {1, EpochCause::kStart, kNow - absl::Seconds(120), {{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}}});
  view.epochs.push_back(
      {2, EpochCause::kFailure, kNow - absl::Seconds(59), {{"a", 0}, {"a", 1}, {"b", 1}}});
  return view;
}

Snapshot MakeSnapshot() {
  Snapshot snapshot;
  snapshot.state.taken = kNow;
  const JobEvent running = RunningJob();
  snapshot.state.jobs.push_back(running.job());
  snapshot.state.ranks["mlp"].assign(running.ranks().begin(), running.ranks().end());
  Job pending;
  pending.set_id("waiting");
  pending.set_phase(JOB_PHASE_PENDING);
  pending.set_reason("needs 8 slots, 1 free");
  snapshot.state.jobs.push_back(pending);
  snapshot.histories["mlp"] = RunningHistory();
  for (const char* name : {"a", "b"}) {
    NodeInfo* node = snapshot.state.nodes.add_nodes();
    node->set_node(name);
    node->set_last_heartbeat_age_s(0.4);
    node->set_lease_left_s(2.6);
    for (int s = 0; s < 2; ++s) {
      SlotInfo* slot = node->add_slots();
      slot->set_slot(s);
      slot->set_rank(-1);
      if (std::string(name) == "a" || s == 1) {
        slot->set_job("mlp");
        slot->set_rank(std::string(name) == "a" ? s : 2);
      }
    }
  }
  return snapshot;
}

TEST(DashboardTest, TheIndexListsJobsWithTheirFiguresAndTheNodes) {
  const HttpResponse r = Render("/", MakeSnapshot());
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  EXPECT_TRUE(absl::StartsWith(r.body, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::StrContains(r.body, "<meta http-equiv=\"refresh\" content=\"5\">"));
  EXPECT_TRUE(absl::StrContains(r.body, "<a href=\"/jobs/mlp\">mlp</a>"));
  EXPECT_TRUE(absl::StrContains(r.body, "<span class=\"phase running\">RUNNING</span>"));
  EXPECT_TRUE(absl::StrContains(r.body, "180 / 300"));
  EXPECT_TRUE(absl::StrContains(r.body, "0.4321"));
  EXPECT_TRUE(absl::StrContains(r.body, "1.54k samples/s"));  // rank 0's, all ranks together
  EXPECT_TRUE(absl::StrContains(r.body, "1 / 3"));            // restarts of the budget
  EXPECT_TRUE(absl::StrContains(r.body, "1 (latest step 100)"));
  EXPECT_TRUE(absl::StrContains(r.body, "PENDING</span><div class=\"reason\">needs 8 slots"));
  // Nodes: a runs ranks 0 and 1, b rank 2 and has an idle slot.
  EXPECT_TRUE(absl::StrContains(r.body, "<table id=\"nodes\">"));
  EXPECT_TRUE(absl::StrContains(r.body, "slot 1: <a href=\"/jobs/mlp\">mlp</a> rank 2"));
  EXPECT_EQ(Count(r.body, "0.40 s ago"), 2);  // heartbeat ages

  DashboardOptions no_refresh;
  no_refresh.refresh_s = 0;
  EXPECT_FALSE(absl::StrContains(Render("/", MakeSnapshot(), no_refresh).body, "refresh"));
}

TEST(DashboardTest, AJobPageShowsItsRecoveryCurvesEpochsRanksAndCheckpoints) {
  const HttpResponse r = Render("/jobs/mlp", MakeSnapshot());
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.body, "<h1 id=\"job\">mlp <span class=\"phase running\">"));
  // The recovery: a timeline row with its bars, and the table.
  EXPECT_EQ(Count(r.body, "<g class=\"recovery\">"), 1);
  EXPECT_TRUE(absl::StrContains(r.body, "  membership epoch 2 failure  world 4→3"));
  EXPECT_TRUE(absl::StrContains(r.body, "<title>rendezvous 0.800 s</title>"));
  EXPECT_TRUE(absl::StrContains(r.body, "<title>restore 1.500 s</title>"));
  EXPECT_TRUE(absl::StrContains(r.body, "2.60 s, lost 20 steps"));  // 0.8 + 1.5 + 0.3
  EXPECT_TRUE(absl::StrContains(r.body, "trainer b/0 exited with signal 9"));
  // Where it resumed from, the steps lost and why, as the trainers said it.
  EXPECT_TRUE(absl::StrContains(
      r.body,
      "resumed from step 100&#39;s checkpoint: 20 steps lost (the job had reached step 120), "
      "because its state is sharded over the ranks (ZeRO-2)"))
      << r.body.substr(r.body.find("<table id=\"recoveries\">"), 1500);
  // The rate and the ETA of the progress line (common/progress_rate.h), its window named.
  EXPECT_TRUE(absl::StrContains(r.body, "4 steps/s<br>ETA 30s"));  // 120 steps at 4 steps/s
  EXPECT_TRUE(absl::StrContains(r.body, "over the last 30 s of steps"));
  EXPECT_TRUE(absl::StrContains(r.body, "<td>Membership epoch</td>"));
  // Three charts against step, epoch 2 shaded: the loss and the throughput each as the reports
  // and their mean over 180 / 25 = 7 reports, the communication shares as means.
  EXPECT_EQ(Count(r.body, "<svg"), 4);  // and the timeline
  EXPECT_EQ(Count(r.body, "<polyline"), 6);
  EXPECT_EQ(Count(r.body, "<circle class=\"point\""), 6 * 180);
  EXPECT_TRUE(absl::StrContains(r.body, ">loss, mean of 7</text>"));
  EXPECT_TRUE(absl::StrContains(r.body, ">samples/s, mean of 7</text>"));
  EXPECT_TRUE(absl::StrContains(r.body, ">exposed, mean of 7</text>"));
  EXPECT_TRUE(absl::StrContains(r.body, ">membership epoch 2</text>"));
  // Members per epoch, newest first.
  const size_t epochs = r.body.find("<table id=\"epochs\">");
  ASSERT_NE(epochs, std::string::npos);
  EXPECT_LT(r.body.find("0: a/0 · 1: a/1 · 2: b/1", epochs),
            r.body.find("0: a/0 · 1: a/1 · 2: b/0 · 3: b/1", epochs));
  // Ranks now: the straggler is marked.
  EXPECT_EQ(Count(r.body, "<tr class=\"straggler\">"), 1);
  EXPECT_TRUE(absl::StrContains(r.body, "1.90× <b>straggler</b>"));
  EXPECT_TRUE(absl::StrContains(r.body, "b/1 (rank 2, compute 1.9x the median)"));
  // The checkpoint.
  EXPECT_TRUE(absl::StrContains(r.body, "<code>/ckpt/mlp/step-100</code>"));
  EXPECT_TRUE(absl::StrContains(r.body, "3.0 MiB"));

  EXPECT_EQ(Render("/jobs/mlp/", MakeSnapshot()).status, 200);
}

TEST(DashboardTest, CountsAreInTheirNounsNumber) {
  Snapshot snapshot = MakeSnapshot();
  std::string body = Render("/", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, "2 jobs: 1 running, 0 ended. 2 nodes."));
  // One job on one node, of one rank.
  snapshot.state.jobs.pop_back();
  snapshot.state.nodes.mutable_nodes()->RemoveLast();
  Job& job = snapshot.state.jobs[0];
  while (job.members_size() > 1) job.mutable_members()->RemoveLast();
  body = Render("/", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, "1 job: 1 running, 0 ended. 1 node.")) << body;
  body = Render("/jobs/mlp", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, "1 rank (min 2, max 4)"));
}

TEST(DashboardTest, ALanguageModelsThroughputIsDrawnInTokensAlone) {
  // tokens/s is samples/s times the context (here 128): on one linear axis with it, samples/s
  // lay flat along the bottom. The chart draws tokens/s, with its unit on the axis.
  Snapshot snapshot = MakeSnapshot();
  for (JobHistory::Point& p : snapshot.histories["mlp"].points) {
    p.samples_per_s = 75;
    p.tokens_per_s = 75 * 128;
  }
  const std::string body = Render("/jobs/mlp", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, ">tokens/s, mean of 7</text>"));
  EXPECT_FALSE(absl::StrContains(body, ">samples/s")) << "no samples/s series or axis";
  EXPECT_EQ(Count(body, "<polyline"), 6);  // loss, tokens/s (reports and mean), 2 comm shares
  // A classifier's in samples/s, the axis saying so.
  const std::string mlp = Render("/jobs/mlp", MakeSnapshot()).body;
  EXPECT_TRUE(absl::StrContains(mlp, ">samples/s, mean of 7</text>"));
  EXPECT_FALSE(absl::StrContains(mlp, ">tokens/s"));
  EXPECT_FALSE(absl::StrContains(mlp, ">per second<")) << "the axis names its unit";
}

TEST(DashboardTest, ALongSeriesIsDrawnThinnedAndAJobWithoutHistorySaysSo) {
  Snapshot snapshot = MakeSnapshot();
  JobHistory::View& history = snapshot.histories["mlp"];
  history.points.insert(history.points.begin(), 1000, history.points.front());
  std::string body = Render("/jobs/mlp", snapshot).body;
  EXPECT_EQ(Count(body, "<circle class=\"point\""), 6 * 240);
  EXPECT_TRUE(absl::StrContains(body, "1180 kept, 240 drawn"));

  snapshot.histories.clear();
  body = Render("/jobs/mlp", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, "No steps reported yet"));
  EXPECT_TRUE(absl::StrContains(body, "No membership epoch committed yet"));
  EXPECT_TRUE(absl::StrContains(body, "<g class=\"recovery\">")) << "from the job itself";
}

TEST(DashboardTest, TheBoldCurveIsTheMeanOfTheReportsAroundEachWithinItsEpoch) {
  // 50 reports of a loss alternating 1, 3, 1, 3, ...: a mean of 50 / 25 = 2 reports is 2
  // everywhere but at the first report (alone) and at the first of epoch 2 (step 31, as the
  // epoch's first it is alone again).
  Snapshot snapshot = MakeSnapshot();
  JobHistory::View& history = snapshot.histories["mlp"];
  history.points.resize(50);
  for (int i = 0; i < 50; ++i) {
    history.points[i].step = i + 1;
    history.points[i].epoch = i < 30 ? 1 : 2;
    history.points[i].loss = i % 2 == 0 ? 1 : 3;
  }
  const std::string body = Render("/jobs/mlp", snapshot).body;
  EXPECT_TRUE(absl::StrContains(body, ">loss, mean of 2</text>"));
  // The loss chart's second polyline is the mean: its y pixels.
  size_t at = body.find("<polyline");
  at = body.find("<polyline", at + 1);
  ASSERT_NE(at, std::string::npos);
  const size_t from = body.find("points=\"", at) + 8;
  std::vector<std::string> ys;
  for (absl::string_view xy : absl::StrSplit(body.substr(from, body.find('"', from) - from), ' ')) {
    if (!xy.empty()) ys.emplace_back(xy.substr(xy.find(',') + 1));
  }
  ASSERT_EQ(ys.size(), 50u);
  EXPECT_NE(ys[0], ys[1]);   // 1 alone
  EXPECT_NE(ys[30], ys[1]);  // step 31 (loss 1) alone: epoch 2's first
  for (int i : {1, 2, 17, 29, 31, 49}) EXPECT_EQ(ys[i], ys[1]) << "report " << i;
}

TEST(DashboardTest, WhatUsersAndNodesWroteIsEscaped) {
  Snapshot snapshot = MakeSnapshot();
  Job* job = &snapshot.state.jobs[0];
  job->set_reason("<script>alert('x')</script> & more");
  job->mutable_recoveries(0)->set_reason("<img src=x onerror=alert(1)>");
  job->mutable_checkpoints(0)->set_path("/ckpt/\"><b>bold</b>");
  snapshot.state.nodes.mutable_nodes(0)->set_node("a<i>");
  snapshot.state.nodes.mutable_nodes(0)->mutable_slots(0)->set_gpu("H200 <x>");
  for (const char* page : {"/", "/jobs/mlp"}) {
    const std::string body = Render(page, snapshot).body;
    EXPECT_FALSE(absl::StrContains(body, "<script>")) << page;
    EXPECT_FALSE(absl::StrContains(body, "<img")) << page;
    EXPECT_FALSE(absl::StrContains(body, "<b>bold")) << page;
    EXPECT_FALSE(absl::StrContains(body, "<i>")) << page;
    EXPECT_FALSE(absl::StrContains(body, "<x>")) << page;
  }
  EXPECT_TRUE(absl::StrContains(Render("/", snapshot).body,
                                "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more"));
  EXPECT_TRUE(absl::StrContains(Render("/", snapshot).body, "a&lt;i&gt;"));
  EXPECT_TRUE(
      absl::StrContains(Render("/jobs/mlp", snapshot).body, "&lt;img src=x onerror=alert(1)&gt;"));
}

TEST(DashboardTest, AJobPageNamesACommandJobsFirstFailure) {
  Snapshot snapshot = MakeSnapshot();
  EXPECT_FALSE(absl::StrContains(Render("/jobs/mlp", snapshot).body, "First failure"));
  ringmaster::RankFailure* f = snapshot.state.jobs[0].mutable_first_failure();
  f->set_epoch(2);
  f->set_rank(3);
  f->mutable_slot()->set_node("b");
  f->mutable_slot()->set_slot(1);
  f->set_program("python3");
  f->set_how("exit code 1");
  f->set_error_message("ValueError: <bad> batch");
  f->set_last_output_line("step 7 & counting");
  f->set_failed_at_s(1767225600.25);  // 2026-01-01 00:00:00.250 UTC
  f->set_failed_at_from_error_file(true);
  const std::string body = Render("/jobs/mlp", snapshot).body;
  EXPECT_TRUE(absl::StrContains(
      body,
      "<td>First failure</td><td><div id=\"first-failure\"><b>rank 3</b> on node b slot 1 in "
      "membership epoch 2: python3: exit code 1 <span class=\"muted\">at 2026-01-01 "
      "00:00:00.250 UTC (its error file's time)</span><br>error file: <code>ValueError: "
      "&lt;bad&gt; batch</code><br>last output line: <code>step 7 &amp; counting</code></div>"))
      << body.substr(body.find("<table class=\"summary\""), 3000);
}

TEST(DashboardTest, AnUnknownJobOrPageIsNotFound) {
  HttpResponse r = Render("/jobs/nosuchjob", MakeSnapshot());
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(absl::StrContains(r.body, "no job &quot;nosuchjob&quot;")) << r.body;
  EXPECT_FALSE(absl::StrContains(r.body, "refresh")) << "a missing page does not reload";
  r = Render("/jobs/<b>", MakeSnapshot());
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(absl::StrContains(r.body, "&lt;b&gt;"));
  for (const char* path : {"/jobs/", "/jobs/mlp/extra", "/favicon.ico", "/nodes"}) {
    EXPECT_EQ(Render(path, MakeSnapshot()).status, 404) << path;
  }
}

TEST(DashboardTest, JobOfPathNamesTheJobAPageShows) {
  EXPECT_EQ(JobOfPath("/jobs/mlp"), "mlp");
  EXPECT_EQ(JobOfPath("/jobs/mlp/"), "mlp");
  EXPECT_EQ(JobOfPath("/"), "");
  EXPECT_EQ(JobOfPath("/metrics"), "");
}

}  // namespace
}  // namespace ringmaster::coordinator::dashboard
