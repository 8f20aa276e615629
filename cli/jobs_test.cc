// ringctl's coordinator commands against a scripted coordinator: which call each makes,
// what it prints where, and its exit status.
#include "cli/jobs.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "client/testing/fake_coordinator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster::cli {
namespace {

using client::testing::FakeCoordinator;
using client::testing::Stream;

struct Ran {
  int status = -1;
  std::string out;
  std::string err;
};

// A stream that a test reads back.
class Captured {
 public:
  Captured() : file_(open_memstream(&data_, &size_)) {}
  ~Captured() {
    if (file_ != nullptr) fclose(file_);
    free(data_);
  }
  FILE* file() { return file_; }
  std::string Text() {
    fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  FILE* file_;
};

class JobsTest : public ::testing::Test {
 protected:
  // Runs ringctl `args` against the fake.
  Ran Run(const std::vector<std::string>& args) {
    ParsedCommandLine parsed = ParseCommandLine(args);
    EXPECT_TRUE(parsed.line.has_value()) << parsed.err;
    if (!parsed.line) return {};
    Captured out, err;
    Ran ran;
    ran.status = JobsCommand(*parsed.line, fake_, out.file(), err.file());
    ran.out = out.Text();
    ran.err = err.Text();
    return ran;
  }

  static Job MakeJob(const std::string& id, JobPhase phase, int64_t step = 0) {
    Job job;
    job.set_id(id);
    job.set_phase(phase);
    job.set_step(step);
    job.set_total_steps(100);
    job.mutable_spec()->set_name(id);
    return job;
  }

  static std::string Spec() {
    return std::string(getenv("TEST_SRCDIR")) + "/ringmaster/examples/fashion_mnist_mlp.yaml";
  }

