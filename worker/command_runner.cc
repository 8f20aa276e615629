#include "worker/command_runner.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/coordinator_store.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/epoch_calls.h"
#include "worker/exec_failure.h"
#include "worker/inprocess_world.h"
#include "worker/program_channel.h"
#include "worker/program_progress.h"
#include "worker/program_output.h"
#include "worker/zygote.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace ringmaster::worker {

absl::StatusOr<CommandPlacement> PlacementFromMembers(const JoinResponse& joined,
                                                      const ringmaster::SlotRef& self) {
  std::vector<const Member*> members;
  for (const Member& m : joined.members()) members.push_back(&m);
  if (static_cast<int>(members.size()) != joined.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the coordinator sent ", members.size(), " members for a world of ",
        joined.world_size(), "; command jobs run on at most 64 ranks in this version"));
  }
  std::sort(members.begin(), members.end(),
            [](const Member* a, const Member* b) { return a->rank() < b->rank(); });
  CommandPlacement p;
  p.rank = joined.rank();
  p.world_size = joined.world_size();
  p.local_world_size = 0;
  std::vector<std::string> nodes;  // in the order of their lowest rank
  bool found = false;
  for (const Member* m : members) {
    const std::string& node = m->slot().node();
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
    if (node != self.node()) continue;
    if (m->slot().slot() == self.slot()) {
      found = true;
      p.local_rank = p.local_world_size;
    }
    ++p.local_world_size;
    p.local_slots.push_back(m->slot().slot());
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", self.node(), "/", self.slot(),
                                                   " is not among the epoch's members"));
  }
  p.group_world_size = static_cast<int>(nodes.size());
  p.group_rank =
      static_cast<int>(std::find(nodes.begin(), nodes.end(), self.node()) - nodes.begin());
  return p;
}

std::string RestartReason(absl::string_view epoch_cause) {
  if (epoch_cause == "grow") return "resize";
  if (epoch_cause == "restore") return "coordinator_restart";
  if (epoch_cause.empty()) return "start";  // a coordinator older than the field
  return std::string(epoch_cause);
}

std::vector<std::string> BuildCommandEnv(const CommandEnvInput& in) {
  std::map<std::string, std::string> env;
  for (const std::string& entry : in.base_env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : in.user_env) env[name] = value;
  // What torchrun inherits or defaults (run.py, local_elastic_agent.py _start_workers).
  auto inherit_or = [&env](const std::string& name, const std::string& fallback) {
    if (env.find(name) == env.end()) env[name] = fallback;
  };
  inherit_or("NCCL_ASYNC_ERROR_HANDLING", "1");
  inherit_or("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (in.placement.local_world_size > 1) inherit_or("OMP_NUM_THREADS", "1");
  const CommandPlacement& p = in.placement;
  if (!p.local_slots.empty()) {
    std::vector<std::string> inherited;
    if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end() && !it->second.empty()) {
      inherited = absl::StrSplit(it->second, ',');
    }
    std::vector<std::string> visible;
    for (int slot : p.local_slots) {
      visible.push_back(slot < static_cast<int>(inherited.size()) ? inherited[slot]
                                                                   : absl::StrCat(slot));
    }
    env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(visible, ",");
  }
  env["RANK"] = absl::StrCat(p.rank);
  env["WORLD_SIZE"] = absl::StrCat(p.world_size);
  env["LOCAL_RANK"] = absl::StrCat(p.local_rank);
  env["LOCAL_WORLD_SIZE"] = absl::StrCat(p.local_world_size);
  env["GROUP_RANK"] = absl::StrCat(p.group_rank);
  env["GROUP_WORLD_SIZE"] = absl::StrCat(p.group_world_size);
  env["ROLE_RANK"] = absl::StrCat(p.rank);  // one role: every rank's
  env["ROLE_NAME"] = "default";
  env["ROLE_WORLD_SIZE"] = absl::StrCat(p.world_size);
  env["MASTER_ADDR"] = in.master_addr;
  env["MASTER_PORT"] = absl::StrCat(in.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(in.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = absl::StrCat(in.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = in.job;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env["TORCHELASTIC_ERROR_FILE"] = in.error_file;
  env["RINGMASTER_JOB"] = in.job;
  env["RINGMASTER_EPOCH"] = absl::StrCat(in.epoch);
  env["RINGMASTER_NODE"] = in.slot.node();
  env["RINGMASTER_SLOT"] = absl::StrCat(in.slot.slot());
  env["RINGMASTER_STOP_GRACE_S"] = absl::StrCat(in.stop_grace_s);
  env["RINGMASTER_RESTART_REASON"] = in.restart_reason;
  if (!in.checkpoint_dir.empty()) env["RINGMASTER_CHECKPOINT_DIR"] = in.checkpoint_dir;
  if (!in.control_socket.empty()) env["RINGMASTER_CONTROL_SOCKET"] = in.control_socket;
  if (!in.python_path.empty()) {
    std::string& python_path = env["PYTHONPATH"];
    python_path = python_path.empty() ? in.python_path : absl::StrCat(in.python_path, ":", python_path);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(absl::StrCat(name, "=", value));
  return out;
}

namespace {

// torchelastic's "timestamp" (ProcessFailure._get_error_data): a string or a number of seconds.
std::optional<int64_t> TimestampField(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) return std::nullopt;
  int64_t seconds = 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &seconds)) return seconds;
  return std::nullopt;
}

}  // namespace

ErrorFile ReadErrorFile(const std::string& path) {
  ErrorFile out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  std::string text(1 << 20, '\0');  // a traceback fits; more is not read
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return out;
  auto it = json.find("message");
  if (it == json.end()) return out;
  const nlohmann::json* message = &*it;
  std::optional<int64_t> seconds;
  if (message->is_object()) {
    if (auto extra = message->find("extraInfo"); extra != message->end() && extra->is_object()) {
      seconds = TimestampField(*extra, "timestamp");
    }
    auto inner = message->find("message");
    if (inner == message->end()) return out;
    message = &*inner;
  } else {
    seconds = TimestampField(json, "timestamp");
  }
  if (!message->is_string()) return out;
  out.message = message->get<std::string>();
  if (out.message.size() > 2000) out.message = out.message.substr(0, 2000) + "...";
  out.message = ValidUtf8(out.message);
  if (seconds.has_value()) {
    out.timestamp = absl::FromUnixSeconds(*seconds);
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      const absl::Time modified = absl::TimeFromTimespec(st.st_mtim);
      if (modified >= out.timestamp && modified < out.timestamp + absl::Seconds(1)) {
        out.timestamp = modified;
      }
    }
  }
  return out;
}

