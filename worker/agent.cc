#include "worker/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/plural.h"
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

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      own_launcher_(options_.launcher == nullptr ? std::make_unique<ProcessLauncher>() : nullptr),
      launcher_(options_.launcher != nullptr ? options_.launcher : own_launcher_.get()),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      reconciler_({.slots = options_.slots}) {}

Agent::~Agent() {
  KillAll(SIGKILL);
  for (const auto& [slot, t] : reconciler_.trainers()) {
    launcher_->Wait(t.pid);
    if (!options_.trainer_records_dir.empty()) ForgetTrainer(options_.trainer_records_dir, slot);
  }
  if (lock_fd_ >= 0) close(lock_fd_);
}

bool Agent::Asked() const {
  return (options_.stop_requested != nullptr && options_.stop_requested->load()) ||
         (options_.drain_requested != nullptr && options_.drain_requested->load());
}

bool Agent::WaitUnlessAsked(absl::Time deadline) {
  while (!Asked()) {
    const absl::Time now = clock_->Now();
    if (now >= deadline) return true;
    clock_->SleepUntil(std::min(deadline, now + absl::Milliseconds(50)));
  }
  return false;
}

absl::Status Agent::LockWorkDir() {
  std::error_code ec;
  std::filesystem::create_directories(options_.work_dir, ec);
  const std::string path = absl::StrCat(options_.work_dir, "/@agent.lock");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open ", path, " (is --work_dir ", options_.work_dir, " writable?): ",
        strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    (void)!pread(fd, holder, sizeof(holder) - 1, 0);
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "another ringworker (pid ", absl::StripAsciiWhitespace(holder),
        ") uses the work directory ", options_.work_dir,
        ": one agent per work directory; stop it, or give this one its own --work_dir"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    LOG(WARNING) << "cannot write this agent's pid into " << path;
  }
  lock_fd_ = fd;
  return absl::OkStatus();
}

absl::Status Agent::EndLeftovers() {
  if (options_.trainer_records_dir.empty()) return absl::OkStatus();
  leftovers_ = EndRecordedTrainers(options_.trainer_records_dir, options_.end_leftovers);
  for (const EndedTrainer& e : leftovers_) {
    const TrainerRecord& r = e.record;
    const std::string what = absl::StrCat("the trainer of job ", r.job, " epoch ", r.epoch,
                                          " on slot ", r.slot, " (pid ", r.pid, ")");
    if (e.survived) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ", left running by an earlier agent of this node, is still there after SIGKILL "
          "(stuck in the kernel?): no trainer may start on its slot; end it, then start the "
          "agent again"));
    }
    if (e.signal == 0) {
      Log(absl::StrCat(what, ", started by an earlier agent of this node, is gone (it died with "
                       "that agent): reporting it"));
    } else {
      Log(absl::StrCat("ended ", what, ", left running by an earlier agent of this node, with ",
                       e.signal == SIGKILL ? "SIGKILL (it outlived SIGTERM's grace)" : "SIGTERM"));
    }
  }
  return absl::OkStatus();
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
  absl::Status last = absl::OkStatus();
  for (int attempt = 0;; ++attempt) {
    if (Asked()) {
      return absl::CancelledError(absl::StrCat(
          "asked to ",
          options_.stop_requested != nullptr && options_.stop_requested->load() ? "stop"
                                                                                : "drain",
          " before node ", options_.node, " registered, so there is nothing to drain",
          last.ok() ? "" : absl::StrCat("; the last attempt: ", last.message())));
    }
    auto response = options_.client->RegisterNode(request);
    if (response.ok()) {
      if (response->node_credential() != credential_) {
        credential_ = response->node_credential();
        std::error_code ec;
        std::filesystem::create_directories(options_.work_dir, ec);
        absl::Status s = WriteFileAtomically(credential_path, credential_, {.mode = 0600});
        if (!s.ok()) LOG(WARNING) << "cannot keep the node credential: " << s;
      }
      heartbeat_interval_ = absl::Seconds(response->heartbeat_interval_s());
      Log(absl::StrCat("registered node ", options_.node, " with ",
                       Plural(options_.slots, "slot"), "; heartbeat every ",
                       absl::FormatDuration(heartbeat_interval_)));
      return absl::OkStatus();
    }
    if (absl::IsInvalidArgument(response.status()) || absl::IsPermissionDenied(response.status()) ||
        absl::IsUnauthenticated(response.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the coordinator refuses node ", options_.node, ": ", response.status().message()));
    }
    if (absl::IsUnavailable(response.status()) && options_.diagnose_unreachable) {
      RM_RETURN_IF_ERROR(options_.diagnose_unreachable(response.status()));
    }
    // Said at once, and again when it changes or every minute: an agent that cannot
    // register is of no use, and its operator must learn why.
    if (attempt == 0 || response.status() != last || attempt % 60 == 0) {
      Log(absl::StrCat("cannot register node ", options_.node, " with the coordinator at ",
                       options_.coordinator_address, ": ", response.status().message(),
                       "; retrying every second (SIGTERM to give up)"));
    }
    last = response.status();
    WaitUnlessAsked(clock_->Now() + absl::Seconds(1));
  }
}

