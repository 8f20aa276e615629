// The Prometheus exposition: its format and values from a hand-made snapshot, and a live
// coordinator (a job with members, progress, a checkpoint and a recovery, driven as agents
// and trainers drive it) scraped over its HTTP port and checked by promtool.
#include "coordinator/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/progress_rate.h"
#include "coordinator/http_server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "spec/job_spec.h"

namespace ringmaster::coordinator {
namespace {

// The samples of an exposition, "name{labels}" → value; checks the format on the way:
// every sample's family has one HELP and one TYPE before it, names and labels are well
// formed, counters end in _total.
std::map<std::string, double> ParseExposition(const std::string& text) {
  static const std::regex kSample(
      R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? (\S+))re");
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string l(line);
    if (absl::StartsWith(l, "# HELP ")) {
      const std::string name = l.substr(7, l.find(' ', 7) - 7);
      EXPECT_TRUE(helped.insert(name).second) << "two HELPs for " << name;
      continue;
    }
    if (absl::StartsWith(l, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(l.substr(7), ' ');
      EXPECT_EQ(parts.size(), 2u) << l;
      EXPECT_TRUE(types.emplace(parts[0], parts[1]).second) << "two TYPEs for " << parts[0];
      if (parts[1] == "counter") {
        EXPECT_TRUE(absl::EndsWith(parts[0], "_total")) << parts[0];
      }
      continue;
    }
    std::smatch m;
    EXPECT_TRUE(std::regex_match(l, m, kSample)) << "not a sample line: " << l;
    if (m.empty()) continue;
    std::string family = m[1];
    for (const char* suffix : {"_sum", "_count"}) {
      if (!types.count(family) && absl::EndsWith(family, suffix)) {
        family = family.substr(0, family.size() - strlen(suffix));
      }
    }
    EXPECT_TRUE(types.count(family) && helped.count(family)) << "no HELP/TYPE before " << l;
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(std::string(m[5]), &value)) << l;
    EXPECT_TRUE(samples.emplace(absl::StrCat(std::string(m[1]), std::string(m[2])), value).second)
        << "duplicate sample " << l;
  }
  return samples;
}

// `sample` is in the exposition `text` (parsed into `m`) with `value` (to rounding).
void ExpectSample(const std::map<std::string, double>& m, const std::string& text,
                  const std::string& sample, double value) {
  auto it = m.find(sample);
  ASSERT_NE(it, m.end()) << "no sample " << sample << " in\n" << text;
  EXPECT_NEAR(it->second, value, 1e-9 * std::max(1.0, std::abs(value))) << sample;
}

// Runs `promtool check metrics` on `text`: its output, or nullopt without promtool.
std::optional<std::pair<int, std::string>> Promtool(const std::string& text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) return std::nullopt;
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/scrape-", getpid(), ".txt");
  std::ofstream(path) << text;
  FILE* p = popen(absl::StrCat("promtool check metrics < ", path, " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), p)) output.append(buffer, n);
  const int status = pclose(p);
  return std::pair{WEXITSTATUS(status), output};
}

#define EXPECT_PROMTOOL_PASSES(text)                                                      \
  do {                                                                                     \
    auto checked = Promtool(text);                                                         \
    if (!checked) {                                                                        \
      GTEST_SKIP() << "promtool not found (Debian's prometheus package; tools/setup.sh "   \
                      "installs it): `promtool check metrics` was not run";                \
    }                                                                                      \
    EXPECT_EQ(checked->first, 0) << checked->second << "\n---\n" << text;                 \
    EXPECT_EQ(checked->second, "") << text;                                                \
  } while (0)

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

TEST(Metrics, EscapeLabelValue) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeLabelValue("\\n"), "\\\\n");
}

