#include "worker/trainer_records.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::worker {
namespace {

std::string RecordPath(const std::string& dir, int slot) {
  return absl::StrCat(dir, "/slot-", slot);
}

// A recorded trainer still running, pinned by a pidfd (which keeps naming that process
// even once its pid is reused).
struct Pinned {
  TrainerRecord record;
  int pidfd = -1;
};

// The raw system calls (glibc's wrappers are not in every glibc this builds with).
int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
void PidfdSendSignal(int pidfd, int signal) {
  syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0);
}

// A pidfd of the recorded process, or -1 when it is gone or the pid names another process.
int Pin(const TrainerRecord& record) {
  const int fd = PidfdOpen(static_cast<pid_t>(record.pid));
  if (fd < 0) return -1;
  // Checked after the pidfd is open: the pid cannot change hands in between unnoticed.
  absl::StatusOr<uint64_t> start = ProcessStartTime(record.pid);
  if (!start.ok() || *start != record.start_time) {
    close(fd);
    return -1;
  }
  return fd;
}

void Send(const Pinned& p, int signal) {
  // Its process group (the launcher made one per trainer, led by it: no other group can
  // have that id while the leader lives), and the process itself should it have left it.
  kill(-static_cast<pid_t>(p.record.pid), signal);
  PidfdSendSignal(p.pidfd, signal);
}

// Waits until every pinned process has exited or `deadline` passes; removes (and closes)
// those that exited.
void WaitForExits(std::vector<Pinned>* pinned, absl::Time deadline) {
  while (!pinned->empty()) {
    std::vector<pollfd> fds;
    for (const Pinned& p : *pinned) fds.push_back({p.pidfd, POLLIN, 0});
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    const int timeout_ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    std::vector<Pinned> running;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        close((*pinned)[i].pidfd);
      } else {
        running.push_back(std::move((*pinned)[i]));
      }
    }
    *pinned = std::move(running);
  }
}

}  // namespace

absl::StatusOr<uint64_t> ProcessStartTime(int64_t pid) {
  absl::StatusOr<std::string> stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return absl::NotFoundError(absl::StrCat("no process ", pid));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after
  // the last ')' are 3 (state) onwards.
  const size_t close_paren = stat->rfind(')');
  if (close_paren == std::string::npos) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/stat does not parse"));
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(*stat).substr(close_paren + 1), ' ', absl::SkipEmpty());
  uint64_t start = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start)) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/stat does not parse"));
  }
  if (fields[0] == "Z" || fields[0] == "X") {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  return start;
}

absl::Status RecordTrainer(const std::string& dir, int slot, int64_t pid, int64_t epoch,
                           const std::string& job) {
  RM_ASSIGN_OR_RETURN(const uint64_t start, ProcessStartTime(pid));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return WriteFileAtomically(RecordPath(dir, slot),
                             absl::StrCat(pid, " ", start, " ", epoch, " ", job, "\n"),
                             {.mode = 0600});
}

void ForgetTrainer(const std::string& dir, int slot) {
  std::error_code ec;
  std::filesystem::remove(RecordPath(dir, slot), ec);
}

std::vector<TrainerRecord> ReadTrainerRecords(const std::string& dir) {
  std::vector<TrainerRecord> records;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    TrainerRecord r;
    absl::string_view slot = name;
    if (!absl::ConsumePrefix(&slot, "slot-") || !absl::SimpleAtoi(slot, &r.slot)) continue;
    absl::StatusOr<std::string> text = ReadFile(entry.path().string());
    const std::vector<std::string> fields =
        text.ok() ? absl::StrSplit(absl::StripTrailingAsciiWhitespace(*text), ' ')
                  : std::vector<std::string>{};
    if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &r.pid) || r.pid <= 0 ||
        !absl::SimpleAtoi(fields[1], &r.start_time) || !absl::SimpleAtoi(fields[2], &r.epoch)) {
      LOG(WARNING) << "ignoring " << entry.path() << ": not a trainer record";
      continue;
    }
    r.job = fields[3];
    records.push_back(std::move(r));
  }
  std::sort(records.begin(), records.end(),
            [](const TrainerRecord& a, const TrainerRecord& b) { return a.slot < b.slot; });
  return records;
}

std::vector<EndedTrainer> EndRecordedTrainers(const std::string& dir,
                                              const EndOptions& options) {
  std::vector<Pinned> pinned;
  std::vector<EndedTrainer> ended;
  for (TrainerRecord& record : ReadTrainerRecords(dir)) {
    const int fd = Pin(record);
    ended.push_back({record, fd >= 0 ? SIGTERM : 0, false});
    if (fd >= 0) pinned.push_back({std::move(record), fd});
  }
  for (const Pinned& p : pinned) Send(p, SIGTERM);
  WaitForExits(&pinned, absl::Now() + options.term_grace);
  for (const Pinned& p : pinned) {
    Send(p, SIGKILL);
    for (EndedTrainer& e : ended) {
      if (e.record.slot == p.record.slot) e.signal = SIGKILL;
    }
  }
  WaitForExits(&pinned, absl::Now() + options.kill_wait);
  for (const Pinned& p : pinned) {
    for (EndedTrainer& e : ended) {
      if (e.record.slot == p.record.slot) e.survived = true;
    }
    close(p.pidfd);
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const bool kept = std::any_of(pinned.begin(), pinned.end(), [&](const Pinned& p) {
      return entry.path().filename() == absl::StrCat("slot-", p.record.slot);
    });
    if (!kept) std::filesystem::remove(entry.path(), ec);
  }
  return ended;
}

}  // namespace ringmaster::worker
