#include "worker/zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "spec/validate.h"
#include "worker/exec_failure.h"

extern char** environ;

namespace ringmaster::worker {

namespace {

// Run as PYTHON -c SOURCE SCRIPT MODULE...; fd 3 is its end of the runner's socket.
// Requests: 4 bytes of length (big-endian), then NUL-separated cwd, argc, argv..., env...,
// with stdin, stdout and stderr as SCM_RIGHTS. Answers: "ready\n" once the preload is done,
// then "pid N\n" per request.
constexpr char kSource[] = R"PY(
import ctypes, os, signal, socket, struct, sys, time

def _zygote():
    sock = socket.socket(fileno=3)
    runner = os.getppid()
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[1]))
    for name in sys.argv[2:]:
        __import__(name)
    libc = ctypes.CDLL(None, use_errno=True)
    sock.sendall(b"ready\n")
    while True:
        head, fds, _, _ = socket.recv_fds(sock, 4, 3)
        if not head:
            os._exit(0)
        while len(head) < 4:
            more = sock.recv(4 - len(head))
            if not more:
                os._exit(0)
            head += more
        size = struct.unpack(">I", head)[0]
        payload = b""
        while len(payload) < size:
            more = sock.recv(size - len(payload))
            if not more:
                os._exit(0)
            payload += more
        parts = [os.fsdecode(p) for p in payload.split(b"\0")]
        cwd, argc = parts[0], int(parts[1])
        request = (cwd, parts[2:2 + argc], parts[2 + argc:], fds)
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        helper = os.fork()
        if helper == 0:
            # Forks the program and exits: the program is reparented to the runner.
            pid, helper = -1, os.getpid()
            try:
                os.close(r)
                pid = os.fork()
            except BaseException:
                os._exit(1)
            if pid == 0:
                os.close(w)
                return sock, runner, helper, libc, request
            try:
                os.setpgid(pid, pid)
                os.write(w, str(pid).encode())
            finally:
                os._exit(0)
        os.close(w)
        for fd in fds:
            os.close(fd)
        got = os.read(r, 32)
        os.close(r)
        os.waitpid(helper, 0)
        sock.sendall(b"pid " + (got or b"0") + b"\n")

def _become(sock, runner, helper, libc, request):
    cwd, argv, env, fds = request
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    sock.close()
    while os.getppid() == helper:  # until the helper's exit reparents it
        time.sleep(0.0002)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, now that the runner is the parent
    if os.getppid() != runner:
        os._exit(1)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    if cwd:
        os.chdir(cwd)
    os.environ.clear()
    for entry in env:
        name, _, value = entry.partition("=")
        os.environ[name] = value
    sys.argv = argv
    if not os.path.exists(argv[0]):
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(argv[0])!r}: "
                         "[Errno 2] No such file or directory\n")
        sys.stderr.flush()
        os._exit(2)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))

_become(*_zygote())
del _zygote, _become
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
)PY";

}  // namespace

const char* ZygoteSource() { return kSource; }