CoordinatorSnapshot HandMade() {
  CoordinatorSnapshot s;
  Job& mlp = s.jobs.emplace_back();
  mlp.set_id("mlp");
  mlp.set_phase(JOB_PHASE_RUNNING);
  mlp.set_epoch(3);
  for (int i = 0; i < 2; ++i) *mlp.add_members()->mutable_slot() = Slot("a", i);
  mlp.set_restarts(2);
  mlp.set_step(120);
  mlp.set_total_steps(1000);
  mlp.set_loss(0.625);
  mlp.set_steps_per_s(4);
  Recovery* r = mlp.add_recoveries();  // a failure, done
  r->set_cause("failure");
  r->set_detect_s(0.5);
  r->set_rendezvous_s(0.25);
  r->set_restore_s(0.3);
  r->set_first_step_s(0.4);
  r->set_lost_steps(5);
  r = mlp.add_recoveries();  // a failure, done, failure time unknown
  r->set_cause("failure");
  r->set_rendezvous_s(1.0);
  r->set_restore_s(0.2);
  r->set_first_step_s(0.1);
  r->set_lost_steps(7);
  r = mlp.add_recoveries();  // a growth still restoring
  r->set_cause("grow");
  r->set_rendezvous_s(0.6);
  r->set_lost_steps(-1);
  CheckpointInfo* c = mlp.add_checkpoints();
  c->set_step(50);
  c->set_bytes(999);
  c = mlp.add_checkpoints();
  c->set_step(100);
  c->set_bytes(123456789012);
  c->set_save_seconds(2.5);
  c->set_blocked_seconds(0.25);
  c->set_committed_ms(1700000000500);
  mlp.set_checkpoint_error_step(110);
  mlp.set_checkpoint_error("No space left on device");

  Job& done = s.jobs.emplace_back();
  done.set_id("done");
  done.set_phase(JOB_PHASE_SUCCEEDED);
  Job& odd = s.jobs.emplace_back();
  odd.set_id("we\"ird\\job\n");  // the state machine refuses such ids; the format copes
  odd.set_phase(JOB_PHASE_PENDING);

  std::vector<RankStats>& ranks = s.ranks["mlp"];
  for (int rank = 0; rank < 2; ++rank) {
    RankStats& st = ranks.emplace_back();
    st.set_rank(rank);
    *st.mutable_slot() = Slot("a", rank);
    st.set_step(120 - rank);
    st.set_step_time_s(0.25);
    st.set_loss(0.625 + rank);
    st.set_comm_fraction(rank == 0 ? 0.25 : 0.5);
    st.set_exposed_comm_fraction(rank == 0 ? 0.125 : 0.375);
    st.set_samples_per_s(rank == 0 ? 512 : 256);
    st.set_lr(rank == 0 ? 0.001 : 0.5);
    st.set_loss_scale(65536);
    st.set_straggler(rank == 1);
    st.set_process_steps(20);
    CommOpStats* op = st.add_comm_ops();
    op->set_group("world");
    op->set_op("allreduce");
    op->set_group_size(2);
    op->set_calls(10 + rank);
    op->set_bytes_sent(1500);
    op->set_bytes_received(1400);
    op->set_seconds(0.5);
    op->set_formula_bytes_sent(1000);
    op->set_payload_bytes(2000);
    BucketStats* b = st.add_buckets();
    b->set_bucket(3);
    b->set_bytes(4096);
    b->set_calls(20);
    b->set_bytes_sent(81920);
    b->set_seconds(0.75);
    b->set_formula_bytes_sent(81920);
  }

  NodeInfo* a = s.nodes.add_nodes();
  a->set_node("a");
  a->set_last_heartbeat_age_s(0.5);
  a->set_lease_left_s(2.5);
  a->add_slots()->set_job("mlp");
  a->add_slots();                   // free
  a->add_slots()->set_backoff_s(3);  // resting after a failure
  NodeInfo* b = s.nodes.add_nodes();
  b->set_node("b");
  b->set_draining(true);
  b->set_last_heartbeat_age_s(-1);
  b->set_lease_left_s(-1);
  b->add_slots()->set_exiting_job("mlp");
  s.heartbeat_rtt_s["a"] = 0.002;
  return s;
}

