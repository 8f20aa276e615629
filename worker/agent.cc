#include "worker/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "spec/job_spec.h"

namespace ringmaster::worker {
namespace {

// The last `max_bytes` of a file (a trainer's log), for the exit report.
std::string Tail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(max_bytes)
                                  ? size - static_cast<std::streamoff>(max_bytes)
                                  : 0;
  in.seekg(from);
  std::string text(static_cast<size_t>(size - from), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

}  // namespace

Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

Agent::~Agent() {
  KillAll(SIGKILL);
  for (auto& [slot, t] : trainers_) waitpid(t.pid, nullptr, 0);
}

void Agent::Log(const std::string& line) {
  LOG(INFO) << line;
  if (options_.log) options_.log(line);
}

absl::Status Agent::Register() {
  const std::string credential_path = absl::StrCat(options_.work_dir, "/node.credential");
  if (credential_.empty()) {
    // From an earlier run of this agent: lets it register the node again at once.
    if (auto saved = ReadSecretFile(credential_path); saved.ok()) credential_ = *saved;
  }
  RegisterNodeRequest request;
  request.set_node(options_.node);
  request.set_slots(options_.slots);
  request.set_address(options_.advertise_host);
  request.set_memory_bytes(options_.memory_bytes);
  request.set_node_credential(credential_);
  request.set_log_address(log_address_);
  while (true) {
    auto response = options_.client->RegisterNode(request);
    if (response.ok()) {
      if (response->node_credential() != credential_) {
        credential_ = response->node_credential();
        std::error_code ec;
        std::filesystem::create_directories(options_.work_dir, ec);
        absl::Status s =
            WriteFileAtomically(credential_path, credential_, {.mode = 0600});
        if (!s.ok()) LOG(WARNING) << "cannot keep the node credential: " << s;
      }
      heartbeat_interval_ = absl::Seconds(response->heartbeat_interval_s());
      Log(absl::StrCat("registered node ", options_.node, " with ", options_.slots,
                       " slots; heartbeat every ", absl::FormatDuration(heartbeat_interval_)));
      return absl::OkStatus();
    }
    if (absl::IsInvalidArgument(response.status()) ||
        absl::IsPermissionDenied(response.status()) ||
        absl::IsUnauthenticated(response.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the coordinator refuses node ", options_.node, ": ", response.status().message()));
    }
    if (options_.stop_requested != nullptr && options_.stop_requested->load()) {
      return absl::CancelledError("stopped before registering");
    }
    LOG(WARNING) << "registering failed, retrying: " << response.status();
    absl::SleepFor(absl::Seconds(1));
  }
}

absl::Status Agent::Start(const StartTrainerCommand& start) {
  const int slot = start.slot().slot();
  if (slot < 0 || slot >= options_.slots) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not on this node"));
  }
  // A trainer told to stop a moment ago (the same heartbeat's stop, say) is being killed:
  // give it a few seconds to be reaped before refusing the slot.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(5);
       trainers_.count(slot) && trainers_[slot].stopping && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(10));
    Reap();
  }
  if (auto it = trainers_.find(slot); it != trainers_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " still runs a trainer of job ", it->second.job, " (pid ",
        it->second.pid, ")"));
  }
  const std::string dir = absl::StrCat(options_.work_dir, "/", start.job());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string spec_path = absl::StrCat(dir, "/spec.yaml");
  const std::string token_path = absl::StrCat(dir, "/slot-", slot, ".token");
  const std::string log_path = absl::StrCat(dir, "/slot-", slot, ".log");
  // Both 0600 from the start: the token lets its holder act for this job's slot, and the
  // spec may name private paths.
  RM_RETURN_IF_ERROR(
      WriteFileAtomically(spec_path, spec::JobSpecToYaml(start.spec()), {.mode = 0600}));
  RM_RETURN_IF_ERROR(WriteFileAtomically(token_path, start.membership_token(), {.mode = 0600}));

  std::vector<std::string> args = {
      options_.trainer_binary,
      absl::StrCat("--coordinator=", options_.coordinator_address),
      absl::StrCat("--job=", start.job()),
      absl::StrCat("--epoch=", start.epoch()),
      absl::StrCat("--node=", options_.node),
      absl::StrCat("--slot=", slot),
      absl::StrCat("--membership_token_file=", token_path),
      absl::StrCat("--spec=", spec_path),
      absl::StrCat("--local_ranks=", options_.slots),
      absl::StrCat("--advertise_host=", options_.advertise_host),
      absl::StrCat("--summary=", dir, "/summary.json"),
  };
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--tls_ca=", options_.tls_ca_file},
        {"--tls_client_cert=", options_.tls_client_cert_file},
        {"--tls_client_key=", options_.tls_client_key_file}}) {
    if (!path.empty()) args.push_back(absl::StrCat(flag, path));
  }
  args.insert(args.end(), options_.trainer_flags.begin(), options_.trainer_flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Everything the child needs is prepared: after fork only async-signal-safe calls.
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  trainers_[slot] = Trainer{pid, start.job(), log_path};
  forget_.erase(start.job());  // its name is in use again: its files are the new job's
  if (logs_ != nullptr) logs_->Add(start.job(), slot);
  Log(absl::StrCat("started trainer for job ", start.job(), " epoch ", start.epoch(), " on slot ",
                   slot, " (pid ", pid, ", log ", log_path, ")"));
  return absl::OkStatus();
}

