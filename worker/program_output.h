// A started program's output, passed through this process: the program writes its stdout and
// stderr into two pipes; a thread copies every byte, unchanged and as it comes, to this
// process's own stdout and stderr (so the trainer's log, and `ringctl logs`, show everything)
// and remembers the last non-empty line the program wrote, which a failure report quotes.
//
//   auto output = ProgramOutput::Create({});     // the pipes
//   fork(); in the child: dup2(output->child_stdout_fd(), 1), dup2(child_stderr_fd(), 2)
//   output->Start();                              // in the parent: copy until the end
//   ... the program exits ...
//   output->Finish(deadline);                     // the rest of its output, then stop
//   output->last_line();
//
// Thread-safety: Start and Finish from one thread; last_line from any. The copy blocks on the
// destination (a full pipe downstream slows it down, as it would slow the program itself).
#ifndef RINGMASTER_WORKER_PROGRAM_OUTPUT_H_
#define RINGMASTER_WORKER_PROGRAM_OUTPUT_H_

#include <unistd.h>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ringmaster::worker {

// The last non-empty line of a stream of bytes fed in pieces, from one or more sources (each
// with its own partial line). A line ends at '\n' or '\r' (a progress bar redraws with '\r':
// the last drawing counts); trailing whitespace is dropped; a line longer than max_bytes keeps
// its first max_bytes, then "...". Invalid UTF-8 and control characters become '?'
// (ValidUtf8: the line goes into a proto string). Thread-compatible.
class LastLine {
 public:
  explicit LastLine(size_t max_bytes = 512) : max_bytes_(max_bytes) {}
  // Bytes of source `source` (0 or 1).
  void Feed(int source, absl::string_view bytes);
  // The source ended: its partial line, if not blank, is a line.
  void End(int source);
  std::string Get() const { return last_; }

 private:
  void Complete(int source);

  size_t max_bytes_;
  std::string partial_[2];
  bool cut_[2] = {false, false};
  std::string last_;
};

// Valid UTF-8 fit to show on one line: each byte of an invalid sequence, and each control
// character but tab, replaced by '?'.
std::string ValidUtf8(absl::string_view text);

class ProgramOutput {
 public:
  struct Options {
    // Where the program's stdout and stderr go (not owned; left open).
    int out_fd = STDOUT_FILENO;
    int err_fd = STDERR_FILENO;
    size_t max_line_bytes = 512;  // LastLine
  };
  // UNAVAILABLE when the pipes cannot be made.
  static absl::StatusOr<std::unique_ptr<ProgramOutput>> Create(const Options& options);
  ~ProgramOutput();  // Finish(now) when it was started and not finished

  ProgramOutput(const ProgramOutput&) = delete;
  ProgramOutput& operator=(const ProgramOutput&) = delete;

  // The pipes' write ends, for the child to dup2 onto 1 and 2 (close-on-exec themselves).
  int child_stdout_fd() const { return out_pipe_[1]; }
  int child_stderr_fd() const { return err_pipe_[1]; }

  // In the parent after fork: closes the write ends and starts the copy.
  void Start();
  // Waits until the program's output has ended (every process holding the pipes closed them
  // or exited) or `deadline`, whichever is first, then stops the copy. True when the output
  // ended; false when something (a process the program left behind) still held the pipes.
  bool Finish(absl::Time deadline);
  std::string last_line() const;

 private:
  explicit ProgramOutput(const Options& options) : options_(options) {}
  void Copy();

  Options options_;
  int out_pipe_[2] = {-1, -1};
  int err_pipe_[2] = {-1, -1};
  int wake_pipe_[2] = {-1, -1};  // Finish's "stop now" to the copy
  std::thread thread_;
  absl::Notification ended_;
  mutable absl::Mutex mu_;
  LastLine last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_PROGRAM_OUTPUT_H_
