#include "cli/jobs.h"

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "spec/job_spec.h"
#include "worker/coordinator_client.h"

namespace ringmaster::cli {

const char kJobsUsage[] =
    "  ringctl submit JOB.yaml [--set key=value ...] [--wait]   (to a coordinator)\n"
    "  ringctl list [--all]\n"
    "  ringctl status JOB\n"
    "  ringctl cancel JOB\n"
    "  ringctl top JOB          (live per-rank figures until the job ends or Ctrl-C)\n"
    "  ringctl checkpoints JOB\n"
    "    common flags: --coordinator HOST:PORT (127.0.0.1:7070) --token_file F --tls_ca F"
    " [--tls_client_cert F --tls_client_key F] --json\n";

namespace {

struct Parsed {
  std::vector<std::string> positional;
  std::multimap<std::string, std::string> flags;
  bool json = false;
  bool all = false;
  bool wait = false;
};

int Usage(const std::string& problem) {
  fprintf(stderr, "ringctl: %s\nusage:\n%s", problem.c_str(), kJobsUsage);
  return 2;
}

// --flag=value, --flag value, and the boolean --json, --all, --wait.
bool Parse(int argc, char** argv, Parsed* p, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      p->json = true;
    } else if (a == "--all") {
      p->all = true;
    } else if (a == "--wait") {
      p->wait = true;
    } else if (absl::StartsWith(a, "--")) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        p->flags.emplace(a.substr(0, eq), a.substr(eq + 1));
      } else if (i + 1 < argc) {
        p->flags.emplace(a, argv[++i]);
      } else {
        *error = absl::StrCat(a, " needs a value");
        return false;
      }
    } else {
      p->positional.push_back(a);
    }
  }
  for (const auto& [flag, value] : p->flags) {
    if (flag != "--coordinator" && flag != "--token_file" && flag != "--tls_ca" &&
        flag != "--tls_client_cert" && flag != "--tls_client_key" && flag != "--set") {
      *error = absl::StrCat("unknown flag ", flag);
      return false;
    }
  }
  return true;
}

std::string FlagOr(const Parsed& p, const std::string& name, const std::string& fallback) {
  auto it = p.flags.find(name);
  return it == p.flags.end() ? fallback : it->second;
}

absl::StatusOr<std::unique_ptr<worker::CoordinatorClient>> Connect(const Parsed& p) {
  worker::CoordinatorClientOptions o;
  o.address = FlagOr(p, "--coordinator", "127.0.0.1:7070");
  o.retry_for = absl::Seconds(5);
  if (const std::string f = FlagOr(p, "--token_file", ""); !f.empty()) {
    auto token = ReadFile(f);
    if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("--token_file: ", token.status().message()));
    o.token = std::string(absl::StripAsciiWhitespace(*token));
  }
  struct {
    const char* flag;
    std::string* into;
  } files[] = {{"--tls_ca", &o.tls_ca},
               {"--tls_client_cert", &o.tls_client_cert},
               {"--tls_client_key", &o.tls_client_key}};
  for (const auto& f : files) {
    const std::string path = FlagOr(p, f.flag, "");
    if (path.empty()) continue;
    auto text = ReadFile(path);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.flag, ": ", text.status().message()));
    }
    *f.into = *text;
  }
  return worker::CoordinatorClient::Create(o);
}