std::string ErrorFileMessage(const std::string& path) { return ReadErrorFile(path).message; }

std::string EpochHeader(const CommandEnvInput& in) {
  return absl::StrCat("==== ringmaster: job ", in.job, " membership epoch ", in.epoch, ": rank ",
                      in.placement.rank, " of ", in.placement.world_size, " on ", in.slot.node(),
                      " slot ", in.slot.slot(), " (restart ", in.restart_count, ", reason ",
                      in.restart_reason, ") ====\n");
}

namespace {

// A port free now on `host` (the kernel's choice). The program binds it moments later;
// a port fresh for each epoch never meets the last epoch's store.
absl::StatusOr<int> PickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot resolve the advertise host ", host, ": ", gai_strerror(rc)));
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  absl::Status status = absl::OkStatus();
  int port = 0;
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("cannot bind a port on ", host, ": ", strerror(errno)));
  } else {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (!status.ok()) return status;
  return port;
}

// MASTER_ADDR:MASTER_PORT of this epoch: rank 0 publishes it, the others wait for it.
absl::StatusOr<std::pair<std::string, int>> AgreeOnMaster(const CommandRunnerOptions& o,
                                                          const JoinResponse& joined,
                                                          comm::Store& store) {
  const std::string key = absl::StrCat(joined.store_prefix(), "command/master");
  if (joined.rank() == 0) {
    RM_ASSIGN_OR_RETURN(const int port, PickFreePort(o.advertise_host));
    RM_RETURN_IF_ERROR(store.Set(key, absl::StrCat(o.advertise_host, ":", port)));
    return std::make_pair(o.advertise_host, port);
  }
  RM_ASSIGN_OR_RETURN(const std::string value, store.Get(key, absl::Now() + o.connect_timeout));
  const size_t colon = value.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(value.substr(colon + 1), &port)) {
    return absl::InternalError(absl::StrCat("rank 0 published a bad master address: ", value));
  }
  return std::make_pair(value.substr(0, colon), port);
}

// The program, started. Its exec's failure comes back through a close-on-exec pipe
// (worker/exec_failure.h).
struct Child {
  pid_t pid = -1;
  std::unique_ptr<ProgramOutput> output;  // its stdout and stderr, passed through
};

absl::StatusOr<Child> StartProgram(const CommandSpec& command, const std::vector<std::string>& env,
                                   const ringmaster::SlotRef& slot, int output_fd, int error_fd) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ProgramOutput> output,
                      ProgramOutput::Create({.out_fd = output_fd, .err_fd = error_fd}));
  std::vector<char*> argv, envp;
  for (const std::string& a : command.argv()) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    close(fds[0]);
    PrepareForkedChild(parent);  // its own group: the stop reaches the program's own children
    if (dup2(output->child_stdout_fd(), 1) < 0 || dup2(output->child_stderr_fd(), 2) < 0) {
      _exit(127);
    }
    if (!command.workdir().empty() && chdir(command.workdir().c_str()) != 0) {
      ExitWithExecFailure(fds[1], ExecStage::kChdir);
    }
    environ = envp.data();
    execvp(argv[0], argv.data());
    ExitWithExecFailure(fds[1], ExecStage::kExec);
  }
  close(fds[1]);
  RM_RETURN_IF_ERROR(AwaitExec(fds[0], pid, command.argv(0), command.workdir(), slot));
  output->Start();
  return Child{pid, std::move(output)};
}

