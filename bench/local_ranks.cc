#include "bench/local_ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/store.h"
#include "common/status_macros.h"

namespace ringmaster::bench {

absl::StatusOr<std::string> RunLocalRanks(int ranks, const comm::TcpCommunicatorOptions& base,
                                          const LocalRankFn& fn) {
  char dir_template[] = "/tmp/ringbench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return ErrnoToStatus(errno, "mkdtemp /tmp/ringbench-XXXXXX");
  }
  const std::string store_dir = dir_template;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return ErrnoToStatus(errno, "pipe");
  absl::Status status;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < ranks; ++rank) {
    pid_t pid = fork();
    if (pid < 0) {
      status = ErrnoToStatus(errno, "fork");
      break;
    }
    if (pid == 0) {
      close(pipe_fds[0]);
      absl::Status rank_status = [&]() -> absl::Status {
        comm::FileStoreOptions store_options;
        store_options.directory = store_dir;
        RM_ASSIGN_OR_RETURN(auto store, comm::FileStore::Create(store_options));
        comm::TcpCommunicatorOptions options = base;
        options.rank = rank;
        options.size = ranks;
        options.store = store.get();
        options.prefix = "ringbench";
        RM_ASSIGN_OR_RETURN(auto comm, comm::TcpCommunicator::Create(options));
        RM_ASSIGN_OR_RETURN(std::string text, fn(*comm));
        if (rank == 0) (void)!write(pipe_fds[1], text.data(), text.size());
        return comm->Barrier(absl::Now() + absl::Seconds(60));
      }();
      if (!rank_status.ok()) {
        fprintf(stderr, "ringbench: rank %d: %s\n", rank, rank_status.ToString().c_str());
        _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  close(pipe_fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) text.append(buf, n);
  close(pipe_fds[0]);
  bool failed = false;
  for (pid_t pid : pids) {
    int wait_status = 0;
    waitpid(pid, &wait_status, 0);
    failed |= !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0;
  }
  // Clean the store directory (files of the form <prefix>/rank-N/addr.value).
  std::string cleanup = absl::StrCat("rm -rf '", store_dir, "'");
  (void)!system(cleanup.c_str());
  if (!status.ok()) return status;
  if (failed) return absl::InternalError("a rank failed (its error is printed above)");
  return text;
}

}  // namespace ringmaster::bench