void Agent::Execute(const AgentCommand& command) {
  if (command.has_start()) {
    absl::Status s = Start(command.start());
    if (!s.ok()) {
      Log(absl::StrCat("cannot start a trainer: ", s.ToString()));
      TrainerExitedRequest exited;
      exited.set_node(options_.node);
      exited.set_node_credential(credential_);
      exited.set_slot(command.start().slot().slot());
      exited.set_job(command.start().job());
      exited.set_exit_code(127);
      exited.set_detail(s.ToString());
      options_.client->TrainerExited(exited).IgnoreError();
    }
  } else if (command.has_forget()) {
    forget_.insert(command.forget().job());
    ForgetJobs();
  } else if (command.has_stop()) {
    auto it = trainers_.find(command.stop().slot().slot());
    if (it != trainers_.end() && it->second.job == command.stop().job()) {
      Log(absl::StrCat("stopping the trainer on slot ", it->first, ": ",
                       command.stop().reason()));
      kill(-it->second.pid, SIGKILL);
      it->second.stopping = true;
    }
  }
}

void Agent::Reap() {
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto it = trainers_.begin(); it != trainers_.end(); ++it) {
      if (it->second.pid != pid) continue;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status)
                                         : (WIFSIGNALED(status) ? -WTERMSIG(status) : -1);
      Log(absl::StrCat("trainer of job ", it->second.job, " on slot ", it->first,
                       code < 0 ? absl::StrCat(" killed by signal ", -code)
                                : absl::StrCat(" exited with code ", code)));
      TrainerExitedRequest exited;
      exited.set_node(options_.node);
      exited.set_node_credential(credential_);
      exited.set_slot(it->first);
      exited.set_job(it->second.job);
      exited.set_exit_code(code);
      exited.set_detail(Tail(it->second.log_path, 2048));
      exited.set_log_path(it->second.log_path);
      exited.set_stopped(it->second.stopping);
      unreported_.push_back(std::move(exited));
      if (logs_ != nullptr) logs_->SetRunning(it->second.job, it->first, false);
      trainers_.erase(it);
      break;
    }
  }
}

absl::Status Agent::StartLogService() {
  if (options_.log_listen.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(options_.work_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the work directory ", options_.work_dir, ": ", ec.message()));
  }
  RM_ASSIGN_OR_RETURN(logs_, LogService::Start({.listen = options_.log_listen,
                                                .node_token = options_.node_token,
                                                .work_dir = options_.work_dir}));
  std::string host = options_.log_listen.substr(0, options_.log_listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    host = options_.advertise_host;
    if (host.find(':') != std::string::npos && host[0] != '[') host = absl::StrCat("[", host, "]");
  }
  log_address_ = absl::StrCat(host, ":", logs_->port());
  Log(absl::StrCat("serving the trainers' logs at ", log_address_));
  return absl::OkStatus();
}

void Agent::ForgetJobs() {
  for (auto it = forget_.begin(); it != forget_.end();) {
    const std::string& job = *it;
    const bool running = std::any_of(trainers_.begin(), trainers_.end(),
                                     [&](const auto& t) { return t.second.job == job; });
    if (running) {
      ++it;
      continue;
    }
    if (logs_ != nullptr) logs_->Forget(job);
    // A directory of the work directory, and nothing else (not node.credential, not where
    // a symbolic link points).
    const std::string dir = absl::StrCat(options_.work_dir, "/", job);
    std::error_code ec;
    if (LogService::IsJobId(job) &&
        std::filesystem::is_directory(std::filesystem::symlink_status(dir, ec))) {
      std::filesystem::remove_all(dir, ec);
      Log(absl::StrCat("job ", job, " was deleted: removed its files",
                       ec ? absl::StrCat(" (failed: ", ec.message(), ")") : ""));
    }
    it = forget_.erase(it);
  }
}

void Agent::ReportExits() {
  // In order; one the coordinator cannot take now (it is down, restarting) is kept and sent
  // again on the next pass, so that the job re-forms at once instead of at a timeout.
  while (!unreported_.empty()) {
    absl::Status s = options_.client->TrainerExited(unreported_.front());
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      LOG_EVERY_N(WARNING, 20) << "reporting the exit of the trainer on slot "
                               << unreported_.front().slot() << " failed; will retry: " << s;
      return;
    }
    if (!s.ok()) LOG(WARNING) << "the coordinator refused an exit report: " << s;
    unreported_.erase(unreported_.begin());
  }
}

