// Runs a function on N forked processes, one per rank, each with its own TCP
// communicator, and collects each rank's result in the parent (the test).
//
// A rank reports its Status and then waits for the parent's release before exiting, so a
// rank that finishes early never closes its sockets under peers still running: each
// survivor's error is its own, not a side effect of another's exit. Ranks listed as
// victims may die or stop; the parent kills whatever is left at the end.
#ifndef RINGMASTER_COMM_TESTING_MULTIPROC_H_
#define RINGMASTER_COMM_TESTING_MULTIPROC_H_

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/tcp/tcp_communicator.h"

namespace ringmaster::comm::testing {

struct RankResult {
  bool reported = false;    // the rank returned from its function
  absl::Status status;      // what it returned
  absl::Duration elapsed;   // time the function reported it spent in the measured op
  std::string exit_detail;  // how the process ended ("exit 0", "signal 9", ...)
};

struct MultiProcOptions {
  int world_size = 2;
  // Base options for every rank; rank, size, store and prefix are filled in.
  TcpCommunicatorOptions comm;
  // Ranks expected not to report (killed or stopped on purpose).
  std::set<int> victims;
  // The parent gives up waiting for reports after this long.
  absl::Duration timeout = absl::Seconds(120);
};

// The function a rank runs. `elapsed` may be set to the duration of the operation under
// test (fault tests compare it with the operation's deadline).
using RankFn = std::function<absl::Status(TcpCommunicator& comm, absl::Duration* elapsed)>;

// Forks world_size processes. A rank whose communicator cannot be created reports that
// error. Returns one result per rank.
std::vector<RankResult> RunRanks(const MultiProcOptions& options, const RankFn& fn);

// A fresh directory under $TEST_TMPDIR for a FileStore.
std::string FreshStoreDir();

// Runs `fn` in a forked child and returns its result, clamped to [0, 255]; -1 when the child
// did not exit normally. For questions whose asking changes the process: CUDA does not
// survive fork, so a test that forks ranks asks "is a GPU visible?" here, never itself.
int RunInChild(const std::function<int()>& fn);

}  // namespace ringmaster::comm::testing

#endif  // RINGMASTER_COMM_TESTING_MULTIPROC_H_
