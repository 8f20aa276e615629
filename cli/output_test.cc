#include "cli/output.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/progress_rate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "yaml-cpp/yaml.h"

namespace ringmaster::cli {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::ordered_json;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

int64_t MillisAgo(absl::Duration d) { return absl::ToUnixMillis(kNow - d); }

// A spec with non-default enums in several messages, and one enum left unset
// (precision.loss_scale.mode: the loss scale is for fp16 only).
JobSpec ExampleSpec() {
  auto spec = spec::LoadJobSpecText(R"(
name: round
epochs: 2
model:
  mlp:
    hidden: [64, 32]
    activation: relu
data:
  fashion_mnist:
    dir: /data/fm
optimizer:
  sgd:
    momentum: 0.9
  lr: 0.00001
  weight_decay: 0.0001
schedule:
  decay: linear
  warmup_steps: 10
checkpoint:
  dir: /ck
  every_steps: 25
  on_busy: skip
batch:
  global: 128
)");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

Job ExampleJob() {
  Job job;
  job.set_id("round");
  *job.mutable_spec() = ExampleSpec();
  job.set_phase(JOB_PHASE_RUNNING);
  job.set_epoch(3);
  job.set_step(100);
  job.set_total_steps(600);
  job.set_steps_per_s(10);
  job.set_loss(0.25);
  job.set_min_ranks(1);
  job.set_max_ranks(4);
  job.set_restart_budget(4);
  job.set_restarts(1);
  job.set_submitted_ms(MillisAgo(absl::Minutes(5)));
  job.set_phase_since_ms(MillisAgo(absl::Seconds(42)));
  for (int slot : {0, 1}) {
    Member* m = job.add_members();
    m->mutable_slot()->set_node("a");
    m->mutable_slot()->set_slot(slot);
    m->set_rank(slot);
    m->set_joined(true);
    m->set_ready(true);
    m->set_step(100);
    m->set_last_progress_ms(MillisAgo(absl::Seconds(1)));
  }
  return job;
}

TEST(FormatMessageTest, JsonShowsDefaultsSpecEnumsAsYamlAndNumbers) {
  auto text = FormatMessage(ExampleJob(), OutputFormat::kJson);
  ASSERT_TRUE(text.ok()) << text.status();
  const Json j = Json::parse(*text);
  EXPECT_EQ(j["phase"], "JOB_PHASE_RUNNING");  // outside the spec: the proto's names
  EXPECT_EQ(j["epoch"], 3);                      // int64 as a number, not "3"
  EXPECT_TRUE(j["epoch"].is_number());
  EXPECT_EQ(j["reason"], "");                    // defaults are shown
  EXPECT_EQ(j["below_min_since_ms"], 0);
  EXPECT_EQ(j["ever_started"], false);
  EXPECT_EQ(j["spec"]["schedule"]["decay"], "linear");  // the spec's own spelling
  EXPECT_EQ(j["spec"]["checkpoint"]["on_busy"], "skip");
  EXPECT_EQ(j["spec"]["model"]["mlp"]["activation"], "relu");
  EXPECT_EQ(j["spec"]["parallelism"]["zero_stage"], 0);
  EXPECT_EQ(j["members"][1]["slot"]["node"], "a");
  // An unset enum in the spec cannot be written in YAML: it is left out.
  EXPECT_THAT(*text, Not(HasSubstr("UNSPECIFIED")));
}

TEST(FormatMessageTest, TheSpecRoundTripsThroughJson) {
  const Job job = ExampleJob();
  auto text = FormatMessage(job, OutputFormat::kJson);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string spec_json = Json::parse(*text)["spec"].dump(2);
  auto back = spec::LoadJobSpecText(spec_json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << spec_json;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, job.spec())) << spec_json;
}

TEST(FormatMessageTest, TheSpecRoundTripsThroughYaml) {
  const Job job = ExampleJob();
  auto text = FormatMessage(job, OutputFormat::kYaml);
  ASSERT_TRUE(text.ok()) << text.status();
  const YAML::Node root = YAML::Load(*text);
  EXPECT_EQ(root["phase"].as<std::string>(), "JOB_PHASE_RUNNING");
  EXPECT_EQ(root["spec"]["schedule"]["decay"].as<std::string>(), "linear");
  YAML::Emitter spec_yaml;
  spec_yaml << root["spec"];
  auto back = spec::LoadJobSpecText(spec_yaml.c_str());
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << spec_yaml.c_str();
  EXPECT_TRUE(MessageDifferencer::Equals(*back, job.spec())) << spec_yaml.c_str();
}

TEST(FormatMessageTest, ListsAndEmptyValues) {
  ListJobsResponse none;
  auto json = FormatMessage(none, OutputFormat::kJson);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(Json::parse(*json), Json::parse(R"({"jobs": [], "next_page_token": ""})"));
  auto yaml = FormatMessage(none, OutputFormat::kYaml);
  ASSERT_TRUE(yaml.ok());
  EXPECT_EQ(*yaml, "jobs: []\nnext_page_token: \"\"\n");
  EXPECT_FALSE(FormatMessage(none, OutputFormat::kTable).ok());
}

TEST(JsonValueToYamlTest, QuotesStringsYamlWouldReadAsSomethingElse) {
  const Json value = Json::parse(
      R"({"id": "123", "flag": "true", "empty": "", "day": "2026-01-31", "plain": "a/0",
          "n": 7, "x": 1e-05, "b": false, "none": null})");
  const YAML::Node back = YAML::Load(JsonValueToYaml(value));
  for (const char* key : {"id", "flag", "empty", "day"}) {
    EXPECT_EQ(back[key].Tag(), "!") << key << " was not quoted: " << JsonValueToYaml(value);
    EXPECT_EQ(back[key].as<std::string>(), value[key].get<std::string>()) << key;
  }
  EXPECT_EQ(back["plain"].Tag(), "?");  // plain: nothing to quote
  EXPECT_EQ(back["plain"].as<std::string>(), "a/0");
  EXPECT_EQ(back["n"].as<int>(), 7);
  EXPECT_DOUBLE_EQ(back["x"].as<double>(), 1e-05);
  EXPECT_THAT(JsonValueToYaml(value), HasSubstr("x: 1.0e-05"));  // a float to YAML 1.1 too
  EXPECT_FALSE(back["b"].as<bool>());
  EXPECT_TRUE(back["none"].IsNull());
}

