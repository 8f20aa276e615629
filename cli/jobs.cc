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

using client::UserCalls;

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

// Where a command prints: its output, and its errors.
struct Io {
  FILE* out;
  FILE* err;
};

int Refused(const Io& io, const absl::Status& s) {
  fprintf(io.err, "ringctl: %s\n", std::string(s.message()).c_str());
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

// Prints `message` as the machine format asked for; returns the exit status.
int PrintMessage(const Io& io, const google::protobuf::Message& message, OutputFormat format) {
  auto text = FormatMessage(message, format);
  if (!text.ok()) return Refused(io, text.status());
  fputs(text->c_str(), io.out);
  return 0;
}

bool MachineFormat(OutputFormat f) { return f == OutputFormat::kJson || f == OutputFormat::kYaml; }

int Submit(const CommandLine& line, UserCalls& client, const Io& io) {
  std::vector<std::string> overrides = line.overrides;
  if (line.extend) overrides.push_back("resume=extend");  // last: it wins
  auto spec = spec::LoadJobSpecFile(line.target, overrides);
  if (!spec.ok()) {
    fprintf(io.err, "ringctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string estimate = FillMemoryEstimate(&*spec);
  auto job = client.Submit(*spec);
  if (!job.ok()) return Refused(io, job.status());
  if (!estimate.empty() && !MachineFormat(line.output)) fprintf(io.out, "%s\n", estimate.c_str());
  if (MachineFormat(line.output) && !line.wait) return PrintMessage(io, *job, line.output);
  fprintf(io.out, "submitted %s: %s\n", job->id().c_str(), PhaseName(job->phase()).c_str());
  fflush(io.out);
  if (!line.wait) return 0;
  Job last = *job;
  absl::Time printed = absl::InfinitePast();
  absl::Status s = client.Watch(job->id(), absl::InfiniteFuture(), [&](const JobEvent& e) {
    const Job& j = e.job();
    const absl::Time now = absl::Now();
    if (j.phase() != last.phase() || j.epoch() != last.epoch() ||
        (j.step() != last.step() && now - printed >= kProgressEvery)) {
      fprintf(io.out, "%s\n", ProgressLine(j, now).c_str());
      fflush(io.out);
      printed = now;
    }
    last = j;
    return true;
  });
  if (!s.ok()) return Refused(io, s);
  if (MachineFormat(line.output)) {
    if (const int status = PrintMessage(io, last, line.output); status != 0) return status;
  }
  return last.phase() == JOB_PHASE_SUCCEEDED ? 0 : 1;
}

int List(const CommandLine& line, UserCalls& client, const Io& io) {
  auto jobs = client.List(line.all);
  if (!jobs.ok()) return Refused(io, jobs.status());
  if (MachineFormat(line.output)) {
    ListJobsResponse response;
    for (const Job& j : *jobs) *response.add_jobs() = j;
    return PrintMessage(io, response, line.output);
  }
  fputs(JobsTable(*jobs, absl::Now(), line.output == OutputFormat::kWide, line.all).c_str(),
        io.out);
  return 0;
}

int Status(const CommandLine& line, UserCalls& client, const Io& io) {
  auto job = client.Get(line.target);
  if (!job.ok()) return Refused(io, job.status());
  if (MachineFormat(line.output)) return PrintMessage(io, *job, line.output);
  fputs(JobDescription(*job, absl::Now(), line.output == OutputFormat::kWide).c_str(), io.out);
  return 0;
}

int Cancel(const CommandLine& line, UserCalls& client, const Io& io) {
  auto job = client.Cancel(line.target);
  if (!job.ok()) return Refused(io, job.status());
  if (MachineFormat(line.output)) return PrintMessage(io, *job, line.output);
  fprintf(io.out, "%s\n", ProgressLine(*job, absl::Now()).c_str());
  return 0;
}

int Delete(const CommandLine& line, UserCalls& client, const Io& io) {
  auto deleted = client.Delete(line.target);
  if (!deleted.ok()) return Refused(io, deleted.status());
  if (MachineFormat(line.output)) {  // {"job": ..., "checkpoints_kept": ...}
    nlohmann::ordered_json out;
    out["job"] = line.target;
    out["checkpoints_kept"] = deleted->checkpoints_kept();
    fputs(FormatJsonValue(out, line.output).c_str(), io.out);
    return 0;
  }
  if (deleted->checkpoints_kept().empty()) {
    fprintf(io.out, "deleted job %s (it wrote no checkpoints)\n", line.target.c_str());
  } else {
    fprintf(io.out,
            "deleted job %s; its checkpoints stay in %s (a job submitted again as %s resumes "
            "from them; remove the directory to free the space)\n",
            line.target.c_str(), deleted->checkpoints_kept().c_str(), line.target.c_str());
  }
  return 0;
}

int Logs(const CommandLine& line, UserCalls& client, const Io& io) {
  LogsRequest request;
  request.set_job(line.target);
  if (line.rank) request.set_rank(*line.rank);
  if (line.slot) {
    request.mutable_slot()->set_node(line.slot->first);
    request.mutable_slot()->set_slot(line.slot->second);
  }
  request.set_follow(line.follow);
  request.set_tail_bytes(line.tail_bytes);
  absl::Status s = client.Logs(request, absl::InfiniteFuture(), [&io](const LogChunk& chunk) {
    fwrite(chunk.data().data(), 1, chunk.data().size(), io.out);
    fflush(io.out);
    return true;
  });
  return s.ok() ? 0 : Refused(io, s);
}

int Nodes(const CommandLine& line, UserCalls& client, const Io& io) {
  auto nodes = client.ListNodes();
  if (!nodes.ok()) return Refused(io, nodes.status());
  if (MachineFormat(line.output)) return PrintMessage(io, *nodes, line.output);
  fputs(NodesTable(*nodes, line.output == OutputFormat::kWide).c_str(), io.out);
  return 0;
}

int Top(const CommandLine& line, UserCalls& client, const Io& io) {
  const bool terminal = isatty(fileno(io.out)) == 1;
  if (terminal) fputs(kClearScreen, io.out);
  absl::Status status = absl::OkStatus();
  absl::Status s = client.Watch(line.target, absl::InfiniteFuture(), [&](const JobEvent& e) {
    if (line.output == OutputFormat::kJson) {
      auto text = MessageToJsonLine(e);
      if (!text.ok()) {
        status = text.status();
        return false;
      }
      fputs(text->c_str(), io.out);
    } else if (terminal) {
      fputs(Redraw(TopFrame(e, absl::Now(), line.rank)).c_str(), io.out);
    } else {
      fputs(TopFrame(e, absl::Now(), line.rank).c_str(), io.out);
    }
    fflush(io.out);
    return true;
  });
  if (!s.ok()) return Refused(io, s);
  return status.ok() ? 0 : Refused(io, status);
}

int Checkpoints(const CommandLine& line, UserCalls& client, const Io& io) {
  auto job = client.Get(line.target);
  if (!job.ok()) return Refused(io, job.status());
  if (MachineFormat(line.output)) {  // {"job": ..., "checkpoints": [...]}
    auto value = MessageToJsonValue(*job);
    if (!value.ok()) return Refused(io, value.status());
    nlohmann::ordered_json only;
    only["job"] = job->id();
    only["checkpoints"] = (*value)["checkpoints"];
    fputs(FormatJsonValue(only, line.output).c_str(), io.out);
    return 0;
  }
  const std::string dir = job->spec().checkpoint().dir();
  if (dir.empty()) {
    fprintf(io.out, "job %s does not checkpoint (no checkpoint.dir)\n", job->id().c_str());
    return 0;
  }
  fprintf(io.out, "job %s checkpoints in %s/%s (ringctl checkpoint list shows them)\n",
          job->id().c_str(), dir.c_str(), job->id().c_str());
  for (const CheckpointInfo& c : job->checkpoints()) {
    fprintf(io.out, "  step %-8ld world %-3d %s\n", static_cast<long>(c.step()), c.world_size(),
            c.path().c_str());
  }
  return 0;
}

}  // namespace

int JobsCommand(const CommandLine& line, UserCalls& client, FILE* out, FILE* err) {
  const Io io{out, err};
  switch (line.command) {
    case Command::kSubmit:
      return Submit(line, client, io);
    case Command::kList:
      return List(line, client, io);
    case Command::kStatus:
      return Status(line, client, io);
    case Command::kCancel:
      return Cancel(line, client, io);
    case Command::kDelete:
      return Delete(line, client, io);
    case Command::kLogs:
      return Logs(line, client, io);
    case Command::kNodes:
      return Nodes(line, client, io);
    case Command::kTop:
      return Top(line, client, io);
    case Command::kCheckpoints:
      return Checkpoints(line, client, io);
    default:
      fprintf(err, "ringctl: not a coordinator command\n");
      return 2;
  }
}

int JobsCommand(const CommandLine& line, const client::CoordinatorClientOptions& options) {
  client::CoordinatorClientOptions o = options;
  o.retry_for = absl::Seconds(5);
  auto coordinator = client::GrpcCoordinatorClient::Create(o);
  if (!coordinator.ok()) return Refused({stdout, stderr}, coordinator.status());
  return JobsCommand(line, **coordinator, stdout, stderr);
}

}  // namespace ringmaster::cli