absl::Status Agent::Start(const StartTrainerCommand& start) {
  const int slot = start.slot().slot();
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
  RM_ASSIGN_OR_RETURN(const int64_t pid,
                      launcher_->Launch({std::move(args), log_path,
                                         options_.trainer_memory_limit_bytes}));
  reconciler_.Started(start, pid, log_path);
  if (!options_.trainer_records_dir.empty()) {
    if (absl::Status s =
            RecordTrainer(options_.trainer_records_dir, slot, pid, start.epoch(), start.job());
        !s.ok() && !absl::IsNotFound(s)) {
      LOG(WARNING) << "cannot record the trainer on slot " << slot
                   << " (an agent restarted after a crash would not find it): " << s;
    }
  }
  if (logs_ != nullptr) logs_->Add(start.job(), slot);
  Log(absl::StrCat("started trainer for job ", start.job(), " epoch ", start.epoch(), " on slot ",
                   slot, " (pid ", pid, ", log ", log_path,
                   options_.trainer_memory_limit_bytes > 0
                       ? absl::StrCat(", memory limit ",
                                      options_.trainer_memory_limit_bytes >> 20, " MiB")
                       : "",
                   ")"));
  return absl::OkStatus();
}

void Agent::Refuse(const StartTrainerCommand& start, const absl::Status& why) {
  Log(absl::StrCat("cannot start a trainer: ", why.ToString()));
  TrainerExitedRequest exited;
  exited.set_node(options_.node);
  exited.set_node_credential(credential_);
  exited.set_slot(start.slot().slot());
  exited.set_job(start.job());
  exited.set_exit_code(127);
  exited.set_start_epoch(start.epoch());
  exited.set_detail(why.ToString());
  options_.client->TrainerExited(exited).IgnoreError();
}

void Agent::Exited(const ReportExit& exit) {
  const int code = exit.exit_code;
  Log(absl::StrCat("trainer of job ", exit.job, " on slot ", exit.slot,
                   code < 0 ? absl::StrCat(" killed by signal ", -code)
                            : absl::StrCat(" exited with code ", code)));
  TrainerExitedRequest exited;
  exited.set_node(options_.node);
  exited.set_node_credential(credential_);
  exited.set_slot(exit.slot);
  exited.set_job(exit.job);
  exited.set_exit_code(code);
  exited.set_detail(exit.log_path.empty() ? exit.detail : Tail(exit.log_path, 2048));
  exited.set_log_path(exit.log_path);
  exited.set_stopped(exit.stopped);
  exited.set_start_epoch(exit.start_epoch);
  unreported_.push_back(std::move(exited));
  if (logs_ != nullptr) logs_->SetRunning(exit.job, exit.slot, false);
  // A trainer that ran (not a start dropped while its slot's trainer still runs).
  if (!exit.log_path.empty() && !options_.trainer_records_dir.empty()) {
    ForgetTrainer(options_.trainer_records_dir, exit.slot);
  }
}

