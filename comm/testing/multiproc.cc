#include "comm/testing/multiproc.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/store.h"

namespace ringmaster::comm::testing {
namespace {

// Report wire format: int32 code, int64 elapsed ns, uint32 length, message bytes.
void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

int RunInChild(const std::function<int()>& fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int result = fn();
    _exit(result < 0 ? 0 : result > 255 ? 255 : result);
  }
  int wstatus = 0;
  if (pid < 0 || waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

std::string FreshStoreDir() {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/store-", getpid(), "-", counter++, "-",
                      absl::ToUnixNanos(absl::Now()));
}

std::vector<RankResult> RunRanks(const MultiProcOptions& options, const RankFn& fn) {
  const int n = options.world_size;
  const std::string store_dir = FreshStoreDir();
  std::vector<RankResult> results(n);
  std::vector<pid_t> pids(n, -1);
  std::vector<int> report_fds(n, -1);
  int release[2];
  if (pipe(release) != 0) {
    for (auto& r : results) r.status = absl::InternalError("pipe failed");
    return results;
  }
  for (int rank = 0; rank < n; ++rank) {
    int report[2];
    if (pipe(report) != 0) break;
    pid_t pid = fork();
    if (pid == 0) {
      close(report[0]);
      close(release[1]);
      absl::Duration elapsed;
      std::unique_ptr<TcpCommunicator> comm;  // kept open until released
      absl::Status status = [&]() -> absl::Status {
        FileStoreOptions store_options;
        store_options.directory = store_dir;
        auto store = FileStore::Create(store_options);
        if (!store.ok()) return store.status();
        TcpCommunicatorOptions comm_options = options.comm;
        comm_options.rank = rank;
        comm_options.size = n;
        comm_options.store = store->get();
        comm_options.prefix = "test";
        auto created = TcpCommunicator::Create(comm_options);
        if (!created.ok()) return created.status();
        comm = std::move(created).value();
        return fn(*comm, &elapsed);
      }();
      int32_t code = static_cast<int32_t>(status.code());
      int64_t ns = absl::ToInt64Nanoseconds(elapsed);
      std::string msg(status.message());
      uint32_t len = static_cast<uint32_t>(msg.size());
      WriteAll(report[1], &code, sizeof(code));
      WriteAll(report[1], &ns, sizeof(ns));
      WriteAll(report[1], &len, sizeof(len));
      WriteAll(report[1], msg.data(), msg.size());
      char c;
      (void)!read(release[0], &c, 1);
      _exit(0);
    }
    close(report[1]);
    pids[rank] = pid;
    report_fds[rank] = report[0];
  }
  close(release[0]);

  // Collect reports from everyone but the victims, until the timeout.
  const absl::Time deadline = absl::Now() + options.timeout;
  for (int rank = 0; rank < n; ++rank) {
    if (report_fds[rank] < 0) {
      results[rank].status = absl::InternalError("could not start this rank");
      continue;
    }
    if (options.victims.count(rank)) continue;
    pollfd p = {report_fds[rank], POLLIN, 0};
    absl::Duration left = deadline - absl::Now();
    int ms = left > absl::ZeroDuration() ? static_cast<int>(absl::ToInt64Milliseconds(left)) : 0;
    if (poll(&p, 1, ms) <= 0) {
      results[rank].status = absl::InternalError("rank did not report before the test timeout");
      continue;
    }
    int32_t code;
    int64_t ns;
    uint32_t len;
    if (!ReadAll(report_fds[rank], &code, sizeof(code)) ||
        !ReadAll(report_fds[rank], &ns, sizeof(ns)) ||
        !ReadAll(report_fds[rank], &len, sizeof(len))) {
      results[rank].status = absl::InternalError("rank died without reporting");
      continue;
    }
    std::string msg(len, '\0');
    ReadAll(report_fds[rank], msg.data(), len);
    results[rank].reported = true;
    results[rank].status = absl::Status(static_cast<absl::StatusCode>(code), msg);
    results[rank].elapsed = absl::Nanoseconds(ns);
  }
  close(release[1]);  // every rank may exit now
  for (int rank = 0; rank < n; ++rank) {
    if (pids[rank] <= 0) continue;
    if (options.victims.count(rank)) kill(pids[rank], SIGKILL);
    int status = 0;
    absl::Time give_up = absl::Now() + absl::Seconds(10);
    pid_t done = 0;
    while ((done = waitpid(pids[rank], &status, WNOHANG)) == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (done == 0) {
      kill(pids[rank], SIGKILL);
      waitpid(pids[rank], &status, 0);
    }
    results[rank].exit_detail = WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                                    : absl::StrCat("exit ", WEXITSTATUS(status));
    close(report_fds[rank]);
  }
  return results;
}

}  // namespace ringmaster::comm::testing