bool WaitForListener(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found) != 0) return false;
  bool listening = false;
  while (!listening) {
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    listening = connect(fd, found->ai_addr, found->ai_addrlen) == 0;
    close(fd);
    if (listening || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  freeaddrinfo(found);
  return listening;
}

bool IsPythonScriptCommand(const std::vector<std::string>& argv) {
  return spec::IsPythonScriptArgv(argv);
}

absl::StatusOr<std::unique_ptr<Zygote>> Zygote::Start(const ZygoteOptions& o) {
  if (!IsPythonScriptCommand(o.argv)) {
    return absl::InvalidArgumentError(
        "command.preload needs command.argv of the form [python3, SCRIPT, ARGS...]");
  }
  std::vector<std::string> args = {o.argv[0], "-c", kSource, o.argv[1]};
  args.insert(args.end(), o.preload.begin(), o.preload.end());
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = o.env;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int sv[2], fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  if (pipe2(fds, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return absl::UnavailableError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // The programs it forks become this process's children when their parent exits.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    PrepareForkedChild(parent);
    const int err_fd = fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    const int sock = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    if (!o.workdir.empty() && chdir(o.workdir.c_str()) != 0) {
      ExitWithExecFailure(err_fd, ExecStage::kChdir);
    }
    dup2(sock, 3);  // without close-on-exec
    environ = envp.data();
    execvp(argv[0], argv.data());
    ExitWithExecFailure(err_fd, ExecStage::kExec);
  }
  close(sv[1]);
  close(fds[1]);
  if (pid < 0) {
    close(sv[0]);
    close(fds[0]);
    return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (absl::Status exec = AwaitExec(fds[0], pid, o.argv[0], o.workdir, o.slot); !exec.ok()) {
    close(sv[0]);
    return exec;
  }
  return std::unique_ptr<Zygote>(new Zygote(o, pid, sv[0]));
}

Zygote::~Zygote() {
  if (socket_ >= 0) close(socket_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status Zygote::Gone(const std::string& what) {
  std::string how = "still running";
  int wstatus = 0;
  // A closed socket is the interpreter's exit, moments before its end: wait for it a little.
  const absl::Time until = absl::Now() + (socket_ < 0 ? absl::Seconds(2) : absl::ZeroDuration());
  while (pid_ > 0) {
    if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      how = WIFEXITED(wstatus) ? absl::StrCat("exit code ", WEXITSTATUS(wstatus))
                               : absl::StrCat("signal ", WTERMSIG(wstatus));
      pid_ = -1;
      break;
    }
    if (absl::Now() >= until) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::UnavailableError(absl::StrCat(
      "the preloaded interpreter (command.preload) ", what, " (", how,
      "); an import that raised printed its traceback in this rank's log"));
}

absl::StatusOr<pid_t> Zygote::Spawn(const std::vector<std::string>& env,
                                    const std::string& workdir, const std::array<int, 3>& stdio) {
  if (socket_ < 0) return absl::UnavailableError("the preloaded interpreter is gone");
  std::string payload = absl::StrCat(workdir, std::string(1, '\0'), options_.argv.size() - 1);
  for (size_t i = 1; i < options_.argv.size(); ++i) absl::StrAppend(&payload, std::string(1, '\0'), options_.argv[i]);
  for (const std::string& e : env) absl::StrAppend(&payload, std::string(1, '\0'), e);
  const uint32_t size = static_cast<uint32_t>(payload.size());
  const char head[4] = {static_cast<char>(size >> 24), static_cast<char>(size >> 16),
                        static_cast<char>(size >> 8), static_cast<char>(size)};
  const std::string message = std::string(head, 4) + payload;
  iovec iov{const_cast<char*>(message.data()), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(3 * sizeof(int));
  memcpy(CMSG_DATA(cmsg), stdio.data(), 3 * sizeof(int));
  ssize_t sent;
  do {
    sent = sendmsg(socket_, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  while (sent >= 0 && static_cast<size_t>(sent) < message.size()) {
    const ssize_t more = send(socket_, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (more < 0 && errno == EINTR) continue;
    if (more < 0) sent = -1; else sent += more;
  }
  if (sent < 0) return Gone(absl::StrCat("cannot be written to: ", strerror(errno)));
  // Its answer (after "ready" when WaitReady did not read it).
  RM_ASSIGN_OR_RETURN(std::string line, ReadLine(absl::Now() + options_.reply_timeout));
  if (line == "ready") {
    ready_ = true;
    RM_ASSIGN_OR_RETURN(line, ReadLine(absl::Now() + options_.reply_timeout));
  }
  int pid = 0;
  if (absl::StartsWith(line, "pid ") && absl::SimpleAtoi(line.substr(4), &pid) && pid > 0) {
    return static_cast<pid_t>(pid);
  }
  return Gone(absl::StrCat("could not fork the program (it said '", line, "')"));
}

absl::Status Zygote::WaitReady() {
  if (ready_) return absl::OkStatus();
  RM_ASSIGN_OR_RETURN(const std::string line, ReadLine(absl::Now() + options_.reply_timeout));
  if (line != "ready") return Gone(absl::StrCat("said '", line, "' before it was ready"));
  ready_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Zygote::ReadLine(absl::Time deadline) {
  if (socket_ < 0) return absl::UnavailableError("the preloaded interpreter is gone");
  std::string line;
  while (true) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) {
      return Gone(absl::StrCat("did not answer within ",
                               absl::FormatDuration(options_.reply_timeout)));
    }
    pollfd p{socket_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1000))) <= 0) continue;
    char c;
    const ssize_t n = read(socket_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(socket_);
      socket_ = -1;
      return Gone("exited");
    }
    if (c == '\n') return line;
    line.push_back(c);
  }
}

}  // namespace ringmaster::worker