std::string DescribeExit(int wstatus) {
  if (WIFEXITED(wstatus)) return absl::StrCat("exit code ", WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    const int sig = WTERMSIG(wstatus);
    const char* name = sigabbrev_np(sig);
    return absl::StrCat("killed by signal ", sig, name != nullptr ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return absl::StrCat("wait status ", wstatus);
}

// command.preload: the program forked from this rank's warm interpreter (worker/zygote.h),
// started with the first epoch's environment and kept for the next epochs; one that has
// died since is started again once. A preload that fails in a fresh interpreter is permanent.
// A rank other than 0 first waits (up to 1 s) for rank 0's program to listen at MASTER_PORT.
absl::StatusOr<Child> StartPreloaded(const CommandRunnerOptions& o, const CommandEnvInput& in,
                                     std::unique_ptr<Zygote>& zygote) {
  const CommandSpec& command = o.spec.command();
  const std::vector<std::string> env = BuildCommandEnv(in);
  RM_ASSIGN_OR_RETURN(std::unique_ptr<ProgramOutput> output,
                      ProgramOutput::Create({.out_fd = o.output_fd, .err_fd = o.error_fd}));
  for (int attempt = 0;; ++attempt) {
    const bool fresh = zygote == nullptr;
    if (fresh) {
      ZygoteOptions zo;
      zo.argv = {command.argv().begin(), command.argv().end()};
      zo.preload = {command.preload().begin(), command.preload().end()};
      zo.env = env;
      zo.workdir = command.workdir();
      zo.slot = o.slot;
      RM_ASSIGN_OR_RETURN(zygote, Zygote::Start(zo));
    }
    absl::Status ready = zygote->WaitReady();
    if (ready.ok() && in.placement.rank != 0 &&
        !WaitForListener(in.master_addr, in.master_port, absl::Now() + absl::Seconds(1))) {
      VLOG(1) << "rank 0's program does not listen at " << in.master_addr << ":"
              << in.master_port << " yet; starting anyway";
    }
    absl::StatusOr<pid_t> pid =
        ready.ok() ? zygote->Spawn(env, command.workdir(),
                                   {STDIN_FILENO, output->child_stdout_fd(),
                                    output->child_stderr_fd()})
                   : absl::StatusOr<pid_t>(ready);
    if (pid.ok()) {
      output->Start();
      return Child{*pid, std::move(output)};
    }
    zygote.reset();
    if (fresh || attempt > 0) {
      return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
          pid.status().message(), " on node ", o.slot.node(), " (slot ", o.slot.slot(),
          "): check command.preload [", absl::StrJoin(command.preload(), ", "), "]")));
    }
    LOG(WARNING) << pid.status() << "; starting it again";
  }
}