void Agent::KillAll(int signal) {
  for (auto& [slot, t] : trainers_) kill(-t.pid, signal);
}

void Agent::Drain() {
  draining_ = true;
  drain_deadline_ = absl::Now() + options_.drain_grace;
  Log(absl::StrCat("draining node ", options_.node, " (", trainers_.size(),
                   " trainers; grace ", absl::FormatDuration(options_.drain_grace), ")"));
  DrainNodeRequest request;
  request.set_node(options_.node);
  request.set_node_credential(credential_);
  request.set_reason("agent asked to drain");
  absl::Status s = options_.client->DrainNode(request);
  if (!s.ok()) LOG(WARNING) << "DrainNode failed (the trainers are drained anyway): " << s;
  // Each trainer takes part in the job's drain save, then leaves.
  KillAll(SIGTERM);
}

absl::Status Agent::Run() {
  if (options_.client == nullptr || options_.trainer_binary.empty() ||
      options_.work_dir.empty() || options_.node.empty() || options_.slots < 1) {
    return absl::InvalidArgumentError(
        "the agent needs a client, a trainer binary, a work dir, a node name and slots >= 1");
  }
  RM_RETURN_IF_ERROR(StartLogService());
  RM_RETURN_IF_ERROR(Register());
  absl::Time next_heartbeat = absl::InfinitePast();
  while (true) {
    Reap();
    ReportExits();
    if (!forget_.empty()) ForgetJobs();
    const bool stop = options_.stop_requested != nullptr && options_.stop_requested->load();
    if (stop) {
      Log("stopping: killing the trainers");
      KillAll(SIGKILL);
      while (!trainers_.empty()) {
        absl::SleepFor(absl::Milliseconds(20));
        Reap();
      }
      return absl::OkStatus();
    }
    const bool notice = !options_.preemption_notice_file.empty() &&
                        access(options_.preemption_notice_file.c_str(), F_OK) == 0;
    if (!draining_ && ((options_.drain_requested != nullptr && options_.drain_requested->load()) ||
                       notice)) {
      if (notice) Log("preemption notice " + options_.preemption_notice_file + " found");
      Drain();
    }
    if (draining_) {
      if (trainers_.empty()) {
        Log("drained: every trainer has exited");
        return absl::OkStatus();
      }
      if (absl::Now() >= drain_deadline_) {
        Log("drain grace is over: killing the trainers left");
        KillAll(SIGKILL);
      }
    }
    // Exits are looked for every 50 ms (a trainer's death is reported at once: that is
    // most of the detection time of a recovery); heartbeats go at their interval.
    if (absl::Now() < next_heartbeat) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    next_heartbeat = absl::Now() + heartbeat_interval_;
    HeartbeatRequest request;
    request.set_node(options_.node);
    request.set_node_credential(credential_);
    for (const auto& [slot, t] : trainers_) {
      ringmaster::SlotRef* s = request.add_running();
      s->set_node(options_.node);
      s->set_slot(slot);
      RunningTrainer* running = request.add_trainers();
      running->set_slot(slot);
      running->set_job(t.job);
    }
    auto response = options_.client->Heartbeat(request);
    if (absl::IsNotFound(response.status())) {
      Log("the coordinator does not know this node (restarted, or the lease lapsed): "
          "registering again");
      RM_RETURN_IF_ERROR(Register());
    } else if (!response.ok()) {
      LOG(WARNING) << "heartbeat failed: " << response.status();
    } else {
      for (const AgentCommand& command : response->commands()) {
        if (draining_ && command.has_start()) continue;  // a draining node takes no work
        Execute(command);
      }
    }
  }
}

}  // namespace ringmaster::worker