TEST(HumanDurationTest, AsKubectlPrintsAges) {
  const std::vector<std::pair<absl::Duration, std::string>> cases = {
      {absl::Seconds(-3), "0s"},
      {absl::Seconds(0), "0s"},
      {absl::Seconds(45), "45s"},
      {absl::Seconds(119), "119s"},
      {absl::Seconds(200), "3m20s"},
      {absl::Minutes(5), "5m"},
      {absl::Minutes(42), "42m"},
      {absl::Minutes(310), "5h10m"},
      {absl::Hours(30), "30h"},
      {absl::Hours(24 * 6 + 2), "6d2h"},
      {absl::Hours(24 * 40), "40d"},
      {absl::Hours(24 * (365 * 2 + 3)), "2y3d"},
      {absl::Hours(24 * 365 * 9), "9y"},
  };
  for (const auto& [d, want] : cases) EXPECT_EQ(HumanDuration(d), want) << d;
}

TEST(FormatTableTest, AlignsColumnsUnderTheirHeaders) {
  EXPECT_EQ(FormatTable({{"NAME", "AGE"}, {"a-long-name", "5m"}, {"b", "12h"}}),
            "NAME          AGE\n"
            "a-long-name   5m\n"
            "b             12h\n");
}

TEST(JobsTableTest, HeadersAgesAndWideColumns) {
  Job done;
  done.set_id("done");
  done.set_phase(JOB_PHASE_FAILED);
  done.set_reason("trainer on a/0 exited with status 1");
  done.set_submitted_ms(MillisAgo(absl::Hours(3)));
  const std::vector<Job> jobs = {ExampleJob(), done};

  const std::string table = JobsTable(jobs, kNow, /*wide=*/false, /*all=*/true);
  EXPECT_EQ(table,
            "NAME    PHASE     STEP      LOSS   RANKS   AGE\n"
            "round   running   100/600   0.25   2       5m\n"
            "done    failed    -         -      0       3h\n");

  const std::string wide = JobsTable(jobs, kNow, /*wide=*/true, /*all=*/true);
  EXPECT_THAT(wide, HasSubstr("MEMBERSHIP-EPOCH"));
  EXPECT_THAT(wide, HasSubstr("1-4"));  // min-max ranks
  EXPECT_THAT(wide, HasSubstr("RESTARTS"));
  EXPECT_THAT(wide, HasSubstr("MEMBERS"));
  EXPECT_THAT(wide, HasSubstr("a/0,a/1"));
  EXPECT_THAT(wide, HasSubstr("1/4"));  // restarts of budget
  EXPECT_THAT(wide, HasSubstr("50s"));  // ETA: 500 steps at 10 steps/s
  EXPECT_THAT(wide, HasSubstr("trainer on a/0 exited with status 1"));

  EXPECT_EQ(JobsTable({}, kNow, false, false), "no jobs running (--all shows finished ones)\n");
}

