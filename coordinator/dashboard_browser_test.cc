// The dashboard in a real browser: a coordinator is driven as two agents and their four
// trainers would drive it (a fake clock; a trainer killed at step 130, the job going on with
// three ranks from its checkpoint of step 100, one of them slow), its dashboard is served on
// an HTTP port (DashboardRoutes), and headless Chromium (Debian's `chromium`) loads it:
// the DOM it built must show the job's name, its phase RUNNING, the members per epoch, the
// recovery and the curves' points, and keep text that trainers sent as text. Screenshots of
// both pages go to the test's undeclared outputs (TEST_UNDECLARED_OUTPUTS_DIR), for a person
// to look at. Skips, saying so, where chromium is not installed (tools/setup.sh installs it).
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "coordinator/coordinator.h"
#include "coordinator/dashboard.h"
#include "coordinator/http_server.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace ringmaster::coordinator {
namespace {

constexpr char kJob[] = "fashion-mlp";

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// chromium on PATH, if any.
std::optional<std::string> FindChromium() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/chromium");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

class DashboardBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/dashboard-browser");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    clock_.Set(absl::FromUnixSeconds(1'800'000'000));
    CoordinatorOptions options;
    options.database = dir_ + "/jobs.db";
    options.clock = &clock_;
    options.membership.grow_after = absl::Seconds(1000);
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }

  void Register(const std::string& node) {
    RegisterNodeRequest r;
    r.set_node(node);
    r.set_slots(2);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  }

  // Both agents, each with the trainers of the job it runs now.
  void Heartbeats() {
    for (const std::string node : {"node-a", "node-b"}) {
      HeartbeatRequest r;
      r.set_node(node);
      r.set_node_credential(coordinator_->NodeCredentialFor(node));
      for (const auto& [slot, rank] : ranks_) {
        if (slot.node() != node) continue;
        *r.add_running() = slot;
        RunningTrainer* t = r.add_trainers();
        t->set_slot(slot.slot());
        t->set_job(kJob);
      }
      auto response = coordinator_->Heartbeat(r);
      ASSERT_TRUE(response.ok()) << node << ": " << response.status();
    }
  }

  // The trainers on `slots` join epoch `epoch` and get ready; ranks_ follows.
  void Form(int64_t epoch, const std::vector<ringmaster::SlotRef>& slots) {
    ranks_.clear();
    std::vector<std::optional<absl::StatusOr<JoinResponse>>> joins(slots.size());
    clock_.Advance(absl::Milliseconds(700));  // the trainers start
    for (size_t i = 0; i < slots.size(); ++i) {
      JoinRequest r;
      r.set_job(kJob);
      r.set_epoch(epoch);
      *r.mutable_slot() = slots[i];
      coordinator_->Join(r, clock_.Now() + absl::Seconds(30),
                         [&joins, i](absl::StatusOr<JoinResponse> v) { joins[i] = v; });
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      ASSERT_TRUE(joins[i].has_value() && joins[i]->ok()) << "join " << i;
      ranks_.emplace_back(slots[i], (*joins[i])->rank());
    }
    Heartbeats();
    clock_.Advance(absl::Milliseconds(1400));  // restoring
    Heartbeats();
    for (const auto& [slot, rank] : ranks_) {
      ReadyRequest r;
      r.set_job(kJob);
      r.set_epoch(epoch);
      *r.mutable_slot() = slot;
      ASSERT_TRUE(coordinator_->Ready(r).ok());
    }
  }

  // Every rank reports steps [from, to]; rank 2 computes slower in epoch 2.
  void Train(int64_t epoch, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      clock_.Advance(absl::Milliseconds(60));
      if (step % 5 == 0) Heartbeats();
      for (const auto& [slot, rank] : ranks_) {
        const bool slow = epoch == 2 && rank == 2;
        ProgressRequest r;
        r.set_job(kJob);
        r.set_epoch(epoch);
        *r.mutable_slot() = slot;
        r.set_total_steps(300);
        RankStats* s = r.mutable_stats();
        s->set_rank(rank);
        s->set_step(step);
        s->set_loss(0.35 + 1.95 * std::exp(-step / 45.0) + 0.03 * std::sin(step * 0.7));
        s->set_grad_norm(1.2 * std::exp(-step / 120.0) + 0.2);
        s->set_step_time_s(slow ? 0.11 : 0.06);
        s->set_comm_fraction(slow ? 0.12 : 0.38 + 0.04 * std::sin(step * 0.3));
        s->set_exposed_comm_fraction(slow ? 0.05 : 0.11 + 0.03 * std::sin(step * 0.5));
        s->set_samples_per_s((epoch == 1 ? 17000 : 11800) + 400 * std::sin(step * 0.2));
        ASSERT_TRUE(coordinator_->Progress(r).ok());
      }
      if (step % 50 == 0) Checkpoint(epoch, step);
    }
  }

  void Checkpoint(int64_t epoch, int64_t step) {
    ReportCheckpointRequest r;
    r.set_job(kJob);
    r.set_epoch(epoch);
    *r.mutable_slot() = ranks_[0].first;
    CheckpointInfo* c = r.mutable_checkpoint();
    c->set_step(step);
    // A path is what a trainer says: markup in it must stay text.
    c->set_path(absl::StrCat("/srv/ckpt/", kJob, "/step-", step, step == 200 ? "<b>x</b>" : ""));
    c->set_world_size(static_cast<int>(ranks_.size()));
    c->set_bytes(2'142'000 + 9000 * step);
    c->set_committed_ms(absl::ToUnixMillis(clock_.Now()));
    c->set_save_seconds(0.21);
    c->set_blocked_seconds(0.012);
    ASSERT_TRUE(coordinator_->ReportCheckpoint(r).ok());
  }

  // Runs chromium headless with `args` on `url`; its stdout (EXPECTs that it succeeded).
  std::string Chromium(const std::string& chromium, const std::string& args,
                       const std::string& url) {
    const std::string out = absl::StrCat(dir_, "/chromium.out");
    const std::string command = absl::StrCat(
        "TMPDIR=", ChromiumTemp(), " HOME=", dir_, " timeout 120 ", chromium,
        " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=", dir_,
        "/profile ", args, " ", url, " >", out, " 2>", out, ".err");
    const int rc = std::system(command.c_str());
    EXPECT_EQ(rc, 0) << command << "\n" << ReadFile(out + ".err").value_or("");
    return ReadFile(out).value_or("");
  }

  // A directory for Chromium's own temporary files: its socket's path must stay under 108
  // bytes, which a directory under TEST_TMPDIR may not.
  const std::string& ChromiumTemp() {
    if (chromium_tmp_.empty()) {
      char name[] = "/tmp/ringmaster-chromium.XXXXXX";
      EXPECT_NE(mkdtemp(name), nullptr);
      chromium_tmp_ = name;
    }
    return chromium_tmp_;
  }
  void TearDown() override {
    if (!chromium_tmp_.empty()) std::filesystem::remove_all(chromium_tmp_);
  }

  std::string dir_;
  std::string chromium_tmp_;
  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::pair<ringmaster::SlotRef, int>> ranks_;  // slot, rank
};