TEST(Metrics, HandMadeSnapshot) {
  const std::string text = PrometheusText(HandMade());
  std::map<std::string, double> m = ParseExposition(text);
  const auto expect = [&](const std::string& sample, double value) {
    ExpectSample(m, text, sample, value);
  };
  expect(R"(ringmaster_jobs{phase="running"})", 1);
  expect(R"(ringmaster_jobs{phase="pending"})", 1);
  expect(R"(ringmaster_jobs{phase="succeeded"})", 1);
  expect(R"(ringmaster_jobs{phase="failed"})", 0);
  expect(R"(ringmaster_job_info{job="we\"ird\\job\n",phase="pending"})", 1);
  expect(R"(ringmaster_job_members{job="mlp"})", 2);
  expect(R"(ringmaster_job_epoch{job="mlp"})", 3);
  expect(R"(ringmaster_job_restarts_total{job="mlp"})", 2);
  expect(R"(ringmaster_job_step{job="mlp"})", 120);
  expect(R"(ringmaster_job_total_steps{job="mlp"})", 1000);
  expect(R"(ringmaster_job_loss{job="mlp"})", 0.625);
  expect(R"(ringmaster_job_steps_per_second{job="mlp"})", 4);
  expect(R"(ringmaster_job_eta_seconds{job="mlp"})", (1000 - 120) / 4.0);
  // Throughput, learning rate and loss scale are rank 0's; the fractions the ranks' mean.
  expect(R"(ringmaster_job_samples_per_second{job="mlp"})", 512);
  expect(R"(ringmaster_job_learning_rate{job="mlp"})", 0.001);
  expect(R"(ringmaster_job_loss_scale{job="mlp"})", 65536);
  expect(R"(ringmaster_job_comm_fraction{job="mlp"})", (0.25 + 0.5) / 2);
  expect(R"(ringmaster_job_exposed_comm_fraction{job="mlp"})", (0.125 + 0.375) / 2);
  expect(R"(ringmaster_job_lost_steps_total{job="mlp"})", 5 + 7);
  expect(R"(ringmaster_recoveries_total{job="mlp",cause="failure"})", 2);
  expect(R"(ringmaster_recoveries_total{job="mlp",cause="grow"})", 1);
  expect(R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="detect"})",
         0.5);
  expect(R"(ringmaster_recovery_phase_seconds_count{job="mlp",cause="failure",phase="detect"})",
         1);
  expect(
      R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="rendezvous"})",
      1.25);
  expect(
      R"(ringmaster_recovery_phase_seconds_count{job="mlp",cause="failure",phase="rendezvous"})",
      2);
  expect(
      R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="first_step"})",
      0.5);
  expect(R"(ringmaster_recovery_phase_seconds_count{job="mlp",cause="grow",phase="rendezvous"})",
         1);
  expect(R"(ringmaster_recovery_phase_seconds_count{job="mlp",cause="grow",phase="restore"})",
         0);
  // The newest checkpoint (the list's last).
  expect(R"(ringmaster_job_checkpoints{job="mlp"})", 2);
  expect(R"(ringmaster_job_checkpoint_step{job="mlp"})", 100);
  expect(R"(ringmaster_job_checkpoint_bytes{job="mlp"})", 123456789012);
  expect(R"(ringmaster_job_checkpoint_save_seconds{job="mlp"})", 2.5);
  expect(R"(ringmaster_job_checkpoint_blocked_seconds{job="mlp"})", 0.25);
  expect(R"(ringmaster_job_checkpoint_timestamp_seconds{job="mlp"})", 1700000000.5);
  expect(R"(ringmaster_job_checkpoint_error{job="mlp"})", 1);
  expect(R"(ringmaster_job_checkpoint_error_step{job="mlp"})", 110);
  expect(R"(ringmaster_job_checkpoint_error{job="done"})", 0);
  EXPECT_EQ(m.count(R"(ringmaster_job_checkpoint_error_step{job="done"})"), 0u);
  EXPECT_EQ(m.count(R"(ringmaster_job_checkpoint_step{job="done"})"), 0u);
  EXPECT_EQ(m.count(R"(ringmaster_job_samples_per_second{job="done"})"), 0u)
      << "no ranks: no throughput";

  expect(R"(ringmaster_rank_info{job="mlp",rank="1",node="a",slot="1"})", 1);
  expect(R"(ringmaster_rank_step{job="mlp",rank="1"})", 119);
  expect(R"(ringmaster_rank_loss{job="mlp",rank="1"})", 1.625);
  expect(R"(ringmaster_rank_exposed_comm_fraction{job="mlp",rank="1"})", 0.375);
  expect(R"(ringmaster_rank_straggler{job="mlp",rank="1"})", 1);
  expect(R"(ringmaster_rank_straggler{job="mlp",rank="0"})", 0);
  expect(R"(ringmaster_rank_process_steps{job="mlp",rank="0"})", 20);
  expect(R"(ringmaster_comm_calls_total{job="mlp",rank="1",group="world",op="allreduce"})", 11);
  expect(R"(ringmaster_comm_sent_bytes_total{job="mlp",rank="0",group="world",op="allreduce"})",
         1500);
  expect(
      R"(ringmaster_comm_received_bytes_total{job="mlp",rank="0",group="world",op="allreduce"})",
      1400);
  expect(
      R"(ringmaster_comm_formula_sent_bytes_total{job="mlp",rank="0",group="world",op="allreduce"})",
      1000);
  expect(R"(ringmaster_comm_seconds_total{job="mlp",rank="0",group="world",op="allreduce"})",
         0.5);
  expect(R"(ringmaster_bucket_bytes{job="mlp",rank="0",bucket="3"})", 4096);
  expect(R"(ringmaster_bucket_sent_bytes_total{job="mlp",rank="1",bucket="3"})", 81920);

  expect("ringmaster_nodes", 2);
  expect(R"(ringmaster_slots{state="busy"})", 1);
  expect(R"(ringmaster_slots{state="free"})", 1);
  expect(R"(ringmaster_slots{state="unavailable"})", 2);  // resting; b's exiting, draining
  expect(R"(ringmaster_node_slots{node="a",state="unavailable"})", 1);
  expect(R"(ringmaster_node_draining{node="b"})", 1);
  expect(R"(ringmaster_node_heartbeat_age_seconds{node="a"})", 0.5);
  EXPECT_EQ(m.count(R"(ringmaster_node_heartbeat_age_seconds{node="b"})"), 0u);
  expect(R"(ringmaster_node_lease_left_seconds{node="b"})", -1);
  expect(R"(ringmaster_node_heartbeat_rtt_seconds{node="a"})", 0.002);

  // Exact text of one family, HELP and TYPE included.
  EXPECT_NE(text.find("# HELP ringmaster_jobs Jobs by phase.\n# TYPE ringmaster_jobs gauge\n"
                      "ringmaster_jobs{phase=\"pending\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("\nringmaster_job_checkpoint_bytes{job=\"mlp\"} 123456789012\n"),
            std::string::npos)
      << "large integers exactly";
  EXPECT_PROMTOOL_PASSES(text);
}