void Agent::Forget(const std::string& job) {
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
}

void Agent::Carry(std::vector<AgentAction> actions) {
  for (AgentAction& action : actions) {
    if (auto* start = std::get_if<StartTrainer>(&action)) {
      if (absl::Status s = Start(start->command); !s.ok()) Refuse(start->command, s);
    } else if (auto* stop = std::get_if<StopTrainer>(&action)) {
      Log(absl::StrCat("stopping the trainer on slot ", stop->slot, ": ", stop->reason));
      launcher_->Signal(stop->pid, SIGKILL);
    } else if (auto* refuse = std::get_if<RefuseStart>(&action)) {
      Refuse(refuse->command, refuse->why);
    } else if (auto* exit = std::get_if<ReportExit>(&action)) {
      Exited(*exit);
    } else if (auto* forget = std::get_if<ForgetJob>(&action)) {
      Forget(forget->job);
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
  for (const auto& [slot, t] : reconciler_.trainers()) launcher_->Signal(t.pid, signal);
}

void Agent::Drain(DrainCause cause) {
  reconciler_.Drain();
  drain_deadline_ = clock_->Now() + options_.drain_grace;
  Log(absl::StrCat("draining node ", options_.node, " (", reconciler_.trainers().size(),
                   " trainers; grace ", absl::FormatDuration(options_.drain_grace), ")"));
  DrainNodeRequest request;
  request.set_node(options_.node);
  request.set_node_credential(credential_);
  const bool notice = cause == DrainCause::kPreemptionNotice;
  request.set_reason(notice ? "preemption notice" : "agent asked to drain");
  request.set_preemption_notice(notice);
  absl::Status s = options_.client->DrainNode(request);
  if (!s.ok()) LOG(WARNING) << "DrainNode failed (the trainers are drained anyway): " << s;
  // Each trainer takes part in the job's drain save, then leaves.
  KillAll(SIGTERM);
}

absl::Status Agent::Connect() {
  if (options_.client == nullptr || options_.trainer_binary.empty() || options_.work_dir.empty() ||
      options_.node.empty() || options_.slots < 1) {
    return absl::InvalidArgumentError(
        "the agent needs a client, a trainer binary, a work dir, a node name and slots >= 1");
  }
  if (options_.trainer_memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the trainers' memory limit is negative (",
                                                   options_.trainer_memory_limit_bytes,
                                                   " bytes); 0 means none"));
  }
  RM_RETURN_IF_ERROR(LockWorkDir());
  RM_RETURN_IF_ERROR(EndLeftovers());
  RM_RETURN_IF_ERROR(StartLogService());
  RM_RETURN_IF_ERROR(Register());
  // The trainers an earlier agent left: the coordinator counts them gone now rather than
  // when their ring's collectives time out (sent by the first Step, with the credential).
  for (const EndedTrainer& e : std::exchange(leftovers_, {})) {
    TrainerExitedRequest exited;
    exited.set_node(options_.node);
    exited.set_node_credential(credential_);
    exited.set_slot(e.record.slot);
    exited.set_job(e.record.job);
    // One gone already died with its agent: by the parent-death signal, SIGKILL.
    exited.set_exit_code(-(e.signal == 0 ? SIGKILL : e.signal));
    exited.set_start_epoch(e.record.epoch);
    exited.set_log_path(
        absl::StrCat(options_.work_dir, "/", e.record.job, "/slot-", e.record.slot, ".log"));
    exited.set_detail(
        e.signal == 0
            ? absl::StrCat("died with the earlier agent of node ", options_.node, " (pid ",
                           e.record.pid, "); found gone when the agent started again")
            : absl::StrCat("left running by an earlier agent of node ", options_.node, " (pid ",
                           e.record.pid, "); ended by ",
                           e.signal == SIGKILL ? "SIGKILL" : "SIGTERM",
                           " when the agent started again"));
    unreported_.push_back(std::move(exited));
  }
  return absl::OkStatus();
}

