#include "cli/jobs.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/output.h"
#include "cli/resources.h"
#include "spec/job_spec.h"

namespace ringmaster::cli {
namespace {

using worker::CoordinatorClient;

// A line at most this often while `submit --wait` follows a job (and at every change of
// phase or epoch).
constexpr absl::Duration kProgressEvery = absl::Seconds(5);
// Clears a terminal (`top` starts so, then redraws in place).
constexpr char kClearScreen[] = "\x1b[H\x1b[2J";

// `frame` drawn over the previous one from the top of the terminal: each line clears what
// was left of the old one, and what was below the old frame goes (no flicker of a full
// clear at every step).
std::string Redraw(const std::string& frame) {
  std::string out = "\x1b[H";
  for (absl::string_view line : absl::StrSplit(frame, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, line, "\x1b[K\n");
  }
  return out + "\x1b[J";
}

int Refused(const absl::Status& s) {
  fprintf(stderr, "ringctl: %s\n", std::string(s.message()).c_str());
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

// Prints `message` as the machine format asked for; returns the exit status.
int PrintMessage(const google::protobuf::Message& message, OutputFormat format) {
  auto text = FormatMessage(message, format);
  if (!text.ok()) return Refused(text.status());
  fputs(text->c_str(), stdout);
  return 0;
}

bool MachineFormat(OutputFormat f) { return f == OutputFormat::kJson || f == OutputFormat::kYaml; }

int Submit(const CommandLine& line, CoordinatorClient& client) {
  std::vector<std::string> overrides = line.overrides;
  if (line.extend) overrides.push_back("resume=extend");  // last: it wins
  auto spec = spec::LoadJobSpecFile(line.target, overrides);
  if (!spec.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string estimate = FillMemoryEstimate(&*spec);
  auto job = client.Submit(*spec);
  if (!job.ok()) return Refused(job.status());
  if (!estimate.empty() && !MachineFormat(line.output)) printf("%s\n", estimate.c_str());
  if (MachineFormat(line.output) && !line.wait) return PrintMessage(*job, line.output);
  printf("submitted %s: %s\n", job->id().c_str(), PhaseName(job->phase()).c_str());
  fflush(stdout);
  if (!line.wait) return 0;
  Job last = *job;
  absl::Time printed = absl::InfinitePast();
  absl::Status s = client.Watch(job->id(), absl::InfiniteFuture(), [&](const JobEvent& e) {
    const Job& j = e.job();
    const absl::Time now = absl::Now();
    if (j.phase() != last.phase() || j.epoch() != last.epoch() ||
        (j.step() != last.step() && now - printed >= kProgressEvery)) {
      printf("%s\n", ProgressLine(j, now).c_str());
      fflush(stdout);
      printed = now;
    }
    last = j;
    return true;
  });
  if (!s.ok()) return Refused(s);
  if (MachineFormat(line.output)) {
    if (const int status = PrintMessage(last, line.output); status != 0) return status;
  }
  return last.phase() == JOB_PHASE_SUCCEEDED ? 0 : 1;
}

int List(const CommandLine& line, CoordinatorClient& client) {
  auto jobs = client.List(line.all);
  if (!jobs.ok()) return Refused(jobs.status());
  if (MachineFormat(line.output)) {
    ListJobsResponse response;
    for (const Job& j : *jobs) *response.add_jobs() = j;
    return PrintMessage(response, line.output);
  }
  fputs(JobsTable(*jobs, absl::Now(), line.output == OutputFormat::kWide, line.all).c_str(),
        stdout);
  return 0;
}

int Status(const CommandLine& line, CoordinatorClient& client) {
  auto job = client.Get(line.target);
  if (!job.ok()) return Refused(job.status());
  if (MachineFormat(line.output)) return PrintMessage(*job, line.output);
  fputs(JobDescription(*job, absl::Now(), line.output == OutputFormat::kWide).c_str(), stdout);
  return 0;
}

int Cancel(const CommandLine& line, CoordinatorClient& client) {
  auto job = client.Cancel(line.target);
  if (!job.ok()) return Refused(job.status());
  if (MachineFormat(line.output)) return PrintMessage(*job, line.output);
  printf("%s\n", ProgressLine(*job, absl::Now()).c_str());
  return 0;
}

int Delete(const CommandLine& line, CoordinatorClient& client) {
  auto deleted = client.Delete(line.target);
  if (!deleted.ok()) return Refused(deleted.status());
  if (MachineFormat(line.output)) {  // {"job": ..., "checkpoints_kept": ...}
    nlohmann::ordered_json out;
    out["job"] = line.target;
    out["checkpoints_kept"] = deleted->checkpoints_kept();
    fputs(FormatJsonValue(out, line.output).c_str(), stdout);
    return 0;
  }
  if (deleted->checkpoints_kept().empty()) {
    printf("deleted job %s (it wrote no checkpoints)\n", line.target.c_str());
  } else {
    printf("deleted job %s; its checkpoints stay in %s (a job submitted again as %s resumes "
           "from them; remove the directory to free the space)\n",
           line.target.c_str(), deleted->checkpoints_kept().c_str(), line.target.c_str());
  }
  return 0;
}

int Logs(const CommandLine& line, CoordinatorClient& client) {
  LogsRequest request;
  request.set_job(line.target);
  if (line.rank) request.set_rank(*line.rank);
  if (line.slot) {
    request.mutable_slot()->set_node(line.slot->first);
    request.mutable_slot()->set_slot(line.slot->second);
  }
  request.set_follow(line.follow);
  request.set_tail_bytes(line.tail_bytes);
  absl::Status s = client.Logs(request, absl::InfiniteFuture(), [](const LogChunk& chunk) {
    fwrite(chunk.data().data(), 1, chunk.data().size(), stdout);
    fflush(stdout);
    return true;
  });
  return s.ok() ? 0 : Refused(s);
}

int Nodes(const CommandLine& line, CoordinatorClient& client) {
  auto nodes = client.ListNodes();
  if (!nodes.ok()) return Refused(nodes.status());
  if (MachineFormat(line.output)) return PrintMessage(*nodes, line.output);
  fputs(NodesTable(*nodes, line.output == OutputFormat::kWide).c_str(), stdout);
  return 0;
}

int Top(const CommandLine& line, CoordinatorClient& client) {
  const bool terminal = isatty(STDOUT_FILENO) == 1;
  if (terminal) fputs(kClearScreen, stdout);
  absl::Status status = absl::OkStatus();
  absl::Status s = client.Watch(line.target, absl::InfiniteFuture(), [&](const JobEvent& e) {
    if (line.output == OutputFormat::kJson) {
      auto text = MessageToJsonLine(e);
      if (!text.ok()) {
        status = text.status();
        return false;
      }
      fputs(text->c_str(), stdout);
    } else if (terminal) {
      fputs(Redraw(TopFrame(e, absl::Now())).c_str(), stdout);
    } else {
      fputs(TopFrame(e, absl::Now()).c_str(), stdout);
    }
    fflush(stdout);
    return true;
  });
  if (!s.ok()) return Refused(s);
  return status.ok() ? 0 : Refused(status);
}

int Checkpoints(const CommandLine& line, CoordinatorClient& client) {
  auto job = client.Get(line.target);
  if (!job.ok()) return Refused(job.status());
  if (MachineFormat(line.output)) {  // {"job": ..., "checkpoints": [...]}
    auto value = MessageToJsonValue(*job);
    if (!value.ok()) return Refused(value.status());
    nlohmann::ordered_json only;
    only["job"] = job->id();
    only["checkpoints"] = (*value)["checkpoints"];
    fputs(FormatJsonValue(only, line.output).c_str(), stdout);
    return 0;
  }
  const std::string dir = job->spec().checkpoint().dir();
  if (dir.empty()) {
    printf("job %s does not checkpoint (no checkpoint.dir)\n", job->id().c_str());
    return 0;
  }
  printf("job %s checkpoints in %s/%s (ringctl checkpoint list shows them)\n",
         job->id().c_str(), dir.c_str(), job->id().c_str());
  for (const CheckpointInfo& c : job->checkpoints()) {
    printf("  step %-8ld world %-3d %s\n", static_cast<long>(c.step()), c.world_size(),
           c.path().c_str());
  }
  return 0;
}

}  // namespace

int JobsCommand(const CommandLine& line, const worker::CoordinatorClientOptions& options) {
  worker::CoordinatorClientOptions o = options;
  o.retry_for = absl::Seconds(5);
  auto client = CoordinatorClient::Create(o);
  if (!client.ok()) return Refused(client.status());
  switch (line.command) {
    case Command::kSubmit:
      return Submit(line, **client);
    case Command::kList:
      return List(line, **client);
    case Command::kStatus:
      return Status(line, **client);
    case Command::kCancel:
      return Cancel(line, **client);
    case Command::kDelete:
      return Delete(line, **client);
    case Command::kLogs:
      return Logs(line, **client);
    case Command::kNodes:
      return Nodes(line, **client);
    case Command::kTop:
      return Top(line, **client);
    case Command::kCheckpoints:
      return Checkpoints(line, **client);
    default:
      fprintf(stderr, "ringctl: not a coordinator command\n");
      return 2;
  }
}

}  // namespace ringmaster::cli
