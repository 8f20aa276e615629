#include "worker/program_output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringmaster::worker {

std::string ValidUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    }
    if (ok && n > 1) {
      // No overlong forms, surrogates or code points past U+10FFFF.
      uint32_t cp = c & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (text[i + k] & 0x3F);
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (!ok || (n == 1 && c < 0x20 && c != '\t') || c == 0x7F) {
      out.push_back('?');
      ++i;
      continue;
    }
    out.append(text.data() + i, n);
    i += n;
  }
  return out;
}

void LastLine::Feed(int source, absl::string_view bytes) {
  for (const char c : bytes) {
    if (c == '\n' || c == '\r') {
      Complete(source);
      continue;
    }
    if (partial_[source].size() < max_bytes_) {
      partial_[source].push_back(c);
    } else {
      cut_[source] = true;
    }
  }
}

void LastLine::End(int source) { Complete(source); }

void LastLine::Complete(int source) {
  std::string& line = partial_[source];
  const absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(line);
  if (!absl::StripLeadingAsciiWhitespace(trimmed).empty()) {
    last_ = ValidUtf8(trimmed);
    if (cut_[source]) absl::StrAppend(&last_, "...");
  }
  line.clear();
  cut_[source] = false;
}

absl::StatusOr<std::unique_ptr<ProgramOutput>> ProgramOutput::Create(const Options& options) {
  std::unique_ptr<ProgramOutput> output(new ProgramOutput(options));
  {
    absl::MutexLock lock(&output->mu_);
    output->last_ = LastLine(options.max_line_bytes);
  }
  for (int* fds : {output->out_pipe_, output->err_pipe_, output->wake_pipe_}) {
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot make a pipe for the program's output: ", strerror(errno)));
    }
  }
  return output;
}

ProgramOutput::~ProgramOutput() {
  if (thread_.joinable()) Finish(absl::Now());
  for (int* fds : {out_pipe_, err_pipe_, wake_pipe_}) {
    for (int i : {0, 1}) {
      if (fds[i] >= 0) close(fds[i]);
    }
  }
}

void ProgramOutput::Start() {
  close(out_pipe_[1]);
  close(err_pipe_[1]);
  out_pipe_[1] = err_pipe_[1] = -1;
  thread_ = std::thread([this] { Copy(); });
}

bool ProgramOutput::Finish(absl::Time deadline) {
  if (!thread_.joinable()) return ended_.HasBeenNotified();
  const bool ended = ended_.WaitForNotificationWithDeadline(deadline);
  if (!ended) {
    const char stop = 1;
    (void)!write(wake_pipe_[1], &stop, 1);
  }
  thread_.join();
  return ended;
}

std::string ProgramOutput::last_line() const {
  absl::MutexLock lock(&mu_);
  return last_.Get();
}

namespace {

// All of `data` to `fd`; false when `fd` takes no more (closed downstream: the rest is
// dropped, the program is not held up).
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void ProgramOutput::Copy() {
  // A reader that went away downstream must not kill this process: write() says EPIPE.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  pollfd fds[3] = {{out_pipe_[0], POLLIN, 0}, {err_pipe_[0], POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
  const int to[2] = {options_.out_fd, options_.err_fd};
  bool writable[2] = {true, true};
  int open_sources = 2;
  char buffer[64 << 10];
  while (open_sources > 0) {
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[2].revents != 0) break;  // Finish: stop now
    for (int s : {0, 1}) {
      if (fds[s].fd < 0 || fds[s].revents == 0) continue;
      const ssize_t n = read(fds[s].fd, buffer, sizeof(buffer));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {  // end of this stream (or an error reading it)
        fds[s].fd = -1;
        --open_sources;
        absl::MutexLock lock(&mu_);
        last_.End(s);
        continue;
      }
      if (writable[s]) writable[s] = WriteAll(to[s], buffer, static_cast<size_t>(n));
      absl::MutexLock lock(&mu_);
      last_.Feed(s, absl::string_view(buffer, static_cast<size_t>(n)));
    }
  }
  if (open_sources == 0) ended_.Notify();
  absl::MutexLock lock(&mu_);
  for (int s : {0, 1}) last_.End(s);
}

}  // namespace ringmaster::worker
