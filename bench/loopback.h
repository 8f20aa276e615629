// Loopback TCP throughput on this machine: the physical limit the collectives benchmark
// is plotted against. Measured with two processes, one thread each driving its sockets
// with non-blocking calls and poll(), like the TCP backend.
#ifndef RINGMASTER_BENCH_LOOPBACK_H_
#define RINGMASTER_BENCH_LOOPBACK_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::bench {

struct LoopbackResult {
  double one_way_gbps = 0;        // one direction busy
  double bidirectional_gbps = 0;  // per direction, both busy (a 2-rank ring's pattern)
};

// Runs each pattern for `duration`. Errors: the socket calls' errno.
absl::StatusOr<LoopbackResult> MeasureLoopback(absl::Duration duration);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_LOOPBACK_H_
