#include "cli/jobs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/local.h"
#include "cli/output.h"
#include "cli/resources.h"
#include "cli/run_name.h"
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

// What the cluster's nodes say of the job before it starts, one note each (empty when all is
// well, or the nodes cannot be listed):
//   - a job with a mesh trains on a multiple of its tp × pp ranks: where the usable slots (or
//     elastic.max_ranks) are not one, a few would idle beside it;
//   - device: cuda where no node reports a GPU: its trainers would fail at start with a
//     configuration error (point 10).
std::vector<std::string> SubmitNotes(const JobSpec& spec, UserCalls& client) {
  const int tp = std::max(1, spec.parallelism().mesh().tp());
  const int pp = std::max(1, spec.parallelism().mesh().pp());
  const int group = tp * pp;
  const bool cuda = spec.device() == JobSpec::DEVICE_CUDA;
  std::vector<std::string> notes;
  if (group == 1 && !cuda) return notes;
  absl::StatusOr<ListNodesResponse> nodes = client.ListNodes();
  if (!nodes.ok() || nodes->nodes().empty()) return notes;
  int slots = 0, gpus = 0;
  for (const NodeInfo& node : nodes->nodes()) {
    if (node.draining()) continue;
    slots += node.slots_size();
    for (const SlotInfo& slot : node.slots()) gpus += slot.gpu().empty() ? 0 : 1;
  }
  const int max_ranks = spec.elastic().max_ranks();
  const int cap = max_ranks > 0 ? std::min(max_ranks, slots) : slots;
  if (cap % group != 0) {
    const int used = cap / group * group;
    notes.push_back(absl::StrCat(
        "note: its ranks come in groups of parallelism.mesh.tp × pp (", tp, " × ", pp, " = ",
        group, "): of the cluster's ", slots, " slots",
        max_ranks > 0 && max_ranks < slots ? absl::StrCat(" (elastic.max_ranks ", max_ranks, ")")
                                           : "",
        " it trains on at most ", used, "; ", cap - used,
        " would idle beside it (unless another job takes them)"));
  }
  if (cuda && gpus == 0) {
    notes.push_back(absl::StrCat(
        "note: device: cuda, but none of the cluster's ", slots,
        " slots is a GPU (ringmaster's nodes list none): a trainer placed on one fails at "
        "start with a configuration error; set device: cpu or auto, or add GPU nodes"));
  }
  return notes;
}