TEST_F(DashboardBrowserTest, ChromiumShowsARunningJobWithItsRecoveryCurvesAndMembers) {
  const std::optional<std::string> chromium = FindChromium();
  if (!chromium) {
    GTEST_SKIP() << "chromium is not installed (Debian's chromium; tools/setup.sh installs it)";
  }
  Register("node-a");
  Register("node-b");
  auto spec = spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_name(kJob);
  spec->mutable_elastic()->set_min_ranks(2);
  spec->mutable_elastic()->set_max_ranks(4);
  ASSERT_TRUE(coordinator_->Submit(*spec).ok());
  Form(1, {Slot("node-a", 0), Slot("node-a", 1), Slot("node-b", 0), Slot("node-b", 1)});
  Train(1, 1, 130);
  // node-b/0's trainer is killed: epoch 2 on three ranks restores the checkpoint of step 100.
  TrainerExitedRequest exited;
  exited.set_node("node-b");
  exited.set_node_credential(coordinator_->NodeCredentialFor("node-b"));
  exited.set_slot(0);
  exited.set_job(kJob);
  exited.set_exit_code(-9);
  exited.set_detail("step 131: loading batch\n");
  ASSERT_TRUE(coordinator_->TrainerExited(exited).ok());
  Form(2, {Slot("node-a", 0), Slot("node-a", 1), Slot("node-b", 1)});
  clock_.Advance(absl::Milliseconds(300));
  Train(2, 101, 215);
  // A second job that waits for room.
  spec->set_name("gpt-small");
  spec->mutable_elastic()->set_min_ranks(4);
  ASSERT_TRUE(coordinator_->Submit(*spec).ok());

  // The dashboard on an HTTP port, as ringmaster --metrics_listen serves it.
  HttpServerOptions http;
  http.listen = "127.0.0.1:0";
  auto server = HttpServer::Start(http, dashboard::DashboardRoutes(coordinator_.get()));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string job_page = (*server)->Url(absl::StrCat("/jobs/", kJob));
  const std::string index_page = (*server)->Url("/");

  const std::string dom = Chromium(*chromium, "--dump-dom", job_page);
  ASSERT_TRUE(absl::StrContains(dom, "</html>")) << dom.substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(dom, absl::StrCat("<h1 id=\"job\">", kJob, " <span")));
  EXPECT_TRUE(absl::StrContains(dom, "<span class=\"phase running\">RUNNING</span>"));
  EXPECT_TRUE(absl::StrContains(dom, "215 / 300"));
  // Members per epoch: epoch 2's three ranks, then epoch 1's four.
  const size_t epochs = dom.find("<table id=\"epochs\">");
  ASSERT_NE(epochs, std::string::npos);
  const std::string epochs_table = dom.substr(epochs, dom.find("</table>", epochs) - epochs);
  EXPECT_EQ(Count(epochs_table, "<tr>"), 3);  // a header and two epochs
  EXPECT_TRUE(absl::StrContains(epochs_table, "0: node-a/0 · 1: node-a/1 · 2: node-b/1"));
  EXPECT_TRUE(
      absl::StrContains(epochs_table, "0: node-a/0 · 1: node-a/1 · 2: node-b/0 · 3: node-b/1"));
  // The recovery: 4 -> 3 ranks, 30 steps lost (130 reported, restored at 100).
  EXPECT_EQ(Count(dom, "<g class=\"recovery\">"), 1);
  EXPECT_TRUE(absl::StrContains(dom, "world 4→3"));
  EXPECT_TRUE(absl::StrContains(dom, "lost 30 steps"));
  // The curves: 215 points of rank 0 (130 of epoch 1 less the 30 done again, 115 of epoch 2)
  // on each of the loss and the throughput, their means, and the two communication means.
  EXPECT_EQ(Count(dom, "<circle class=\"point\""), 6 * 215);
  EXPECT_TRUE(absl::StrContains(dom, "<polyline"));
  // Ranks now: rank 2 is the straggler.
  EXPECT_EQ(Count(dom, "<tr class=\"straggler\">"), 1);
  // The trainer's markup stayed text.
  EXPECT_TRUE(absl::StrContains(dom, "step-200&lt;b&gt;x&lt;/b&gt;"));
  EXPECT_FALSE(absl::StrContains(dom, "<b>x</b>"));

  const std::string index = Chromium(*chromium, "--dump-dom", index_page);
  EXPECT_TRUE(absl::StrContains(index, absl::StrCat("<a href=\"/jobs/", kJob, "\">")));
  EXPECT_TRUE(absl::StrContains(index, "<span class=\"phase pending\">PENDING</span>"));
  EXPECT_TRUE(absl::StrContains(index, "node-b"));

  // Screenshots, for a person to look at.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string shots = outputs != nullptr ? outputs : dir_;
  for (const auto& [page, name, size] :
       {std::tuple{job_page, "dashboard_job.png", "1280,2000"},
        std::tuple{index_page, "dashboard_index.png", "1280,700"}}) {
    const std::string png = absl::StrCat(shots, "/", name);
    Chromium(*chromium, absl::StrCat("--screenshot=", png, " --window-size=", size), page);
    struct stat st;
    ASSERT_EQ(stat(png.c_str(), &st), 0) << "no screenshot " << png;
    EXPECT_GT(st.st_size, 20000) << png << " is too small to show the page";
    std::cout << "screenshot: " << png << "\n";
  }
}

}  // namespace
}  // namespace ringmaster::coordinator
