#include "bench/emulated_link.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace ringmaster::bench {
namespace {

constexpr char kBridge[] = "rmlink";
constexpr absl::Duration kToolTimeout = absl::Seconds(10);

// Where Debian's iproute2 puts ip and tc (and its usrmerge links). Not PATH: a library reads
// no environment.
std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<std::string> Tool(const std::string& name) {
  std::string path = FindTool(name);
  if (path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the emulated link needs `", name,
                     "` (not in /usr/sbin, /sbin, /usr/bin or /bin): apt-get install iproute2"));
  }
  return path;
}

// Runs `tool args...` (ip or tc) in the network namespace of process `netns_pid` (0: this
// process's) and returns its stdout and stderr. INTERNAL naming the command and its output
// when it fails or outlives kToolTimeout.
absl::StatusOr<std::string> RunTool(const std::string& tool, const std::vector<std::string>& args,
                                    pid_t netns_pid = 0) {
  RM_ASSIGN_OR_RETURN(const std::string path, Tool(tool));
  std::vector<std::string> words = {path};
  words.insert(words.end(), args.begin(), args.end());
  const std::string command =
      absl::StrCat(absl::StrJoin(words, " "),
                   netns_pid > 0 ? absl::StrCat(" (in the namespace of pid ", netns_pid, ")") : "");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const std::string netns = absl::StrCat("/proc/", netns_pid, "/ns/net");
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe for ", command, ": ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("fork for ", command, ": ", strerror(error)));
  }
  if (pid == 0) {  // async-signal-safe calls only until exec
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (netns_pid > 0) {
      const int fd = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        const char message[] = "cannot enter the rank's network namespace\n";
        (void)!write(2, message, sizeof(message) - 1);
        _exit(126);
      }
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string output;
  const absl::Time deadline = absl::Now() + kToolTimeout;
  bool timed_out = false;
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::InternalError(
        absl::StrCat(command, ": no answer within ", absl::FormatDuration(kToolTimeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(command, " failed (",
                                            WIFEXITED(status)
                                                ? absl::StrCat("exit status ", WEXITSTATUS(status))
                                                : absl::StrCat("signal ", WTERMSIG(status)),
                                            "): ", absl::StripTrailingAsciiWhitespace(output)));
  }
  return output;
}

absl::Status Unshare(const char* what) {
  if (unshare(CLONE_NEWNET) == 0) return absl::OkStatus();
  const int error = errno;
  if (error == EPERM) {
    return absl::FailedPreconditionError(
        absl::StrCat("the emulated link cannot make ", what,
                     "'s network namespace: unshare(CLONE_NEWNET) needs root (CAP_SYS_ADMIN)"));
  }
  return absl::InternalError(
      absl::StrCat("unshare(CLONE_NEWNET) for ", what, ": ", strerror(error)));
}

// Moves this process into a new network namespace with a bridge (the hub), up.
absl::Status EnterLinkHub() {
  RM_RETURN_IF_ERROR(Unshare("the hub"));
  RM_RETURN_IF_ERROR(RunTool("ip", {"link", "add", kBridge, "type", "bridge"}).status());
  return RunTool("ip", {"link", "set", kBridge, "up"}).status();
}

// Moves this process (a rank, just forked) into a new network namespace of its own.
absl::Status EnterRankNamespace() { return Unshare("a rank"); }

// Joins the namespace of process `pid` to the hub's bridge (see RunRanksOnLink, which checks
// the rank and the rate).
absl::Status ConnectRank(pid_t pid, int rank, const EmulatedLinkOptions& options) {
  const double bits_per_second = options.gbit * 1e9;
  const int64_t burst =
      options.burst_bytes > 0
          ? options.burst_bytes
          : std::max<int64_t>(64 << 10, static_cast<int64_t>(bits_per_second / 8 / 1000));
  const std::string hub_end = absl::StrCat("hub", rank);
  RM_RETURN_IF_ERROR(RunTool("ip", {"link", "add", hub_end, "type", "veth", "peer", "name",
                                    kLinkInterface, "netns", absl::StrCat(pid)})
                         .status());
  RM_RETURN_IF_ERROR(RunTool("ip", {"link", "set", hub_end, "master", kBridge, "up"}).status());
  RM_RETURN_IF_ERROR(
      RunTool("ip", {"addr", "add", absl::StrCat(LinkAddress(rank), "/24"), "dev", kLinkInterface},
              pid)
          .status());
  RM_RETURN_IF_ERROR(RunTool("ip", {"link", "set", kLinkInterface, "up"}, pid).status());
  // The queue holds 100 ms at the rate: TCP's own pacing keeps it short, and a drop (which
  // ReadLinkCounters reports) would cost a retransmission.
  return RunTool("tc",
                 {"qdisc", "add", "dev", kLinkInterface, "root", "tbf", "rate",
                  absl::StrCat(static_cast<int64_t>(bits_per_second), "bit"), "burst",
                  absl::StrCat(burst), "latency", "100ms"},
                 pid)
      .status();
}

// Writes one line to the report pipe (a write of at most PIPE_BUF bytes is atomic, so the
// lines of several processes do not interleave).
void Report(int fd, const std::string& message) {
  std::string line = message.substr(0, PIPE_BUF - 1) + "\n";
  (void)!write(fd, line.data(), line.size());
}

// Waits for a child, retrying on EINTR.
int WaitFor(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The hub process: its namespace and bridge, the ranks, their links. Returns its exit
// status; every failure is reported on `report`.
int HubMain(int ranks, const EmulatedLinkOptions& options, const LinkRankFn& fn, int report) {
  if (absl::Status s = EnterLinkHub(); !s.ok()) {
    Report(report, absl::StrCat("link: ", s.ToString()));
    return 1;
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    Report(report, absl::StrCat("link: pipe: ", strerror(errno)));
    return 1;
  }
  std::vector<pid_t> pids;
  std::vector<int> go;  // write ends: a byte lets rank r start
  const auto kill_all = [&]() {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) WaitFor(p);
  };
  for (int rank = 0; rank < ranks; ++rank) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      Report(report, absl::StrCat("link: pipe: ", strerror(errno)));
      kill_all();
      return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      Report(report, absl::StrCat("link: fork: ", strerror(errno)));
      kill_all();
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(ready[0]);
      close(fds[1]);
      for (int fd : go) close(fd);
      const absl::Status entered = EnterRankNamespace();
      const char c = entered.ok() ? 'r' : 'x';
      (void)!write(ready[1], &c, 1);
      close(ready[1]);
      if (!entered.ok()) {
        Report(report, absl::StrCat("rank ", rank, ": ", entered.ToString()));
        _exit(1);
      }
      char g = 0;
      ssize_t n;
      while ((n = read(fds[0], &g, 1)) < 0 && errno == EINTR) {
      }
      close(fds[0]);
      if (n != 1) _exit(1);  // the hub gave up (and said why)
      const absl::Status s = fn(rank);
      if (!s.ok()) Report(report, absl::StrCat("rank ", rank, ": ", s.ToString()));
      fflush(stdout);
      fflush(stderr);
      _exit(s.ok() ? 0 : 1);
    }
    close(fds[0]);
    pids.push_back(pid);
    go.push_back(fds[1]);
  }
  close(ready[1]);
  int entered = 0;
  for (char c = 0; entered < ranks; ++entered) {
    ssize_t n;
    while ((n = read(ready[0], &c, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1 || c != 'r') break;
  }
  close(ready[0]);
  if (entered < ranks) {
    kill_all();
    return 1;  // the rank said why
  }
  for (int rank = 0; rank < ranks; ++rank) {
    if (absl::Status s = ConnectRank(pids[rank], rank, options); !s.ok()) {
      Report(report, absl::StrCat("link: rank ", rank, ": ", s.ToString()));
      kill_all();
      return 1;
    }
  }
  for (int fd : go) {
    (void)!write(fd, "g", 1);
    close(fd);
  }
  int failed = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const int status = WaitFor(pids[rank]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failed;
    if (WIFSIGNALED(status)) {
      Report(report, absl::StrCat("rank ", rank, ": killed by signal ", WTERMSIG(status)));
    }
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

absl::Status CheckLinkSupport() {
  RM_RETURN_IF_ERROR(Tool("ip").status());
  RM_RETURN_IF_ERROR(Tool("tc").status());
  // A child tries: this process stays where it is.
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : (errno == EPERM ? 1 : 2));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
    return absl::FailedPreconditionError(
        "the emulated link needs network namespaces, and unshare(CLONE_NEWNET) was refused "
        "(EPERM): run as root (CAP_SYS_ADMIN and CAP_NET_ADMIN)");
  }
  return absl::FailedPreconditionError(
      "the emulated link needs network namespaces, and unshare(CLONE_NEWNET) failed: is the "
      "kernel built with CONFIG_NET_NS?");
}

absl::Status RunRanksOnLink(int ranks, const EmulatedLinkOptions& options, const LinkRankFn& fn) {
  if (ranks < 1 || ranks > kMaxLinkRanks) {
    return absl::InvalidArgumentError(absl::StrCat("ranks: ", ranks, " is outside [1, ",
                                                   kMaxLinkRanks, "] for the emulated link"));
  }
  if (!(options.gbit > 0) || !std::isfinite(options.gbit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gbit: the link's rate must be positive, not ", options.gbit));
  }
  RM_RETURN_IF_ERROR(CheckLinkSupport());
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t hub = fork();
  if (hub < 0) {
    const int error = errno;
    close(report[0]);
    close(report[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(error)));
  }
  if (hub == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(report[0]);
    _exit(HubMain(ranks, options, fn, report[1]));
  }
  close(report[1]);
  // Until every process holding the pipe (the hub, the ranks) has exited.
  std::string messages;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(report[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    messages.append(buffer, static_cast<size_t>(n));
  }
  close(report[0]);
  const int status = WaitFor(hub);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (messages.empty()) {
    messages = WIFSIGNALED(status) ? absl::StrCat("the hub was killed by signal ", WTERMSIG(status))
                                   : "a process of the link failed without saying why";
  }
  return absl::InternalError(
      absl::StrJoin(absl::StrSplit(absl::StripTrailingAsciiWhitespace(messages), '\n'), "; "));
}

std::string LinkAddress(int rank) { return absl::StrCat("10.231.0.", rank + 1); }

absl::StatusOr<LinkCounters> ReadLinkCounters(const std::string& interface) {
  RM_ASSIGN_OR_RETURN(const std::string dev, ReadFile("/proc/self/net/dev"));
  LinkCounters c;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(dev, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos ||
        absl::StripAsciiWhitespace(line.substr(0, colon)) != interface) {
      continue;
    }
    // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets ...
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipWhitespace());
    if (fields.size() < 10 || !absl::SimpleAtoi(fields[8], &c.tx_bytes) ||
        !absl::SimpleAtoi(fields[9], &c.tx_packets)) {
      return absl::InternalError(absl::StrCat("/proc/self/net/dev: cannot read \"", line, "\""));
    }
    found = true;
  }
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("no interface ", interface, " in this process's network namespace"));
  }
  RM_ASSIGN_OR_RETURN(const std::string qdisc,
                      RunTool("tc", {"-s", "qdisc", "show", "dev", interface}));
  // " Sent 54819202 bytes 36217 pkt (dropped 0, overlimits 2405 requeues 0)"
  const size_t at = qdisc.find("(dropped ");
  if (at == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("tc -s qdisc show dev ", interface, ": no \"(dropped N\" in \"", qdisc, "\""));
  }
  absl::string_view rest = absl::string_view(qdisc).substr(at + 9);
  rest = rest.substr(0, rest.find(','));
  if (!absl::SimpleAtoi(rest, &c.qdisc_drops)) {
    return absl::InternalError(absl::StrCat("tc -s qdisc show dev ", interface,
                                            ": cannot read the drops in \"", qdisc, "\""));
  }
  return c;
}

}  // namespace ringmaster::bench
