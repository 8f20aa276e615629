// Runs a benchmark on local ranks: forked processes joined by the TCP backend (loopback, or
// shared-memory rings between them), as `ringbench` does for each of its commands.
#ifndef RINGMASTER_BENCH_LOCAL_RANKS_H_
#define RINGMASTER_BENCH_LOCAL_RANKS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "comm/tcp/tcp_communicator.h"

namespace ringmaster::bench {

// What a rank runs; rank 0's text is handed back to the caller (the others' is dropped).
using LocalRankFn = std::function<absl::StatusOr<std::string>(comm::TcpCommunicator& comm)>;

// Forks `ranks` processes; each makes its communicator from `base` (rank, size, a FileStore
// in a fresh /tmp/ringbench-* directory and the prefix filled in), runs `fn`, then waits at a
// barrier (60 s) so that no rank closes its connections under a peer still running. A rank
// whose setup or `fn` fails prints its error to stderr as "ringbench: rank R: ..." and exits
// 1. Returns rank 0's text; INTERNAL when a rank failed, the errno's status when a process
// or the store directory cannot be made. Blocks until every rank has exited (no deadline of
// its own: the ranks' collectives are bounded by theirs). Call from a single-threaded
// process (it forks).
absl::StatusOr<std::string> RunLocalRanks(int ranks, const comm::TcpCommunicatorOptions& base,
                                          const LocalRankFn& fn);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_LOCAL_RANKS_H_