int Refused(const absl::Status& s) {
  fprintf(stderr, "ringctl: %s\n", std::string(s.message()).c_str());
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string PhaseName(ringmaster::JobPhase phase) {
  const std::string name = JobPhase_Name(phase);
  return absl::AsciiStrToLower(absl::StripPrefix(name, "JOB_PHASE_"));
}

std::string Ago(int64_t ms) {
  if (ms <= 0) return "-";
  return absl::FormatDuration(absl::Trunc(absl::Now() - absl::FromUnixMillis(ms),
                                          absl::Seconds(1)));
}

std::string Summary(const Job& job) {
  std::string progress = job.total_steps() > 0
                             ? absl::StrFormat("step %d/%d", job.step(), job.total_steps())
                             : absl::StrFormat("step %d", std::max<int64_t>(0, job.step()));
  return absl::StrFormat("%-20s %-10s epoch %-3d ranks %-3d %-16s loss %-8.4g restarts %d%s",
                         job.id(), PhaseName(job.phase()), job.epoch(), job.members_size(),
                         progress, job.loss(), job.restarts(),
                         job.reason().empty() ? "" : absl::StrCat("  (", job.reason(), ")"));
}

void PrintStatus(const Job& job) {
  printf("job %s: %s for %s%s\n", job.id().c_str(), PhaseName(job.phase()).c_str(),
         Ago(job.phase_since_ms()).c_str(),
         job.reason().empty() ? "" : absl::StrCat(" (", job.reason(), ")").c_str());
  printf("  epoch %ld (%s), %d members, min %d max %d, restarts %d of %d\n",
         static_cast<long>(job.epoch()), job.epoch_cause().c_str(), job.members_size(),
         job.min_ranks(), job.max_ranks(), job.restarts(), job.restart_budget());
  printf("  step %ld/%ld, loss %.4g, %.2f steps/s\n", static_cast<long>(job.step()),
         static_cast<long>(job.total_steps()), job.loss(), job.steps_per_s());
  if (!job.checkpoint_error().empty()) {
    printf("  checkpoint of step %ld failed: %s\n", static_cast<long>(job.checkpoint_error_step()),
           job.checkpoint_error().c_str());
  }
  for (const Member& m : job.members()) {
    printf("  rank %-3d %s/%d  step %ld%s\n", m.rank(), m.slot().node().c_str(), m.slot().slot(),
           static_cast<long>(m.step()), m.ready() ? "" : (m.joined() ? "  (joined)" : "  (joining)"));
  }
  for (const Recovery& r : job.recoveries()) {
    printf("  recovery to epoch %ld (%s): %d -> %d ranks; rendezvous %.2fs, restore %.2fs, "
           "first step %.2fs, %s — %s\n",
           static_cast<long>(r.epoch()), r.cause().c_str(), r.old_world(), r.new_world(),
           r.rendezvous_s(), r.restore_s(), r.first_step_s(),
           r.lost_steps() < 0 ? "steps lost: not known yet"
                              : absl::StrCat(r.lost_steps(), " steps lost").c_str(),
           r.reason().c_str());
  }
}

int Submit(const Parsed& p) {
  if (p.positional.size() != 1) return Usage("submit: give exactly one job spec file");
  std::vector<std::string> overrides;
  for (auto [it, end] = p.flags.equal_range("--set"); it != end; ++it) {
    overrides.push_back(it->second);
  }
  auto spec = spec::LoadJobSpecFile(p.positional[0], overrides);
  if (!spec.ok()) {
    fprintf(stderr, "ringctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  auto job = (*client)->Submit(*spec);
  if (!job.ok()) return Refused(job.status());
  if (p.json && !p.wait) {
    printf("%s\n", Json(*job).c_str());
    return 0;
  }
  printf("submitted %s: %s\n", job->id().c_str(), PhaseName(job->phase()).c_str());
  if (!p.wait) return 0;
  Job last = *job;
  int64_t printed_step = -1;
  absl::Status s = (*client)->Watch(job->id(), absl::InfiniteFuture(), [&](const JobEvent& e) {
    const Job& j = e.job();
    if (j.phase() != last.phase() || j.epoch() != last.epoch()) {
      printf("%s\n", Summary(j).c_str());
    } else if (j.step() / 20 != printed_step / 20 && j.step() > 0) {
      printf("%s\n", Summary(j).c_str());
      printed_step = j.step();
    }
    fflush(stdout);
    last = j;
    return true;
  });
  if (!s.ok()) return Refused(s);
  if (p.json) printf("%s\n", Json(last).c_str());
  return last.phase() == JOB_PHASE_SUCCEEDED ? 0 : 1;
}

int List(const Parsed& p) {
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  auto jobs = (*client)->List(p.all);
  if (!jobs.ok()) return Refused(jobs.status());
  if (p.json) {
    ListJobsResponse response;
    for (const Job& j : *jobs) *response.add_jobs() = j;
    printf("%s\n", Json(response).c_str());
    return 0;
  }
  if (jobs->empty()) printf("no jobs%s\n", p.all ? "" : " running (--all shows finished ones)");
  for (const Job& j : *jobs) printf("%s\n", Summary(j).c_str());
  return 0;
}

int Status(const Parsed& p) {
  if (p.positional.size() != 1) return Usage("status: give one job");
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  auto job = (*client)->Get(p.positional[0]);
  if (!job.ok()) return Refused(job.status());
  if (p.json) {
    printf("%s\n", Json(*job).c_str());
  } else {
    PrintStatus(*job);
  }
  return 0;
}

int Cancel(const Parsed& p) {
  if (p.positional.size() != 1) return Usage("cancel: give one job");
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  auto job = (*client)->Cancel(p.positional[0]);
  if (!job.ok()) return Refused(job.status());
  printf("%s\n", p.json ? Json(*job).c_str() : Summary(*job).c_str());
  return 0;
}

int Top(const Parsed& p) {
  if (p.positional.size() != 1) return Usage("top: give one job");
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  absl::Status s =
      (*client)->Watch(p.positional[0], absl::InfiniteFuture(), [&](const JobEvent& e) {
        if (p.json) {
          printf("%s\n", Json(e).c_str());
        } else {
          printf("%s\n  rank  slot          step  step_time  comm   loss      grad_norm\n",
                 Summary(e.job()).c_str());
          for (const RankStats& r : e.ranks()) {
            printf("  %-5d %-12s %6ld  %7.1fms  %4.0f%%  %-9.4g %.3g\n", r.rank(),
                   absl::StrCat(r.slot().node(), "/", r.slot().slot()).c_str(),
                   static_cast<long>(r.step()), 1e3 * r.step_time_s(), 100 * r.comm_fraction(),
                   r.loss(), r.grad_norm());
          }
        }
        fflush(stdout);
        return true;
      });
  return s.ok() ? 0 : Refused(s);
}

int Checkpoints(const Parsed& p) {
  if (p.positional.size() != 1) return Usage("checkpoints: give one job");
  auto client = Connect(p);
  if (!client.ok()) return Refused(client.status());
  auto job = (*client)->Get(p.positional[0]);
  if (!job.ok()) return Refused(job.status());
  if (p.json) {
    Job only;
    *only.mutable_checkpoints() = job->checkpoints();
    printf("%s\n", Json(only).c_str());
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

bool IsJobsCommand(const std::string& command) {
  return command == "submit" || command == "list" || command == "status" ||
         command == "cancel" || command == "top" || command == "checkpoints";
}

int JobsCommand(const std::string& command, int argc, char** argv) {
  Parsed p;
  std::string error;
  if (!Parse(argc, argv, &p, &error)) return Usage(absl::StrCat(command, ": ", error));
  if (command == "submit") return Submit(p);
  if (p.flags.count("--set") > 0) return Usage(absl::StrCat(command, ": --set is for submit"));
  if (command == "list") return List(p);
  if (command == "status") return Status(p);
  if (command == "cancel") return Cancel(p);
  if (command == "top") return Top(p);
  return Checkpoints(p);
}

}  // namespace ringmaster::cli