int Submit(const CommandLine& line, UserCalls& client, const Io& io) {
  std::vector<std::string> overrides = line.overrides;
  if (line.extend) overrides.push_back("resume=extend");  // last: it wins
  auto spec = line.program.empty() ? spec::LoadJobSpecFile(line.target, overrides)
                                    : CommandJobSpec(line.program, overrides);
  if (!spec.ok()) {
    fprintf(io.err, "ringctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string estimate = FillMemoryEstimate(&*spec);
  // The agents place a relative metrics path: ringctl's directory is not theirs.
  if (absl::StatusOr<std::string> metrics = NameRun(&*spec, absl::Now(), ""); !metrics.ok()) {
    fprintf(io.err, "ringctl: %s\n", std::string(metrics.status().message()).c_str());
    return 2;
  }
  auto job = client.Submit(*spec);
  if (!job.ok()) return Refused(io, job.status());
  if (!estimate.empty() && !MachineFormat(line.output)) fprintf(io.out, "%s\n", estimate.c_str());
  if (MachineFormat(line.output) && !line.wait) return PrintMessage(io, *job, line.output);
  fprintf(io.out, "submitted %s: %s\n", job->id().c_str(), PhaseName(job->phase()).c_str());
  for (const std::string& note : SubmitNotes(*spec, client)) fprintf(io.out, "%s\n", note.c_str());
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

LogsRequest LogsRequestOf(const CommandLine& line) {
  LogsRequest request;
  request.set_job(line.target);
  if (line.rank) request.set_rank(*line.rank);
  if (line.slot) {
    request.mutable_slot()->set_node(line.slot->first);
    request.mutable_slot()->set_slot(line.slot->second);
  }
  return request;
}

// Writes a log's chunks to `out` from `from` (an offset in the log) on; with `line_start`, from
// the first line that starts there or after: a chunk stream that starts inside a line (a tail
// in bytes) drops that line's end.
class LogWriter {
 public:
  LogWriter(FILE* out, int64_t from, bool line_start)
      : out_(out), from_(from), line_start_(line_start) {}

  bool Write(const LogChunk& chunk) {
    absl::string_view data = chunk.data();
    const int64_t offset = chunk.offset();
    if (offset + static_cast<int64_t>(data.size()) <= from_) return true;
    if (offset < from_) data.remove_prefix(from_ - offset);
    if (first_) {
      first_ = false;
      // A stream from the log's beginning starts a line.
      skipping_ = line_start_ && std::max(offset, from_) > 0;
    }
    if (skipping_) {
      const size_t end = data.find('\n');
      if (end == absl::string_view::npos) return true;
      data.remove_prefix(end + 1);
      skipping_ = false;
    }
    fwrite(data.data(), 1, data.size(), out_);
    fflush(out_);
    return true;
  }

 private:
  FILE* const out_;
  const int64_t from_;
  const bool line_start_;
  bool first_ = true;
  bool skipping_ = false;
};

// Where the last `lines` lines of `text` start (a last line without its line break counts).
// npos when `text` holds fewer lines whole.
size_t LastLinesStart(absl::string_view text, int64_t lines) {
  size_t end = text.size();
  if (end > 0 && text[end - 1] == '\n') --end;
  for (int64_t i = 0; i < lines; ++i) {
    if (end == 0) return absl::string_view::npos;
    const size_t brk = text.rfind('\n', end - 1);
    if (brk == absl::string_view::npos) return absl::string_view::npos;
    end = brk;
  }
  return lines == 0 ? text.size() : end + 1;
}

// `logs --tail N`: reads larger tails of the log until they hold N whole lines (or the whole
// log), prints its last N lines, and with -f follows on from where that read ended.
int LogsTailLines(const CommandLine& line, UserCalls& client, const Io& io) {
  int64_t window = int64_t{64} << 10;
  std::string text;
  int64_t first = 0;  // the log's offset of text[0]
  while (true) {
    LogsRequest request = LogsRequestOf(line);
    request.set_tail_bytes(window);
    text.clear();
    first = -1;
    absl::Status s = client.Logs(request, absl::InfiniteFuture(), [&](const LogChunk& chunk) {
      if (first < 0) first = chunk.offset();
      text.append(chunk.data());
      return true;
    });
    if (!s.ok()) return Refused(io, s);
    if (first < 0) first = 0;  // an empty log
    const size_t start = LastLinesStart(text, *line.tail_lines);
    if (start != absl::string_view::npos || first == 0 || window >= (int64_t{1} << 40)) {
      const size_t from = start == absl::string_view::npos ? 0 : start;
      fwrite(text.data() + from, 1, text.size() - from, io.out);
      fflush(io.out);
      break;
    }
    window *= 4;
  }
  if (!line.follow) return 0;
  // What was written since that read, and on: a tail that reaches back past it (the log grew
  // little in between), of which the bytes already printed are skipped.
  const int64_t end = first + static_cast<int64_t>(text.size());
  LogsRequest request = LogsRequestOf(line);
  request.set_follow(true);
  request.set_tail_bytes(static_cast<int64_t>(text.size()) + (int64_t{1} << 20));
  LogWriter writer(io.out, end, /*line_start=*/false);
  absl::Status s = client.Logs(request, absl::InfiniteFuture(),
                               [&writer](const LogChunk& chunk) { return writer.Write(chunk); });
  return s.ok() ? 0 : Refused(io, s);
}

int Logs(const CommandLine& line, UserCalls& client, const Io& io) {
  if (line.tail_lines) return LogsTailLines(line, client, io);
  LogsRequest request = LogsRequestOf(line);
  request.set_follow(line.follow);
  // One byte more than asked: when it is a line break, the tail starts with a whole line.
  request.set_tail_bytes(line.tail_bytes > 0 ? line.tail_bytes + 1 : 0);
  LogWriter writer(io.out, 0, /*line_start=*/line.tail_bytes > 0);
  absl::Status s = client.Logs(request, absl::InfiniteFuture(),
                               [&writer](const LogChunk& chunk) { return writer.Write(chunk); });
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