TEST(Metrics, EmptyCoordinator) {
  const std::string text = PrometheusText(CoordinatorSnapshot());
  std::map<std::string, double> m = ParseExposition(text);
  EXPECT_EQ(m["ringmaster_nodes"], 0);
  EXPECT_EQ(m.at(R"(ringmaster_jobs{phase="running"})"), 0);
  EXPECT_PROMTOOL_PASSES(text);
}

// A real coordinator on a fake clock behind a real HTTP port: two agents, a four-rank job
// with progress, a checkpoint and a failure recovered at three ranks; /metrics scraped.
class LiveMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/metrics-", getpid());
    std::filesystem::remove_all(dir_);
    CoordinatorOptions options;
    options.database = dir_ + "/jobs.db";
    options.clock = &clock_;
    options.membership.lease = absl::Seconds(3);
    options.membership.grow_after = absl::Seconds(1000);
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    HttpServerOptions http;
    http.user_token = kToken;
    auto server = HttpServer::Start(http, MonitoringRoutes(coordinator_.get()));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  void Register(const std::string& node, int slots) {
    RegisterNodeRequest r;
    r.set_node(node);
    r.set_slots(slots);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    ASSERT_TRUE(coordinator_->RegisterNode(r).ok());
  }

  void Heartbeat(const std::string& node, double rtt) {
    HeartbeatRequest r;
    r.set_node(node);
    r.set_node_credential(coordinator_->NodeCredentialFor(node));
    r.set_last_heartbeat_rtt_s(rtt);
    ASSERT_TRUE(coordinator_->Heartbeat(r).ok());
  }

  void JoinAll(const std::vector<ringmaster::SlotRef>& slots, int64_t epoch) {
    std::vector<std::optional<absl::StatusOr<JoinResponse>>> results(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      JoinRequest r;
      r.set_job("mlp");
      r.set_epoch(epoch);
      *r.mutable_slot() = slots[i];
      coordinator_->Join(r, clock_.Now() + absl::Seconds(30),
                         [&results, i](absl::StatusOr<JoinResponse> v) { results[i] = v; });
    }
    for (auto& result : results) {
      ASSERT_TRUE(result.has_value() && result->ok());
    }
  }

  void ReadyAll(const std::vector<ringmaster::SlotRef>& slots, int64_t epoch) {
    for (const ringmaster::SlotRef& slot : slots) {
      ReadyRequest r;
      r.set_job("mlp");
      r.set_epoch(epoch);
      *r.mutable_slot() = slot;
      ASSERT_TRUE(coordinator_->Ready(r).ok());
    }
  }

  void Progress(const ringmaster::SlotRef& slot, int64_t epoch, int rank, int64_t step,
                double loss) {
    ProgressRequest r;
    r.set_job("mlp");
    r.set_epoch(epoch);
    r.set_total_steps(500);
    *r.mutable_slot() = slot;
    RankStats* s = r.mutable_stats();
    s->set_rank(rank);
    s->set_step(step);
    s->set_loss(loss);
    s->set_step_time_s(0.125);
    // The trainer's rate over its window (common/progress_rate.h), not 1 / the step time;
    // samples/s are it times the global batch of 160.
    s->set_steps_per_s(6.4);
    s->set_samples_per_s(1024);
    s->set_comm_fraction(0.25);
    s->set_exposed_comm_fraction(0.125);
    s->set_lr(0.01);
    CommOpStats* op = s->add_comm_ops();
    op->set_group("world");
    op->set_op("allreduce");
    op->set_calls(step);
    op->set_bytes_sent(step * 300);
    ASSERT_TRUE(coordinator_->Progress(r).ok());
  }

  std::string Scrape() {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_bearer_token_auth(kToken);
    auto r = client.Get("/metrics");
    EXPECT_TRUE(r) << httplib::to_string(r.error());
    if (!r) return "";
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), kPrometheusContentType);
    return r->body;
  }

  static constexpr char kToken[] = "metrics-test-user-token";
  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(LiveMetricsTest, AJobWithARecoveryScrapedAndChecked) {
  Register("a", 2);
  Register("b", 2);
  Heartbeat("a", 0.003);
  Heartbeat("b", 0.25);
  auto spec = spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_name("mlp");
  spec->mutable_elastic()->set_min_ranks(2);
  spec->mutable_elastic()->set_max_ranks(4);
  ASSERT_TRUE(coordinator_->Submit(*spec).ok());
  const std::vector<ringmaster::SlotRef> four = {Slot("a", 0), Slot("a", 1), Slot("b", 0),
                                                 Slot("b", 1)};
  JoinAll(four, 1);
  ReadyAll(four, 1);
  for (int rank = 0; rank < 4; ++rank) Progress(four[rank], 1, rank, 10, 2.25);

  ReportCheckpointRequest checkpoint;
  checkpoint.set_job("mlp");
  checkpoint.set_epoch(1);
  *checkpoint.mutable_slot() = four[0];
  checkpoint.mutable_checkpoint()->set_step(10);
  checkpoint.mutable_checkpoint()->set_path(dir_ + "/ckpt/step-10");
  checkpoint.mutable_checkpoint()->set_world_size(4);
  checkpoint.mutable_checkpoint()->set_bytes(4096);
  checkpoint.mutable_checkpoint()->set_save_seconds(1.5);
  checkpoint.mutable_checkpoint()->set_blocked_seconds(0.5);
  ASSERT_TRUE(coordinator_->ReportCheckpoint(checkpoint).ok());
  Progress(four[0], 1, 0, 12, 2.0);  // step 12 was reached before the failure

  // b/0's trainer dies: epoch 2 forms of the three others, 0.2 s to commit, 0.3 s to ready,
  // 0.4 s to its first step (11: steps 11 and 12 are trained again).
  TrainerExitedRequest exited;
  exited.set_node("b");
  exited.set_node_credential(coordinator_->NodeCredentialFor("b"));
  exited.set_slot(0);
  exited.set_job("mlp");
  exited.set_exit_code(-9);
  ASSERT_TRUE(coordinator_->TrainerExited(exited).ok());
  const std::vector<ringmaster::SlotRef> three = {Slot("a", 0), Slot("a", 1), Slot("b", 1)};
  clock_.Advance(absl::Milliseconds(200));
  JoinAll(three, 2);
  clock_.Advance(absl::Milliseconds(300));
  ReadyAll(three, 2);
  clock_.Advance(absl::Milliseconds(400));
  for (int rank = 0; rank < 3; ++rank) Progress(three[rank], 2, rank, 11, 1.75);

  const std::string text = Scrape();
  std::map<std::string, double> m = ParseExposition(text);
  const auto expect = [&](const std::string& sample, double value) {
    ExpectSample(m, text, sample, value);
  };
  expect(R"(ringmaster_jobs{phase="running"})", 1);
  expect(R"(ringmaster_job_info{job="mlp",phase="running"})", 1);
  expect(R"(ringmaster_job_members{job="mlp"})", 3);
  expect(R"(ringmaster_job_epoch{job="mlp"})", 2);
  expect(R"(ringmaster_job_restarts_total{job="mlp"})", 1);
  expect(R"(ringmaster_job_step{job="mlp"})", 11);  // the new epoch's
  expect(R"(ringmaster_job_total_steps{job="mlp"})", 500);
  expect(R"(ringmaster_job_samples_per_second{job="mlp"})", 1024);
  // The rate and ETA every view shows: rank 0's, samples/s = steps/s x the global batch.
  expect(R"(ringmaster_job_steps_per_second{job="mlp"})", 6.4);
  expect(R"(ringmaster_job_samples_per_second{job="mlp"})", 6.4 * 160);
  expect(R"(ringmaster_job_eta_seconds{job="mlp"})", *EtaSeconds(11, 500, 6.4));
  expect(R"(ringmaster_job_exposed_comm_fraction{job="mlp"})", 0.125);
  expect(R"(ringmaster_job_lost_steps_total{job="mlp"})", 2);
  expect(R"(ringmaster_recoveries_total{job="mlp",cause="failure"})", 1);
  expect(R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="rendezvous"})",
         0.2);
  expect(R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="restore"})",
         0.3);
  expect(R"(ringmaster_recovery_phase_seconds_sum{job="mlp",cause="failure",phase="first_step"})",
         0.4);
  expect(
      R"(ringmaster_recovery_phase_seconds_count{job="mlp",cause="failure",phase="first_step"})",
      1);
  expect(R"(ringmaster_job_checkpoint_step{job="mlp"})", 10);
  expect(R"(ringmaster_job_checkpoint_bytes{job="mlp"})", 4096);
  expect(R"(ringmaster_job_checkpoint_save_seconds{job="mlp"})", 1.5);
  expect(R"(ringmaster_job_checkpoint_blocked_seconds{job="mlp"})", 0.5);
  // The ranks of the current epoch only.
  expect(R"(ringmaster_rank_info{job="mlp",rank="2",node="b",slot="1"})", 1);
  EXPECT_EQ(m.count(R"(ringmaster_rank_step{job="mlp",rank="3"})"), 0u);
  expect(R"(ringmaster_rank_step{job="mlp",rank="2"})", 11);
  expect(R"(ringmaster_comm_sent_bytes_total{job="mlp",rank="1",group="world",op="allreduce"})",
         3300);
  expect("ringmaster_nodes", 2);
  expect(R"(ringmaster_slots{state="busy"})", 3);
  expect(R"(ringmaster_node_heartbeat_rtt_seconds{node="a"})", 0.003);
  expect(R"(ringmaster_node_heartbeat_rtt_seconds{node="b"})", 0.25);
  expect(R"(ringmaster_node_heartbeat_age_seconds{node="a"})", 0.9);

  httplib::Client client("127.0.0.1", server_->port());
  client.set_bearer_token_auth(kToken);
  auto healthz = client.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
  EXPECT_EQ(healthz->body, "ok\n");
  httplib::Client anonymous("127.0.0.1", server_->port());
  auto refused = anonymous.Get("/metrics");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);

  EXPECT_PROMTOOL_PASSES(text);
}

}  // namespace
}  // namespace ringmaster::coordinator