// Waits for the child until `deadline`; its wait status, or nullopt when it still runs.
std::optional<int> WaitUntil(pid_t pid, absl::Time deadline) {
  while (true) {
    int wstatus = 0;
    const pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) return wstatus;
    if (r < 0 && errno != EINTR) return 0;  // not our child any more: nothing to wait for
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// The stop message on the program's channel when it is connected ({"type":"stop",
// "reason":...}), SIGTERM and SIGCONT to its group (a stopped program handles its SIGTERM only
// once it runs), stop_grace, then SIGKILL. Returns its wait status.
int StopProgram(pid_t pid, absl::Duration grace, ProgramChannel* channel, const char* reason) {
  if (channel != nullptr) {
    channel->Poll();  // takes a connection the program has just made
    if (channel->connected()) {
      if (absl::Status s = channel->Send({{"type", "stop"}, {"reason", reason}}); !s.ok()) {
        LOG(WARNING) << "cannot send the program its stop: " << s;
      }
    }
  }
  kill(-pid, SIGTERM);
  kill(-pid, SIGCONT);
  std::optional<int> status = WaitUntil(pid, absl::Now() + grace);
  if (status) {
    kill(-pid, SIGKILL);  // whatever of its group is left
    return *status;
  }
  LOG(WARNING) << "the program did not exit within " << absl::FormatDuration(grace)
               << " of SIGTERM: SIGKILL";
  kill(-pid, SIGKILL);
  // SIGKILL ends a process unless it is stuck in the kernel (a hung device or mount): then it
  // is left behind, said so, rather than blocking this rank for ever.
  std::optional<int> killed = WaitUntil(pid, absl::Now() + absl::Seconds(30));
  if (!killed) LOG(ERROR) << "the program (pid " << pid << ") outlived SIGKILL by 30 s; left behind";
  return killed.value_or(SIGKILL);
}

void ReportFailure(const CommandRunnerOptions& o, int64_t epoch, const absl::Status& error,
                   const ringmaster::RankFailure* failure = nullptr) {
  ReportEpochError({o.client, o.job, o.slot}, epoch, error, failure);
}

// How the program failed in `epoch`, for the coordinator: its exit `wstatus` seen at
// `exited_at`, its error file, its last line of output.
ringmaster::RankFailure DescribeFailure(const CommandRunnerOptions& o, int64_t epoch, int rank,
                                        int wstatus, absl::Time exited_at, const ErrorFile& error,
                                        const std::string& last_line) {
  ringmaster::RankFailure f;
  f.set_epoch(epoch);
  f.set_rank(rank);
  *f.mutable_slot() = o.slot;
  f.set_program(ValidUtf8(o.spec.command().argv(0)));
  f.set_exit_code(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
  const auto& codes = o.spec.command().permanent_exit_codes();
  f.set_how(absl::StrCat(DescribeExit(wstatus),
                         WIFEXITED(wstatus) && std::find(codes.begin(), codes.end(),
                                                         f.exit_code()) != codes.end()
                             ? " (in command.permanent_exit_codes: no restart)"
                             : ""));
  if (WIFSIGNALED(wstatus)) {
    f.set_signal(WTERMSIG(wstatus));
    if (const char* name = sigabbrev_np(WTERMSIG(wstatus)); name != nullptr) {
      f.set_signal_name(absl::StrCat("SIG", name));
    }
  }
  f.set_error_message(error.message);
  f.set_last_output_line(last_line);
  const bool from_file = error.timestamp != absl::InfinitePast();
  f.set_failed_at_s(static_cast<double>(absl::ToUnixMicros(from_file ? error.timestamp : exited_at)) /
                    1e6);
  f.set_failed_at_from_error_file(from_file);
  return f;
}

// The program's own failure (DescribeFailure) as a status: ABORTED (the next epoch), or, for an
// exit code in command.permanent_exit_codes, a permanent FAILED_PRECONDITION.
absl::Status FailureStatus(const CommandRunnerOptions& o, const ringmaster::RankFailure& f) {
  const auto& codes = o.spec.command().permanent_exit_codes();
  const bool permanent = f.signal() == 0 && f.exit_code() >= 0 &&
                         std::find(codes.begin(), codes.end(), f.exit_code()) != codes.end();
  const std::string message = absl::StrCat(
      "rank ", f.rank(), " (node ", o.slot.node(), ", slot ", o.slot.slot(), ") ",
      o.spec.command().argv(0), ": ", f.how(),
      f.error_message().empty() ? "" : absl::StrCat("; its error file says: ", f.error_message()),
      f.last_output_line().empty() ? ""
                                   : absl::StrCat("; its last output line: ", f.last_output_line()));
  if (permanent) return MarkPermanent(absl::FailedPreconditionError(message));
  return absl::AbortedError(message);
}

// A program stopped by ringmaster (a later epoch, the job's end, this trainer leaving) that had
// written an error file may have failed by itself, only slower to exit than the rank whose
// report ended the epoch: its failure is reported for its epoch, as stopped_after (the
// coordinator keeps the epoch's earliest failure; such a report never makes one).
void ReportStoppedFailure(const CommandRunnerOptions& o, int64_t epoch, int rank,
                          const std::string& error_file, const std::string& last_line) {
  const ErrorFile error = ReadErrorFile(error_file);
  if (error.message.empty()) return;
  ringmaster::RankFailure f = DescribeFailure(o, epoch, rank, SIGTERM, absl::Now(), error, last_line);
  f.set_how("raised (its error file) before ringmaster stopped it");
  f.set_stopped_after(true);
  LOG(WARNING) << "epoch " << epoch << ": the stopped program had failed: " << error.message;
  ReportFailure(o, epoch,
                absl::AbortedError(absl::StrCat("rank ", rank, " (node ", o.slot.node(), ", slot ",
                                                o.slot.slot(), ") ", f.program(), ": ", f.how(),
                                                "; its error file says: ", error.message)),
                &f);
}

absl::StatusOr<int64_t> NextEpoch(const CommandRunnerOptions& o, int64_t epoch) {
  return worker::NextEpoch({o.client, o.job, o.slot}, epoch, o.join_timeout, Clock::Real());
}

// How one epoch of the program ended.
struct EpochEnd {
  enum Kind { kExited, kStopped, kLeft, kJobOver } kind = kExited;
  int wstatus = 0;           // kExited: the program's own exit
  int64_t next_epoch = 0;    // kStopped: the epoch the coordinator announced
  std::string why;           // kJobOver
  std::optional<RankStats> stats;  // kExited: the program's last report, if it reported
  // With kStopped (in-process recovery): not stopped; the program lives on into next_epoch.
  bool go_on = false;
};

// The program's channel of one epoch, listening at <error_file_dir>/control-<node>-<slot>.sock
// (a path too long for a socket address is bound through /proc/self/fd: ProgramChannel). No
// channel (logged) when it cannot listen: the program then runs as one that never connects.
struct ControlSocket {
  std::unique_ptr<ProgramChannel> channel;
};

std::unique_ptr<ControlSocket> OpenControlSocket(const CommandRunnerOptions& o) {
  auto control = std::make_unique<ControlSocket>();
  absl::StatusOr<std::unique_ptr<ProgramChannel>> channel = ProgramChannel::Listen(
      absl::StrCat(o.error_file_dir, "/control-", o.slot.node(), "-", o.slot.slot(), ".sock"));
  if (!channel.ok()) {
    LOG(WARNING) << channel.status() << "; the program runs without its channel";
  } else {
    control->channel = *std::move(channel);
  }
  return control;
}

// What the program's reports become (worker/program_progress.h), for this rank of the epoch.
std::unique_ptr<ProgramProgress> NewProgramProgress(const CommandRunnerOptions& o, int rank) {
  ProgramProgressOptions po;
  po.rank = rank;
  po.metrics_jsonl = o.spec.metrics().jsonl();
  po.job = o.job;
  po.run = o.spec.metrics().run();
  if (o.spec.diagnostics().has_log_every()) {
    po.log_every = std::max<int64_t>(1, o.spec.diagnostics().log_every());
  }
  po.heartbeat_timeout = o.heartbeat_timeout;
  absl::StatusOr<std::unique_ptr<ProgramProgress>> progress = ProgramProgress::Create(po);
  if (progress.ok()) return *std::move(progress);
  LOG(WARNING) << progress.status() << "; the program's reports are not recorded there";
  po.metrics_jsonl.clear();
  return *ProgramProgress::Create(po);
}

// Watches the running program: its reports (or keep-alives while it lives), the coordinator's
// answers, our SIGTERM.
EpochEnd Supervise(const CommandRunnerOptions& o, int64_t epoch, int rank, pid_t pid,
                   ProgramChannel* channel, InProcessWorld* inprocess = nullptr) {
  const absl::Duration grace = absl::Seconds(o.spec.command().stop_grace_s());
  std::unique_ptr<ProgramProgress> progress = NewProgramProgress(o, rank);
  if (inprocess != nullptr && inprocess->opted_in()) {
    // An in-process program that lives on said hello in an earlier epoch: its heartbeats
    // keep telling whether it is alive (a frozen one gets no keep-alive).
    progress->Take({{"type", "hello"}, {"inprocess", true}}, absl::Now());
  }
  auto poll = [&] {
    if (channel == nullptr) return;
    for (const nlohmann::json& m : channel->Poll()) {
      progress->Take(m, absl::Now());
      if (inprocess != nullptr) inprocess->Take(m, channel);
    }
  };
  absl::Time next_report = absl::Now();
  bool silent = false;
  while (true) {
    if (std::optional<int> status = WaitUntil(pid, std::min(next_report, absl::Now() +
                                                                             absl::Milliseconds(100)))) {
      poll();  // what it said last
      return {EpochEnd::kExited, *status, 0, "", progress->last_stats()};
    }
    poll();
    if (o.leave_requested != nullptr && o.leave_requested->load()) {
      LOG(INFO) << "SIGTERM: stopping the program (stop_grace_s " << grace << ")";
      StopProgram(pid, grace, channel, "drain");
      return {EpochEnd::kLeft, 0, 0, ""};
    }
    const absl::Time now = absl::Now();
    if (now < next_report) continue;
    next_report = now + o.progress_interval;
    ProgressRequest request;
    request.set_job(o.job);
    request.set_epoch(epoch);
    *request.mutable_slot() = o.slot;
    if (std::optional<RankStats> stats = progress->TakeStats()) {
      *request.mutable_stats() = *stats;  // its report
    } else if (progress->Alive(now)) {
      request.mutable_stats()->set_rank(rank);
      request.mutable_stats()->set_step(-1);  // a keep-alive
    } else {
      // Said hello, then fell silent: frozen (SIGSTOP) or hung. No keep-alive for it.
      if (!silent) {
        LOG(WARNING) << "the program has sent nothing on its channel for over "
                     << o.heartbeat_timeout << " (stopped or frozen): no keep-alive for it";
      }
      silent = true;
      continue;
    }
    if (silent) LOG(INFO) << "the program is heard again";
    silent = false;
    auto response = o.client->Progress(request);
    if (absl::IsFailedPrecondition(response.status())) {
      StopProgram(pid, grace, channel, "job_over");
      return {EpochEnd::kJobOver, 0, 0, std::string(response.status().message())};
    }
    if (!response.ok()) {
      LOG(WARNING) << "progress report failed: " << response.status();
      continue;
    }
    if (response->epoch() > epoch && !response->leave() && inprocess != nullptr &&
        inprocess->opted_in()) {
      LOG(INFO) << "the coordinator formed epoch " << response->epoch()
                << ": the program goes on in its process (in-process recovery)";
      EpochEnd go_on{EpochEnd::kStopped, 0, response->epoch(), ""};
      go_on.go_on = true;
      return go_on;
    }
    if (response->epoch() > epoch) {
      LOG(INFO) << "the coordinator formed epoch " << response->epoch()
                << ": stopping the program (stop_grace_s " << grace << ")";
      StopProgram(pid, grace, channel, response->leave() ? "drain" : "epoch");
      if (response->leave()) return {EpochEnd::kLeft, 0, 0, ""};
      return {EpochEnd::kStopped, 0, response->epoch(), ""};
    }
  }
}

// Where rank `rank` says, after the coordinator took its Ready, that it did.
std::string ReadyKey(const JoinResponse& joined, int rank) {
  return absl::StrCat(joined.store_prefix(), "command/ready/", rank);
}

// With the program's last report, so that the job's end keeps its figures (no step without
// one: a step 0 would overwrite the job's step and loss).
absl::Status Finish(const CommandRunnerOptions& o, int64_t epoch, int rank,
                    const std::optional<RankStats>& stats) {
  FinishedRequest finished;
  finished.set_job(o.job);
  finished.set_epoch(epoch);
  *finished.mutable_slot() = o.slot;
  if (stats) *finished.mutable_stats() = *stats;
  finished.mutable_stats()->set_rank(rank);
  if (!stats) finished.mutable_stats()->set_step(-1);
  return o.client->Finished(finished);
}

// RINGMASTER_CHECKPOINT_DIR: checkpoint.dir/<job>, created; empty without checkpoint.dir.
absl::StatusOr<std::string> CheckpointDir(const CommandRunnerOptions& o) {
  if (o.spec.checkpoint().dir().empty()) return std::string();
  const std::string dir = absl::StrCat(o.spec.checkpoint().dir(), "/", o.job);
  for (const std::string& d : {o.spec.checkpoint().dir(), dir}) {
    if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: cannot create ", d, " on node ", o.slot.node(), ": ", strerror(errno)));
    }
  }
  return dir;
}

// What the program of this rank sees in epoch `joined`: its placement, MASTER_ADDR:PORT (rank
// 0 publishes it), the checkpoint directory (created) and the rest of BuildCommandEnv's input.
absl::StatusOr<CommandEnvInput> EpochEnvironment(const CommandRunnerOptions& o,
                                                 const JoinResponse& joined, comm::Store& store) {
  CommandEnvInput in;
  // The same on every node and every restart: the job fails once, saying why.
  absl::StatusOr<CommandPlacement> placement = PlacementFromMembers(joined, o.slot);
  if (!placement.ok()) {
    return MarkPermanent(absl::FailedPreconditionError(placement.status().message()));
  }
  in.placement = *placement;
  // This node's: another node may create it.
  absl::StatusOr<std::string> checkpoint_dir = CheckpointDir(o);
  if (!checkpoint_dir.ok()) return MarkNodeLocal(checkpoint_dir.status());
  in.checkpoint_dir = *checkpoint_dir;
  RM_ASSIGN_OR_RETURN(std::tie(in.master_addr, in.master_port), AgreeOnMaster(o, joined, store));
  in.base_env = o.base_env;
  in.job = o.job;
  in.epoch = joined.epoch();
  // The coordinator's count, the same for every rank of the epoch: failure-caused epochs
  // (torchrun's meaning: a resize is no restart).
  in.restart_count = joined.restarts();
  in.restart_reason = RestartReason(joined.epoch_cause());
  in.max_restarts = o.spec.elastic().restart_budget();
  in.error_file = absl::StrCat(o.error_file_dir, "/error-", o.job, "-epoch", joined.epoch(), "-",
                               o.slot.node(), "-", o.slot.slot(), ".json");
  in.slot = o.slot;
  in.stop_grace_s = o.spec.command().stop_grace_s();
  in.python_path = o.python_module_dir;
  for (const auto& [name, value] : o.spec.command().env()) in.user_env[name] = value;
  return in;
}

// An in-process program that lives on into the next epoch (in-process recovery), with the
// error file its environment names.
struct Carried {
  Child child;
  std::string error_file;
};

// In-process recovery (worker/inprocess_world.h): this rank's program died while its peers'
// programs live on. Tells the coordinator to re-form the job without this slot and keep it
// for a rejoin (ReportErrorRequest.rejoin). An error (ABORTED: the epoch moved on already)
// leaves this rank a member of the next epoch: the ordinary path applies.
absl::Status ReportRejoin(const CommandRunnerOptions& o, int64_t epoch,
                          const absl::Status& failure, const ringmaster::RankFailure& report) {
  ReportErrorRequest request;
  request.set_job(o.job);
  request.set_epoch(epoch);
  *request.mutable_slot() = o.slot;
  request.set_detail(failure.ToString(absl::StatusToStringMode::kWithNoExtraData));
  request.set_rejoin(true);
  *request.mutable_failure() = report;
  return o.client->ReportError(request);
}

// After ReportRejoin: the program is started again at once, in the environment of the epoch
// it failed in (its world comes on the channel), and returned once it said hello with
// "inprocess" (its imports done); the caller then joins the job's current epoch, which takes
// the slot back. Errors: the start's, its exit or join_timeout before its hello
// (DEADLINE_EXCEEDED), this trainer's SIGTERM (CANCELLED).
absl::StatusOr<Carried> RestartToRejoin(const CommandRunnerOptions& o, CommandEnvInput input,
                                        ProgramChannel& channel, std::unique_ptr<Zygote>& zygote,
                                        InProcessWorld& inprocess) {
  inprocess.ProgramGone();
  input.restart_reason = "failure";
  input.error_file = absl::StrCat(input.error_file, ".rejoin");
  unlink(input.error_file.c_str());
  const std::string header = absl::StrCat(
      "==== ringmaster: job ", o.job, ": the program of ", o.slot.node(), " slot ",
      o.slot.slot(), " started again after its failure in membership epoch ", input.epoch,
      "; it rejoins its peers, which went on in their processes (in-process recovery) ====\n");
  if (write(o.output_fd, header.data(), header.size()) < 0) {
    LOG(WARNING) << "cannot write the epoch's header line: " << strerror(errno);
  }
  const absl::Time began = absl::Now();
  absl::StatusOr<Child> child =
      o.spec.command().preload().empty()
          ? StartProgram(o.spec.command(), BuildCommandEnv(input), o.slot, o.output_fd,
                         o.error_fd)
          : StartPreloaded(o, input, zygote);
  if (!child.ok()) return child.status();
  const absl::Time deadline = absl::Now() + o.join_timeout;
  while (!inprocess.opted_in()) {
    if (std::optional<int> status = WaitUntil(child->pid, absl::Now() + absl::Milliseconds(10))) {
      kill(-child->pid, SIGKILL);
      child->output->Finish(absl::Now() + absl::Seconds(2));
      return absl::AbortedError(absl::StrCat("the program started again to rejoin ended before "
                                             "it said hello: ", DescribeExit(*status)));
    }
    for (const nlohmann::json& m : channel.Poll()) inprocess.Take(m, &channel);
    const bool leave = o.leave_requested != nullptr && o.leave_requested->load();
    if (leave || absl::Now() > deadline) {
      StopProgram(child->pid, absl::Seconds(o.spec.command().stop_grace_s()), &channel, "drain");
      child->output->Finish(absl::Now() + absl::Seconds(2));
      if (leave) return absl::CancelledError("SIGTERM while the program started again");
      return absl::DeadlineExceededError(absl::StrCat(
          "the program started again did not say hello within ",
          absl::FormatDuration(o.join_timeout)));
    }
  }
  LOG(INFO) << "the program started again said hello after " << absl::Now() - began
            << ": rejoining the job";
  return Carried{*std::move(child), input.error_file};
}

// What a rank keeps across epochs for its program: its channel, in-process recovery's worlds,
// and the program that lives on into the next epoch (in-process recovery).
struct ProgramState {
  InProcessWorld inprocess;
  std::unique_ptr<ControlSocket> control;
  std::optional<Carried> carried;
};

// The program of the epoch `input` describes, its channel listening before it starts; or the
// in-process program that goes on (keeping its channel and the error file its environment
// names), given the epoch's world.
absl::StatusOr<Child> ProgramForEpoch(const CommandRunnerOptions& o, CommandEnvInput& input,
                                      ProgramState& p, std::unique_ptr<Zygote>& zygote) {
  const bool goes_on = p.carried.has_value();
  if (!goes_on) {
    p.control = OpenControlSocket(o);
    p.inprocess.ProgramGone();
  }
  if (p.control->channel != nullptr) input.control_socket = p.control->channel->path();
  if (goes_on) input.error_file = p.carried->error_file;
  if (!goes_on) unlink(input.error_file.c_str());
  const std::string header = EpochHeader(input);
  if (write(o.output_fd, header.data(), header.size()) < 0) {
    LOG(WARNING) << "cannot write the epoch's header line: " << strerror(errno);
  }
  absl::StatusOr<Child> child =
      goes_on ? absl::StatusOr<Child>(std::move(p.carried->child))
      : o.spec.command().preload().empty()
          ? StartProgram(o.spec.command(), BuildCommandEnv(input), o.slot, o.output_fd,
                         o.error_fd)
          : StartPreloaded(o, input, zygote);
  p.carried.reset();
  if (child.ok() && p.control->channel != nullptr) {
    // An in-process program gets the epoch's world now, or when it says hello.
    if (absl::Status s = p.inprocess.SetWorld(input, p.control->channel.get()); !s.ok()) {
      LOG(WARNING) << "cannot send the program the world of epoch " << input.epoch << ": " << s;
    }
  }
  return child;
}

// In-process recovery after this rank's program failed (not permanently) in `epoch`: its
// peers go on without it, and it rejoins once its program is up again. nullopt: the ordinary
// path applies (the program did not opt in, the world is one rank, or the coordinator did not
// take the rejoin); OK: p.carried holds the program started again (join the next epoch);
// else the error to end with (CANCELLED: this trainer leaves; else it exits, which frees the
// slot).
std::optional<absl::Status> TryRejoin(const CommandRunnerOptions& o, int64_t epoch,
                                      int world_size, const absl::Status& failure,
                                      const ringmaster::RankFailure& report,
                                      const CommandEnvInput& input, ProgramState& p,
                                      std::unique_ptr<Zygote>& zygote) {
  if (!p.inprocess.opted_in() || world_size < 2 || p.control->channel == nullptr) {
    return std::nullopt;
  }
  if (absl::Status s = ReportRejoin(o, epoch, failure, report); !s.ok()) {
    LOG(WARNING) << "the coordinator did not take the rejoin (" << s
                 << "): the program starts again in the next epoch";
    return std::nullopt;
  }
  absl::StatusOr<Carried> again = RestartToRejoin(o, input, *p.control->channel, zygote,
                                                  p.inprocess);
  if (!again.ok()) return again.status();
  p.carried = *std::move(again);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CommandResult> RunCommandJob(const CommandRunnerOptions& o) {
  if (o.client == nullptr || !o.spec.has_command() || o.spec.command().argv().empty()) {
    return absl::InvalidArgumentError("no coordinator client, or a spec without command.argv");
  }
  CommandResult result;
  std::unique_ptr<Zygote> zygote;  // command.preload's warm interpreter, from the first epoch
  ProgramState program;  // its channel, and an in-process program that lives on
  int64_t epoch = o.first_epoch;
  while (true) {
    JoinRequest join;
    join.set_job(o.job);
    join.set_epoch(epoch);
    *join.mutable_slot() = o.slot;
    auto joined = o.client->Join(join, absl::Now() + o.join_timeout);
    if (absl::IsAborted(joined.status())) {
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
      continue;
    }
    if (!joined.ok()) return joined.status();
    epoch = joined->epoch();
    LOG(INFO) << "job " << o.job << " membership epoch " << epoch << ": rank " << joined->rank()
              << " of " << joined->world_size();
    client::CoordinatorStore store(o.client, o.job, o.slot, epoch);
    absl::StatusOr<CommandEnvInput> input = EpochEnvironment(o, *joined, store);
    if (!input.ok()) {
      LOG(WARNING) << "epoch " << epoch << " could not start: " << input.status();
      ReportFailure(o, epoch, input.status());
      if (IsPermanent(input.status()) || IsNodeLocal(input.status())) return input.status();
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
      continue;
    }
    absl::StatusOr<Child> child = ProgramForEpoch(o, *input, program, zygote);
    if (!child.ok()) {
      LOG(ERROR) << child.status();
      ReportFailure(o, epoch, child.status());
      if (IsPermanent(child.status())) return child.status();
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
      continue;
    }
    ++result.epochs;
    ReadyRequest ready;
    ready.set_job(o.job);
    ready.set_epoch(epoch);
    *ready.mutable_slot() = o.slot;
    if (absl::Status s = o.client->Ready(ready); !s.ok()) {
      LOG(WARNING) << "Ready refused in epoch " << epoch << ": " << s;
    } else if (absl::Status s = store.Set(ReadyKey(*joined, joined->rank()), "1"); !s.ok()) {
      LOG(WARNING) << "cannot say Ready through the store in epoch " << epoch << ": " << s;
    }
    const EpochEnd end = Supervise(o, epoch, joined->rank(), child->pid,
                                    program.control->channel.get(), &program.inprocess);
    if (end.go_on) {  // in-process: the program lives on into the next epoch
      program.carried = Carried{*std::move(child), input->error_file};
      epoch = end.next_epoch;
      continue;
    }
    const absl::Time ended_at = absl::Now();
    if (end.kind == EpochEnd::kExited) kill(-child->pid, SIGKILL);  // what it left in its group
    // The rest of its output (a process it left outside its group may hold the pipes: not
    // waited for long).
    if (!child->output->Finish(absl::Now() + absl::Seconds(2))) {
      LOG(WARNING) << "a process the program left behind still holds its output; not copied";
    }
    const std::string last_line = child->output->last_line();
    switch (end.kind) {
      case EpochEnd::kLeft:
        ReportStoppedFailure(o, epoch, joined->rank(), input->error_file, last_line);
        result.left = true;
        return result;
      case EpochEnd::kJobOver:
        ReportStoppedFailure(o, epoch, joined->rank(), input->error_file, last_line);
        return absl::FailedPreconditionError(absl::StrCat("job ", o.job, " is over: ", end.why));
      case EpochEnd::kStopped:
        ReportStoppedFailure(o, epoch, joined->rank(), input->error_file, last_line);
        epoch = end.next_epoch;
        continue;
      case EpochEnd::kExited:
        break;
    }
    if (WIFEXITED(end.wstatus) && WEXITSTATUS(end.wstatus) == 0) {
      // The coordinator takes Finished from a running epoch only: one whose every rank said
      // Ready. A program that ends at once may end before a slower peer's trainer said it.
      std::vector<std::string> ready_keys;
      for (int r = 0; r < joined->world_size(); ++r) ready_keys.push_back(ReadyKey(*joined, r));
      if (absl::Status s = store.Wait(ready_keys, absl::Now() + o.connect_timeout); !s.ok()) {
        LOG(WARNING) << "not every rank said Ready in epoch " << epoch << ": " << s;
      }
      RM_RETURN_IF_ERROR(Finish(o, epoch, joined->rank(), end.stats));
      return result;
    }
    const ringmaster::RankFailure report = DescribeFailure(
        o, epoch, joined->rank(), end.wstatus, ended_at, ReadErrorFile(input->error_file), last_line);
    const absl::Status failure = FailureStatus(o, report);
    const bool permanent = IsPermanent(failure);
    LOG(WARNING) << "epoch " << epoch << ": " << failure;
    if (std::optional<absl::Status> rejoin =
            permanent ? std::nullopt
                      : TryRejoin(o, epoch, joined->world_size(), failure, report, *input,
                                  program, zygote)) {
      result.left = absl::IsCancelled(*rejoin);
      if (result.left) return result;
      RM_RETURN_IF_ERROR(*rejoin);
      RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));  // the epoch that takes it back
      continue;
    }
    ReportFailure(o, epoch, failure, &report);
    if (permanent) return failure;
    RM_ASSIGN_OR_RETURN(epoch, NextEpoch(o, epoch));
  }
}

}  // namespace ringmaster::worker