  FakeCoordinator fake_;
};

TEST_F(JobsTest, StatusPrintsTheJobAndAsJsonTheMessage) {
  fake_.get.Always(MakeJob("job-a", JOB_PHASE_RUNNING, 40));
  Ran table = Run({"status", "job-a"});
  EXPECT_EQ(table.status, 0);
  EXPECT_TRUE(absl::StrContains(table.out, "job-a")) << table.out;
  EXPECT_EQ(table.err, "");
  EXPECT_EQ(fake_.get.requests().at(0).job(), "job-a");

  Ran json = Run({"status", "job-a", "-o", "json"});
  ASSERT_EQ(json.status, 0);
  auto parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["id"], "job-a");
  EXPECT_EQ(parsed["step"], 40);
}

TEST_F(JobsTest, ARefusalIsPrintedOnStderrWithExitStatus1AndBadInput2) {
  fake_.get.Then(absl::NotFoundError("no job job-x"))
      .Then(absl::UnavailableError("the coordinator at c:1 cannot be reached"))
      .Then(absl::InvalidArgumentError("job: not a job name"));
  Ran missing = Run({"status", "job-x"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_EQ(missing.out, "");
  EXPECT_EQ(missing.err, "ringctl: no job job-x\n");
  EXPECT_EQ(Run({"status", "job-x"}).status, 1);
  Ran bad = Run({"status", "job-x"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "ringctl: job: not a job name\n");
}

TEST_F(JobsTest, ListAsksForFinishedJobsOnlyWithAll) {
  fake_.list.Always(
      std::vector<Job>{MakeJob("job-a", JOB_PHASE_RUNNING), MakeJob("job-b", JOB_PHASE_PENDING)});
  Ran table = Run({"list"});
  EXPECT_EQ(table.status, 0);
  EXPECT_TRUE(absl::StrContains(table.out, "job-a") && absl::StrContains(table.out, "job-b"))
      << table.out;
  Ran json = Run({"list", "--all", "-o", "json"});
  EXPECT_EQ(json.status, 0);
  auto parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["jobs"].size(), 2u);
  EXPECT_EQ(parsed["jobs"][1]["id"], "job-b");
  const auto requests = fake_.list.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_FALSE(requests[0].include_finished());
  EXPECT_TRUE(requests[1].include_finished());
}

TEST_F(JobsTest, CancelPrintsTheJobsLine) {
  fake_.cancel.Always(MakeJob("job-a", JOB_PHASE_CANCELLED, 12));
  Ran ran = Run({"cancel", "job-a"});
  EXPECT_EQ(ran.status, 0);
  EXPECT_EQ(fake_.cancel.requests().at(0).job(), "job-a");
  EXPECT_TRUE(absl::StrContains(ran.out, "job-a")) << ran.out;
  EXPECT_TRUE(absl::StrContains(ran.out, "cancelled")) << ran.out;
}

TEST_F(JobsTest, DeleteSaysWhereTheCheckpointsStay) {
  DeleteJobResponse kept;
  kept.set_checkpoints_kept("/ckpt/job-a");
  fake_.delete_job.Then(kept).Then(DeleteJobResponse()).Then(kept);
  EXPECT_EQ(Run({"delete", "job-a"}).out,
            "deleted job job-a; its checkpoints stay in /ckpt/job-a (a job submitted again as "
            "job-a resumes from them; remove the directory to free the space)\n");
  EXPECT_EQ(Run({"delete", "job-a"}).out, "deleted job job-a (it wrote no checkpoints)\n");
  auto json = nlohmann::json::parse(Run({"delete", "job-a", "-o", "json"}).out);
  EXPECT_EQ(json["job"], "job-a");
  EXPECT_EQ(json["checkpoints_kept"], "/ckpt/job-a");
}

TEST_F(JobsTest, LogsWritesTheBytesAsTheyComeAndPassesTheRequest) {
  Stream<LogChunk> log;
  log.items.emplace_back().set_data("step 1\n");
  log.items.emplace_back().set_data("step 2\n");
  fake_.logs.Then(log);
  Ran ran = Run({"logs", "job-a", "-f", "--slot", "node-b/3", "--tail_bytes", "100"});
  EXPECT_EQ(ran.status, 0);
  EXPECT_EQ(ran.out, "step 1\nstep 2\n");
  const LogsRequest request = fake_.logs.requests().at(0);
  EXPECT_EQ(request.job(), "job-a");
  EXPECT_TRUE(request.follow());
  EXPECT_EQ(request.slot().node(), "node-b");
  EXPECT_EQ(request.slot().slot(), 3);
  EXPECT_EQ(request.tail_bytes(), 101) << "one byte more: a line break there starts a line";

  log.status = absl::UnavailableError("the agent of node-b cannot be reached");
  fake_.logs.Then(log);
  Ran broken = Run({"logs", "job-a", "--rank", "1"});
  EXPECT_EQ(broken.status, 1);
  EXPECT_EQ(broken.out, "step 1\nstep 2\n") << "what came before the error is kept";
  EXPECT_EQ(broken.err, "ringctl: the agent of node-b cannot be reached\n");
  EXPECT_EQ(fake_.logs.requests().at(1).rank(), 1);
}

LogChunk Chunk(int64_t offset, const std::string& data) {
  LogChunk chunk;
  chunk.set_offset(offset);
  chunk.set_data(data);
  return chunk;
}

// Issue 36 point 13: --tail_bytes started mid-line.
TEST_F(JobsTest, LogsTailBytesStartsAtALineBoundary) {
  Stream<LogChunk> cut;  // the tail starts inside "the end of a line\n"
  cut.items = {Chunk(90, "d of a line\nstep 5\n"), Chunk(110, "step 6\n")};
  fake_.logs.Then(cut);
  EXPECT_EQ(Run({"logs", "job-a", "--tail_bytes", "26"}).out, "step 5\nstep 6\n");
  Stream<LogChunk> on_a_break;  // the byte asked for beyond the tail is a line break
  on_a_break.items = {Chunk(99, "\nstep 7\n")};
  fake_.logs.Then(on_a_break);
  EXPECT_EQ(Run({"logs", "job-a", "--tail_bytes", "7"}).out, "step 7\n");
  Stream<LogChunk> across;  // the cut line ends in the second chunk
  across.items = {Chunk(90, "abc"), Chunk(93, "def\nstep 8\n")};
  fake_.logs.Then(across);
  EXPECT_EQ(Run({"logs", "job-a", "--tail_bytes", "12"}).out, "step 8\n");
  Stream<LogChunk> whole;  // a log shorter than the tail: from its beginning
  whole.items = {Chunk(0, "step 1\n")};
  fake_.logs.Then(whole);
  EXPECT_EQ(Run({"logs", "job-a", "--tail_bytes", "100"}).out, "step 1\n");
}

// Issue 36 point 13: --tail N, lines; with -f, what follows them.
TEST_F(JobsTest, LogsTailPrintsTheLastLinesThenFollows) {
  std::string log;
  for (int i = 1; i <= 5; ++i) log += "step " + std::to_string(i) + "\n";
  Stream<LogChunk> short_tail;  // a tail of the first window holding one line whole
  short_tail.items = {Chunk(static_cast<int64_t>(log.size()) - 9, log.substr(log.size() - 9))};
  Stream<LogChunk> everything;
  everything.items = {Chunk(0, log.substr(0, 10)), Chunk(10, log.substr(10))};
  Stream<LogChunk> following;  // from before the end of what was printed, then new lines
  following.items = {Chunk(14, log.substr(14)), Chunk(static_cast<int64_t>(log.size()), "step 6\n")};
  fake_.logs.Then(short_tail).Then(everything).Then(following);
  Ran ran = Run({"logs", "job-a", "--tail", "2", "-f", "--rank", "1"});
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_EQ(ran.out, "step 4\nstep 5\nstep 6\n");
  const auto& requests = fake_.logs.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_FALSE(requests[0].follow());
  EXPECT_EQ(requests[0].tail_bytes(), 64 << 10);
  EXPECT_EQ(requests[1].tail_bytes(), 256 << 10) << "a larger tail when one held too few lines";
  EXPECT_TRUE(requests[2].follow());
  EXPECT_EQ(requests[2].rank(), 1);

  Stream<LogChunk> unterminated;  // the last line not ended yet counts
  unterminated.items = {Chunk(0, "a\nb\nc")};
  fake_.logs.Then(unterminated);
  EXPECT_EQ(Run({"logs", "job-a", "--tail", "2"}).out, "b\nc");
  fake_.logs.Then(unterminated);
  EXPECT_EQ(Run({"logs", "job-a", "--tail", "9"}).out, "a\nb\nc");
  EXPECT_FALSE(ParseCommandLine({"logs", "job-a", "--tail", "2", "--tail_bytes", "9"}).line)
      << "one of the two";
}

TEST_F(JobsTest, NodesPrintsTheTableOrTheMessage) {
  ListNodesResponse nodes;
  NodeInfo* node = nodes.add_nodes();
  node->set_node("node-a");
  node->add_slots()->set_slot(0);
  fake_.list_nodes.Always(nodes);
  Ran table = Run({"nodes"});
  EXPECT_EQ(table.status, 0);
  EXPECT_TRUE(absl::StrContains(table.out, "node-a")) << table.out;
  auto json = nlohmann::json::parse(Run({"nodes", "-o", "json"}).out);
  EXPECT_EQ(json["nodes"][0]["node"], "node-a");
}

TEST_F(JobsTest, CheckpointsListsTheJobsCheckpoints) {
  Job job = MakeJob("job-a", JOB_PHASE_RUNNING);
  Ran none;
  fake_.get.Then(job);
  none = Run({"checkpoints", "job-a"});
  EXPECT_EQ(none.out, "job job-a does not checkpoint (no checkpoint.dir)\n");

  job.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  CheckpointInfo* c = job.add_checkpoints();
  c->set_step(200);
  c->set_world_size(4);
  c->set_path("/ckpt/job-a/step-200");
  fake_.get.Always(job);
  EXPECT_EQ(Run({"checkpoints", "job-a"}).out,
            "job job-a checkpoints in /ckpt/job-a (ringctl checkpoint list shows them)\n"
            "  step 200      world 4   /ckpt/job-a/step-200\n");
  auto json = nlohmann::json::parse(Run({"checkpoints", "job-a", "-o", "json"}).out);
  EXPECT_EQ(json["job"], "job-a");
  EXPECT_EQ(json["checkpoints"][0]["path"], "/ckpt/job-a/step-200");
}

TEST_F(JobsTest, SubmitSendsTheSpecWithTheOverridesAndPrintsTheJob) {
  fake_.submit.Always(MakeJob("fashion_mnist_mlp", JOB_PHASE_PENDING));
  Ran ran = Run({"submit", Spec(), "--set", "seed=7", "--set", "checkpoint.dir=/ckpt", "--extend"});
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_TRUE(absl::StrContains(ran.out, "submitted fashion_mnist_mlp: pending")) << ran.out;
  const JobSpec sent = fake_.submit.requests().at(0).spec();
  EXPECT_EQ(sent.seed(), 7u);
  EXPECT_EQ(sent.resume(), "extend");
  EXPECT_EQ(sent.checkpoint().dir(), "/ckpt");
  EXPECT_EQ(fake_.watch.calls(), 0) << "no --wait";
}

// Issue 36 point 11: a tp-2 job on 3 slots trained on 2 and said nothing of the third.
TEST_F(JobsTest, SubmitSaysWhatTheClusterCannotGiveTheJob) {
  fake_.submit.Always(MakeJob("tiny_gpt", JOB_PHASE_PENDING));
  ListNodesResponse nodes;
  for (const char* name : {"a", "b"}) {
    NodeInfo* node = nodes.add_nodes();
    node->set_node(name);
    node->add_slots()->set_slot(0);
  }
  nodes.mutable_nodes(1)->add_slots()->set_slot(1);  // 3 slots
  fake_.list_nodes.Always(nodes);
  const std::string spec =
      std::string(getenv("TEST_SRCDIR")) + "/ringmaster/examples/tiny_gpt.yaml";
  Ran ran = Run({"submit", spec, "--set", "parallelism.mesh.tp=2"});
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_TRUE(absl::StrContains(
      ran.out, "note: its ranks come in groups of parallelism.mesh.tp × pp (2 × 1 = 2): of the "
               "cluster's 3 slots it trains on at most 2; 1 would idle beside it"))
      << ran.out;
  Ran capped = Run({"submit", spec, "--set", "parallelism.mesh.tp=2", "--set",
                    "elastic.max_ranks=2"});
  EXPECT_FALSE(absl::StrContains(capped.out, "note:")) << capped.out;
  Ran plain = Run({"submit", spec});
  EXPECT_FALSE(absl::StrContains(plain.out, "note:")) << plain.out;

  // Issue 36 point 10: device: cuda where no node has a GPU.
  Ran cuda = Run({"submit", spec, "--set", "device=cuda"});
  EXPECT_TRUE(absl::StrContains(cuda.out, "note: device: cuda, but none of the cluster's 3 "
                                          "slots is a GPU"))
      << cuda.out;
  nodes.mutable_nodes(0)->mutable_slots(0)->set_gpu("NVIDIA H200");
  fake_.list_nodes.Always(nodes);
  Ran gpu = Run({"submit", spec, "--set", "device=cuda"});
  EXPECT_FALSE(absl::StrContains(gpu.out, "note:")) << gpu.out;
}

// `ringctl submit -- PROGRAM ARGS...`: a command job named after its script, --set applied.
TEST_F(JobsTest, SubmitOfAProgramSendsACommandJob) {
  fake_.submit.Always(MakeJob("train", JOB_PHASE_PENDING));
  Ran ran = Run({"submit", "--set", "command.workdir=/srv/code", "--set", "elastic.min_ranks=2",
                 "--", "/usr/bin/python3", "train.py", "--epochs", "3"});
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_TRUE(absl::StrContains(ran.out, "submitted train: pending")) << ran.out;
  const JobSpec sent = fake_.submit.requests().at(0).spec();
  EXPECT_EQ(sent.name(), "train");
  EXPECT_EQ(std::vector<std::string>(sent.command().argv().begin(), sent.command().argv().end()),
            (std::vector<std::string>{"/usr/bin/python3", "train.py", "--epochs", "3"}));
  EXPECT_EQ(sent.command().workdir(), "/srv/code");
  EXPECT_EQ(sent.elastic().min_ranks(), 2);
  // A bad override names the field, and nothing is sent.
  Ran bad = Run({"submit", "--set", "command.stop_grace_s=-1", "--", "python3", "t.py"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(absl::StrContains(bad.err, "stop_grace_s")) << bad.err;
  EXPECT_EQ(fake_.submit.calls(), 1);
}

TEST_F(JobsTest, SubmitOfABadSpecIsExitStatus2WithoutACall) {
  Ran ran = Run({"submit", Spec(), "--set", "no_such_field=1"});
  EXPECT_EQ(ran.status, 2);
  EXPECT_TRUE(absl::StrContains(ran.err, "no_such_field")) << ran.err;
  EXPECT_EQ(fake_.submit.calls(), 0);
}

TEST_F(JobsTest, SubmitWaitFollowsTheJobAndReturnsItsOutcome) {
  fake_.submit.Always(MakeJob("job-a", JOB_PHASE_PENDING));
  Stream<JobEvent> succeeded, failed;
  for (JobPhase phase : {JOB_PHASE_PENDING, JOB_PHASE_RUNNING, JOB_PHASE_SUCCEEDED}) {
    *succeeded.items.emplace_back().mutable_job() = MakeJob("job-a", phase, 100);
  }
  *failed.items.emplace_back().mutable_job() = MakeJob("job-a", JOB_PHASE_FAILED);
  fake_.watch.Then(succeeded).Then(failed).Then(
      Stream<JobEvent>{.items = {}, .status = absl::PermissionDeniedError("not your job")});
  Ran ok = Run({"submit", Spec(), "--wait"});
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(fake_.watch.requests().at(0).job(), "job-a");
  EXPECT_TRUE(absl::StrContains(ok.out, "succeeded")) << ok.out;
  EXPECT_EQ(Run({"submit", Spec(), "--wait"}).status, 1);
  Ran refused = Run({"submit", Spec(), "--wait"});
  EXPECT_EQ(refused.status, 1);
  EXPECT_EQ(refused.err, "ringctl: not your job\n");
}

TEST_F(JobsTest, TopPrintsAFramePerEventOrAJsonLine) {
  Stream<JobEvent> events;
  for (int64_t step : {10, 20}) {
    JobEvent& e = events.items.emplace_back();
    e.set_version(step);
    *e.mutable_job() = MakeJob("job-a", JOB_PHASE_RUNNING, step);
  }
  fake_.watch.Always(events);
  Ran frames = Run({"top", "job-a"});
  EXPECT_EQ(frames.status, 0);
  EXPECT_FALSE(absl::StrContains(frames.out, "\x1b[")) << "not a terminal: plain frames";
  EXPECT_TRUE(absl::StrContains(frames.out, "job-a"));
  Ran json = Run({"top", "job-a", "-o", "json"});
  ASSERT_EQ(json.status, 0);
  std::vector<std::string> lines = absl::StrSplit(json.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["job"]["step"], 20);
}

}  // namespace
}  // namespace ringmaster::cli