TEST(NodesTableTest, ARowPerSlotWithTheJobRankAndWhatHoldsIt) {
  ListNodesResponse nodes;
  NodeInfo* a = nodes.add_nodes();
  a->set_node("a");
  a->set_last_heartbeat_age_s(2.4);
  a->set_lease_left_s(1);
  a->set_address("10.0.0.1");
  a->set_log_address("10.0.0.1:7071");
  SlotInfo* s0 = a->add_slots();
  s0->set_slot(0);
  s0->set_job("mlp");
  s0->set_rank(1);
  s0->set_gpu("H100");
  SlotInfo* s1 = a->add_slots();
  s1->set_slot(1);
  s1->set_rank(-1);
  s1->set_exiting_job("old");
  s1->set_backoff_s(8);
  NodeInfo* b = nodes.add_nodes();
  b->set_node("b");
  b->set_draining(true);
  b->set_lease_left_s(2);
  b->set_last_heartbeat_age_s(-1);
  b->add_slots()->set_rank(-1);
  EXPECT_EQ(NodesTable(nodes, /*wide=*/false),
            "NODE   STATUS     HEARTBEAT   SLOT   JOB   RANK   NOTE\n"
            "a      ready      2s          0      mlp   1      -\n"
            "                              1      -     -      trainer of old exiting; "
            "backing off 8s\n"
            "b      draining   -           0      -     -      -\n");
  const std::string wide = NodesTable(nodes, /*wide=*/true);
  EXPECT_THAT(wide, HasSubstr("GPU"));
  EXPECT_THAT(wide, HasSubstr("H100"));
  EXPECT_THAT(wide, HasSubstr("10.0.0.1:7071"));
  EXPECT_THAT(NodesTable(ListNodesResponse(), false), HasSubstr("no nodes"));
}

TEST(ProgressLineTest, ShowsElapsedTimeAndEta) {
  Job job = ExampleJob();
  const std::string line = ProgressLine(job, kNow);
  EXPECT_THAT(line, HasSubstr("step 100/600"));
  EXPECT_THAT(line, HasSubstr("elapsed 5m"));
  EXPECT_THAT(line, HasSubstr("ETA 50s"));  // (600 - 100) / 10 steps/s
  job.set_phase(JOB_PHASE_SUCCEEDED);
  EXPECT_THAT(ProgressLine(job, kNow), Not(HasSubstr("ETA")));
  job.set_phase(JOB_PHASE_RUNNING);
  job.set_steps_per_s(0);  // not measured yet
  EXPECT_THAT(ProgressLine(job, kNow), Not(HasSubstr("ETA")));
}