absl::Status Agent::Heartbeat() {
  HeartbeatRequest request;
  request.set_node(options_.node);
  request.set_node_credential(credential_);
  for (const auto& [slot, t] : reconciler_.trainers()) {
    ringmaster::SlotRef* s = request.add_running();
    s->set_node(options_.node);
    s->set_slot(slot);
    RunningTrainer* running = request.add_trainers();
    running->set_slot(slot);
    running->set_job(t.job);
  }
  request.set_last_heartbeat_rtt_s(absl::ToDoubleSeconds(last_heartbeat_rtt_));
  const absl::Time sent = clock_->Now();
  auto response = options_.client->Heartbeat(request);
  if (response.ok()) last_heartbeat_rtt_ = clock_->Now() - sent;
  if (absl::IsNotFound(response.status())) {
    Log("the coordinator does not know this node (restarted, or the lease lapsed): "
        "registering again");
    // The exits seen under the old registration go first: a coordinator that restarted
    // still holds the node's slots from its database until the node registers again, and
    // an exit reported after that blames no one (the job's recovery would name what the
    // survivors saw instead of the death that caused it).
    ReportExits();
    return Register();
  }
  if (!response.ok()) {
    LOG(WARNING) << "heartbeat failed: " << response.status();
    return absl::OkStatus();
  }
  for (const AgentCommand& command : response->commands()) {
    Carry(reconciler_.Want(command, clock_->Now()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Agent::Step() {
  for (const ProcessExit& exit : launcher_->Reap()) {
    Carry(reconciler_.Exited(exit.pid, exit.exit_code));
  }
  // Stopping: leave as soon as the trainers killed are reaped, reporting nothing more.
  if (stopping_) return reconciler_.trainers().empty();
  ReportExits();
  Carry(reconciler_.Tick(clock_->Now()));
  if (options_.stop_requested != nullptr && options_.stop_requested->load()) {
    Log("stopping: killing the trainers");
    KillAll(SIGKILL);
    stopping_ = true;
    return reconciler_.trainers().empty();
  }
  const bool notice = !options_.preemption_notice_file.empty() &&
                      access(options_.preemption_notice_file.c_str(), F_OK) == 0;
  if (!reconciler_.draining() &&
      ((options_.drain_requested != nullptr && options_.drain_requested->load()) || notice)) {
    if (notice) Log("preemption notice " + options_.preemption_notice_file + " found");
    Drain(notice ? DrainCause::kPreemptionNotice : DrainCause::kAsked);
  }
  if (reconciler_.draining()) {
    if (reconciler_.trainers().empty()) {
      Log("drained: every trainer has exited");
      return true;
    }
    if (clock_->Now() >= drain_deadline_) {
      Log("drain grace is over: killing the trainers left");
      KillAll(SIGKILL);
    }
  }
  // Exits are looked for at every step (a trainer's death is reported at once: that is
  // most of the detection time of a recovery); heartbeats go at their interval.
  if (clock_->Now() < next_heartbeat_) return false;
  next_heartbeat_ = clock_->Now() + heartbeat_interval_;
  RM_RETURN_IF_ERROR(Heartbeat());
  return false;
}

absl::Status Agent::Run() {
  RM_RETURN_IF_ERROR(Connect());
  while (true) {
    RM_ASSIGN_OR_RETURN(const bool done, Step());
    if (done) return absl::OkStatus();
    // Every 50 ms (20 ms while the trainers of a stop are being reaped).
    clock_->SleepUntil(clock_->Now() +
                       (stopping_ ? absl::Milliseconds(20) : absl::Milliseconds(50)));
  }
}

}  // namespace ringmaster::worker