TEST(JobDescriptionTest, MembersTableAndWideExtras) {
  Job job = ExampleJob();
  Recovery* r = job.add_recoveries();
  r->set_epoch(3);
  r->set_cause("failure");
  r->set_reason("trainer on slot 2 killed by signal 9");
  r->set_old_world(3);
  r->set_new_world(2);
  r->set_lost_steps(4);
  const std::string text = JobDescription(job, kNow, /*wide=*/false);
  EXPECT_THAT(text, HasSubstr("job round: running for 42s (submitted 5m ago)"));
  EXPECT_THAT(text, HasSubstr("RANK   SLOT   STEP   STATE   PROGRESS"));
  EXPECT_THAT(text, HasSubstr("ETA 50s"));
  EXPECT_THAT(text, HasSubstr("3 -> 2 ranks"));
  EXPECT_THAT(text, HasSubstr("killed by signal 9"));
  EXPECT_THAT(text, Not(HasSubstr("spec:")));
  const std::string wide = JobDescription(job, kNow, /*wide=*/true);
  EXPECT_THAT(wide, HasSubstr("JOINED"));
  EXPECT_THAT(wide, HasSubstr("spec:"));
  EXPECT_THAT(wide, HasSubstr("decay: linear"));
}

// A command job's status names the first rank to fail: where, how, when, what it said.
TEST(JobDescriptionTest, ACommandJobsFirstFailure) {
  Job job = ExampleJob();
  EXPECT_THAT(JobDescription(job, kNow, false), Not(HasSubstr("first failure")));
  RankFailure* f = job.mutable_first_failure();
  f->set_epoch(2);
  f->set_rank(3);
  f->mutable_slot()->set_node("b");
  f->mutable_slot()->set_slot(1);
  f->set_program("python3");
  f->set_how("exit code 1");
  f->set_error_message("ValueError: bad batch");
  f->set_last_output_line("step 7");
  f->set_failed_at_s(static_cast<double>(absl::ToUnixMicros(kNow - absl::Milliseconds(90'750))) / 1e6);
  f->set_failed_at_from_error_file(true);
  EXPECT_THAT(JobDescription(job, kNow, false),
              HasSubstr("  first failure: rank 3 (node b, slot 1) in membership epoch 2: python3: "
                        "exit code 1\n    at 2027-01-15 07:58:29.250 UTC (90s ago; its error "
                        "file's time)\n    error file: ValueError: bad batch\n    last output "
                        "line: step 7\n"));
  f->set_how("killed by signal 9 (SIGKILL)");
  f->clear_error_message();
  f->set_failed_at_from_error_file(false);
  const std::string text = JobDescription(job, kNow, false);
  EXPECT_THAT(text, HasSubstr("python3: killed by signal 9 (SIGKILL)\n"));
  EXPECT_THAT(text, HasSubstr("ago; when its exit was seen)\n    last output line: step 7\n"));
}

// One rate and one ETA (common/progress_rate.h) in every view of the same job: the job's
// steps_per_s as the trainer measured it, never a figure of its own (such as 1 / a rank's
// last step time), and the ETA of EtaSeconds.
TEST(RateAndEtaTest, EveryViewShowsTheJobsRateAndTheSameEta) {
  Job job = ExampleJob();
  job.set_step(265);
  job.set_total_steps(1000);
  job.set_steps_per_s(7.84);
  JobEvent event;
  *event.mutable_job() = job;
  RankStats* r = event.add_ranks();
  r->set_rank(0);
  r->set_step(265);
  r->set_step_time_s(0.82);  // one slow step: 1.22 steps/s were it the rate
  r->set_steps_per_s(7.84);
  const std::string eta = EtaText(*EtaSeconds(265, 1000, 7.84));  // 93.75 s
  EXPECT_EQ(eta, "1m34s");
  EXPECT_EQ(Eta(job), eta);
  const std::string views[] = {JobsTable({job}, kNow, /*wide=*/true, /*all=*/false),
                               ProgressLine(job, kNow), JobDescription(job, kNow, false),
                               TopFrame(event, kNow)};
  for (const std::string& view : views) {
    EXPECT_THAT(view, HasSubstr(eta)) << view;
    EXPECT_THAT(view, Not(HasSubstr("1.22"))) << view;
  }
  EXPECT_THAT(views[0], HasSubstr("7.84"));
  EXPECT_THAT(views[2], HasSubstr("7.84 steps/s over the last 30 s of steps, ETA 1m34s"));
}

// The job's epoch is its membership epoch (a rendezvous round) wherever it is shown, never
// a bare "epoch" that reads as a pass over the data.
TEST(MembershipEpochTest, NamedAsSuch) {
  Job job = ExampleJob();
  Recovery* r = job.add_recoveries();
  r->set_epoch(3);
  r->set_cause("failure");
  EXPECT_THAT(ProgressLine(job, kNow), HasSubstr("membership epoch 3"));
  EXPECT_THAT(JobDescription(job, kNow, false), HasSubstr("  membership epoch 3 (-), 2 members"));
  EXPECT_THAT(JobDescription(job, kNow, false), HasSubstr("recovery to membership epoch 3"));
}

// A recovery that resumed from a checkpoint older than the step the job had reached says
// from where, the steps lost and why, as its trainers told the coordinator.
TEST(JobDescriptionTest, ARecoverySaysTheStepsLostAndWhy) {
  Job job = ExampleJob();
  Recovery* r = job.add_recoveries();
  r->set_epoch(3);
  r->set_cause("failure");
  r->set_reason("trainer on b/0 killed by signal 9");
  r->set_step_before(265);
  r->set_lost_steps(65);
  r->set_resumed_from_step(200);
  r->set_resumed_from("step 200's checkpoint");
  r->set_lost_because("its state is sharded over the ranks (ZeRO-2)");
  EXPECT_THAT(JobDescription(job, kNow, false),
              HasSubstr("resumed from step 200's checkpoint: 65 steps lost (the job had reached "
                        "step 265), because its state is sharded over the ranks (ZeRO-2) — "
                        "trainer on b/0 killed by signal 9"));
  // Before the trainers said it: the count alone.
  r->clear_resumed_from();
  EXPECT_THAT(JobDescription(job, kNow, false), HasSubstr("65 steps lost — trainer on b/0"));
}

TEST(TopFrameTest, ProgressAndRankTable) {
  JobEvent event;
  *event.mutable_job() = ExampleJob();
  RankStats* r = event.add_ranks();
  r->set_rank(1);
  r->mutable_slot()->set_node("b");
  r->mutable_slot()->set_slot(0);
  r->set_step(99);
  r->set_step_time_s(0.0125);
  r->set_comm_fraction(0.3);
  const std::string frame = TopFrame(event, kNow);
  EXPECT_THAT(frame, HasSubstr("ETA 50s"));
  EXPECT_THAT(frame, HasSubstr("RANK   SLOT   STEP   STEP_TIME   COMM"));
  EXPECT_THAT(frame, HasSubstr("b/0"));
  EXPECT_THAT(frame, HasSubstr("12.5ms"));
  EXPECT_THAT(frame, HasSubstr("30%"));
  EXPECT_THAT(frame, Not(HasSubstr("straggler")));
  r->set_slowdown(2.4);
  r->set_straggler(true);
  EXPECT_THAT(TopFrame(event, kNow), HasSubstr("2.4x straggler"));
}

// Hand-made ranks: 10 steps; rank 0 all-reduced 100 MB a step (N = 4: the ring's
// 2(N-1)/N = 1.5 x 100 MB) and sent 1.5 % more than the formula; rank 1 barriers only.
JobEvent CommEvent() {
  JobEvent event;
  *event.mutable_job() = ExampleJob();
  for (int rank : {0, 1}) {
    RankStats* r = event.add_ranks();
    r->set_rank(rank);
    r->set_process_steps(10);
    CommOpStats* op = r->add_comm_ops();
    op->set_group("world");
    op->set_group_size(4);
    if (rank == 0) {
      op->set_op("all_reduce");
      op->set_calls(40);
      op->set_payload_bytes(1000000000);
      op->set_formula_bytes_sent(1500000000);
      op->set_bytes_sent(1522500000);
      op->set_seconds(0.5);
      BucketStats* b = r->add_buckets();
      b->set_bucket(0);
      b->set_bytes(25000000);
      b->set_calls(10);
      b->set_bytes_sent(375000000);
      b->set_formula_bytes_sent(375000000);
      b->set_seconds(0.2);
    } else {
      op->set_op("barrier");
      op->set_calls(5);
    }
  }
  return event;
}

TEST(CommTableTest, PerStepFiguresAgainstTheFormula) {
  const JobEvent event = CommEvent();
  const std::string all = CommTable(event);
  EXPECT_THAT(all, HasSubstr("RANK   GROUP      OP           CALLS/STEP   MB/STEP   FORMULA_MB   "
                             "RATIO   TIME/STEP"));
  // 40 calls / 10 steps; 152.25 MB against 150 MB a step; 50 ms a step.
  EXPECT_THAT(all, HasSubstr("0      world(4)   all_reduce   4.0          152.250   150.000      "
                             "1.015   50.00ms"));
  EXPECT_THAT(all, HasSubstr("1      world(4)   barrier      0.5          0.000     0.000        "
                             "-       0.00ms"));
  EXPECT_THAT(all, Not(HasSubstr("BUCKET")));
  for (absl::string_view line : absl::StrSplit(all, '\n')) EXPECT_LE(line.size(), 100u) << line;

  const std::string one = CommTable(event, 0);
  EXPECT_THAT(one, Not(HasSubstr("barrier")));
  EXPECT_THAT(one, HasSubstr("gradient buckets of rank 0"));
  EXPECT_THAT(one, HasSubstr("0        25.000   1.0          37.500    37.500       1.000   "
                             "20.00ms"));
  EXPECT_EQ(CommTable(event, 7), "");  // no such rank
  EXPECT_THAT(TopFrame(event, kNow, 1), HasSubstr("barrier"));
  EXPECT_THAT(TopFrame(event, kNow, 1), Not(HasSubstr("all_reduce")));
}

TEST(CommTableTest, BeforeTheFirstStepShowsTotalsAsDashes) {
  JobEvent event = CommEvent();
  event.mutable_ranks(0)->set_process_steps(0);
  EXPECT_THAT(CommTable(event, 0), HasSubstr("0      world(4)   all_reduce   -            -    "));
  EXPECT_EQ(CommTable(JobEvent()), "");
}

// What went wrong and who is slow, in `ringctl status` (issue 17, points 2, 11, 13).
TEST(JobDescriptionTest, CheckpointFailureStragglersAndExcludedNodes) {
  Job job = ExampleJob();
  job.set_checkpoint_error_step(40);
  job.set_checkpoint_error("rank 1: pwrite of /ck/j/tmp/shard-1.bin: No space left on device");
  job.add_stragglers("b/0 (rank 2, compute 3.6x the median)");
  job.add_excluded_nodes("c");
  const std::string text = JobDescription(job, kNow, /*wide=*/false);
  EXPECT_THAT(text, HasSubstr("checkpoint of step 40 failed: rank 1: pwrite of"));
  EXPECT_THAT(text, HasSubstr("No space left on device"));
  EXPECT_THAT(text, HasSubstr("straggler: b/0 (rank 2, compute 3.6x the median)"));
  EXPECT_THAT(text, HasSubstr("not placed on (its data is missing there): c"));
}

TEST(ParseOutputFormatTest, KnownNamesOnly) {
  EXPECT_EQ(*ParseOutputFormat(""), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_THAT(ParseOutputFormat("xml").status().message(), HasSubstr("table, wide, json, yaml"));
}

}  // namespace
}  // namespace ringmaster::cli
